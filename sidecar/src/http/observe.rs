//! Counts every HTTP call by operation, store and status, and times it.
//!
//! The store label is set by the handler once it has found the store in
//! the generation serving ([`StoreLabel`]), so a caller naming random stores
//! cannot grow the metric without bound: an unknown store is counted with an
//! empty label.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::Instrument;

use super::error::HttpError;
use super::{auth, deadline, routes};
use crate::dapr::StoreLabel;
use crate::result_code::ResultCode;
use crate::{ApiOptions, ApiState};

/// Middleware, the only one: refuses a call without the token its route
/// needs ([`auth`](super::auth); no span is made for it, nor for a health
/// probe without the app token while one is set), runs every other
/// in its trace span (continuing the caller's `traceparent`; the status
/// answered recorded on it, `ERROR` for a 5xx), bounds it by `request_timeout`
/// ([`deadline`](super::deadline); a file upload bounds itself by
/// inactivity instead), answers 500 `ERR_INTERNAL` when the handler
/// panics (the connection is not dropped), and records
/// `observe_request("http", operation, store, status, elapsed)`. One layer instead of three: each
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
    let options = &state.options;
    // A call refused for its token makes no span: its caller would
    // otherwise continue traces of its choosing, sampled, in the export
    // queue. (gRPC refuses in its interceptor, before any span too.) Nor
    // does a health probe without the token while one is set: it is
    // answered, but a token-less flood of probes must not fill the queue.
    let refusal = auth::refusal(options, &request);
    let span = match refusal {
        Some(_) => tracing::Span::none(),
        None if !traced_for_its_token(options, &request) => tracing::Span::none(),
        None => {
            let caller = crate::telemetry::propagation::caller_of_http(request.headers());
            crate::telemetry::propagation::api_span("http", operation, caller)
        }
    };
    // The call's future is built where it is awaited, in no wrapper of
    // its own: a future is copied at each layer it is moved through.
    let response = match refusal {
        Some(refusal) => refusal,
        // An upload bounds itself by inactivity (`file::put`).
        None if is_upload(&request) => {
            let answered = AssertUnwindSafe(run(request))
                .catch_unwind()
                .instrument(span.clone())
                .await;
            unless_panicked(operation, answered)
        }
        None => {
            let limit = options.request_timeout;
            let timed = tokio::time::timeout(limit, AssertUnwindSafe(run(request)).catch_unwind())
                .instrument(span.clone())
                .await;
            deadline::answer(
                limit,
                timed.map(|answered| unless_panicked(operation, answered)),
            )
        }
    };
    crate::telemetry::propagation::record_http_status(&span, response.status().as_u16());
    state.metrics.observe_request(
        "http",
        operation,
        label.name(),
        ResultCode::Http(response.status().as_u16()),
        started.elapsed(),
    );
    response
}

/// Whether a call admitted by [`auth::refusal`] may make a span (and so
/// continue its caller's trace): any call while no app token is set, a
/// health probe (open to all) only when it carries the app or admin token,
/// every other admitted call (it carried the token its route needs).
fn traced_for_its_token(options: &ApiOptions, request: &Request) -> bool {
    let open = routes::UNAUTHENTICATED.contains(&request.uri().path());
    !open || options.app_token.is_none() || auth::authenticated(options, request.headers())
}

/// A call's answer, or, when its handler (or a component under it)
/// panicked, Dapr's JSON error with 500 `ERR_INTERNAL`: the caller gets an
/// answer instead of a reset connection, and the call is counted. The
/// panic's message went to the log through the panic hook; it is not
/// echoed to the caller.
fn unless_panicked(
    operation: &'static str,
    answered: Result<Response, Box<dyn Any + Send>>,
) -> Response {
    answered.unwrap_or_else(|_| {
        tracing::error!(operation, "An HTTP call's handler panicked; answered 500.");
        HttpError::Api {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: PANICKED_CODE,
            message: format!("{operation} failed: the sidecar's handler panicked"),
        }
        .into_response()
    })
}

/// Dapr's error code of a call whose handler panicked.
const PANICKED_CODE: &str = "ERR_INTERNAL";

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

/// The operation name of a call (Dapr's names where Dapr has the route,
/// Layotto's gRPC names for the sequencer and files), a fixed set so the
/// metric stays bounded. `NotFound`: no route, or not with this method.
fn operation(method: &Method, matched: Option<&MatchedPath>) -> &'static str {
    let Some(path) = matched.map(MatchedPath::as_str) else {
        return "NotFound";
    };
    // A `HEAD` is answered by the route's `GET` (axum's rule), except on
    // a file, where it is a stat of its own, and on a `GET` that changes
    // state, which refuses it as an unknown call.
    let method = match (method.as_str(), path) {
        ("HEAD", routes::FILE) => "HEAD",
        (
            "HEAD",
            routes::SEQUENCER
            | routes::CONFIGURATION_SUBSCRIBE
            | routes::CONFIGURATION_SUBSCRIBE_ALPHA1
            | routes::CONFIGURATION_UNSUBSCRIBE
            | routes::CONFIGURATION_UNSUBSCRIBE_ALPHA1,
        ) => return "NotFound",
        ("HEAD", _) => "GET",
        (method, _) => method,
    };
    match (method, path) {
        ("GET", routes::HEALTHZ) => "Healthz",
        ("GET", routes::HEALTHZ_OUTBOUND) => "HealthzOutbound",
        ("POST" | "PUT", routes::STATE) => "SaveState",
        ("GET", routes::STATE_KEY) => GET_STATE,
        ("DELETE", routes::STATE_KEY) => "DeleteState",
        ("POST" | "PUT", routes::STATE_BULK) => "GetBulkState",
        ("POST" | "PUT", routes::STATE_TRANSACTION) => "ExecuteStateTransaction",
        ("POST" | "PUT", routes::STATE_QUERY_ALPHA1) => "QueryStateAlpha1",
        ("POST", routes::LOCK) => "TryLockAlpha1",
        ("POST", routes::UNLOCK) => "UnlockAlpha1",
        ("GET", routes::SECRET) => "GetSecret",
        ("GET", routes::SECRETS_BULK) => "GetBulkSecret",
        ("GET", routes::CONFIGURATION | routes::CONFIGURATION_ALPHA1) => "GetConfiguration",
        ("GET", routes::CONFIGURATION_SUBSCRIBE) => "SubscribeConfiguration",
        ("GET", routes::CONFIGURATION_SUBSCRIBE_ALPHA1) => "SubscribeConfigurationAlpha1",
        ("GET", routes::CONFIGURATION_UNSUBSCRIBE) => "UnsubscribeConfiguration",
        ("GET", routes::CONFIGURATION_UNSUBSCRIBE_ALPHA1) => "UnsubscribeConfigurationAlpha1",
        ("GET", routes::METADATA) => "GetMetadata",
        ("PUT", routes::METADATA_KEY) => "SetMetadata",
        ("GET", routes::METRICS) => "Metrics",
        ("GET", routes::STATUS) => "Status",
        ("POST" | "PUT", routes::PUBLISH) => "PublishEvent",
        ("POST" | "PUT", routes::PUBLISH_BULK) => "BulkPublishEventAlpha1",
        ("POST" | "PUT", routes::PUBLISH_BULK_V1) => "BulkPublishEvent",
        ("GET" | "POST", routes::SEQUENCER) => "GetNextId",
        ("GET", routes::FILES) => "ListFile",
        ("GET", routes::FILE) => "GetFile",
        ("PUT", routes::FILE) => "PutFile",
        ("HEAD", routes::FILE) => "GetFileMeta",
        ("DELETE", routes::FILE) => "DelFile",
        _ => "NotFound",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::StatusCode;
    use tower_service::Service;

    use super::*;

    /// Every path the HTTP API declares (the string constants of
    /// `routes.rs`), as written there: a route added later is probed too.
    fn declared_paths() -> Vec<&'static str> {
        include_str!("routes.rs")
            .lines()
            .filter_map(|line| line.trim().strip_prefix("pub const "))
            .filter_map(|line| line.split_once(": &str = \""))
            .filter_map(|(_, rest)| rest.strip_suffix("\";"))
            .collect()
    }

    /// `path` with each `{name}` and `{*name}` given a value.
    fn concrete(path: &str) -> String {
        path.split('/')
            .map(|part| match part.strip_prefix('{') {
                Some(wildcard) if wildcard.starts_with('*') => "some/file".to_string(),
                Some(name) => name.trim_end_matches('}').to_string(),
                None => part.to_string(),
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    #[tokio::test]
    async fn every_routed_call_has_an_operation_name() {
        let state = ApiState::empty().await;
        let runtime = state.runtime.clone();
        // The name the observing middleware gives each call.
        let named: Arc<Mutex<Option<&'static str>>> = Arc::default();
        let seen = named.clone();
        let mut router = super::super::router(state).layer(axum::middleware::from_fn(
            move |request: Request, next: Next| {
                let name = operation(request.method(), request.extensions().get::<MatchedPath>());
                *seen.lock().unwrap() = Some(name);
                next.run(request)
            },
        ));
        let paths = declared_paths();
        assert!(paths.len() >= 20, "routes.rs not parsed: {paths:?}");
        let methods = [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
        ];
        let mut routed = 0;
        for path in paths {
            for method in &methods {
                let uri = concrete(path);
                let request = Request::builder()
                    .method(method.clone())
                    .uri(&uri)
                    .body(Body::empty())
                    .unwrap();
                let response = router.call(request).await.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                // No store is configured, so no handler answers 404 (they
                // answer 400, store not found): a 404 is the router's, whose
                // body says so except on a `HEAD`, answered without one.
                let unrouted = status == StatusCode::NOT_FOUND
                    && (method == Method::HEAD
                        || String::from_utf8_lossy(&body).contains("ERR_NOT_FOUND"));
                let name = named.lock().unwrap().take();
                let name = name.unwrap_or_else(|| panic!("{method} {uri} not observed"));
                assert_eq!(
                    name == "NotFound",
                    unrouted,
                    "{method} {uri} ({path}) is named {name} and answered {status}"
                );
                routed += usize::from(!unrouted);
            }
        }
        assert!(routed >= 25, "only {routed} calls were routed");
        runtime.shutdown().await;
    }

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
