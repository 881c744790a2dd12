//! Layotto's pub/sub methods on the Dapr ones: `PublishEvent` and the
//! bidirectional `SubscribeTopicEvents` carry Dapr's fields under Layotto's
//! names, so the messages are turned into Dapr's and back, and the shared
//! delivery engine serves both (a subscription follows its broker across
//! reloads here too).

use std::collections::HashMap;

use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::dapr_pubsub;
use super::dapr_pubsub_stream::{self, TopicStreams};
use super::proto::dapr::proto::runtime::v1 as dapr;
use super::proto::spec::proto::runtime::v1 as pb;
use crate::dapr::Call;
use crate::ApiState;

use dapr::subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType as DaprRequest;
use dapr::subscribe_topic_events_response_alpha1::SubscribeTopicEventsResponseType as DaprResponse;
use pb::subscribe_topic_events_request::SubscribeTopicEventsRequestType as Request;
use pb::subscribe_topic_events_response::SubscribeTopicEventsResponseType as Response;

/// The answer stream of Layotto's `SubscribeTopicEvents`.
pub(super) type LayottoTopicEventStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::SubscribeTopicEventsResponse, Status>> + Send>,
>;

/// `PublishEvent`, as Dapr's.
pub(super) async fn publish(call: Call, req: pb::PublishEventRequest) -> Result<(), Status> {
    let request = dapr::PublishEventRequest {
        pubsub_name: req.pubsub_name,
        topic: req.topic,
        data: req.data,
        data_content_type: req.data_content_type,
        metadata: req.metadata,
    };
    dapr_pubsub::publish(call, request).await
}

/// `SubscribeTopicEvents`, as Dapr's `SubscribeTopicEventsAlpha1`.
pub(super) async fn subscribe(
    state: &ApiState,
    incoming: Streaming<pb::SubscribeTopicEventsRequest>,
    shutdown: CancellationToken,
    streams: &TopicStreams,
) -> Result<LayottoTopicEventStream, Status> {
    let incoming = incoming.map(|message| message.map(request_of));
    let outgoing = dapr_pubsub_stream::subscribe(state, incoming, shutdown, streams).await?;
    Ok(Box::pin(outgoing.map(|message| message.map(response_of))))
}

fn request_of(message: pb::SubscribeTopicEventsRequest) -> dapr::SubscribeTopicEventsRequestAlpha1 {
    let kind = message
        .subscribe_topic_events_request_type
        .map(|kind| match kind {
            Request::InitialRequest(initial) => {
                DaprRequest::InitialRequest(dapr::SubscribeTopicEventsRequestInitialAlpha1 {
                    pubsub_name: initial.pubsub_name,
                    topic: initial.topic,
                    metadata: initial.metadata,
                    dead_letter_topic: initial.dead_letter_topic,
                })
            }
            Request::EventProcessed(processed) => {
                DaprRequest::EventProcessed(dapr::SubscribeTopicEventsRequestProcessedAlpha1 {
                    id: processed.id,
                    // Layotto's and Dapr's status values are the same
                    // (0 success, 1 retry, 2 drop).
                    status: processed
                        .status
                        .map(|s| dapr::TopicEventResponse { status: s.status }),
                })
            }
        });
    dapr::SubscribeTopicEventsRequestAlpha1 {
        subscribe_topic_events_request_type: kind,
    }
}

fn response_of(
    message: dapr::SubscribeTopicEventsResponseAlpha1,
) -> pb::SubscribeTopicEventsResponse {
    let kind = message
        .subscribe_topic_events_response_type
        .map(|kind| match kind {
            DaprResponse::InitialResponse(_) => {
                Response::InitialResponse(pb::SubscribeTopicEventsResponseInitial {})
            }
            DaprResponse::EventMessage(event) => Response::EventMessage(pb::TopicEventRequest {
                id: event.id,
                source: event.source,
                r#type: event.r#type,
                spec_version: event.spec_version,
                data_content_type: event.data_content_type,
                topic: event.topic,
                data: event.data,
                pubsub_name: event.pubsub_name,
                metadata: metadata_of(event.extensions),
            }),
        });
    pb::SubscribeTopicEventsResponse {
        subscribe_topic_events_response_type: kind,
    }
}

/// The event's CloudEvent fields beyond those `TopicEventRequest` has its
/// own for, which Dapr's stream passes on as `extensions` (the publisher's
/// trace `traceparent`/`tracestate`, `topic`, `pubsubname`, the
/// publisher's own fields), as Layotto's `metadata`: text as it is, numbers
/// and booleans as text; a null, list or object field has no text form
/// there and is left out.
pub(crate) fn metadata_of(extensions: Option<prost_types::Struct>) -> HashMap<String, String> {
    use prost_types::value::Kind;
    let fields = extensions.map(|e| e.fields).unwrap_or_default();
    fields
        .into_iter()
        .filter_map(|(key, value)| {
            let text = match value.kind? {
                Kind::StringValue(text) => text,
                Kind::NumberValue(number) => number.to_string(),
                Kind::BoolValue(flag) => flag.to_string(),
                Kind::NullValue(_) | Kind::ListValue(_) | Kind::StructValue(_) => return None,
            };
            Some((key, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::value::Kind;

    fn value(kind: Kind) -> prost_types::Value {
        prost_types::Value { kind: Some(kind) }
    }

    #[test]
    fn an_events_extensions_become_its_layotto_metadata() {
        let fields = [
            (
                "traceparent",
                value(Kind::StringValue("00-abc-def-01".into())),
            ),
            ("topic", value(Kind::StringValue("orders".into()))),
            ("priority", value(Kind::NumberValue(3.0))),
            ("urgent", value(Kind::BoolValue(true))),
            ("nothing", value(Kind::NullValue(0))),
            (
                "nested",
                value(Kind::StructValue(prost_types::Struct::default())),
            ),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect();
        let event = dapr::TopicEventRequest {
            id: "e1".into(),
            topic: "orders".into(),
            extensions: Some(prost_types::Struct { fields }),
            ..Default::default()
        };
        let message = dapr::SubscribeTopicEventsResponseAlpha1 {
            subscribe_topic_events_response_type: Some(DaprResponse::EventMessage(event)),
        };
        let Some(Response::EventMessage(event)) =
            response_of(message).subscribe_topic_events_response_type
        else {
            panic!("an event message stays one");
        };
        let expected: HashMap<String, String> = [
            ("traceparent", "00-abc-def-01"),
            ("topic", "orders"),
            ("priority", "3"),
            ("urgent", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(event.metadata, expected);
        assert_eq!(event.id, "e1");
    }
}
