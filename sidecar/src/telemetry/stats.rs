//! What became of the spans: exported or dropped, for `/metrics`
//! (`rewire_trace_spans_exported_total`,
//! `rewire_trace_spans_dropped_total{reason="queue_full"|"export_failed"}`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// Counters of the span pipeline, shared with the sidecar's registry.
#[derive(Debug)]
pub struct TraceStats {
    /// Spans the collector accepted.
    pub exported: Counter,
    /// Spans dropped because the export queue was full.
    pub dropped_queue_full: Counter,
    /// Spans dropped because their export failed or timed out.
    pub dropped_export_failed: Counter,
    dropped: Family<DropLabels, Counter>,
}

impl Default for TraceStats {
    fn default() -> Self {
        let dropped = Family::<DropLabels, Counter>::default();
        let reason = |reason| dropped.get_or_create(&DropLabels { reason }).clone();
        Self {
            exported: Counter::default(),
            dropped_queue_full: reason("queue_full"),
            dropped_export_failed: reason("export_failed"),
            dropped,
        }
    }
}

impl TraceStats {
    /// Registers the counters in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "trace_spans_exported",
            "Trace spans the OTLP collector accepted",
            self.exported.clone(),
        );
        registry.register(
            "trace_spans_dropped",
            "Trace spans dropped: export queue full, or export failed or timed out",
            self.dropped.clone(),
        );
    }
}
