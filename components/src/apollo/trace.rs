//! The trace span of one request to Apollo: method and path (app id,
//! cluster, namespace), never headers, query or body.

/// A client span for `method` of `path`.
pub(super) fn request_span(method: &'static str, path: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "rewire.apollo",
        otel.name = tracing::field::Empty,
        otel.kind = "client",
        http.request.method = method,
        url.path = path,
    );
    if !span.is_disabled() {
        span.record("otel.name", format!("apollo {method}"));
    }
    span
}
