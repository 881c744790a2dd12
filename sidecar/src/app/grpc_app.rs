//! [`GrpcApp`]: the app over gRPC (`--app-protocol grpc`), which serves
//! Dapr's `dapr.proto.runtime.v1.AppCallback` ([`grpc_route`]) or
//! Layotto's `spec.proto.runtime.v1.AppCallback` ([`layotto_route`]: what
//! Layotto's SDKs register, and only that). Dapr's is called first; a call
//! the app answers `UNIMPLEMENTED` is made again with the other service,
//! and when that one answers (a response, not a timeout or an error), the
//! app is taken to speak it from then on
//! (the clones of one app's [`GrpcApp`] share what was found). So a
//! Layotto app's subscriptions are taken and its events delivered, rather
//! than none listed and each event acknowledged undelivered. A delivery
//! whose call could not connect to the app at all is no answer: the
//! engine waits for the app rather than spend an attempt
//! ([`GrpcApp::deliver_if_reachable`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{DeliveryOutcome, SecretString};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use super::app_calls::{noticing_unconnected, AppCalls, ConnectNoticed, SendsAppToken};
use super::callback_call::Delivered;
use super::subscriptions::{ask_until_answered, Listing, ASK_FOR};
use super::{grpc_route, layotto_route, AppChannel, AppSubscription, APP_CALL_TIMEOUT};
use crate::dapr::{EventSink, TopicEvent};
use crate::grpc::proto::dapr::proto::runtime::v1::app_callback_client::AppCallbackClient as DaprCallback;
use crate::grpc::proto::spec::proto::runtime::v1::app_callback_client::AppCallbackClient as LayottoCallback;

/// Which `AppCallback` service the app serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavour {
    Dapr,
    Layotto,
}

impl Flavour {
    fn other(self) -> Self {
        match self {
            Flavour::Dapr => Flavour::Layotto,
            Flavour::Layotto => Flavour::Dapr,
        }
    }

    fn service(self) -> &'static str {
        match self {
            Flavour::Dapr => "dapr.proto.runtime.v1.AppCallback",
            Flavour::Layotto => "spec.proto.runtime.v1.AppCallback",
        }
    }
}

/// One subscription's deliveries over the app's gRPC channel.
pub struct GrpcRoute {
    app: GrpcApp,
    path: String,
}

impl GrpcRoute {
    /// Delivers over `channel`, naming `path` (the subscription's route),
    /// with no app token: an app that requires one (Dapr's
    /// `APP_API_TOKEN`) refuses every event `UNAUTHENTICATED`, so they are
    /// retried for ever; build it [`with_token`](Self::with_token) then.
    pub fn new(channel: Channel, path: String) -> Self {
        Self {
            app: GrpcApp::new(channel),
            path,
        }
    }

    /// [`new`](Self::new), `token` (when set) sent on every call to the
    /// app as its `dapr-api-token` metadata, marked sensitive, as the
    /// sidecar's own deliveries send `APP_API_TOKEN`. A token that cannot
    /// be metadata (a control character, such as a line feed) is an
    /// error, which does not say it.
    pub fn with_token(
        channel: Channel,
        path: String,
        token: Option<SecretString>,
    ) -> Result<Self, String> {
        let token = token
            .map(|token| AsciiMetadataValue::try_from(token.expose().as_bytes()))
            .transpose()
            .map_err(|_| {
                "GrpcRoute: the app token cannot be sent as gRPC metadata: it must not hold \
                 control characters such as a line feed"
                    .to_string()
            })?;
        Ok(Self {
            app: GrpcApp::with_token(channel, token),
            path,
        })
    }
}

#[tonic::async_trait]
impl EventSink for GrpcRoute {
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome {
        self.app.deliver(&self.path, event, within).await
    }

    async fn send_if_reachable(
        &self,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        self.app
            .deliver_if_reachable(&self.path, event, within)
            .await
    }

    async fn reachable(&self) {
        self.app.reachable().await;
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// The app's two `AppCallback` clients over one channel, and which of them
/// it serves (Dapr's until found otherwise).
#[derive(Clone)]
pub struct GrpcApp {
    dapr: DaprCallback<AppCalls>,
    layotto: LayottoCallback<AppCalls>,
    speaks_layotto: Arc<AtomicBool>,
    /// Where the app listens, waited for when it could not be reached
    /// (unknown for a channel given in code: not waited for).
    listening_on: Option<AppChannel>,
}

impl GrpcApp {
    /// The app behind `channel` (no app token sent).
    pub fn new(channel: Channel) -> Self {
        Self::with_token(channel, None)
    }

    /// The app behind `channel`, `token` sent on every call to it as its
    /// `dapr-api-token` metadata (marked sensitive).
    pub(super) fn with_token(channel: Channel, token: Option<AsciiMetadataValue>) -> Self {
        let token = SendsAppToken(token.map(|mut token| {
            token.set_sensitive(true);
            token
        }));
        let channel = ConnectNoticed(channel);
        Self {
            dapr: DaprCallback::with_interceptor(channel.clone(), token.clone()),
            layotto: LayottoCallback::with_interceptor(channel, token),
            speaks_layotto: Arc::default(),
            listening_on: None,
        }
    }

    /// The same app, listening on `app`'s address: [`Self::reachable`]
    /// waits for its port.
    pub(super) fn listening_on(self, app: AppChannel) -> Self {
        Self {
            listening_on: Some(app),
            ..self
        }
    }

    /// Resolves once the app takes connections on its port again
    /// ([`wait_for_app`](super::wait_for_app)), at once when its address
    /// is not known; its caller bounds it.
    pub(super) async fn reachable(&self) {
        if let Some(app) = &self.listening_on {
            super::wait_for_app(app, &CancellationToken::new()).await;
        }
    }

    /// Whether the app's port takes connections now; false when its
    /// address is not known.
    async fn listens_now(&self) -> bool {
        match &self.listening_on {
            Some(app) => super::takes_connections(&app.address).await,
            None => false,
        }
    }

    /// [`deliver`](Self::deliver), `None` when a call could not connect to
    /// the app at all and nothing answered (so the app cannot have seen
    /// the event: see `EventSink::send_if_reachable`).
    pub(super) async fn deliver_if_reachable(
        &self,
        path: &str,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        let (outcome, not_connected) =
            noticing_unconnected(self.deliver(path, event, within)).await;
        match (outcome, not_connected) {
            (DeliveryOutcome::Retry, true) if self.listens_now().await => {
                // Its port is open, yet the call could not connect (the
                // way there fails): waiting for the port would not mend
                // it, so the send spends an attempt.
                tracing::debug!(id = %crate::dapr::logged(&event.id), "The app's port is open but the call could not connect to it; retried.");
                Some(DeliveryOutcome::Retry)
            }
            (DeliveryOutcome::Retry, true) => {
                tracing::debug!(id = %crate::dapr::logged(&event.id), "The app could not be reached; the event waits for it.");
                None
            }
            (outcome, _) => Some(outcome),
        }
    }

    pub(super) fn flavour(&self) -> Flavour {
        if self.speaks_layotto.load(Ordering::Relaxed) {
            Flavour::Layotto
        } else {
            Flavour::Dapr
        }
    }

    fn speaks(&self, flavour: Flavour) {
        let was = self
            .speaks_layotto
            .swap(flavour == Flavour::Layotto, Ordering::Relaxed);
        if was != (flavour == Flavour::Layotto) {
            tracing::info!(
                service = flavour.service(),
                "The app serves this AppCallback; its events are delivered through it."
            );
        }
    }

    /// Delivers `event` (routed to `path`, which only Dapr's request
    /// names) with the app's `OnTopicEvent`, all within `within`: the
    /// other service's when the app does not implement the one it was
    /// thought to serve. An app implementing neither has the event
    /// acknowledged undelivered, as daprd (and Layotto) do with an
    /// `UNIMPLEMENTED` answer: retrying would not help.
    pub(super) async fn deliver(
        &self,
        path: &str,
        event: &TopicEvent,
        within: Duration,
    ) -> DeliveryOutcome {
        if let Some(outcome) = event.unreadable_over_grpc() {
            return outcome;
        }
        let deadline = Instant::now() + within;
        let first = self.flavour();
        match self.call(first, path, event, within).await {
            Delivered::Answered(outcome) | Delivered::Failed(outcome) => return outcome,
            Delivered::Unimplemented(_) => {}
        }
        let other = first.other();
        let left = deadline.saturating_duration_since(Instant::now());
        match self.call(other, path, event, left).await {
            Delivered::Answered(outcome) => {
                self.speaks(other);
                outcome
            }
            Delivered::Failed(outcome) => outcome,
            Delivered::Unimplemented(message) => {
                tracing::warn!(id = %crate::dapr::logged(&event.id), %message, "The app implements neither Dapr's nor Layotto's OnTopicEvent; the event is acknowledged undelivered.");
                DeliveryOutcome::Success
            }
        }
    }

    async fn call(
        &self,
        flavour: Flavour,
        path: &str,
        event: &TopicEvent,
        within: Duration,
    ) -> Delivered {
        match flavour {
            Flavour::Dapr => grpc_route::on_topic_event(&self.dapr, path, event, within).await,
            Flavour::Layotto => layotto_route::on_topic_event(&self.layotto, event, within).await,
        }
    }

    /// One listing, bounded by `within` per call: Dapr's
    /// `ListTopicSubscriptions`, else (answered `UNIMPLEMENTED`) Layotto's,
    /// whose answer makes the app a Layotto one. Neither implemented: no
    /// programmatic subscriptions, as Dapr.
    pub(super) async fn list_once(&self, within: Duration) -> Listing {
        let unimplemented = match grpc_route::list_once(&self.dapr, within).await {
            Ok(listed) => return Listing::Answered(listed),
            Err(status) if status.code() == tonic::Code::Unimplemented => status,
            Err(status) => return unanswered(&status),
        };
        match layotto_route::list_once(&self.layotto, within).await {
            Ok(listed) => {
                self.speaks(Flavour::Layotto);
                Listing::Answered(listed)
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(message = unimplemented.message(), "The app implements neither Dapr's nor Layotto's ListTopicSubscriptions; it has no programmatic subscriptions.");
                Listing::Answered(Vec::new())
            }
            Err(status) => unanswered(&status),
        }
    }
}

fn unanswered(status: &tonic::Status) -> Listing {
    Listing::Unanswered(format!("{:?}: {}", status.code(), status.message()))
}

/// The app's subscriptions from `ListTopicSubscriptions`, asked with
/// [`ask_until_answered`]: none when the app implements it in neither
/// flavour (as Dapr) or gives no usable answer for [`ASK_FOR`], each call
/// bounded by [`APP_CALL_TIMEOUT`]; `None` once `shutdown` is cancelled.
pub(super) async fn ask_app(
    app: &GrpcApp,
    shutdown: &CancellationToken,
) -> Option<Vec<AppSubscription>> {
    ask_until_answered("ListTopicSubscriptions", ASK_FOR, shutdown, || {
        app.list_once(APP_CALL_TIMEOUT)
    })
    .await
}

#[cfg(test)]
#[path = "grpc_app_tests.rs"]
mod tests;
