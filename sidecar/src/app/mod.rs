//! The app channel (`rewire run --app-port P`): the sidecar delivers
//! pub/sub events to the app, as Dapr does.
//!
//! Once the app listens ([`wait_for_app`]), the sidecar asks it for its
//! subscriptions (`GET /dapr/subscribe`), adds the declared ones, and
//! delivers each topic's events as a `POST` of the CloudEvent to the
//! subscription's route ([`HttpRoute`]) through the shared delivery engine
//! ([`TopicDelivery`](crate::dapr::TopicDelivery)), which follows the
//! pub/sub across reloads. With [`AppProtocol::Grpc`], the app is Dapr's
//! `AppCallback` service instead: `ListTopicSubscriptions`, then
//! `OnTopicEvent` per event ([`GrpcRoute`]).

mod grpc_route;
mod http_route;
mod subscriptions;

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::Runtime;
use tokio_util::sync::CancellationToken;

pub use grpc_route::GrpcRoute;
pub use http_route::HttpRoute;
pub use subscriptions::{parse_subscriptions, AppSubscription};

use crate::dapr::TopicDelivery;

/// How often the app's port is tried while waiting for it.
const APP_POLL: Duration = Duration::from_millis(200);
/// How long one call to the app may take.
pub const APP_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How the app is called (`--app-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AppProtocol {
    /// `GET /dapr/subscribe`, a `POST` per event.
    #[default]
    Http,
    /// Dapr's `AppCallback` gRPC service.
    Grpc,
}

/// Where the app listens and how it is spoken to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppChannel {
    /// `host:port` of the app.
    pub address: String,
    /// How it is called.
    pub protocol: AppProtocol,
}

impl AppChannel {
    /// The app on `port` of the loopback interface, over HTTP.
    pub fn local(port: u16) -> Self {
        Self {
            address: format!("127.0.0.1:{port}"),
            protocol: AppProtocol::Http,
        }
    }

    /// The same app, called with `protocol`.
    pub fn with_protocol(self, protocol: AppProtocol) -> Self {
        Self { protocol, ..self }
    }

    fn url(&self, path: &str) -> String {
        let path = path.trim_start_matches('/');
        format!("http://{}/{path}", self.address)
    }
}

/// Waits until the app accepts connections on its port (or `shutdown`).
pub async fn wait_for_app(channel: &AppChannel, shutdown: &CancellationToken) -> bool {
    let mut logged = false;
    loop {
        if tokio::net::TcpStream::connect(&channel.address)
            .await
            .is_ok()
        {
            return true;
        }
        if !logged {
            tracing::info!(app = %channel.address, "Waiting for the app to listen before delivering events.");
            logged = true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(APP_POLL) => {}
        }
    }
}

/// Delivers the app's subscriptions (its own, from `GET /dapr/subscribe`,
/// plus `declared`) in the background, once the app listens, until
/// `shutdown`.
pub fn serve_app(
    runtime: Runtime,
    channel: AppChannel,
    declared: Vec<AppSubscription>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if !wait_for_app(&channel, &shutdown).await {
            return;
        }
        let Some(sinks) = Sinks::connect(&channel).await else {
            return;
        };
        let mut all = sinks.ask_app(&channel).await;
        all.extend(declared);
        for subscription in all {
            let route = sinks.route(&channel, &subscription.route);
            let delivery = TopicDelivery {
                pubsub_name: subscription.pubsub_name.clone(),
                topic: subscription.topic.clone(),
                dead_letter_topic: subscription.dead_letter_topic.clone(),
            };
            match delivery
                .start(
                    &runtime,
                    route,
                    subscription.metadata.clone(),
                    shutdown.clone(),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(pubsub = %subscription.pubsub_name, topic = %subscription.topic, route = %subscription.route, "App subscribed.")
                }
                Err(err) => {
                    tracing::warn!(pubsub = %subscription.pubsub_name, topic = %subscription.topic, error = %err, "App subscription refused.")
                }
            }
        }
    })
}

/// The app's client, by protocol.
enum Sinks {
    Http(reqwest::Client),
    Grpc(tonic::transport::Channel),
}

impl Sinks {
    async fn connect(channel: &AppChannel) -> Option<Self> {
        match channel.protocol {
            AppProtocol::Http => match reqwest::Client::builder().timeout(APP_CALL_TIMEOUT).build()
            {
                Ok(client) => Some(Self::Http(client)),
                Err(err) => {
                    tracing::error!(error = %err, "Cannot build the app's HTTP client.");
                    None
                }
            },
            AppProtocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(channel.url("")).map(|e| {
                    e.timeout(APP_CALL_TIMEOUT)
                        .connect_timeout(APP_CALL_TIMEOUT)
                });
                match endpoint {
                    Ok(endpoint) => Some(Self::Grpc(endpoint.connect_lazy())),
                    Err(err) => {
                        tracing::error!(error = %err, app = %channel.address, "Cannot address the app over gRPC.");
                        None
                    }
                }
            }
        }
    }

    async fn ask_app(&self, channel: &AppChannel) -> Vec<AppSubscription> {
        match self {
            Self::Http(client) => subscriptions::ask_app(client, channel).await,
            Self::Grpc(grpc) => grpc_route::ask_app(grpc.clone()).await,
        }
    }

    fn route(&self, channel: &AppChannel, route: &str) -> Arc<dyn crate::dapr::EventSink> {
        match self {
            Self::Http(client) => Arc::new(HttpRoute::new(client.clone(), channel.url(route))),
            Self::Grpc(grpc) => Arc::new(GrpcRoute::new(grpc.clone(), route.to_string())),
        }
    }
}
