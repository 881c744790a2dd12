//! The OTLP/gRPC exporter's channel, built here rather than by
//! `opentelemetry-otlp` (whose channel has no connect timeout and no
//! HTTP/2 keepalive): a collector whose address black-holes the SYN is
//! given up after the export timeout, and a connection that dies without
//! a FIN or RST (a NAT or load balancer dropping it, a collector host
//! gone) is found dead by unanswered pings and dialled again, instead of
//! every export waiting out its timeout on it for good.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::tls::ExportTls;

/// How the channel watches its connection to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Keepalive {
    /// An HTTP/2 ping is sent after this long without a frame received.
    pub(super) every: Duration,
    /// A ping unanswered within this ends the connection (the next
    /// export dials again).
    pub(super) timeout: Duration,
    /// Whether pings are sent while no export is in flight too (the
    /// connection is found dead before the next export needs it).
    pub(super) while_idle: bool,
}

/// The keepalive of the exporter's channel: a ping every 30 s, answered
/// within 10 s, idle or not.
pub(super) const KEEPALIVE: Keepalive = Keepalive {
    every: Duration::from_secs(30),
    timeout: Duration::from_secs(10),
    while_idle: true,
};

/// The endpoint of the channel to `endpoint` (the collector's URL): each
/// request and each connection attempt cut after `timeout`, HTTP/2 pings
/// per `keepalive`, and for an `https` URL the TLS of `tls` with its
/// handshake cut after `timeout` too. The error names the endpoint
/// without its credentials.
pub(super) fn endpoint(
    endpoint: &str,
    timeout: Duration,
    tls: &ExportTls,
    keepalive: Keepalive,
) -> Result<Endpoint, String> {
    let endpoint = &with_scheme(endpoint, insecure(&|name| std::env::var(name).ok()));
    let shown = || rewire_runtime::without_credentials(endpoint);
    let built = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| format!("the OTLP endpoint {} is not a valid URL: {e}", shown()))?
        .timeout(timeout)
        .connect_timeout(timeout)
        .http2_keep_alive_interval(keepalive.every)
        .keep_alive_timeout(keepalive.timeout)
        .keep_alive_while_idle(keepalive.while_idle);
    let secure = endpoint
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("https://");
    if !secure {
        return Ok(built);
    }
    built.tls_config(tls.tonic(timeout)).map_err(|e| {
        format!(
            "cannot configure TLS for the OTLP endpoint {}: {e}",
            shown()
        )
    })
}

/// `endpoint` with a scheme: one without is `https`, or `http` when
/// `insecure` (as `opentelemetry-otlp`'s own channel did).
pub(super) fn with_scheme(endpoint: &str, insecure: bool) -> String {
    let has_scheme = endpoint
        .split_once("://")
        .is_some_and(|(scheme, _)| !scheme.contains(['/', '?', '#']));
    match (has_scheme, insecure) {
        (true, _) => endpoint.to_string(),
        (false, true) => format!("http://{endpoint}"),
        (false, false) => format!("https://{endpoint}"),
    }
}

/// Whether `OTEL_EXPORTER_OTLP_TRACES_INSECURE` (else
/// `OTEL_EXPORTER_OTLP_INSECURE`) in `var` says `true`: an endpoint
/// without a scheme is then dialled without TLS.
fn insecure(var: &dyn Fn(&str) -> Option<String>) -> bool {
    var("OTEL_EXPORTER_OTLP_TRACES_INSECURE")
        .or_else(|| var("OTEL_EXPORTER_OTLP_INSECURE"))
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
}

/// The channel of [`endpoint`], dialled at its first export (must be
/// called inside a Tokio runtime: the channel's task runs on it).
pub(super) fn channel(
    endpoint_url: &str,
    timeout: Duration,
    tls: &ExportTls,
    keepalive: Keepalive,
) -> Result<Channel, String> {
    Ok(endpoint(endpoint_url, timeout, tls, keepalive)?.connect_lazy())
}
