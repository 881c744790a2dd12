//! One `OnTopicEvent` call to the app, whichever `AppCallback` service
//! makes it (Dapr's in `grpc_route`, Layotto's in `layotto_route`): the
//! request carrying the publisher's trace and bounded by the delivery's
//! time, and what its answer says.

use std::time::Duration;

use rewire_runtime::DeliveryOutcome;

use crate::dapr::TopicEvent;

/// How one `OnTopicEvent` call went.
pub(super) enum Delivered {
    /// The app's answer: it serves this service.
    Answered(DeliveryOutcome),
    /// No answer: a timeout, a transport failure or an error status (a
    /// retry). Says nothing of which service the app serves, so it never
    /// switches the app's flavour.
    Failed(DeliveryOutcome),
    /// The app does not serve this service's `OnTopicEvent`; why.
    Unimplemented(String),
}

/// The outcome of an `OnTopicEvent` `call` bounded by `within` whose
/// answer's status is read with `status_of`: a retry when it fails or no
/// answer comes in time.
pub(super) async fn delivered<T>(
    event: &TopicEvent,
    within: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    status_of: impl FnOnce(T) -> DeliveryOutcome,
) -> Delivered {
    let Ok(answered) = tokio::time::timeout(within, call).await else {
        tracing::debug!(id = %crate::dapr::logged(&event.id), "OnTopicEvent did not complete within {within:?}; retried.");
        return Delivered::Failed(DeliveryOutcome::Retry);
    };
    match answered {
        Ok(answer) => Delivered::Answered(status_of(answer.into_inner())),
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            Delivered::Unimplemented(status.message().to_string())
        }
        Err(status) => {
            tracing::debug!(code = ?status.code(), "OnTopicEvent failed; retried.");
            Delivered::Failed(DeliveryOutcome::Retry)
        }
    }
}

/// `request`, bounded by `within` (told to the app as its `grpc-timeout`),
/// carrying the publisher's trace in its metadata, as Dapr passes it,
/// when it is one (see `delivered_trace`). Only valid values are sent: a
/// field of the event that is not one must not fail every attempt at it.
pub(super) fn traced<T>(message: T, event: &TopicEvent, within: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let (traceparent, tracestate) = crate::telemetry::propagation::delivered_trace(
        Some(&event.field("traceparent")),
        Some(&event.field("tracestate")),
    );
    for (name, value) in [("traceparent", traceparent), ("tracestate", tracestate)] {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            continue;
        };
        if let Ok(value) = tonic::metadata::MetadataValue::try_from(value.as_str()) {
            request.metadata_mut().insert(name, value);
        }
    }
    request.set_timeout(within);
    request
}
