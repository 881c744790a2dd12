//! W3C trace context in and out: `traceparent` / `tracestate` of an
//! incoming HTTP or gRPC call continue the caller's trace; the context of
//! the current span goes out with published events.

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::MetadataMap;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::calls_traced;

const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        TRACE_HEADERS
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        TRACE_HEADERS
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

/// The caller's trace context in `headers`, when tracing is on and the
/// call carries a valid `traceparent`.
pub fn caller_of_http(headers: &HeaderMap) -> Option<Context> {
    calls_traced().then(|| remote(&Headers(headers))).flatten()
}

/// The caller's trace context in gRPC `metadata` (as [`caller_of_http`]).
pub fn caller_of_grpc(metadata: &MetadataMap) -> Option<Context> {
    calls_traced()
        .then(|| remote(&Metadata(metadata)))
        .flatten()
}

fn remote(extractor: &dyn Extractor) -> Option<Context> {
    let cx = TraceContextPropagator::new().extract(extractor);
    cx.span().span_context().is_valid().then_some(cx)
}

/// The span of one API call: `api` is `http` or `grpc`, `method` the
/// operation (Dapr's or Layotto's name); a child of `caller` when given.
/// The component it uses, and the generation that served it, are recorded
/// by [`record_component`].
pub fn api_span(api: &'static str, method: &'static str, caller: Option<Context>) -> Span {
    let span = tracing::info_span!(
        "rewire.api",
        otel.name = method,
        otel.kind = "server",
        rpc.system = api,
        rpc.method = method,
        rewire.component = Empty,
        rewire.component_type = Empty,
        rewire.generation = Empty,
    );
    if let Some(caller) = caller {
        // Only fails once the span has started, which it has not.
        let _ = span.set_parent(caller);
    }
    span
}

/// Records on the current span the component `key` (`kind/name`) of type
/// `type_name` that the call uses, and the number of the `generation` it
/// was found in (during a reload, which set served the call). Nothing is
/// recorded, or formatted, when the span is disabled.
pub fn record_component(key: &dyn std::fmt::Display, type_name: &str, generation: u64) {
    let span = Span::current();
    if !span.is_disabled() {
        span.record("rewire.component", tracing::field::display(key));
        span.record("rewire.component_type", type_name);
        span.record("rewire.generation", generation);
    }
}

/// The W3C `traceparent` of the current span, when calls are traced and the
/// span is part of a trace.
pub fn current_traceparent() -> Option<String> {
    if !calls_traced() {
        return None;
    }
    let cx = Span::current().context();
    let span = cx.span();
    let context = span.span_context();
    context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            context.trace_id(),
            context.span_id(),
            context.trace_flags().to_u8()
        )
    })
}
