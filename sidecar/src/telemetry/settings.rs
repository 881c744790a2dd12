//! What tracing does, from the standard `OTEL_*` variables and the config
//! file's `tracing` section (the file wins where it says something).

use std::time::Duration;

use rewire_runtime::config::{OtelProtocol, TracingSection};

use super::tls::ExportTlsFiles;

/// Default time one export may take before it counts as failed.
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How new traces are sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    /// Every trace.
    AlwaysOn,
    /// No trace.
    AlwaysOff,
    /// A fraction of trace ids.
    Ratio(f64),
    /// A continued trace follows the caller's decision; a new one is
    /// decided by the inner choice.
    ParentBased(ParentBasedRoot),
}

/// The decision for root spans under [`SamplerChoice::ParentBased`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParentBasedRoot {
    /// Every new trace.
    AlwaysOn,
    /// No new trace.
    AlwaysOff,
    /// A fraction of new traces.
    Ratio(f64),
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The collector's URL (for HTTP, the full `…/v1/traces` URL); `None`:
    /// tracing is off.
    pub endpoint: Option<String>,
    /// OTLP over HTTP/protobuf or over gRPC.
    pub protocol: OtelProtocol,
    /// Which new traces are sampled.
    pub sampler: SamplerChoice,
    /// `service.name` of every span.
    pub service_name: String,
    /// Limit of one export.
    pub export_timeout: Duration,
    /// The CA and client identity for a `https` collector.
    pub tls: ExportTlsFiles,
}

impl TraceSettings {
    /// The settings the `OTEL_*` variables in `env` say, with `section`
    /// (the config file's `tracing`) winning where given; `app_id` names
    /// the service when `OTEL_SERVICE_NAME` is unset.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        section: Option<&TracingSection>,
        app_id: &str,
    ) -> Self {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
        let mut protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .and_then(|p| OtelProtocol::parse(p.trim()))
            .unwrap_or_default();
        let mut endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| under_base(&base, protocol)));
        let mut sampler = env_sampler(&var);
        if let Some(section) = section {
            if let Some(otel) = &section.otel {
                protocol = otel.protocol;
                let base = with_scheme(&otel.endpoint_address, otel.is_secure);
                endpoint = Some(signal_url(&base, protocol));
            }
            if let Some(rate) = section.sampling_rate {
                sampler = rate_sampler(rate);
            }
        }
        let service_name = var("OTEL_SERVICE_NAME").unwrap_or_else(|| {
            if app_id.is_empty() {
                "rewire".to_string()
            } else {
                app_id.to_string()
            }
        });
        let export_timeout = var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map_or(DEFAULT_EXPORT_TIMEOUT, Duration::from_millis);
        Self {
            endpoint: endpoint.filter(|_| !disabled),
            protocol,
            sampler,
            service_name,
            export_timeout,
            tls: ExportTlsFiles::from_env(&var),
        }
    }

    /// Whether spans are recorded and exported at all: whenever a
    /// collector is set. Even `always_off` keeps the reloads' traces (the
    /// sampler decides for calls only); `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none` turn everything off.
    pub fn enabled(&self) -> bool {
        self.endpoint.is_some()
    }

    /// Whether calls may be traced: tracing is on and the sampler is not
    /// `always_off` (else a call makes no span and parses no header).
    pub fn traces_calls(&self) -> bool {
        self.enabled() && self.sampler != SamplerChoice::AlwaysOff
    }
}

/// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, as the specification
/// names them (default `parentbased_always_on`).
fn env_sampler(var: &dyn Fn(&str) -> Option<String>) -> SamplerChoice {
    let ratio = || {
        var("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r))
            .unwrap_or(1.0)
    };
    match var("OTEL_TRACES_SAMPLER").as_deref().map(str::trim) {
        Some("always_on") => SamplerChoice::AlwaysOn,
        Some("always_off") => SamplerChoice::AlwaysOff,
        Some("traceidratio") => SamplerChoice::Ratio(ratio()),
        Some("parentbased_always_off") => SamplerChoice::ParentBased(ParentBasedRoot::AlwaysOff),
        Some("parentbased_traceidratio") => {
            SamplerChoice::ParentBased(ParentBasedRoot::Ratio(ratio()))
        }
        _ => SamplerChoice::ParentBased(ParentBasedRoot::AlwaysOn),
    }
}

/// The sampler of the file's `samplingRate`: rate 0 turns call tracing off
/// as Dapr's does (no span, a caller's sampled trace not continued either);
/// a reload's trace is still made.
fn rate_sampler(rate: f64) -> SamplerChoice {
    if rate <= 0.0 {
        SamplerChoice::AlwaysOff
    } else {
        SamplerChoice::ParentBased(ParentBasedRoot::Ratio(rate))
    }
}

/// `address` as a URL: Dapr writes `host:port`.
fn with_scheme(address: &str, secure: bool) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_string()
    } else if secure {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}

/// The traces URL under `OTEL_EXPORTER_OTLP_ENDPOINT`: for OTLP/HTTP the
/// specification always appends `v1/traces` to it, path or not
/// (`http://gw:4318/otlp` posts to `/otlp/v1/traces`); gRPC uses it as it
/// is, a scheme not added either: the gRPC channel dials one without over
/// TLS unless `OTEL_EXPORTER_OTLP_INSECURE=true` (the specification's
/// rule), as it does `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL).
fn under_base(base: &str, protocol: OtelProtocol) -> String {
    match protocol {
        OtelProtocol::Grpc => base.trim().to_string(),
        OtelProtocol::Http => format!(
            "{}/v1/traces",
            with_scheme(base, false).trim_end_matches('/')
        ),
    }
}

/// The traces URL of the config file's `otel` section (Dapr's
/// `endpointAddress`, `host:port`): OTLP/HTTP posts to `/v1/traces`
/// unless a path is given; gRPC uses the address as it is.
fn signal_url(base: &str, protocol: OtelProtocol) -> String {
    let base = with_scheme(base, false);
    match protocol {
        OtelProtocol::Grpc => base,
        OtelProtocol::Http => {
            let path_given = base
                .split_once("://")
                .and_then(|(_, rest)| rest.split_once('/'))
                .is_some_and(|(_, path)| !path.is_empty());
            if path_given {
                base
            } else {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::config::OtelExport;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_set_is_off() {
        let settings = TraceSettings::resolve(&env(&[]), None, "shop");
        assert!(!settings.enabled());
        assert_eq!(settings.service_name, "shop");
    }

    #[test]
    fn env_configures_http_with_the_signal_path_and_the_sampler() {
        let settings = TraceSettings::resolve(
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
                ("OTEL_SERVICE_NAME", "orders"),
            ]),
            None,
            "shop",
        );
        assert_eq!(
            settings.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            settings.sampler,
            SamplerChoice::ParentBased(ParentBasedRoot::Ratio(0.5))
        );
        assert_eq!(settings.service_name, "orders");
        let grpc = TraceSettings::resolve(
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
            None,
            "",
        );
        assert_eq!(grpc.endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!(grpc.protocol, OtelProtocol::Grpc);
        assert_eq!(grpc.service_name, "rewire");
    }

    /// The generic variable is a base: `v1/traces` goes under its path
    /// (the specification's rule); the traces variable is used as it is.
    #[test]
    fn the_generic_endpoint_s_path_is_a_base_for_the_signal() {
        let url = |pairs| TraceSettings::resolve(&env(pairs), None, "shop").endpoint;
        assert_eq!(
            url(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gw:4318/otlp")]),
            Some("http://gw:4318/otlp/v1/traces".to_string())
        );
        assert_eq!(
            url(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gw:4318/otlp/")]),
            Some("http://gw:4318/otlp/v1/traces".to_string())
        );
        assert_eq!(
            url(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://gw:4318/custom"
            )]),
            Some("http://gw:4318/custom".to_string())
        );
    }

    /// A gRPC collector given without a scheme in the generic variable is
    /// left to the gRPC channel, which dials it over TLS unless
    /// `…_INSECURE=true`, as it does the traces variable. Before, it
    /// became `http://collector:4317`: spans and auth headers in plaintext.
    #[test]
    fn a_grpc_base_without_a_scheme_is_left_to_the_channel_s_tls_rule() {
        let url = |pairs| TraceSettings::resolve(&env(pairs), None, "shop").endpoint;
        let cases: [&'static [(&str, &str)]; 3] = [
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", " collector:4317 "),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            &[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        ];
        for pairs in cases {
            let endpoint = url(pairs).unwrap_or_else(|| panic!("{pairs:?}: no endpoint"));
            assert_eq!(endpoint.trim(), "collector:4317", "{pairs:?}");
            assert_eq!(
                super::super::grpc_channel::with_scheme(endpoint.trim(), false),
                "https://collector:4317",
                "{pairs:?}"
            );
        }
        // A scheme given is kept; OTLP/HTTP without one stays `http`.
        assert_eq!(
            url(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
            Some("http://collector:4317".to_string())
        );
        assert_eq!(
            url(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
            Some("http://collector:4318/v1/traces".to_string())
        );
    }

    #[test]
    fn the_file_wins_over_the_environment() {
        let section = TracingSection {
            sampling_rate: Some(0.25),
            otel: Some(OtelExport {
                endpoint_address: "otel:4318".into(),
                protocol: OtelProtocol::Http,
                is_secure: true,
            }),
        };
        let settings = TraceSettings::resolve(
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://elsewhere:4318")]),
            Some(&section),
            "",
        );
        assert_eq!(
            settings.endpoint.as_deref(),
            Some("https://otel:4318/v1/traces")
        );
        assert_eq!(
            settings.sampler,
            SamplerChoice::ParentBased(ParentBasedRoot::Ratio(0.25))
        );
    }

    /// Dapr's `samplingRate: "0"` means no call tracing: not a parent-based
    /// ratio 0, under which every call still made a span and a caller's
    /// sampled trace was continued and exported.
    #[test]
    fn a_sampling_rate_of_zero_turns_call_tracing_off() {
        let section = TracingSection {
            sampling_rate: Some(0.0),
            otel: Some(OtelExport {
                endpoint_address: "otel:4318".into(),
                protocol: OtelProtocol::Http,
                is_secure: false,
            }),
        };
        let settings = TraceSettings::resolve(&env(&[]), Some(&section), "");
        assert_eq!(settings.sampler, SamplerChoice::AlwaysOff);
        assert!(!settings.traces_calls());
        // Reloads are still exported.
        assert!(settings.enabled());
        let section = TracingSection {
            sampling_rate: Some(0.25),
            ..section
        };
        let settings = TraceSettings::resolve(&env(&[]), Some(&section), "");
        assert!(settings.traces_calls());
    }

    #[test]
    fn always_off_samples_no_call_but_keeps_exporting_reloads() {
        let settings = TraceSettings::resolve(
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_TRACES_SAMPLER", "always_off"),
            ]),
            None,
            "",
        );
        assert_eq!(settings.sampler, SamplerChoice::AlwaysOff);
        assert!(settings.enabled());
    }

    #[test]
    fn the_sdk_switch_turns_it_off() {
        let settings = TraceSettings::resolve(
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_SDK_DISABLED", "true"),
            ]),
            None,
            "",
        );
        assert!(!settings.enabled());
    }
}
