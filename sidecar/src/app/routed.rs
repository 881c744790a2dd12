//! [`RoutedSink`]: one subscription's deliveries to the app, each event to
//! the path its routes choose (the first rule whose `match` holds, else
//! the default). The routes can be replaced while the subscription runs,
//! so a reload that only changes routes moves no message.

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::DeliveryOutcome;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{grpc_route, http_route, AppChannel, AppProtocol, APP_CALL_TIMEOUT};
use crate::dapr::{EventSink, TopicEvent};
use crate::grpc::proto::dapr::proto::runtime::v1::app_callback_client::AppCallbackClient;

/// The app, as events are delivered to it.
#[derive(Clone)]
pub(super) enum AppTarget {
    /// `POST` of the CloudEvent to `http://ADDRESS/PATH`.
    Http {
        client: reqwest::Client,
        channel: AppChannel,
    },
    /// `AppCallback.OnTopicEvent`, naming the path.
    Grpc(AppCallbackClient<Channel>),
}

impl AppTarget {
    /// The app's client for `channel`'s protocol (`None`, said in the log,
    /// when it cannot be built).
    pub(super) fn connect(channel: &AppChannel) -> Option<Self> {
        match channel.protocol {
            AppProtocol::Http => match reqwest::Client::builder().timeout(APP_CALL_TIMEOUT).build()
            {
                Ok(client) => Some(Self::Http {
                    client,
                    channel: channel.clone(),
                }),
                Err(err) => {
                    tracing::error!(error = %err, "Cannot build the app's HTTP client.");
                    None
                }
            },
            AppProtocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(channel.url("")).map(|e| {
                    // No channel-wide timeout: each call is bounded whole
                    // in `grpc_route` (a delivery by its inbound policy's
                    // timeout, which may be longer than the default); the
                    // pings find a connection whose app went away without
                    // closing it.
                    e.connect_timeout(APP_CALL_TIMEOUT)
                        .http2_keep_alive_interval(APP_CALL_TIMEOUT)
                        .keep_alive_timeout(APP_CALL_TIMEOUT)
                });
                match endpoint {
                    Ok(endpoint) => {
                        Some(Self::Grpc(AppCallbackClient::new(endpoint.connect_lazy())))
                    }
                    Err(err) => {
                        tracing::error!(error = %err, app = %channel.address, "Cannot address the app over gRPC.");
                        None
                    }
                }
            }
        }
    }

    async fn deliver(&self, path: &str, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        match self {
            Self::Http { client, channel } => {
                http_route::post_event(client, &channel.url(path), event, within).await
            }
            Self::Grpc(client) => grpc_route::on_topic_event(client, path, event, within).await,
        }
    }
}

/// One subscription's sink: routes, then the app.
pub(super) struct RoutedSink {
    pub(super) app: AppTarget,
    pub(super) routes: watch::Receiver<Arc<SubscriptionRoutes>>,
}

#[tonic::async_trait]
impl EventSink for RoutedSink {
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        let routes = self.routes.borrow().clone();
        match routes.path_for(&event.cloud_event) {
            Some(path) => self.app.deliver(path, event, within).await,
            None => {
                // As Dapr: an event no rule takes, with no default route,
                // is acknowledged without delivery.
                tracing::debug!(id = %event.id, topic = %event.topic, "No route matches the event and there is no default route; acknowledged.");
                DeliveryOutcome::Success
            }
        }
    }

    async fn closed(&self) {
        std::future::pending().await
    }

    fn takes(&self, event: &TopicEvent) -> bool {
        self.routes.borrow().path_for(&event.cloud_event).is_some()
    }
}
