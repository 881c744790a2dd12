//! Configuration updates pushed to the app (Dapr's HTTP configuration
//! subscriptions: `GET /v1.0/configuration/{store}/subscribe`): each change
//! of a subscription is `POST`ed to the app at `/configuration/{store}/{key}`,
//! once per item key, the body being the whole change as Dapr sends it
//! (`{"id": "...", "items": {"key": {"value", "version", "metadata"}}}`).
//!
//! A subscription follows its store across reloads (it is made through the
//! runtime's handle), and uses the gRPC subscriptions' machinery: a task
//! takes each change as it comes and queues it without waiting, in a queue
//! bounded in bytes (`max_response_bytes`) and messages, all queues together
//! in bytes (16 times that; when full, the subscriber holding the most is
//! dropped). Each subscription posts from its own task, one `POST` at a
//! time, each bounded by [`APP_CALL_TIMEOUT`](super::APP_CALL_TIMEOUT): an
//! app that answers slowly holds up its own subscriptions only, and is
//! dropped once it falls behind. A failed `POST` (no answer, or not `200`)
//! is logged and not retried, as in Dapr.
//!
//! A subscription ends when it is unsubscribed, when its store is removed,
//! when it is dropped for falling behind, or when the sidecar stops. At most
//! [`MAX_SUBSCRIPTIONS`] are open at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use reqwest::StatusCode;
use serde::Serialize;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::routed::AppTarget;
use super::AppChannel;
use crate::grpc::open_subscriptions::{Booking, OpenSubscriptions, Started};
use crate::grpc::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use crate::grpc::subscription_forward::Forward;
use crate::grpc::subscription_queue::{queue, QueuedBytes};
use crate::metrics::ApiMetrics;
use rewire_runtime::ConfigSubscription;

/// Why an unsubscribe did nothing (as over gRPC).
pub use crate::grpc::open_subscriptions::UnsubscribeError as CloseError;

/// Configuration subscriptions open over HTTP at once, at most.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// The configuration subscriptions whose updates go to the app.
#[derive(Clone)]
pub struct ConfigUpdates {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None`: the app is not spoken to over HTTP (or has no client).
    app: Option<(reqwest::Client, AppChannel)>,
    /// HTTP has no connection to own a subscription: any caller with the
    /// id may close it.
    open: OpenSubscriptions,
    limit: usize,
    total: QueuedBytes,
    metrics: Arc<ApiMetrics>,
}

/// Why a subscription was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// No app channel, or not an HTTP one.
    #[error("app channel is not initialized. cannot subscribe to configuration updates")]
    NoAppChannel,
    /// As many subscriptions as allowed are open.
    #[error("{0} configuration subscriptions are open over HTTP, the most allowed; unsubscribe one first")]
    TooMany(usize),
}

/// A change as Dapr posts it to the app.
#[derive(Debug, Serialize)]
struct UpdateEvent<'a> {
    id: &'a str,
    items: BTreeMap<&'a str, Item<'a>>,
}

/// One item of a change (Dapr omits what is empty).
#[derive(Debug, Serialize)]
struct Item<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    value: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    metadata: &'a HashMap<String, String>,
}

impl ConfigUpdates {
    /// Updates posted to `app` (none: every subscribe is refused with
    /// [`OpenError::NoAppChannel`]); all subscriptions end when `shutdown`
    /// is cancelled; a subscriber may have `limit` bytes queued (drops are
    /// counted in `metrics`).
    pub fn new(
        app: Option<&AppChannel>,
        shutdown: CancellationToken,
        limit: usize,
        metrics: Arc<ApiMetrics>,
    ) -> Self {
        Self::with_max(app, shutdown, limit, metrics, MAX_SUBSCRIPTIONS)
    }

    /// The same, with at most `max_subscriptions` open.
    fn with_max(
        app: Option<&AppChannel>,
        shutdown: CancellationToken,
        limit: usize,
        metrics: Arc<ApiMetrics>,
        max_subscriptions: usize,
    ) -> Self {
        crate::tls::install_ring_provider();
        let app = app.and_then(|channel| match AppTarget::connect(channel)? {
            AppTarget::Http { client, channel } => Some((client, channel)),
            AppTarget::Grpc(_) => None,
        });
        Self {
            inner: Arc::new(Inner {
                app,
                open: OpenSubscriptions::new(shutdown, max_subscriptions),
                limit,
                total: QueuedBytes::for_subscribers(limit),
                metrics,
            }),
        }
    }

    /// Whether updates can be posted to the app (an HTTP app channel).
    pub fn has_app(&self) -> bool {
        self.inner.app.is_some()
    }

    /// Posts the changes of `subscription` on `store` to the app until it
    /// ends; its id (booked, then started).
    pub fn open(&self, store: &str, subscription: ConfigSubscription) -> Result<String, OpenError> {
        Ok(self.book(store)?.start(subscription))
    }

    /// Books a place for a subscription on `store` before the store is
    /// asked (a client looping at the cap costs no store read or watch);
    /// given back unless started.
    pub fn book(&self, store: &str) -> Result<BookedUpdates, OpenError> {
        let Some((client, channel)) = self.inner.app.clone() else {
            return Err(OpenError::NoAppChannel);
        };
        let booking = self
            .inner
            .open
            .add(store, None)
            .map_err(|full| OpenError::TooMany(full.0))?;
        Ok(BookedUpdates {
            updates: self.clone(),
            booking,
            client,
            channel,
        })
    }

    /// Ends subscription `id`; when `store` is not empty it must be the
    /// subscription's store.
    pub fn close(&self, store: &str, id: &str) -> Result<(), CloseError> {
        self.inner.open.close(store, id, None)
    }

    /// How many subscriptions are open.
    pub fn len(&self) -> usize {
        self.inner.open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A place booked among the open subscriptions, given back when dropped
/// unless its subscription was started (the [`Booking`] gives it back).
pub struct BookedUpdates {
    updates: ConfigUpdates,
    booking: Booking,
    client: reqwest::Client,
    channel: AppChannel,
}

impl BookedUpdates {
    /// Posts the changes of `subscription` to the app until it ends, in
    /// the place booked (given back when it ends); its id.
    pub fn start(self, subscription: ConfigSubscription) -> String {
        let Started {
            id,
            store,
            cancel,
            place,
        } = self.booking.started();
        let (client, channel) = (self.client, self.channel);
        let updates = self.updates;
        let label = format!("subscription `{id}`");
        let (sender, mut stream) = queue::<SubscribeConfigurationResponse>(
            label,
            updates.inner.limit,
            updates.inner.total.clone(),
        );
        let forward = Forward {
            id: id.clone(),
            store: store.clone(),
            subscription,
            sender,
            cancel: cancel.clone(),
        };
        let poster = Poster {
            client,
            channel,
            store: store.clone(),
            id: id.clone(),
        };
        tokio::spawn(async move {
            let posting = async move {
                loop {
                    let next = tokio::select! {
                        () = cancel.cancelled() => break,
                        next = stream.next() => next,
                    };
                    match next {
                        Some(Ok(change)) => {
                            tokio::select! {
                                () = cancel.cancelled() => break,
                                () = poster.post(&change) => {}
                            }
                        }
                        Some(Err(reason)) => {
                            tracing::warn!(subscription = %poster.id, store = %poster.store, reason = %reason.message(), "Configuration subscription ended.");
                            break;
                        }
                        None => break,
                    }
                }
                // The forwarding side learns that nobody reads any more.
                drop(stream);
            };
            let (dropped, ()) = tokio::join!(forward.run(), posting);
            if dropped {
                updates.inner.metrics.subscriber_dropped();
            }
            drop(place);
        });
        id
    }
}

/// Posts one subscription's changes to the app.
struct Poster {
    client: reqwest::Client,
    channel: AppChannel,
    store: String,
    id: String,
}

impl Poster {
    /// One `POST` per item key of `change`, in turn; failures are logged.
    async fn post(&self, change: &SubscribeConfigurationResponse) {
        let event = UpdateEvent {
            id: &change.id,
            items: change
                .items
                .iter()
                .map(|(key, item)| {
                    let shown = Item {
                        value: &item.value,
                        version: &item.version,
                        metadata: &item.metadata,
                    };
                    (key.as_str(), shown)
                })
                .collect(),
        };
        let body = match serde_json::to_vec(&event) {
            Ok(body) => body,
            Err(err) => {
                tracing::error!(subscription = %self.id, error = %err, "Cannot encode a configuration update.");
                return;
            }
        };
        for key in event.items.keys() {
            let Some(url) = self.url(key) else {
                tracing::error!(subscription = %self.id, key = %key, "Cannot address the app for a configuration update.");
                continue;
            };
            let sent = self
                .client
                .post(url.clone())
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(answer) if answer.status() == StatusCode::OK => {}
                Ok(answer) => {
                    tracing::error!(subscription = %self.id, store = %self.store, url = %url, status = answer.status().as_u16(), "The app refused a configuration update; not retried.");
                }
                Err(err) => {
                    tracing::error!(subscription = %self.id, store = %self.store, url = %url, error = %err, "Sending a configuration update to the app failed; not retried.");
                }
            }
        }
    }

    /// `http://APP/configuration/{store}/{key}`, the store and the key
    /// each one segment, what a URL path cannot carry percent-encoded: a
    /// key `../../admin/reset` or `a/b` stays beneath `configuration/`.
    /// None for a store or key `.` or `..`, which no URL path carries as
    /// a segment (even percent-encoded, it is resolved).
    fn url(&self, key: &str) -> Option<reqwest::Url> {
        let dots = |segment: &str| matches!(segment, "." | "..");
        if dots(&self.store) || dots(key) {
            return None;
        }
        let mut url = reqwest::Url::parse(&self.channel.url("")).ok()?;
        url.path_segments_mut()
            .ok()?
            .clear()
            .push("configuration")
            .push(&self.store)
            .push(key);
        Some(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::ConfigChange;
    use tokio::sync::mpsc;

    fn subscription() -> (mpsc::Sender<ConfigChange>, ConfigSubscription) {
        let (sender, changes) = mpsc::channel(4);
        (
            sender,
            ConfigSubscription {
                id: "1".into(),
                changes,
            },
        )
    }

    fn updates(app: Option<&AppChannel>) -> ConfigUpdates {
        ConfigUpdates::new(
            app,
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
        )
    }

    #[tokio::test]
    async fn no_http_app_refuses_subscriptions() {
        let (_tx, sub) = subscription();
        assert_eq!(
            updates(None).open("config", sub).err(),
            Some(OpenError::NoAppChannel)
        );
        let grpc = AppChannel::local(1).with_protocol(super::super::AppProtocol::Grpc);
        let (_tx, sub) = subscription();
        assert_eq!(
            updates(Some(&grpc)).open("config", sub).err(),
            Some(OpenError::NoAppChannel)
        );
    }

    #[tokio::test]
    async fn subscriptions_are_bounded_in_number_and_closed_by_id_and_store() {
        let updates = ConfigUpdates::with_max(
            Some(&AppChannel::local(1)),
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
            2,
        );
        let (_a, first) = subscription();
        let (_b, second) = subscription();
        let (_c, third) = subscription();
        let one = updates.open("config", first).expect("first");
        let two = updates.open("config", second).expect("second");
        assert_ne!(one, two);
        assert!(one.len() >= "config-".len() + 32, "{one}");
        assert_eq!(
            updates.open("config", third).err(),
            Some(OpenError::TooMany(2))
        );
        assert_eq!(
            updates.close("other", &one),
            Err(CloseError::OtherStore {
                id: one.clone(),
                store: "other".into()
            })
        );
        assert_eq!(updates.close("config", &one), Ok(()));
        assert_eq!(
            updates.close("config", &one),
            Err(CloseError::Unknown(one.clone()))
        );
        assert_eq!(updates.len(), 1);
        let (_d, fourth) = subscription();
        assert!(updates.open("config", fourth).is_ok(), "room again");
    }

    /// A place is booked before the store is asked (at the bound, a
    /// subscribe costs no store read), and given back when the store
    /// refuses (the booking dropped unstarted).
    #[tokio::test]
    async fn a_place_is_booked_before_the_store_is_asked_and_given_back_unless_started() {
        let updates = ConfigUpdates::with_max(
            Some(&AppChannel::local(1)),
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
            1,
        );
        let booked = updates.book("config").expect("room");
        assert_eq!(updates.book("config").err(), Some(OpenError::TooMany(1)));
        drop(booked);
        assert!(updates.is_empty(), "given back");
        let (_tx, sub) = subscription();
        let id = updates.book("config").expect("room again").start(sub);
        assert!(id.starts_with("config-"), "{id}");
        assert_eq!(updates.len(), 1, "kept once started");
    }

    #[tokio::test]
    async fn a_subscription_whose_store_goes_away_is_forgotten() {
        let updates = updates(Some(&AppChannel::local(1)));
        let (changes, sub) = subscription();
        updates.open("config", sub).expect("open");
        drop(changes);
        testkit::soon("the subscription to end", async {
            while !updates.is_empty() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    #[tokio::test]
    async fn shutdown_ends_every_subscription() {
        let shutdown = CancellationToken::new();
        let updates = ConfigUpdates::new(
            Some(&AppChannel::local(1)),
            shutdown.clone(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
        );
        let (_changes, sub) = subscription();
        updates.open("config", sub).expect("open");
        assert_eq!(updates.len(), 1);
        shutdown.cancel();
        testkit::soon("the subscription to end", async {
            while !updates.is_empty() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    #[test]
    fn keys_are_percent_encoded_in_the_path() {
        crate::tls::install_ring_provider();
        let poster = Poster {
            client: reqwest::Client::new(),
            channel: AppChannel::local(8080),
            store: "config".into(),
            id: "i".into(),
        };
        assert_eq!(
            poster.url("a b?c").map(|u| u.to_string()).as_deref(),
            Some("http://127.0.0.1:8080/configuration/config/a%20b%3Fc")
        );
    }

    /// A key is one segment: `..` and `/` in it do not lead the update to
    /// another of the app's routes.
    #[test]
    fn a_key_stays_one_segment_beneath_configuration() {
        crate::tls::install_ring_provider();
        let poster = Poster {
            client: reqwest::Client::new(),
            channel: AppChannel::local(8080),
            store: "con/fig".into(),
            id: "i".into(),
        };
        let url = |key| poster.url(key).map(|u| u.to_string());
        assert_eq!(
            url("../../admin/reset").as_deref(),
            Some("http://127.0.0.1:8080/configuration/con%2Ffig/..%2F..%2Fadmin%2Freset")
        );
        assert_eq!(
            url("a/b").as_deref(),
            Some("http://127.0.0.1:8080/configuration/con%2Ffig/a%2Fb")
        );
        assert_eq!(url(".."), None);
        assert_eq!(url("."), None);
    }
}
