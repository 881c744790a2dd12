//! Spans leave the process through a bounded queue: a finished span is
//! handed over with `try_send` (never a wait) and counted as dropped when
//! the queue is full (or closed, counted apart), so a slow or dead
//! collector costs a request nothing.
//! One task batches the queue and exports with the exporter in force,
//! each export cut after its timeout; asked to flush (at shutdown), it
//! exports everything queued so far and answers. The task holds the
//! queue's receiving ends only while it runs ([`TakenReceivers`]): ended
//! with its runtime (a library user dropping one runtime and starting a
//! host on another), it puts them back for a task on the next.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};
use opentelemetry_sdk::Resource;
use rewire_runtime::config::OtelProtocol;
use tokio::sync::{mpsc, oneshot, watch};

use super::grpc_channel;
use super::settings::TraceSettings;
use super::stats::TraceStats;
use super::tls::ExportTls;

/// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`, default).
pub(super) const DEFAULT_QUEUE: usize = 2048;
/// Spans sent in one export at most.
const BATCH: usize = 512;
/// How long a span waits for a fuller batch (`OTEL_BSP_SCHEDULE_DELAY`,
/// default).
pub(super) const DEFAULT_DELAY: Duration = Duration::from_secs(5);

/// The collector client in force and how long one export may take.
pub(super) struct Exporter {
    pub(super) inner: opentelemetry_otlp::SpanExporter,
    timeout: Duration,
}

/// Builds the exporter `settings` describe (its endpoint must be set),
/// with `tls` (their files as read and checked).
pub(super) fn build_exporter(
    settings: &TraceSettings,
    endpoint: &str,
    tls: &ExportTls,
) -> Result<Exporter, String> {
    let keepalive = grpc_channel::Keepalive::for_exports_cut_after(settings.export_timeout);
    build_exporter_keeping(settings, endpoint, tls, Some(keepalive))
}

/// [`build_exporter`] with the gRPC channel's `keepalive` (`None`: no
/// HTTP/2 pings, for tests only).
pub(super) fn build_exporter_keeping(
    settings: &TraceSettings,
    endpoint: &str,
    tls: &ExportTls,
    keepalive: Option<grpc_channel::Keepalive>,
) -> Result<Exporter, String> {
    use opentelemetry_otlp::WithTonicConfig;
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let timeout = settings.export_timeout;
    let mut inner = match settings.protocol {
        OtelProtocol::Http => {
            crate::crypto::install_ring_provider();
            let client = tls.http_client(endpoint, timeout)?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .build()
        }
        OtelProtocol::Grpc => {
            // An `https` collector (a URL without a scheme may be one)
            // and nothing to trust it by: refused here, rather than every
            // export failing its handshake.
            if let Some(missing) = tls.missing_roots() {
                let dialled = grpc_channel::endpoint(endpoint, timeout, tls, None)?;
                if dialled.uri().scheme_str() == Some("https") {
                    return Err(missing);
                }
            }
            // Our channel: connect timeout and HTTP/2 keepalive, which
            // the library's own has not (its timeout must match).
            let channel = grpc_channel::channel(endpoint, timeout, tls, keepalive)?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_channel(channel)
                .with_timeout(timeout)
                .build()
        }
    }
    .map_err(|e| without_endpoint_credentials(&e.to_string(), endpoint))?;
    inner.set_resource(
        &Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .build(),
    );
    Ok(Exporter { inner, timeout })
}

/// The library's `error` about `endpoint` as logged: the endpoint shown
/// without its credentials (it quotes `user:pw@collector:4318/…` as given);
/// its own words dropped if they still hold them in another form.
fn without_endpoint_credentials(error: &str, endpoint: &str) -> String {
    let shown = super::shown_endpoint(endpoint);
    let error = error.replace(endpoint, &shown);
    let after_scheme = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((credentials, _)) if !credentials.is_empty() && error.contains(credentials) => {
            format!("the OTLP exporter for {shown} cannot be built")
        }
        _ => error,
    }
}

/// The provider's span processor: hands finished spans to the queue.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    stats: Arc<TraceStats>,
}

impl QueueProcessor {
    /// A processor feeding a queue of `capacity` spans, and that queue's
    /// receiving end (for [`export_loop`]).
    pub(super) fn new(capacity: usize, stats: Arc<TraceStats>) -> (Self, mpsc::Receiver<SpanData>) {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        (Self { queue, stats }, receiver)
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let dropped = match self.queue.try_send(span) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => &self.stats.dropped_queue_full,
            Err(mpsc::error::TrySendError::Closed(_)) => &self.stats.dropped_queue_closed,
        };
        dropped.inc();
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The receiving ends of the export task: the spans' queue and the flush
/// requests.
pub(super) struct Receivers {
    pub(super) spans: mpsc::Receiver<SpanData>,
    pub(super) flushes: mpsc::Receiver<oneshot::Sender<()>>,
}

/// Where the receivers wait while no export task holds them.
pub(super) type ReceiversHome = Arc<Mutex<Option<Receivers>>>;

/// The receivers as an export task holds them: put back in their home
/// when dropped (the task ended, or was dropped with its runtime), so
/// that a task spawned later takes them again.
pub(super) struct TakenReceivers {
    receivers: Option<Receivers>,
    home: ReceiversHome,
}

impl TakenReceivers {
    /// Takes the receivers from `home`; `None` while a task holds them.
    pub(super) fn take(home: &ReceiversHome) -> Option<Self> {
        let receivers = home.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        Some(Self {
            receivers: Some(receivers),
            home: Arc::clone(home),
        })
    }
}

impl Drop for TakenReceivers {
    fn drop(&mut self) {
        if let Some(receivers) = self.receivers.take() {
            *self.home.lock().unwrap_or_else(|p| p.into_inner()) = Some(receivers);
        }
    }
}

/// Exports what the queue receives, in batches of at most [`BATCH`] or
/// every `delay`, with the exporter `exporter` holds at that moment; on a
/// request from the flush receiver, exports every span queued and then
/// answers it.
pub(super) async fn export_loop(
    mut taken: TakenReceivers,
    exporter: watch::Receiver<Option<Arc<Exporter>>>,
    delay: Duration,
    stats: Arc<TraceStats>,
) {
    let Some(Receivers {
        spans: queue,
        flushes,
    }) = taken.receivers.as_mut()
    else {
        return;
    };
    let mut batch = Vec::with_capacity(BATCH);
    let mut tick = tokio::time::interval(delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            received = queue.recv() => match received {
                Some(span) => {
                    batch.push(span);
                    if batch.len() >= BATCH {
                        export(&mut batch, &exporter, &stats, &mut failing).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if !batch.is_empty() {
                    export(&mut batch, &exporter, &stats, &mut failing).await;
                }
            }
            Some(done) = flushes.recv() => {
                while let Ok(span) = queue.try_recv() {
                    batch.push(span);
                    if batch.len() >= BATCH {
                        export(&mut batch, &exporter, &stats, &mut failing).await;
                    }
                }
                if !batch.is_empty() {
                    export(&mut batch, &exporter, &stats, &mut failing).await;
                }
                let _ = done.send(());
            }
        }
    }
}

async fn export(
    batch: &mut Vec<SpanData>,
    exporter: &watch::Receiver<Option<Arc<Exporter>>>,
    stats: &TraceStats,
    failing: &mut bool,
) {
    let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
    let count = spans.len() as u64;
    let current = exporter.borrow().clone();
    let Some(exporter) = current else {
        stats.dropped_export_failed.inc_by(count);
        return;
    };
    let outcome = match tokio::time::timeout(exporter.timeout, exporter.inner.export(spans)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {:?}", exporter.timeout)),
    };
    match outcome {
        Ok(()) => {
            stats.exported.inc_by(count);
            if std::mem::take(failing) {
                tracing::info!("Span export works again.");
            }
        }
        Err(error) => {
            stats.dropped_export_failed.inc_by(count);
            if !std::mem::replace(failing, true) {
                tracing::warn!(%error, spans = count, "Span export failed; spans are dropped (counted in rewire_trace_spans_dropped_total) until it works again.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks, SpanProcessor};

    use super::QueueProcessor;
    use crate::telemetry::stats::TraceStats;

    /// A finished, sampled span.
    fn sampled_span() -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1),
                SpanId::from(1),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "span".into(),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::default(),
        }
    }

    /// An endpoint the library refuses (no scheme, for OTLP/HTTP) with
    /// credentials in it: the build error names it without them. Before:
    /// "invalid endpoint 'user:pw-9x@collector:4318/v1/traces'" was logged.
    #[test]
    fn a_refused_endpoint_is_named_without_its_credentials() {
        let settings = crate::telemetry::TraceSettings {
            endpoint: None,
            protocol: rewire_runtime::config::OtelProtocol::Http,
            sampler: crate::telemetry::SamplerChoice::AlwaysOn,
            service_name: "build-error-test".into(),
            export_timeout: std::time::Duration::from_secs(1),
            tls: crate::telemetry::tls::ExportTlsFiles::default(),
        };
        let tls = settings.tls.load().expect("no files");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = runtime.enter();
        let endpoint = "user:pw-9x@collector:4318/v1/traces";
        let error = super::build_exporter(&settings, endpoint, &tls)
            .err()
            .expect("refused");
        assert!(!error.contains("pw-9x"), "{error}");
        assert!(error.contains("collector:4318"), "{error}");
        // Also with the credentials in another form than given.
        let other = super::without_endpoint_credentials("bad 'USER:PW-9X@x' user:pw-9x", endpoint);
        assert!(!other.contains("pw-9x"), "{other}");
    }

    /// A span ended after the queue's receiving end is gone is counted as
    /// dropped for a closed queue, not a full one; one ended while the
    /// queue is full still counts as full. Before: both were `queue_full`.
    #[test]
    fn a_closed_queue_is_counted_apart_from_a_full_one() {
        let stats = Arc::new(TraceStats::default());
        let (processor, receiver) = QueueProcessor::new(1, Arc::clone(&stats));
        processor.on_end(sampled_span());
        processor.on_end(sampled_span());
        assert_eq!(stats.dropped_queue_full.get(), 1);
        assert_eq!(stats.dropped_queue_closed.get(), 0);
        drop(receiver);
        processor.on_end(sampled_span());
        assert_eq!(stats.dropped_queue_closed.get(), 1);
        assert_eq!(stats.dropped_queue_full.get(), 1);
    }
}
