//! The OTLP/gRPC exporter's channel, built here rather than by
//! `opentelemetry-otlp` (whose channel has no connect timeout and no
//! HTTP/2 keepalive): a collector whose address black-holes the SYN is
//! given up after the export timeout, and a connection that dies without
//! a FIN or RST (a NAT or load balancer dropping it, a collector host
//! gone) is found dead by unanswered pings and dialled again, instead of
//! every export waiting out its timeout on it for good.
//!
//! Pings are sent only while an export is in flight, never while the
//! connection is idle: gRPC servers built on grpc-go (the OpenTelemetry
//! Collector among them) by default count a ping while no stream is open,
//! or one sooner than 5 min after the last, as a strike unless they wrote
//! an answer since the last ping, and past two strikes answer GOAWAY
//! `too_many_pings` and close the connection. Every export a collector
//! answers wipes its strikes, so a default collector never sees too many.
//! A connection that died while idle is therefore found by the next
//! export: its first ping goes out at once (nothing was read for longer
//! than the interval), the connection is closed when it goes unanswered,
//! and the exporter retries that export on a new connection within its
//! timeout, instead of every export waiting out its timeout until the
//! kernel gives up retransmitting (many minutes).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::tls::ExportTls;

/// How the channel watches its connection to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Keepalive {
    /// An HTTP/2 ping is sent after this long without a frame received.
    pub(super) every: Duration,
    /// A ping unanswered within this ends the connection (the export in
    /// flight fails; the next one dials again).
    pub(super) timeout: Duration,
    /// Whether pings are sent while no export is in flight too (`false`
    /// for a collector: grpc-go servers answer idle pings with GOAWAY).
    pub(super) while_idle: bool,
}

/// The longest interval between pings (for long export timeouts).
const LONGEST_PING_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest interval between pings (for very short export timeouts).
const SHORTEST_PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered at most.
const LONGEST_PING_TIMEOUT: Duration = Duration::from_secs(10);

impl Keepalive {
    /// The keepalive of a channel whose exports are cut after
    /// `export_timeout`: a ping after half of it without a frame received
    /// (at most 30 s, at least 1 s), unanswered for at most that interval
    /// (and 10 s), and only while an export is in flight: a dead
    /// connection under an export is closed by the time that export is
    /// cut (within one interval of its start after an idle spell), and a
    /// default grpc-go server never counts too many pings.
    pub(super) fn for_exports_cut_after(export_timeout: Duration) -> Self {
        let every = (export_timeout / 2).clamp(SHORTEST_PING_INTERVAL, LONGEST_PING_INTERVAL);
        Self {
            every,
            timeout: every.min(LONGEST_PING_TIMEOUT),
            while_idle: false,
        }
    }
}

/// The endpoint of the channel to `endpoint` (the collector's URL): each
/// request and each connection attempt cut after `timeout`, HTTP/2 pings
/// per `keepalive` (none at all for `None`, which only tests use: it
/// shows what the pings are for), and for an `https` URL the TLS of
/// `tls` with its handshake cut after `timeout` too. The error names the endpoint
/// without its credentials.
pub(super) fn endpoint(
    endpoint: &str,
    timeout: Duration,
    tls: &ExportTls,
    keepalive: Option<Keepalive>,
) -> Result<Endpoint, String> {
    let endpoint = &with_scheme(endpoint, insecure(&|name| std::env::var(name).ok()));
    let shown = || rewire_runtime::without_credentials(endpoint);
    let mut built = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| format!("the OTLP endpoint {} is not a valid URL: {e}", shown()))?
        .timeout(timeout)
        .connect_timeout(timeout);
    if let Some(keepalive) = keepalive {
        built = built
            .http2_keep_alive_interval(keepalive.every)
            .keep_alive_timeout(keepalive.timeout)
            .keep_alive_while_idle(keepalive.while_idle);
    }
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
    keepalive: Option<Keepalive>,
) -> Result<Channel, String> {
    Ok(endpoint(endpoint_url, timeout, tls, keepalive)?.connect_lazy())
}
