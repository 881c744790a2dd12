//! One gRPC call: run with a fresh generation snapshot ([`Call`]), secret
//! values scrubbed from its error (`UNAVAILABLE` when a circuit breaker
//! refused it), and its entry in the request metrics.

use std::future::Future;
use std::time::Instant;

use tonic::{Code, Status};
use tracing::Instrument;

use super::status::code_name;
use crate::dapr::{Call, StoreLabel};
use crate::metrics::ResultCode;
use crate::ApiState;

/// The trace a call's `traceparent`/`tracestate` metadata continues
/// (while tracing is on). Read before the request is taken apart.
pub(super) fn caller<T>(request: &tonic::Request<T>) -> Option<opentelemetry::Context> {
    crate::telemetry::propagation::caller_of_grpc(request.metadata())
}

/// Runs `handler` as the gRPC method `method`: in its trace span (a child
/// of `caller`'s, see [`caller`]), with a fresh generation snapshot,
/// secret values scrubbed from its error, and the call counted in the
/// request metrics.
pub(super) async fn observed<T, F, Fut>(
    state: &ApiState,
    method: &'static str,
    caller: Option<opentelemetry::Context>,
    handler: F,
) -> Result<T, Status>
where
    F: FnOnce(Call) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let span = crate::telemetry::propagation::api_span("grpc", method, caller);
    observed_here(state, method, handler).instrument(span).await
}

async fn observed_here<T, F, Fut>(
    state: &ApiState,
    method: &'static str,
    handler: F,
) -> Result<T, Status>
where
    F: FnOnce(Call) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let started = Instant::now();
    let label = StoreLabel::default();
    let call = Call::new(&state.runtime, label.clone());
    // A call refused by a component's open circuit breaker is
    // UNAVAILABLE, as Dapr answers it, whatever its operation's code.
    let result = handler(call).await.map_err(|status| {
        let code = if label.breaker_refused() {
            Code::Unavailable
        } else {
            status.code()
        };
        let message = state.runtime.redact(status.message());
        if code == status.code() && message == status.message() {
            // Kept whole, with its rich details (Dapr's ErrorInfo...):
            // their text is taken from the message, found clean, or from
            // the caller's own request.
            status
        } else {
            Status::new(code, message)
        }
    });
    let code = result.as_ref().err().map_or(Code::Ok, Status::code);
    let store = label.get();
    state.metrics.observe_request(
        "grpc",
        method,
        label.name(),
        ResultCode::Grpc(code_name(code)),
        started.elapsed(),
    );
    if let Err(status) = &result {
        tracing::debug!(
            method,
            store,
            code = code_name(code),
            message = status.message(),
            "gRPC call failed."
        );
    }
    result
}

/// One unary call of `method`, [`observed`], cut after the API's
/// `request_timeout`: `handler` gets the call and the request message.
pub(super) async fn unary<Req, Resp, F, Fut>(
    state: &ApiState,
    method: &'static str,
    request: tonic::Request<Req>,
    handler: F,
) -> Result<tonic::Response<Resp>, Status>
where
    F: FnOnce(Call, Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let caller = caller(&request);
    let message = request.into_inner();
    let timeout = state.options.request_timeout;
    observed(state, method, caller, |call| async move {
        tokio::time::timeout(timeout, handler(call, message))
            .await
            .unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "the call did not complete within {timeout:?} (request_timeout)"
                )))
            })
    })
    .await
    .map(tonic::Response::new)
}

#[cfg(test)]
mod tests {

    use super::*;

    async fn state() -> ApiState {
        ApiState::empty().await
    }

    #[tokio::test]
    async fn every_call_is_counted_with_its_code_and_only_known_stores_label_it() {
        let state = state().await;
        let missing = observed(&state, "GetState", None, |call| async move {
            call.state_store("random-name")
                .map(|_| ())
                .map_err(Status::from)
        })
        .await;
        // No state store at all: Dapr's FAILED_PRECONDITION.
        assert_eq!(missing.map_err(|s| s.code()), Err(Code::FailedPrecondition));
        let answered = observed(&state, "GetMetadata", None, |call| async move {
            call.label("orders");
            Ok(call.generation().number)
        })
        .await;
        assert_eq!(answered.ok(), Some(1));
        let text = state.metrics.render(&state.runtime);
        assert!(
            text.contains(r#"rewire_requests_total{api="grpc",method="GetState",store="",code="FAILED_PRECONDITION"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rewire_requests_total{api="grpc",method="GetMetadata",store="orders",code="OK"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("random-name"),
            "unknown stores do not become labels"
        );
        state.runtime.shutdown().await;
    }
}
