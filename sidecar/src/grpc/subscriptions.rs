//! The configuration subscriptions open on this server: each has an id the
//! client can unsubscribe with, and a task forwarding its changes to the
//! client's stream until it is unsubscribed, the client goes away, the store
//! is removed, or the server shuts down.
//!
//! Ids are unguessable: any caller holding one can unsubscribe, from any
//! connection (as in Dapr; a pooled channel spreads a client's calls over
//! several). A subscriber's queue is bounded in bytes (`max_response_bytes`)
//! and in messages, and all queues together in bytes (16 times that, shared
//! with Layotto's configuration streams); a subscriber that falls behind is
//! dropped with its reason, and when all queues together are full the one
//! holding the most is dropped (`subscription_queue`); a change tonic has
//! taken counts there until it asks for the next, and is charged to the
//! connection's reply budget until the server has sent it
//! (`connection::count_requests`). At most 4,096 are open at once
//! (`open_subscriptions`, which the HTTP subscriptions use too).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::open_subscriptions::{Booking, OpenSubscriptions, Started};
use super::proto::dapr::proto::runtime::v1::SubscribeConfigurationResponse;
use super::subscription_forward::{id_bytes, Forward};
use super::subscription_queue::{queue, QueuedBytes};
use crate::metrics::ApiMetrics;
use rewire_runtime::ConfigSubscription;

pub(super) use super::open_subscriptions::UnsubscribeError;
pub use super::subscription_queue::SubscriptionStream;

/// Configuration subscriptions open over gRPC at once, at most.
const MAX_SUBSCRIPTIONS: usize = 4096;

/// The open subscriptions, by id.
#[derive(Clone)]
pub(super) struct Subscriptions {
    inner: Arc<Inner>,
}

struct Inner {
    open: OpenSubscriptions,
    limit: usize,
    total: QueuedBytes,
    metrics: Arc<ApiMetrics>,
}

impl Subscriptions {
    /// No subscription yet; all of them end when `shutdown` is cancelled; a
    /// subscriber may have `limit` bytes queued (drops are counted in
    /// `metrics`).
    pub(super) fn new(shutdown: CancellationToken, limit: usize, metrics: Arc<ApiMetrics>) -> Self {
        Self::with_max(shutdown, limit, metrics, MAX_SUBSCRIPTIONS)
    }

    /// The same, with at most `max` open at once.
    pub(super) fn with_max(
        shutdown: CancellationToken,
        limit: usize,
        metrics: Arc<ApiMetrics>,
        max: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                open: OpenSubscriptions::new(shutdown, max),
                limit,
                total: QueuedBytes::for_subscribers(limit),
                metrics,
            }),
        }
    }

    /// Books a place for a subscription on `store`, owned by the
    /// connection `owner`, before the store is asked (a client looping at
    /// the cap costs no store read or watch); given back unless started.
    /// Refused when as many as allowed are open.
    pub(super) fn book(&self, store: &str, owner: Option<SocketAddr>) -> Result<Booked, Status> {
        let booking = self.inner.open.add(store, owner).map_err(|full| {
            Status::resource_exhausted(format!(
                "{} configuration subscriptions are open over gRPC, the most allowed; unsubscribe one first",
                full.0
            ))
        })?;
        Ok(Booked {
            subscriptions: self.clone(),
            booking,
        })
    }

    /// Opens a stream for `subscription` on `store`, owned by the
    /// connection `owner` (booked, then started).
    #[cfg(test)]
    pub(super) fn open(
        &self,
        store: &str,
        subscription: ConfigSubscription,
        owner: Option<SocketAddr>,
    ) -> Result<SubscriptionStream, Status> {
        Ok(self.book(store, owner)?.start(subscription))
    }

    /// Ends subscription `id`, asked by the connection `caller` (any may);
    /// when `store` is not empty it must be the subscription's store.
    pub(super) fn close(
        &self,
        store: &str,
        id: &str,
        caller: Option<SocketAddr>,
    ) -> Result<(), UnsubscribeError> {
        self.inner.open.close(store, id, caller)
    }

    /// The bytes queued for all subscribers, which Layotto's configuration
    /// streams count into too.
    pub(super) fn total(&self) -> QueuedBytes {
        self.inner.total.clone()
    }

    /// How many subscriptions are open.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.inner.open.len()
    }
}

/// A place booked among the open subscriptions, given back when dropped
/// unless its subscription was started (the [`Booking`] gives it back).
pub(super) struct Booked {
    subscriptions: Subscriptions,
    booking: Booking,
}

impl Booked {
    /// Starts a stream for `subscription` in the place booked: its first
    /// message carries only the subscription id, then one message per
    /// change. The place is given back when the stream's task ends.
    pub(super) fn start(self, subscription: ConfigSubscription) -> SubscriptionStream {
        let Started {
            id,
            store,
            cancel,
            place,
        } = self.booking.started();
        let inner = &self.subscriptions.inner;
        let label = format!("subscription `{id}`");
        let (sender, stream) = queue(label, inner.limit, inner.total.clone());
        let first = SubscribeConfigurationResponse {
            id: id.clone(),
            items: HashMap::new(),
        };
        // The queue is new and empty: the first message fits (room is
        // made in the total if need be).
        let _ = sender.try_send(Ok(first), id_bytes(&id));
        let forward = Forward {
            id,
            store,
            subscription,
            sender,
            cancel,
        };
        let subscriptions = self.subscriptions;
        tokio::spawn(async move {
            if forward.run().await {
                subscriptions.inner.metrics.subscriber_dropped();
            }
            drop(place);
        });
        stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::proto::dapr::proto::common::v1::ConfigurationItem as DaprItem;
    use prost::Message as _;
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
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
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
    async fn one_subscription_past_the_bound_is_refused_naming_it_and_a_close_makes_room() {
        let subscriptions = Subscriptions::with_max(
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
            1,
        );
        let (_a, first) = subscription();
        let (_b, second) = subscription();
        let (_c, third) = subscription();
        let mut stream = subscriptions
            .open("config", first, None)
            .expect("the first");
        let refused = subscriptions
            .open("config", second, None)
            .err()
            .expect("one past the bound");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .message()
                .contains("1 configuration subscriptions are open"),
            "{}",
            refused.message()
        );
        let id = stream
            .next()
            .await
            .and_then(Result::ok)
            .expect("first message")
            .id;
        assert_eq!(subscriptions.close("config", &id, None), Ok(()));
        assert!(
            subscriptions.open("config", third, None).is_ok(),
            "room again"
        );
    }

    /// A place is booked before the store is asked (at the bound, a
    /// subscribe costs no store read), and given back when the store
    /// refuses (the booking dropped unstarted).
    #[tokio::test]
    async fn a_place_is_booked_before_the_store_is_asked_and_given_back_unless_started() {
        let subscriptions = Subscriptions::with_max(
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
            1,
        );
        let booked = subscriptions.book("config", None).expect("room");
        let refused = subscriptions.book("config", None).err();
        assert_eq!(
            refused.map(|status| status.code()),
            Some(tonic::Code::ResourceExhausted)
        );
        drop(booked);
        assert_eq!(subscriptions.len(), 0, "given back");
        let (_changes, subscription) = subscription();
        let booked = subscriptions.book("config", None).expect("room again");
        let _stream = booked.start(subscription);
        assert_eq!(subscriptions.len(), 1, "kept once started");
    }

    #[tokio::test]
    async fn shutdown_ends_every_stream() {
        let shutdown = CancellationToken::new();
        let subscriptions =
            Subscriptions::new(shutdown.clone(), 1 << 20, Arc::new(ApiMetrics::new()));
        let (_changes, subscription) = subscription();
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
        assert!(testkit::soon("the stream's next message", stream.next())
            .await
            .is_some());
        shutdown.cancel();
        assert!(testkit::soon("the stream's next message", stream.next())
            .await
            .is_none());
    }

    #[tokio::test]
    async fn ids_are_unguessable_and_any_connection_closes_them() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            1 << 20,
            Arc::new(ApiMetrics::new()),
        );
        let owner: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let other: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let (_a, first) = subscription();
        let (_b, second) = subscription();
        let mut one = subscriptions
            .open("config", first, Some(owner))
            .expect("open");
        let mut two = subscriptions
            .open("config", second, Some(owner))
            .expect("open");
        let id = |m: Option<Result<SubscribeConfigurationResponse, Status>>| {
            m.and_then(Result::ok).expect("first message").id
        };
        let (id1, id2) = (id(one.next().await), id(two.next().await));
        assert_ne!(id1, id2);
        assert!(id1.len() >= "config-".len() + 32, "{id1}");
        assert_eq!(subscriptions.close("config", &id1, Some(other)), Ok(()));
        assert!(
            testkit::soon("the stream's next message", one.next())
                .await
                .is_none(),
            "the stream ends"
        );
        assert_eq!(
            subscriptions.close("config", &id1, Some(owner)),
            Err(UnsubscribeError::Unknown(id1))
        );
        assert_eq!(subscriptions.close("config", &id2, None), Ok(()));
    }

    /// A change larger than one message may be (a reload's catch-up sends
    /// every differing item as one) is delivered in several messages, each
    /// within the limit, and the subscription stays open; only an item
    /// larger than the limit alone drops the subscriber (failed before the
    /// fix: dropped, "a change of 12… bytes is larger than the limit").
    #[tokio::test]
    async fn a_change_larger_than_one_message_is_delivered_in_several() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            10_000,
            Arc::new(ApiMetrics::new()),
        );
        let (changes, subscription) = subscription();
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
        let id = testkit::soon("the stream's next message", stream.next())
            .await
            .and_then(Result::ok)
            .expect("the id")
            .id;
        let item = |key: &str, n: usize| ConfigItem {
            key: key.into(),
            value: "x".repeat(n),
            ..ConfigItem::default()
        };
        let change = ConfigChange {
            items: vec![item("a", 6_000), item("b", 6_000)],
        };
        changes.send(change).await.expect("send");
        for key in ["a", "b"] {
            let message = testkit::soon("the stream's next message", stream.next())
                .await
                .expect("a message")
                .unwrap_or_else(|status| panic!("dropped: {status:?}"));
            assert_eq!(message.id, id);
            let keys: Vec<_> = message.items.keys().cloned().collect();
            assert_eq!(keys, vec![key.to_string()]);
        }
        assert_eq!(subscriptions.len(), 1, "still open");
        // Alone over the limit with the id: dropped, naming the size of
        // the message it would make, which is over the limit (failed
        // before the fix: "an item of 9991 bytes is larger than the limit
        // of 10000 bytes", its own bytes without the id's).
        let huge = item("huge", 9_990);
        let would_be = SubscribeConfigurationResponse {
            id: id.clone(),
            items: HashMap::from([(
                huge.key.clone(),
                DaprItem {
                    value: huge.value.clone(),
                    ..DaprItem::default()
                },
            )]),
        }
        .encoded_len();
        assert!(would_be > 10_000, "{would_be}");
        let change = ConfigChange {
            items: vec![item("small", 1), huge],
        };
        changes.send(change).await.expect("send");
        let reason = testkit::soon("the stream's next message", stream.next())
            .await
            .expect("a reason")
            .expect_err("dropped");
        assert_eq!(reason.code(), tonic::Code::ResourceExhausted);
        assert!(
            reason.message().contains(&format!(
                "item 1 of a change (9994 bytes of key, value, version and metadata) takes \
                 {would_be} bytes in a message with the subscription id, encoded, more than the \
                 limit of 10000 bytes"
            )),
            "{}",
            reason.message()
        );
    }

    /// After a change cut into several, the next change reaches a client
    /// that has read none of it yet (failed before the fix: the second change was refused, the client "stopped reading",
    /// its stream ended `RESOURCE_EXHAUSTED` after `a` and `b`).
    #[tokio::test]
    async fn a_change_after_one_cut_in_several_reaches_a_client_yet_to_read() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            10_000,
            Arc::new(ApiMetrics::new()),
        );
        let (changes, subscription) = subscription();
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
        let item = |key: &str, n: usize| ConfigItem {
            key: key.into(),
            value: "x".repeat(n),
            ..ConfigItem::default()
        };
        let first = ConfigChange {
            items: vec![item("a", 6_000), item("b", 6_000)],
        };
        changes.send(first).await.expect("send");
        let second = ConfigChange {
            items: vec![item("c", 10)],
        };
        changes.send(second).await.expect("send");
        // The forwarder has taken both (the channel holds 4) once a third
        // goes in and the subscription is still open.
        let mut keys = Vec::new();
        for _ in 0..4 {
            let message = testkit::soon("the stream's next message", stream.next())
                .await
                .expect("a message")
                .unwrap_or_else(|status| panic!("dropped: {status:?}"));
            keys.extend(message.items.into_keys());
        }
        assert_eq!(keys, vec!["a", "b", "c"]);
        assert_eq!(subscriptions.len(), 1, "still open");
    }

    /// Every message of a change of many small items, cut at the default
    /// 4 MiB, is at most 4 MiB encoded, gRPC clients' default receive
    /// limit (failed before the fix: the first was about 4.26 MB, the
    /// items' bytes counted without their protobuf framing).
    #[tokio::test]
    async fn every_message_of_a_change_cut_in_several_is_within_the_limit_encoded() {
        const LIMIT: usize = 4 * 1024 * 1024;
        let subscriptions =
            Subscriptions::new(CancellationToken::new(), LIMIT, Arc::new(ApiMetrics::new()));
        let (changes, subscription) = subscription();
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
        let items: Vec<ConfigItem> = (0..8_000)
            .map(|n| ConfigItem {
                key: format!("key-{n}"),
                value: "x".repeat(1_000),
                version: "1".into(),
                ..ConfigItem::default()
            })
            .collect();
        changes.send(ConfigChange { items }).await.expect("send");
        let mut delivered = 0;
        let mut messages = 0;
        while delivered < 8_000 {
            let message = testkit::soon("the stream's next message", stream.next())
                .await
                .expect("a message")
                .unwrap_or_else(|status| panic!("dropped: {status:?}"));
            assert!(
                message.encoded_len() <= LIMIT,
                "{} bytes encoded",
                message.encoded_len()
            );
            delivered += message.items.len();
            messages += 1;
        }
        assert_eq!(delivered, 8_000);
        assert!(messages > 2, "the id and the change cut in two at least");
    }

    #[tokio::test]
    async fn a_subscriber_behind_by_more_bytes_than_the_limit_is_dropped_with_the_reason() {
        let subscriptions = Subscriptions::new(
            CancellationToken::new(),
            10_000,
            Arc::new(ApiMetrics::new()),
        );
        let (changes, subscription) = subscription();
        let mut stream = subscriptions
            .open("config", subscription, None)
            .expect("open");
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
        // Three changes of 6 KB each, unread: the second fills the 10 KB
        // (counted up to the room left), the third finds it full.
        for _ in 0..3 {
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
