//! The app channel (`rewire run --app-port P`): the sidecar delivers
//! pub/sub events to the app, as Dapr does.
//!
//! Once the app listens ([`wait_for_app`]), the sidecar asks it for its
//! subscriptions (`GET /dapr/subscribe`), adds the declared ones (the
//! configuration's `subscriptions` section, followed across reloads), and
//! delivers each topic's events as a `POST` of the CloudEvent to the route
//! the subscription's routing rules choose, through the shared delivery
//! engine ([`TopicDelivery`](crate::dapr::TopicDelivery)), which follows
//! the pub/sub across reloads. With [`AppProtocol::Grpc`], the app is
//! Dapr's `AppCallback` service instead: `ListTopicSubscriptions`, then
//! `OnTopicEvent` per event, naming the chosen route as `path`; or
//! Layotto's, when the app serves that one ([`grpc_app`]).
//! Configuration updates of HTTP subscriptions are posted to an HTTP app
//! too ([`config_updates`]).

mod app_calls;
mod callback_call;
pub mod config_updates;
mod follow;
mod grpc_app;
mod grpc_route;
mod http_route;
mod layotto_route;
mod listing;
mod routed;
mod subscriptions;

use std::collections::BTreeSet;
use std::time::Duration;

use rewire_runtime::{Runtime, SecretString};

use crate::dapr::{AppConnection, ProgrammaticSubscriptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use grpc_app::GrpcRoute;
pub use http_route::HttpRoute;
pub use subscriptions::{parse_subscriptions, AppSubscription};

use follow::Deliveries;
use routed::AppTarget;

/// How often the app's port is tried while waiting for it.
const APP_POLL: Duration = Duration::from_millis(200);
/// How long one call to the app may take (an event's delivery: unless
/// its pub/sub's inbound resiliency policy sets another timeout).
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

impl AppProtocol {
    /// Dapr's name of the protocol (`--app-protocol`): `http`, `grpc`.
    pub fn dapr_name(self) -> &'static str {
        match self {
            AppProtocol::Http => "http",
            AppProtocol::Grpc => "grpc",
        }
    }
}

/// Where the app listens and how it is spoken to; its clones share the
/// subscriptions [`serve_app`] took from the app ([`AppChannel::listed`]).
#[derive(Debug, Clone)]
pub struct AppChannel {
    /// `host:port` of the app.
    pub address: String,
    /// How it is called.
    pub protocol: AppProtocol,
    /// Sent on every call to the app when set (Dapr's `APP_API_TOKEN`,
    /// as `dapr-api-token`), so it can tell the sidecar's calls apart.
    /// Never printed.
    app_token: Option<SecretString>,
    listed: ProgrammaticSubscriptions,
}

/// Two channels are equal when they reach the same app the same way.
impl PartialEq for AppChannel {
    fn eq(&self, other: &Self) -> bool {
        self.address == other.address && self.protocol == other.protocol
    }
}

impl Eq for AppChannel {}

impl AppChannel {
    /// The app on `port` of the loopback interface, over HTTP.
    pub fn local(port: u16) -> Self {
        Self {
            address: format!("127.0.0.1:{port}"),
            protocol: AppProtocol::Http,
            app_token: None,
            listed: ProgrammaticSubscriptions::default(),
        }
    }

    /// The subscriptions [`serve_app`] took from the app (and was given in
    /// code) over this channel or a clone of it, by id.
    pub fn listed(&self) -> &ProgrammaticSubscriptions {
        &self.listed
    }

    /// How this channel reaches the app, for the metadata.
    pub fn connection(&self) -> AppConnection {
        listing::connection(self)
    }

    /// The same app, called with `protocol`.
    pub fn with_protocol(self, protocol: AppProtocol) -> Self {
        Self { protocol, ..self }
    }

    /// The same app, with `token` sent on every call to it as Dapr sends
    /// `APP_API_TOKEN`: the `dapr-api-token` header (HTTP) or metadata
    /// (gRPC); none: no token sent.
    pub fn with_app_token(self, token: Option<SecretString>) -> Self {
        Self {
            app_token: token,
            ..self
        }
    }

    /// The token sent on every call to the app ([`Self::with_app_token`]).
    pub(crate) fn app_token(&self) -> Option<&SecretString> {
        self.app_token.as_ref()
    }

    fn url(&self, path: &str) -> String {
        let path = path.trim_start_matches('/');
        format!("http://{}/{path}", self.address)
    }
}

/// How long one try of whether the app takes connections waits for its
/// port to answer (an address that drops what is sent to it, never
/// refusing, would hold a try for the system's ~2 minutes).
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// Whether something takes TCP connections at `address` (`host:port`)
/// now: a connection made within [`PROBE_WITHIN`], and let go.
pub(super) async fn takes_connections(address: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(address);
    matches!(tokio::time::timeout(PROBE_WITHIN, connect).await, Ok(Ok(_)))
}

/// Waits until the app accepts connections on its port (or `shutdown`),
/// each try bounded ([`takes_connections`]).
pub async fn wait_for_app(channel: &AppChannel, shutdown: &CancellationToken) -> bool {
    let mut logged = false;
    loop {
        let listening = tokio::select! {
            () = shutdown.cancelled() => return false,
            listening = takes_connections(&channel.address) => listening,
        };
        if listening {
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

/// Delivers the app's subscriptions in the background, once the app
/// listens, until `shutdown`: its own (from `GET /dapr/subscribe` or
/// `ListTopicSubscriptions`, asked until answered, with backoff, for a
/// while: then fixed), `given` (in code), and the
/// declared ones of the configuration's `subscriptions` section, followed
/// across reloads ([`follow`]).
///
/// Pass a clone of the channel given in
/// [`ApiOptions::app_channel`](crate::ApiOptions::app_channel): clones
/// share the list of subscriptions taken from the app, which the
/// metadata APIs show; another channel built for the same port does not.
pub fn serve_app(
    runtime: Runtime,
    channel: AppChannel,
    given: Vec<AppSubscription>,
    shutdown: CancellationToken,
) -> AppService {
    let (subscribed_tx, subscribed) = watch::channel(BTreeSet::new());
    let task = tokio::spawn(async move {
        if !wait_for_app(&channel, &shutdown).await {
            return;
        }
        let Some(app) = AppTarget::connect(&channel) else {
            return;
        };
        let own = match &app {
            AppTarget::Http { client, .. } => {
                subscriptions::ask_app(client, &channel, &shutdown).await
            }
            AppTarget::Grpc(app) => grpc_app::ask_app(app, &shutdown).await,
        };
        let Some(own) = own else {
            return;
        };
        let fixed: std::sync::Arc<[_]> = own
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("app#{i}"), s))
            .chain(
                given
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| (format!("given#{i}"), s)),
            )
            .collect();
        channel.listed.set(listing::programmatic(&fixed));
        Deliveries::new(runtime, app, shutdown, subscribed_tx)
            .follow(fixed)
            .await;
        channel.listed.set(std::sync::Arc::new([]));
    });
    AppService { task, subscribed }
}

/// The app's deliveries running in the background ([`serve_app`]).
pub struct AppService {
    /// Ends at shutdown (or when the app cannot be reached at all).
    pub task: tokio::task::JoinHandle<()>,
    /// The ids of the subscriptions delivering (`app#N`, `given#N`, or a
    /// declared subscription's name: `declared#NAME` when the name has a
    /// `#`, so it never takes an id of the app's own), told after each
    /// change.
    pub subscribed: watch::Receiver<BTreeSet<String>>,
}
