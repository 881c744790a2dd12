//! The configuration subscriptions open on this server: each has an id the
//! client can unsubscribe with, and a task forwarding its changes to the
//! client's stream until it is unsubscribed, the client goes away, the store
//! is removed, or the server shuts down.
//!
//! Ids are unguessable and bound to the connection that subscribed: only
//! that connection can unsubscribe (another caller is told the id does not
//! exist). A subscriber's queue is bounded in bytes (`max_response_bytes`)
//! and in messages, and all queues together in bytes (16 times that, shared
//! with Layotto's configuration streams); a subscriber that falls behind is
//! dropped with its reason, and when all queues together are full the one
//! holding the most is dropped (`subscription_queue`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use super::subscription_forward::Forward;
use super::subscription_queue::{queue, QueuedBytes};
use crate::metrics::ApiMetrics;
use rewire_runtime::ConfigSubscription;

pub use super::subscription_queue::SubscriptionStream;

/// All subscribers together may have this many times the per-subscriber
/// limit queued.
const TOTAL_PER_SUBSCRIBER_LIMIT: usize = 16;

/// The open subscriptions, by id.
#[derive(Clone)]
pub(super) struct Subscriptions {
    inner: Arc<Inner>,
}

struct Inner {
    next: AtomicU64,
    ids: std::collections::hash_map::RandomState,
    open: Mutex<HashMap<String, Open>>,
    shutdown: CancellationToken,
    limit: usize,
    total: QueuedBytes,
    metrics: Arc<ApiMetrics>,
}

struct Open {
    store: String,
    owner: Option<SocketAddr>,
    cancel: CancellationToken,
}

/// Why an unsubscribe did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum UnsubscribeError {
    /// No open subscription of the caller's connection has that id.
    #[error("subscription `{0}` does not exist")]
    Unknown(String),
    /// The subscription is on another store.
    #[error("subscription `{id}` is not on configuration store `{store}`")]
    OtherStore {
        /// The subscription.
        id: String,
        /// The store named by the caller.
        store: String,
    },
}

impl Subscriptions {
    /// No subscription yet; all of them end when `shutdown` is cancelled; a
    /// subscriber may have `limit` bytes queued (drops are counted in
    /// `metrics`).
    pub(super) fn new(shutdown: CancellationToken, limit: usize, metrics: Arc<ApiMetrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                next: AtomicU64::new(0),
                ids: std::collections::hash_map::RandomState::new(),
                open: Mutex::new(HashMap::new()),
                shutdown,
                limit,
                total: QueuedBytes::new(limit.saturating_mul(TOTAL_PER_SUBSCRIBER_LIMIT)),
                metrics,
            }),
        }
    }

    /// Opens a stream for `subscription` on `store`, owned by the
    /// connection `owner`: its first message carries only the subscription
    /// id, then one message per change.
    pub(super) fn open(
        &self,
        store: &str,
        subscription: ConfigSubscription,
        owner: Option<SocketAddr>,
    ) -> SubscriptionStream {
        let id = format!("{store}-{}", self.unguessable());
        let cancel = self.inner.shutdown.child_token();
        let open = Open {
            store: store.to_string(),
            owner,
            cancel: cancel.clone(),
        };
        self.lock().insert(id.clone(), open);
        let label = format!("subscription `{id}`");
        let (sender, stream) = queue(label, self.inner.limit, self.inner.total.clone());
        let first = SubscribeConfigurationResponse {
            id: id.clone(),
            items: HashMap::new(),
        };
        // The queue is new and empty: the first message fits (room is
        // made in the total if need be).
        let _ = sender.try_send(Ok(first), id.len());
        let forward = Forward {
            id: id.clone(),
            store: store.to_string(),
            subscription,
            sender,
            cancel,
        };
        let subscriptions = self.clone();
        tokio::spawn(async move {
            if forward.run().await {
                subscriptions.count_dropped();
            }
            subscriptions.forget(&id);
        });
        stream
    }

    /// 128 bits no caller can predict (SipHash keyed by the OS's random
    /// source, over a counter).
    fn unguessable(&self) -> String {
        let number = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let half = |salt: u64| {
            let mut hasher = self.inner.ids.build_hasher();
            hasher.write_u64(number);
            hasher.write_u64(salt);
            hasher.finish()
        };
        format!("{:016x}{:016x}", half(1), half(2))
    }

    /// Ends subscription `id` for the connection `caller`; when `store` is
    /// not empty it must be the subscription's store.
    pub(super) fn close(
        &self,
        store: &str,
        id: &str,
        caller: Option<SocketAddr>,
    ) -> Result<(), UnsubscribeError> {
        let mut open = self.lock();
        match open.get(id) {
            Some(o) if o.owner != caller => return Err(UnsubscribeError::Unknown(id.to_string())),
            None => return Err(UnsubscribeError::Unknown(id.to_string())),
            Some(o) if !store.is_empty() && o.store != store => {
                return Err(UnsubscribeError::OtherStore {
                    id: id.to_string(),
                    store: store.to_string(),
                })
            }
            Some(_) => {}
        }
        if let Some(o) = open.remove(id) {
            o.cancel.cancel();
        }
        Ok(())
    }

    /// The bytes queued for all subscribers, which Layotto's configuration
    /// streams count into too.
    pub(super) fn total(&self) -> QueuedBytes {
        self.inner.total.clone()
    }

    /// How many subscriptions are open.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Forgets subscription `id` (its stream has ended).
    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Counts one subscriber dropped for falling behind.
    fn count_dropped(&self) {
        self.inner.metrics.subscriber_dropped();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Open>> {
        self.inner.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::{ConfigChange, ConfigItem};
    use tokio::sync::mpsc;
    use tokio_stream::StreamExt;
    use tonic::Status;

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

    #[tokio::test]
    async fn first_message_is_the_id_then_changes_until_closed() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
        );
        let (changes, subscription) = subscription();
        let mut stream = subscriptions.open("config", subscription, None);
        let first = stream
            .next()
            .await
            .and_then(Result::ok)
            .expect("first message");
        assert!(first.items.is_empty());
        let item = ConfigItem {
            key: "k".into(),
            value: "v".into(),
            ..ConfigItem::default()
        };
        changes
            .send(ConfigChange { items: vec![item] })
            .await
            .expect("send");
        let update = testkit::soon("the stream's next message", stream.next())
            .await
            .and_then(Result::ok)
            .expect("update");
        assert_eq!(
            (update.id.as_str(), update.items["k"].value.as_str()),
            (first.id.as_str(), "v")
        );
        assert_eq!(
            subscriptions.close("other", &first.id, None),
            Err(UnsubscribeError::OtherStore {
                id: first.id.clone(),
                store: "other".into()
            })
        );
        assert_eq!(subscriptions.close("config", &first.id, None), Ok(()));
        assert!(
            testkit::soon("the stream's next message", stream.next())
                .await
                .is_none(),
            "the stream ends"
        );
        assert_eq!(subscriptions.len(), 0);
        assert_eq!(
            subscriptions.close("config", &first.id, None),
            Err(UnsubscribeError::Unknown(first.id))
        );
    }

    #[tokio::test]
    async fn shutdown_ends_every_stream() {
        let shutdown = CancellationToken::new();
        let subscriptions =
            Subscriptions::new(shutdown.clone(), 1 << 20, Arc::new(ApiMetrics::new()));
        let (_changes, subscription) = subscription();
        let mut stream = subscriptions.open("config", subscription, None);
        assert!(testkit::soon("the stream's next message", stream.next())
            .await
            .is_some());
        shutdown.cancel();
        assert!(testkit::soon("the stream's next message", stream.next())
            .await
            .is_none());
    }

    #[tokio::test]
    async fn ids_are_unguessable_and_only_their_connection_closes_them() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
        );
        let owner: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let other: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let (_a, first) = subscription();
        let (_b, second) = subscription();
        let mut one = subscriptions.open("config", first, Some(owner));
        let mut two = subscriptions.open("config", second, Some(owner));
        let id = |m: Option<Result<SubscribeConfigurationResponse, Status>>| {
            m.and_then(Result::ok).expect("first message").id
        };
        let (id1, id2) = (id(one.next().await), id(two.next().await));
        assert_ne!(id1, id2);
        assert!(id1.len() >= "config-".len() + 32, "{id1}");
        assert_eq!(
            subscriptions.close("config", &id1, Some(other)),
            Err(UnsubscribeError::Unknown(id1.clone()))
        );
        assert_eq!(
            subscriptions.close("config", &id1, None),
            Err(UnsubscribeError::Unknown(id1.clone()))
        );
        assert_eq!(subscriptions.close("config", &id1, Some(owner)), Ok(()));
    }

    #[tokio::test]
    async fn a_subscriber_behind_by_more_bytes_than_the_limit_is_dropped_with_the_reason() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            10_000,
            Arc::new(ApiMetrics::new()),
        );
        let (changes, subscription) = subscription();
        let mut stream = subscriptions.open("config", subscription, None);
        let big = |n: usize| ConfigChange {
            items: vec![ConfigItem {
                key: "k".into(),
                value: "x".repeat(n),
                ..ConfigItem::default()
            }],
        };
        assert!(
            testkit::soon("the stream's next message", stream.next())
                .await
                .is_some(),
            "the id"
        );
        // Two changes of 6 KB each, unread: the second does not fit 10 KB.
        for _ in 0..2 {
            changes.send(big(6_000)).await.expect("send");
        }
        // Wait for the drop itself before reading anything.
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while subscriptions.len() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the slow subscriber is dropped");
        let mut messages = Vec::new();
        while let Some(message) = testkit::soon("the stream's next message", stream.next()).await {
            messages.push(message);
        }
        let reason = messages.pop().expect("a reason").expect_err("dropped");
        assert_eq!(reason.code(), tonic::Code::ResourceExhausted);
        assert!(
            reason.message().contains("10000 bytes"),
            "{}",
            reason.message()
        );
        assert!(messages.is_empty(), "its unread change was discarded");
        assert_eq!(subscriptions.len(), 0);
    }
}
