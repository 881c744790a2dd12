//! `tracing`: where spans go and how many traces are sampled, in Dapr's
//! shape (`samplingRate` as a string, `otel.endpointAddress`,
//! `otel.protocol`, `otel.isSecure`). The sidecar reads it from each
//! published generation, so a change applies without a restart.

use serde::Deserialize;
use serde_json::Value;

use crate::metadata::{decode, MetadataError};
use crate::problem::Problem;

/// The `tracing` section, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TracingSection {
    /// Fraction of new traces sampled, `0..=1` (`samplingRate`); a trace
    /// continued from a caller follows the caller's decision.
    pub sampling_rate: Option<f64>,
    /// Where spans are exported (`otel`).
    pub otel: Option<OtelExport>,
}

/// `tracing.otel`: the OTLP collector spans are sent to. Its `Debug`
/// shows the address without URL credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct OtelExport {
    /// `endpointAddress`: `host:port` or a URL.
    pub endpoint_address: String,
    /// `protocol`.
    pub protocol: OtelProtocol,
    /// `isSecure`: TLS when the address has no scheme.
    pub is_secure: bool,
}

impl std::fmt::Debug for OtelExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtelExport")
            .field(
                "endpoint_address",
                &crate::redact::without_credentials(&self.endpoint_address),
            )
            .field("protocol", &self.protocol)
            .field("is_secure", &self.is_secure)
            .finish()
    }
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtelProtocol {
    /// OTLP over HTTP with protobuf bodies (`http`, `http/protobuf`).
    #[default]
    Http,
    /// OTLP over gRPC (`grpc`).
    Grpc,
}

impl OtelProtocol {
    /// The protocol named `name` as `OTEL_EXPORTER_OTLP_PROTOCOL` and Dapr
    /// spell it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "http" | "http/protobuf" => Some(Self::Http),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTracing {
    #[serde(rename = "samplingRate", default)]
    sampling_rate: Option<Value>,
    #[serde(default)]
    otel: Option<RawOtel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOtel {
    #[serde(rename = "endpointAddress")]
    endpoint_address: String,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(rename = "isSecure", default)]
    is_secure: bool,
}

/// Decodes the `tracing` section; every problem names the field.
pub(crate) fn decode_tracing(value: &Value) -> Result<TracingSection, Problem> {
    let problem = |message: String| Problem::file(format!("tracing: {message}"));
    let Value::Object(map) = value else {
        return Err(problem(
            "must be an object with `samplingRate` and `otel`".into(),
        ));
    };
    let raw: RawTracing = decode(map).map_err(|err| problem(field_message(&err)))?;
    let sampling_rate = raw
        .sampling_rate
        .map(|rate| sampling_rate(&rate).ok_or_else(|| problem(format!(
            "field `samplingRate`: expected a number from 0 to 1 (as a string, like \"0.5\"), got {rate}"
        ))))
        .transpose()?;
    let otel = match raw.otel {
        None => None,
        Some(otel) => {
            if otel.endpoint_address.trim().is_empty() {
                return Err(problem(
                    "field `otel.endpointAddress`: must not be empty".into(),
                ));
            }
            let protocol = match otel.protocol.as_deref() {
                None => OtelProtocol::default(),
                Some(name) => OtelProtocol::parse(name).ok_or_else(|| {
                    problem(format!(
                        "field `otel.protocol`: expected `http` or `grpc`, got `{name}`"
                    ))
                })?,
            };
            Some(OtelExport {
                endpoint_address: otel.endpoint_address,
                protocol,
                is_secure: otel.is_secure,
            })
        }
    };
    Ok(TracingSection {
        sampling_rate,
        otel,
    })
}

/// `samplingRate` as Dapr writes it (a string) or as a number, in `0..=1`.
fn sampling_rate(value: &Value) -> Option<f64> {
    let rate = match value {
        Value::String(text) => text.trim().parse::<f64>().ok()?,
        Value::Number(number) => number.as_f64()?,
        _ => return None,
    };
    (0.0..=1.0).contains(&rate).then_some(rate)
}

fn field_message(err: &MetadataError) -> String {
    err.to_string().replace("metadata field", "field")
}

/// Decodes `tracing` when the file has one.
pub(crate) fn decode_optional(value: Option<&Value>) -> Result<Option<TracingSection>, Problem> {
    value.map(decode_tracing).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn debug_shows_the_endpoint_without_its_credentials() {
        let section = decode_tracing(&json!({
            "otel": {"endpointAddress": "https://bot:hunter2@collector:4318"}
        }))
        .unwrap_or_else(|p| panic!("{p}"));
        let shown = format!("{section:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("collector:4318"), "{shown}");
    }

    #[test]
    fn dapr_shape_decodes() {
        let section = decode_tracing(&json!({
            "samplingRate": "0.25",
            "otel": {"endpointAddress": "localhost:4317", "protocol": "grpc", "isSecure": false}
        }))
        .unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(section.sampling_rate, Some(0.25));
        let otel = section.otel.unwrap_or_else(|| panic!("no otel"));
        assert_eq!(otel.protocol, OtelProtocol::Grpc);
        assert_eq!(otel.endpoint_address, "localhost:4317");
    }

    #[test]
    fn bad_fields_are_named() {
        let rate = decode_tracing(&json!({"samplingRate": "2"}))
            .err()
            .map(|p| p.to_string());
        assert!(rate.is_some_and(|m| m.contains("tracing: field `samplingRate`")));
        let protocol =
            decode_tracing(&json!({"otel": {"endpointAddress": "x:1", "protocol": "udp"}}))
                .err()
                .map(|p| p.to_string());
        assert!(protocol.is_some_and(|m| m.contains("`otel.protocol`")));
        let unknown = decode_tracing(&json!({"samplingrate": "1"}))
            .err()
            .map(|p| p.to_string());
        assert!(
            unknown.is_some_and(|m| m.contains("samplingRate")),
            "suggests the spelling"
        );
    }
}
