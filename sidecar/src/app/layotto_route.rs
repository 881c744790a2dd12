//! Layotto's `spec.proto.runtime.v1.AppCallback`, as a Layotto subscriber
//! app serves it ([`GrpcApp`](super::grpc_app::GrpcApp) finds out):
//! `ListTopicSubscriptions` (a pub/sub, a topic and metadata each: no
//! routes, so every event goes to the default route) and `OnTopicEvent`,
//! whose request has no `path` but the event's CloudEvent extensions as
//! `metadata`, as Layotto's `SubscribeTopicEvents` stream gives them.

use std::time::Duration;

use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::DeliveryOutcome;

use super::app_calls::AppCalls;
use super::callback_call::{delivered, traced, Delivered};
use super::AppSubscription;
use crate::dapr::TopicEvent;
use crate::grpc::layotto_pubsub::metadata_of;
use crate::grpc::proto::spec::proto::runtime::v1 as pb;
use pb::app_callback_client::AppCallbackClient;
use pb::topic_event_response::TopicEventResponseStatus;

/// Delivers `event` with Layotto's `OnTopicEvent`, bounded by `within`;
/// the status maps as Dapr's (an unknown one is a retry).
pub(super) async fn on_topic_event(
    client: &AppCallbackClient<AppCalls>,
    event: &TopicEvent,
    within: Duration,
) -> Delivered {
    let request = traced(request_of(event), event, within);
    let call = async { client.clone().on_topic_event(request).await };
    delivered(event, within, call, |answer: pb::TopicEventResponse| {
        match TopicEventResponseStatus::try_from(answer.status) {
            Ok(TopicEventResponseStatus::Success) => DeliveryOutcome::Success,
            Ok(TopicEventResponseStatus::Drop) => DeliveryOutcome::Drop,
            _ => DeliveryOutcome::Retry,
        }
    })
    .await
}

/// Layotto's request for `event`.
fn request_of(event: &TopicEvent) -> pb::TopicEventRequest {
    pb::TopicEventRequest {
        id: event.id.clone(),
        source: event.field("source"),
        r#type: event.field("type"),
        spec_version: event.field("specversion"),
        data_content_type: event.data_content_type.clone(),
        topic: event.topic.clone(),
        data: event.data.clone(),
        pubsub_name: event.pubsub_name.clone(),
        metadata: metadata_of(Some(event.extensions())),
    }
}

/// One Layotto `ListTopicSubscriptions`, bounded whole by `within` (no
/// answer in time is `DEADLINE_EXCEEDED`); at most
/// [`MAX_SUBSCRIPTIONS`](super::subscriptions::MAX_SUBSCRIPTIONS) taken,
/// the rest left out with a warning.
pub(super) async fn list_once(
    client: &AppCallbackClient<AppCalls>,
    within: Duration,
) -> Result<Vec<AppSubscription>, tonic::Status> {
    let listed = tokio::time::timeout(within, client.clone().list_topic_subscriptions(()))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded(format!("no answer within {within:?}")))??;
    let (listed, _) = super::subscriptions::at_most_taken(
        "spec.proto.runtime.v1.AppCallback/ListTopicSubscriptions",
        listed.into_inner().subscriptions,
    );
    Ok(listed
        .into_iter()
        .map(|s| AppSubscription {
            routes: SubscriptionRoutes::single(""),
            pubsub_name: s.pubsub_name,
            topic: s.topic,
            dead_letter_topic: None,
            metadata: s.metadata.into_iter().collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_extensions_are_its_layotto_metadata_and_field_9_is_not_a_path() {
        let message = rewire_runtime::Message {
            data: serde_json::json!({
                "specversion": "1.0", "id": "e1", "source": "shop", "type": "t",
                "datacontenttype": "text/plain", "data": "x", "priority": 3
            })
            .to_string()
            .into_bytes(),
            ..Default::default()
        };
        let event = TopicEvent::of(&message, "bus", "orders");
        let request = request_of(&event);
        assert_eq!(
            request.metadata.get("priority").map(String::as_str),
            Some("3")
        );
        assert_eq!(request.source, "shop");
        assert_eq!(
            (request.pubsub_name.as_str(), request.topic.as_str()),
            ("bus", "orders")
        );
    }
}
