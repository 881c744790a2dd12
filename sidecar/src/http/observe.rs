//! Counts every HTTP call by operation, store and status, and times it.
//!
//! The store label is set by the handler once it has found the store in
//! the generation serving ([`StoreLabel`]), so a caller naming random stores
//! cannot grow the metric without bound: an unknown store is counted with an
//! empty label.

use std::future::Future;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::{auth, deadline, routes};
use crate::dapr::StoreLabel;
use crate::metrics::ResultCode;
use crate::ApiState;

/// Middleware, the only one: runs every call in its trace span (continuing
/// the caller's `traceparent`), refuses it without the token its route
/// needs ([`auth`](super::auth)), bounds it by `request_timeout`
/// ([`deadline`](super::deadline); a file upload bounds itself by
/// inactivity instead), and records `observe_request("http",
/// operation, store, status, elapsed)`. One layer instead of three: each
/// `from_fn` layer costs a call a clone of the service below it, a boxed
/// future and a clone of the state.
pub async fn observe(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let operation = operation(request.method(), request.extensions().get::<MatchedPath>());
    let label = StoreLabel::default();
    request.extensions_mut().insert(label.clone());
    observed(&state, operation, &label, request, |request| {
        next.run(request)
    })
    .await
}

/// What [`observe`] does around a call, for a caller that has routed it
/// already (the [`hot_path`](super::hot_path)): `run` answers `request`
/// and records its store in `label`.
pub(super) async fn observed<F, Fut>(
    state: &ApiState,
    operation: &'static str,
    label: &StoreLabel,
    request: Request,
    run: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let started = Instant::now();
    let caller = crate::telemetry::propagation::caller_of_http(request.headers());
    let span = crate::telemetry::propagation::api_span("http", operation, caller);
    let options = &state.options;
    // The call's future is built where it is awaited, in no wrapper of
    // its own: a future is copied at each layer it is moved through.
    let response = match span.in_scope(|| auth::refusal(options, &request)) {
        Some(refusal) => refusal,
        // An upload bounds itself by inactivity (`file::put`).
        None if is_upload(&request) => run(request).instrument(span).await,
        None => {
            let limit = options.request_timeout;
            let timed = tokio::time::timeout(limit, run(request))
                .instrument(span)
                .await;
            deadline::answer(limit, timed)
        }
    };
    state.metrics.observe_request(
        "http",
        operation,
        label.name(),
        ResultCode::Http(response.status().as_u16()),
        started.elapsed(),
    );
    response
}

/// Whether `request` is a file upload (`PUT` on the file route), which is
/// not bounded as a whole.
fn is_upload(request: &Request) -> bool {
    request.method() == Method::PUT
        && request
            .extensions()
            .get::<MatchedPath>()
            .is_some_and(|path| path.as_str() == routes::FILE)
}

/// The operation name of a state GET.
pub(super) const GET_STATE: &str = "GetState";

/// The operation name of a call (Dapr's names where Dapr has the route), a
/// fixed set so the metric stays bounded.
fn operation(method: &Method, matched: Option<&MatchedPath>) -> &'static str {
    let Some(path) = matched.map(MatchedPath::as_str) else {
        return "NotFound";
    };
    match (method.as_str(), path) {
        ("GET", routes::HEALTHZ) => "Healthz",
        ("GET", routes::HEALTHZ_OUTBOUND) => "HealthzOutbound",
        ("POST" | "PUT", routes::STATE) => "SaveState",
        ("GET", routes::STATE_KEY) => GET_STATE,
        ("DELETE", routes::STATE_KEY) => "DeleteState",
        ("POST" | "PUT", routes::STATE_BULK) => "GetBulkState",
        ("POST" | "PUT", routes::STATE_TRANSACTION) => "ExecuteStateTransaction",
        ("POST", routes::LOCK) => "TryLockAlpha1",
        ("POST", routes::UNLOCK) => "UnlockAlpha1",
        ("GET", routes::SECRET) => "GetSecret",
        ("GET", routes::SECRETS_BULK) => "GetBulkSecret",
        ("GET", routes::CONFIGURATION | routes::CONFIGURATION_ALPHA1) => "GetConfiguration",
        ("GET", routes::METADATA) => "GetMetadata",
        ("GET", routes::METRICS) => "Metrics",
        ("GET", routes::STATUS) => "Status",
        _ => "NotFound",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_store_set_wins() {
        let label = StoreLabel::default();
        assert_eq!(label.get(), "");
        label.set("orders");
        label.set("other");
        assert_eq!(label.get(), "orders");
    }

    #[test]
    fn unmatched_paths_are_one_label() {
        assert_eq!(operation(&Method::GET, None), "NotFound");
    }
}
