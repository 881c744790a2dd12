//! What became of the spans: exported or dropped, for `/metrics`
//! (`rewire_trace_spans_exported_total`,
//! `rewire_trace_spans_dropped_total{reason="queue_full"|"queue_closed"|"export_failed"}`).

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
    /// Spans dropped because the export queue was closed (its receiving
    /// end gone: no export task will ever take them).
    pub dropped_queue_closed: Counter,
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
            dropped_queue_closed: reason("queue_closed"),
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
            "Trace spans dropped: export queue full or closed, or export failed or timed out",
            self.dropped.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    use super::TraceStats;

    /// Each drop reason is exported under its own label, a closed queue
    /// apart from a full one.
    #[test]
    fn each_drop_reason_is_exported_under_its_own_label() {
        let stats = TraceStats::default();
        stats.dropped_queue_full.inc();
        stats.dropped_queue_closed.inc_by(2);
        stats.dropped_export_failed.inc_by(3);
        let mut registry = Registry::default();
        stats.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            r#"trace_spans_dropped_total{reason="queue_full"} 1"#,
            r#"trace_spans_dropped_total{reason="queue_closed"} 2"#,
            r#"trace_spans_dropped_total{reason="export_failed"} 3"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
    }
}
