//! Dapr's `dapr.proto.runtime.v1.AppCallback` calls to the app
//! (`--app-protocol grpc`): an event delivered through `OnTopicEvent`,
//! answered with Dapr's status values (a failed call retries), and the
//! listing. Which service the app serves (Dapr's or Layotto's) is found
//! by `GrpcApp`. Each call is bounded whole,
//! body and trailers included (the channel has no timeout of its own): a
//! delivery by the `within` it is given (the pub/sub's inbound resiliency
//! timeout, else [`ANSWER_WITHIN`](crate::dapr::ANSWER_WITHIN)), the
//! listing by [`APP_CALL_TIMEOUT`](super::APP_CALL_TIMEOUT).

use std::time::Duration;

use rewire_runtime::config::{RawRoutes, RawRule, SubscriptionRoutes};
use rewire_runtime::DeliveryOutcome;

use super::app_calls::AppCalls;
use super::callback_call::{delivered, traced, Delivered};
use super::AppSubscription;
use crate::dapr::TopicEvent;
use crate::grpc::proto::dapr::proto::runtime::v1 as pb;
use pb::app_callback_client::AppCallbackClient;
use pb::topic_event_response::TopicEventResponseStatus;

/// Delivers `event` with Dapr's `OnTopicEvent`, naming `path` (the route
/// chosen for it); the app's answer (a retry when none comes `within`,
/// which the app is told as the call's `grpc-timeout`), or that it does
/// not implement the call.
pub(super) async fn on_topic_event(
    client: &AppCallbackClient<AppCalls>,
    path: &str,
    event: &TopicEvent,
    within: Duration,
) -> Delivered {
    let message = pb::TopicEventRequest {
        id: event.id.clone(),
        source: event.field("source"),
        r#type: event.field("type"),
        spec_version: event.field("specversion"),
        data_content_type: event.data_content_type.clone(),
        data: event.data.clone(),
        topic: event.topic.clone(),
        pubsub_name: event.pubsub_name.clone(),
        path: path.to_string(),
        extensions: Some(event.extensions()),
    };
    let request = traced(message, event, within);
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

/// One Dapr `ListTopicSubscriptions`, bounded whole by `within` (no
/// answer in time is `DEADLINE_EXCEEDED`).
pub(super) async fn list_once(
    client: &AppCallbackClient<AppCalls>,
    within: Duration,
) -> Result<Vec<AppSubscription>, tonic::Status> {
    let listed = tokio::time::timeout(within, client.clone().list_topic_subscriptions(()))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded(format!("no answer within {within:?}")))??;
    Ok(listed_subscriptions(listed.into_inner()))
}

/// The subscriptions of the app's answer to take (at most
/// [`MAX_SUBSCRIPTIONS`](super::subscriptions::MAX_SUBSCRIPTIONS), the
/// rest left out with a warning; bulk ones and ones with malformed routes
/// are left out, said in the log).
fn listed_subscriptions(answer: pb::ListTopicSubscriptionsResponse) -> Vec<AppSubscription> {
    let (listed, _) = super::subscriptions::at_most_taken(
        "dapr.proto.runtime.v1.AppCallback/ListTopicSubscriptions",
        answer.subscriptions,
    );
    listed
            .into_iter()
            .filter_map(|s| {
                let bulk = s.bulk_subscribe.as_ref().is_some_and(|b| b.enabled);
                if super::subscriptions::refuses_bulk(&s.pubsub_name, &s.topic, bulk) {
                    return None;
                }
                let routes = s.routes.map(|r| RawRoutes {
                    rules: Some(
                        r.rules
                            .into_iter()
                            .map(|rule| RawRule {
                                matcher: Some(rule.r#match),
                                path: Some(rule.path),
                            })
                            .collect(),
                    ),
                    default: Some(r.default),
                });
                let routes = match SubscriptionRoutes::from_dapr(None, routes) {
                    // As Dapr: with no rule and no default (`routes`
                    // absent, or empty as the SDKs send it), every event
                    // goes to the default route, the path "".
                    Ok(routes) if routes.rules.is_empty() && routes.default.is_none() => {
                        SubscriptionRoutes::single("")
                    }
                    Ok(routes) => routes,
                    Err(err) => {
                        tracing::warn!(pubsub = %s.pubsub_name, topic = %s.topic, error = %err, "An app subscription's routes are malformed; it is not taken.");
                        return None;
                    }
                };
                Some(AppSubscription {
                    routes,
                    pubsub_name: s.pubsub_name,
                    topic: s.topic,
                    dead_letter_topic: Some(s.dead_letter_topic).filter(|t| !t.is_empty()),
                    metadata: s.metadata.into_iter().collect(),
                })
            })
            .collect()
}
