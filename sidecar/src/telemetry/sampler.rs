//! The sampler in force, swapped when the settings change (the tracer
//! provider, built once, keeps this one sampler).

use std::sync::Arc;

use arc_swap::ArcSwap;
use opentelemetry::trace::{Link, SpanKind, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingResult, ShouldSample};

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
        self.0
            .load()
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}
