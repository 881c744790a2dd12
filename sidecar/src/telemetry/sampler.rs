//! The sampler in force, swapped when the settings change (the tracer
//! provider, built once, keeps this one sampler).
//!
//! The choice samples requests. A reload is no request: its root span
//! (`rewire.reload`) is always sampled, and so are its component spans
//! (`rewire.component`, children of a sampled span), whatever the choice:
//! every reload is a trace of its own.

use std::sync::Arc;

use arc_swap::ArcSwap;
use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, SamplingResult, ShouldSample};

use super::settings::{ParentBasedRoot, SamplerChoice};

/// A sampler whose choice can change while spans are being sampled.
#[derive(Debug, Clone)]
pub(super) struct LiveSampler(Arc<ArcSwap<Sampler>>);

impl LiveSampler {
    /// Samples nothing until [`set`](Self::set).
    pub(super) fn new() -> Self {
        Self(Arc::new(ArcSwap::from_pointee(Sampler::AlwaysOff)))
    }

    /// Samples by `choice` from now on.
    pub(super) fn set(&self, choice: SamplerChoice) {
        self.0.store(Arc::new(sampler_of(choice)));
    }
}

fn sampler_of(choice: SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::Ratio(ratio) => Sampler::TraceIdRatioBased(ratio),
        SamplerChoice::ParentBased(root) => Sampler::ParentBased(Box::new(match root {
            ParentBasedRoot::AlwaysOn => Sampler::AlwaysOn,
            ParentBasedRoot::AlwaysOff => Sampler::AlwaysOff,
            ParentBasedRoot::Ratio(ratio) => Sampler::TraceIdRatioBased(ratio),
        })),
    }
}

impl ShouldSample for LiveSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        if let Some(sampled) = reload_decision(parent_context, name) {
            return sampled;
        }
        self.0
            .load()
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

/// The root span of a reload (a new trace of its own).
const RELOAD_SPAN: &str = "rewire.reload";
/// A component action of a reload (a child of its root span).
const COMPONENT_SPAN: &str = "rewire.component";

/// Record-and-sample for a reload's root span and for a component span
/// whose parent (the reload's span) is sampled; `None` for any other span,
/// which the choice in force decides.
fn reload_decision(parent_context: Option<&Context>, name: &str) -> Option<SamplingResult> {
    let parent = parent_context
        .filter(|cx| cx.has_active_span())
        .map(|cx| cx.span().span_context().clone());
    let trace_state = match (name, parent) {
        (RELOAD_SPAN, None) => TraceState::default(),
        (COMPONENT_SPAN, Some(parent)) if parent.is_sampled() => parent.trace_state().clone(),
        _ => return None,
    };
    Some(SamplingResult {
        decision: SamplingDecision::RecordAndSample,
        attributes: Vec::new(),
        trace_state,
    })
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags};

    use super::*;

    /// Every choice that keeps no new request trace.
    const UNSAMPLED: [SamplerChoice; 4] = [
        SamplerChoice::AlwaysOff,
        SamplerChoice::Ratio(0.0),
        SamplerChoice::ParentBased(ParentBasedRoot::AlwaysOff),
        SamplerChoice::ParentBased(ParentBasedRoot::Ratio(0.0)),
    ];

    fn decision(choice: SamplerChoice, parent: Option<&Context>, name: &str) -> SamplingDecision {
        let sampler = LiveSampler::new();
        sampler.set(choice);
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        sampler
            .should_sample(parent, trace_id, name, &SpanKind::Internal, &[], &[])
            .decision
    }

    fn parent(sampled: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            flags,
            false,
            TraceState::default(),
        ))
    }

    #[test]
    fn a_reload_is_sampled_whatever_the_request_sampling() {
        let root = Context::new();
        for choice in UNSAMPLED {
            // A request's new trace is dropped, as chosen…
            assert_eq!(
                decision(choice, Some(&root), "GetState"),
                SamplingDecision::Drop,
                "{choice:?}"
            );
            // …a reload's is not, nor its component spans.
            for reload in [None, Some(&root)] {
                assert_eq!(
                    decision(choice, reload, RELOAD_SPAN),
                    SamplingDecision::RecordAndSample,
                    "{choice:?}"
                );
            }
            assert_eq!(
                decision(choice, Some(&parent(true)), COMPONENT_SPAN),
                SamplingDecision::RecordAndSample,
                "{choice:?}"
            );
        }
    }

    #[test]
    fn only_a_reload_root_and_its_sampled_children_are_forced() {
        let off = SamplerChoice::AlwaysOff;
        // A component span under an unsampled parent, or a span named
        // like a reload's under a caller's trace, follows the choice.
        assert_eq!(
            decision(off, Some(&parent(false)), COMPONENT_SPAN),
            SamplingDecision::Drop
        );
        assert_eq!(
            decision(off, Some(&parent(true)), RELOAD_SPAN),
            SamplingDecision::Drop
        );
        assert_eq!(decision(off, None, COMPONENT_SPAN), SamplingDecision::Drop);
    }
}
