//! Layotto's pub/sub methods on the Dapr ones: `PublishEvent` and the
//! bidirectional `SubscribeTopicEvents` carry Dapr's fields under Layotto's
//! names, so the messages are turned into Dapr's and back, and the shared
//! delivery engine serves both (a subscription follows its broker across
//! reloads here too).

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
                metadata: Default::default(),
            }),
        });
    pb::SubscribeTopicEventsResponse {
        subscribe_topic_events_response_type: kind,
    }
}
