//! Publishing: `PublishEvent`, `BulkPublishEventAlpha1` (and
//! `BulkPublishEvent`) on the shared [`PubSubOps`](crate::dapr::PubSubOps),
//! with Dapr's codes.

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{check_item_metadata, Call, PubSubOpError, PublishEvent};
use rewire_runtime::PubSubError;

tokio::task_local! {
    /// The W3C trace headers of the call being served.
    pub(super) static TRACE: (Option<String>, Option<String>);
}

/// The trace headers a published event carries: the caller's when valid,
/// else the call's own span's (when traced).
fn current_trace() -> (Option<String>, Option<String>) {
    TRACE
        .try_with(|(parent, state)| {
            crate::telemetry::propagation::event_trace(parent.as_deref(), state.as_deref())
        })
        .unwrap_or_else(|_| (crate::telemetry::propagation::current_traceparent(), None))
}

/// The W3C trace headers of a request, passed into the CloudEvent: read
/// as W3C asks, as the call's span reads them
/// ([`trace_headers`](crate::telemetry::propagation::trace_headers)).
pub(super) fn trace_context(metadata: &MetadataMap) -> (Option<String>, Option<String>) {
    let (traceparent, tracestate) = crate::telemetry::propagation::trace_headers(metadata.as_ref());
    (traceparent.map(String::from), tracestate)
}

/// `PublishEvent`: one event, wrapped in a CloudEvent unless
/// `metadata.rawPayload` is `true`.
pub(super) async fn publish(call: Call, req: pb::PublishEventRequest) -> Result<(), Status> {
    let trace = current_trace();
    let pubsub = call.pubsub(&req.pubsub_name)?;
    pubsub.check_metadata(&req.metadata)?;
    let event = PublishEvent {
        data: req.data,
        content_type: Some(req.data_content_type).filter(|c| !c.is_empty()),
        metadata: req.metadata,
        traceparent: trace.0,
        tracestate: trace.1,
    };
    pubsub.publish(&req.topic, event).await?;
    Ok(())
}

/// `BulkPublishEventAlpha1`: every entry published (the request's
/// metadata under each entry's own); the failed ones listed with their
/// errors, answered a little before `request_timeout` (the entries not
/// settled by then failed) rather than cut whole `DEADLINE_EXCEEDED`.
pub(super) async fn bulk_publish(
    call: Call,
    req: pb::BulkPublishRequest,
    request_timeout: std::time::Duration,
) -> Result<pb::BulkPublishResponse, Status> {
    let trace = current_trace();
    let pubsub = call.pubsub(&req.pubsub_name)?;
    pubsub.check_entry_count(req.entries.len())?;
    pubsub.check_metadata(&req.metadata)?;
    for (index, entry) in req.entries.iter().enumerate() {
        check_item_metadata(("pubsub", &req.pubsub_name), index, &entry.metadata)
            .map_err(PubSubOpError::from)?;
    }
    let entries = req
        .entries
        .into_iter()
        .map(|entry| {
            let event = PublishEvent {
                data: entry.event,
                content_type: Some(entry.content_type).filter(|c| !c.is_empty()),
                metadata: entry.metadata,
                traceparent: trace.0.clone(),
                tracestate: trace.1.clone(),
            };
            (entry.entry_id, event)
        })
        .collect();
    let failed = pubsub
        .bulk_publish_within(&req.topic, &req.metadata, entries, request_timeout)
        .await?;
    Ok(pb::BulkPublishResponse {
        failed_entries: failed
            .into_iter()
            .map(|(entry_id, error)| pb::BulkPublishResponseFailedEntry { entry_id, error })
            .collect(),
    })
}

/// Dapr's codes: a missing or unknown pub/sub or topic is
/// `INVALID_ARGUMENT` (Dapr's `validateAndGetPubsubAndTopic` for a publish,
/// its `StartStreamerSubscription` for a streamed subscription), as are a
/// bad `entryId`, a payload sent as a CloudEvent that is not one and a
/// request over the sidecar's bounds; a full broker `RESOURCE_EXHAUSTED`,
/// a broker failure `INTERNAL`.
impl From<PubSubOpError> for Status {
    fn from(err: PubSubOpError) -> Self {
        let code = match err {
            PubSubOpError::NameEmpty
            | PubSubOpError::NotFound(_)
            | PubSubOpError::TopicEmpty(_)
            | PubSubOpError::EntryId { .. }
            | PubSubOpError::CloudEvent { .. }
            | PubSubOpError::EventConversion { .. }
            | PubSubOpError::Limit(_)
            | PubSubOpError::Metadata { .. }
            | PubSubOpError::Publish {
                source: PubSubError::Invalid(_),
                ..
            }
            | PubSubOpError::Subscribe {
                source: PubSubError::Invalid(_),
                ..
            } => Code::InvalidArgument,
            PubSubOpError::Busy { .. } => Code::ResourceExhausted,
            PubSubOpError::Publish { .. } | PubSubOpError::Subscribe { .. } => Code::Internal,
        };
        let detail = err.detail();
        super::status::dapr_status(code, err.to_string(), detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish or subscription the broker refuses as invalid (the redis
    /// pub/sub's topic holding `||`) is `INVALID_ARGUMENT`; a broker
    /// failure stays `INTERNAL`. Before: every refusal was `INTERNAL`.
    #[test]
    fn a_request_the_broker_refuses_as_invalid_is_an_invalid_argument() {
        let invalid = || PubSubError::Invalid("topic can't contain `||`".into());
        let publish = PubSubOpError::Publish {
            pubsub: "orders".into(),
            topic: "lock||a||b".into(),
            source: invalid(),
        };
        assert_eq!(Status::from(publish).code(), Code::InvalidArgument);
        let subscribe = PubSubOpError::Subscribe {
            pubsub: "orders".into(),
            topic: "lock||a||b".into(),
            source: invalid(),
        };
        assert_eq!(Status::from(subscribe).code(), Code::InvalidArgument);
        let failed = PubSubOpError::Publish {
            pubsub: "orders".into(),
            topic: "t".into(),
            source: PubSubError::Backend("connection reset".into()),
        };
        assert_eq!(Status::from(failed).code(), Code::Internal);
    }
}
