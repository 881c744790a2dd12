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

/// Names of message metadata never passed on to the app: what the sidecar
/// sets itself (the trace, `pubsubname`), what frames the request, and
/// what HTTP/2 or gRPC reserve. As daprd, `dapr-…` names and binary
/// (`…-bin`) ones are left out too.
const NOT_PASSED_ON: [&str; 16] = [
    "traceparent",
    "tracestate",
    "pubsubname",
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "host",
    "expect",
    "user-agent",
];

/// The broker message's metadata the app is passed, as daprd passes it
/// (HTTP headers, gRPC metadata): names lowercased, those of
/// [`NOT_PASSED_ON`] and `dapr-`, `grpc-`, `:` or `-bin` ones left out.
/// Whether a name or value is a valid header is the caller's to check:
/// one that is not is left out (it must not fail every attempt).
pub(super) fn passed_on(event: &TopicEvent) -> impl Iterator<Item = (String, &str)> {
    event.metadata.iter().filter_map(|(name, value)| {
        let name = name.to_ascii_lowercase();
        let reserved = NOT_PASSED_ON.contains(&name.as_str())
            || name.starts_with("dapr-")
            || name.starts_with("grpc-")
            || name.starts_with(':')
            || name.ends_with("-bin");
        (!reserved).then_some((name, value.as_str()))
    })
}

/// `request`, bounded by `within` (told to the app as its `grpc-timeout`),
/// carrying the publisher's trace in its metadata, as Dapr passes it,
/// when it is one (see `delivered_trace`), `pubsubname` and the message's
/// metadata ([`passed_on`]), as daprd's `WithCustomGRPCMetadata`. Only
/// valid values are sent: a field of the event that is not one must not
/// fail every attempt at it.
pub(super) fn traced<T>(message: T, event: &TopicEvent, within: Duration) -> tonic::Request<T> {
    use tonic::metadata::{AsciiMetadataKey, MetadataValue};
    let mut request = tonic::Request::new(message);
    for (name, value) in passed_on(event) {
        if let (Ok(name), Ok(value)) = (
            AsciiMetadataKey::from_bytes(name.as_bytes()),
            MetadataValue::try_from(value),
        ) {
            request.metadata_mut().insert(name, value);
        }
    }
    if let Ok(value) = MetadataValue::try_from(event.pubsub_name.as_str()) {
        request.metadata_mut().insert("pubsubname", value);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_metadata_carries_the_messages_as_daprd_passes_it() {
        let message = rewire_runtime::Message {
            topic: "orders".into(),
            data: br#"{"specversion":"1.0","id":"e1","source":"s","type":"t","data":"x"}"#.to_vec(),
            metadata: std::collections::HashMap::from([
                ("X-Tenant".to_string(), "acme".to_string()),
                ("dapr-api-token".to_string(), "not passed".to_string()),
                ("grpc-timeout".to_string(), "1n".to_string()),
                ("key-bin".to_string(), "x".to_string()),
                ("bad name".to_string(), "v".to_string()),
                ("multi".to_string(), "line\nvalue".to_string()),
            ]),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "bus", "orders");
        let request = traced((), &event, Duration::from_secs(5));
        let metadata = request.metadata();
        assert_eq!(
            metadata.get("x-tenant").map(|v| v.as_bytes()),
            Some(&b"acme"[..])
        );
        assert_eq!(
            metadata.get("pubsubname").map(|v| v.as_bytes()),
            Some(&b"bus"[..])
        );
        for left_out in ["dapr-api-token", "key-bin", "multi"] {
            assert!(metadata.get(left_out).is_none(), "{left_out}");
        }
        assert_eq!(
            metadata.get("grpc-timeout").map(|v| v.as_bytes()),
            Some(&b"5000000u"[..]),
            "the delivery's own bound"
        );
    }
}
