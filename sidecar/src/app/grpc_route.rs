//! [`GrpcRoute`]: an event delivered through the app's gRPC
//! `AppCallback.OnTopicEvent` (`--app-protocol grpc`), answered with
//! Dapr's status values; a failed call retries. The app's subscriptions
//! come from `AppCallback.ListTopicSubscriptions`.

use rewire_runtime::config::{RawRoutes, RawRule, SubscriptionRoutes};
use rewire_runtime::DeliveryOutcome;
use tonic::transport::Channel;

use super::AppSubscription;
use crate::dapr::{EventSink, TopicEvent};
use crate::grpc::proto::dapr::proto::runtime::v1 as pb;
use pb::app_callback_client::AppCallbackClient;
use pb::topic_event_response::TopicEventResponseStatus;

/// One subscription's deliveries over the app's gRPC channel.
pub struct GrpcRoute {
    client: AppCallbackClient<Channel>,
    path: String,
}

impl GrpcRoute {
    /// Delivers over `channel`, naming `path` (the subscription's route).
    pub fn new(channel: Channel, path: String) -> Self {
        Self {
            client: AppCallbackClient::new(channel),
            path,
        }
    }
}

#[tonic::async_trait]
impl EventSink for GrpcRoute {
    async fn send(&self, event: &TopicEvent) -> DeliveryOutcome {
        on_topic_event(&self.client, &self.path, event).await
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// Delivers `event` with `OnTopicEvent`, naming `path` (the route chosen
/// for it); the app's answer.
pub(super) async fn on_topic_event(
    client: &AppCallbackClient<Channel>,
    path: &str,
    event: &TopicEvent,
) -> DeliveryOutcome {
    let request = pb::TopicEventRequest {
        id: event.id.clone(),
        source: event.field("source"),
        r#type: event.field("type"),
        spec_version: event.field("specversion"),
        data_content_type: event.data_content_type.clone(),
        data: event.data.clone(),
        topic: event.topic.clone(),
        pubsub_name: event.pubsub_name.clone(),
        path: path.to_string(),
        extensions: None,
    };
    match client.clone().on_topic_event(request).await {
        Ok(answer) => match TopicEventResponseStatus::try_from(answer.into_inner().status) {
            Ok(TopicEventResponseStatus::Success) => DeliveryOutcome::Success,
            Ok(TopicEventResponseStatus::Drop) => DeliveryOutcome::Drop,
            _ => DeliveryOutcome::Retry,
        },
        // As Dapr's publishMessageGRPC: an app that does not implement
        // the call has the event acknowledged (retrying it would not
        // help), not dead-lettered.
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::warn!(id = %event.id, message = status.message(), "The app does not implement OnTopicEvent; the event is acknowledged undelivered.");
            DeliveryOutcome::Success
        }
        Err(status) => {
            tracing::debug!(code = ?status.code(), "OnTopicEvent failed; retried.");
            DeliveryOutcome::Retry
        }
    }
}

/// The app's subscriptions from `ListTopicSubscriptions` (none when the
/// call fails, said in the log).
pub(super) async fn ask_app(client: &AppCallbackClient<Channel>) -> Vec<AppSubscription> {
    match client.clone().list_topic_subscriptions(()).await {
        Ok(answer) => answer
            .into_inner()
            .subscriptions
            .into_iter()
            .take(super::subscriptions::MAX_SUBSCRIPTIONS)
            .filter_map(|s| {
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
            .collect(),
        Err(status) => {
            tracing::warn!(code = ?status.code(), message = status.message(), "The app did not list its subscriptions (ListTopicSubscriptions).");
            Vec::new()
        }
    }
}
