//! One gRPC call: run with a fresh generation snapshot ([`Call`]), secret
//! values scrubbed from its error (`UNAVAILABLE` when a circuit breaker
//! refused it), a panic of its handler answered `INTERNAL`, and its entry
//! in the request metrics.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures_util::FutureExt;
use tonic::{Code, Status};
use tracing::Instrument;

use super::status::code_name;
use crate::dapr::{Call, StoreLabel};
use crate::result_code::ResultCode;
use crate::ApiState;

/// The trace a call's `traceparent`/`tracestate` metadata continues
/// (while tracing is on). Read before the request is taken apart.
pub(super) fn caller<T>(request: &tonic::Request<T>) -> Option<opentelemetry::Context> {
    crate::telemetry::propagation::caller_of_grpc(request.metadata())
}

/// Runs `handler` as the gRPC method `method`: in its trace span (a child
/// of `caller`'s, see [`caller`]), with a fresh generation snapshot,
/// secret values scrubbed from its error, a panic of `handler` (or of a
/// component under it) answered `INTERNAL` instead of the stream reset,
/// and the call counted in the request metrics. The span records the code
/// answered (and, for a server's error, status `ERROR` with the message
/// answered). The hot path (`hot_path`) calls the same methods, so it
/// passes here too.
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
    let result = observed_here(state, method, handler)
        .instrument(span.clone())
        .await;
    let (code, message) = match &result {
        Ok(_) => (Code::Ok, ""),
        Err(status) => (status.code(), status.message()),
    };
    crate::telemetry::propagation::record_grpc_status(&span, code, message);
    result
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
    let answered = AssertUnwindSafe(async move { handler(call).await })
        .catch_unwind()
        .await;
    let result = unless_panicked(method, answered).map_err(|status| {
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
            fitted_to_trailers(status)
        } else {
            fitted_to_trailers(Status::new(code, message))
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

/// A call's answer, or, when its handler (or a component under it)
/// panicked, `INTERNAL` naming the method: the caller gets a status
/// instead of a reset stream, and the call is counted and its span marked
/// as an error. The panic's message went to the log, scrubbed, through the
/// panic hook (`rewire_runtime::redact_panics`); it is not echoed to the
/// caller.
fn unless_panicked<T>(
    method: &'static str,
    answered: Result<Result<T, Status>, Box<dyn std::any::Any + Send>>,
) -> Result<T, Status> {
    answered.unwrap_or_else(|_| {
        tracing::error!(method, "A gRPC call's handler panicked; answered INTERNAL.");
        Err(Status::internal(format!(
            "{method} failed: the sidecar's handler panicked"
        )))
    })
}

/// Longest error message a call answers, in bytes: sent as the
/// `grpc-message` trailer, percent-encoded (up to three times as long).
/// With [`MAX_STATUS_DETAILS`], at most about 7 KiB of trailers: within
/// what clients accept in headers (grpc-java's default is 8 KiB for all
/// of them).
pub(super) const MAX_STATUS_MESSAGE: usize = 1024;
/// Longest rich error details (`grpc-status-details-bin`, base64: a
/// third longer) a call answers with; longer ones are left out, the
/// message kept.
pub(super) const MAX_STATUS_DETAILS: usize = 3072;

/// `status` as it may go in trailers: a message longer than
/// [`MAX_STATUS_MESSAGE`] cut on a character boundary (`…`), details
/// longer than [`MAX_STATUS_DETAILS`] left out. Values a client sent are
/// quoted cut short where errors are made; this bounds what a store's
/// own text quotes, or any message made later, whatever it is: a
/// trailer of megabytes broke the call's HTTP/2 stream. Every unary
/// call's error passes here ([`observed`]), and every status a server
/// stream ends with (`EndableStream`).
pub(super) fn fitted_to_trailers(status: Status) -> Status {
    let message_fits = status.message().len() <= MAX_STATUS_MESSAGE;
    let details_fit = status.details().len() <= MAX_STATUS_DETAILS;
    if message_fits && details_fit {
        return status;
    }
    let message = match message_fits {
        true => status.message().to_string(),
        false => {
            let mut cut = MAX_STATUS_MESSAGE;
            while !status.message().is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…", &status.message()[..cut])
        }
    };
    let details = match details_fit {
        true => status.details().to_vec().into(),
        false => Default::default(),
    };
    Status::with_details_and_metadata(status.code(), message, details, status.metadata().clone())
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

    #[test]
    fn an_error_too_long_for_trailers_is_cut_and_keeps_its_code_and_small_details() {
        let short = Status::with_details(Code::NotFound, "gone", vec![7; 100].into());
        let kept = fitted_to_trailers(short);
        assert_eq!((kept.message(), kept.details()), ("gone", &[7; 100][..]));

        let long = "é".repeat(MAX_STATUS_MESSAGE);
        let cut = fitted_to_trailers(Status::with_details(
            Code::InvalidArgument,
            long.clone(),
            vec![7; 100].into(),
        ));
        assert_eq!(cut.code(), Code::InvalidArgument);
        assert!(cut.message().len() <= MAX_STATUS_MESSAGE + '…'.len_utf8());
        let kept_text = cut.message().trim_end_matches('…');
        assert!(cut.message().ends_with('…') && long.starts_with(kept_text));
        assert_eq!(cut.details(), &[7; 100][..], "small details kept");

        let heavy = Status::with_details(
            Code::Aborted,
            "etag",
            vec![7; MAX_STATUS_DETAILS + 1].into(),
        );
        let light = fitted_to_trailers(heavy);
        assert_eq!((light.code(), light.message()), (Code::Aborted, "etag"));
        assert!(
            light.details().is_empty(),
            "details too long for trailers left out"
        );
    }

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

    /// A handler (or a component under it) that panics is answered
    /// `INTERNAL` naming the method, without the panic's text, and counted;
    /// before, the panic reset the call's stream and went uncounted.
    #[tokio::test]
    async fn a_panicking_handler_is_answered_internal_and_counted() {
        let state = state().await;
        let panicked = observed(&state, "GetState", None, |_call| async move {
            if state_is_poisoned() {
                panic!("component blew up with s3cret");
            }
            Ok(())
        })
        .await;
        let status = panicked.unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            "GetState failed: the sidecar's handler panicked"
        );
        let text = state.metrics.render(&state.runtime);
        assert!(
            text.contains(
                r#"rewire_requests_total{api="grpc",method="GetState",store="",code="INTERNAL"} 1"#
            ),
            "{text}"
        );
        state.runtime.shutdown().await;
    }

    /// Always true: keeps the handler's `Ok` reachable for the compiler.
    fn state_is_poisoned() -> bool {
        std::hint::black_box(true)
    }
}
