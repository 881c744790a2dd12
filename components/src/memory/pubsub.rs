//! The `memory` pub/sub broker: in process, each topic fanned out to every
//! subscription, each subscription with a bounded queue.
//!
//! A publish waits (up to [`PUBLISH_WAIT`] in all, however many queues are
//! full) for room in every queue of the topic, and puts the message in all
//! of them only once each has room for it, so an acknowledged publish is
//! delivered to every subscription that existed when it was made, and a
//! publish that fails (`Busy`: a queue had no room in time) was given to
//! none: its retry is not delivered twice to the others. Nothing is
//! dropped. A queue has room for [`QUEUE_CAPACITY`]
//! messages and [`QUEUE_BYTES`] bytes, a message counting until it is
//! settled; its payload is shared by the queues of every subscription
//! (copied for a delivery only, at most [`MAX_IN_FLIGHT`] at a time). A message settled `Retry` (or not settled) is
//! delivered again after [`REDELIVER_AFTER`]; at most
//! [`MAX_IN_FLIGHT`] deliveries per subscription await their outcome.
//!
//! Every metadata change is applied in place. A rebuild (a new `appId`, a
//! change of `type`) moves the subscriptions: a subscription made through
//! the runtime's handle subscribes to the new broker before the swap and
//! drains the old one (see `rewire_runtime`'s handle subscriptions), one
//! made on the instance ends with it. A rebuild of the same type goes on
//! with its predecessor's message ids (see [`crate::memory`]), so no id
//! is handed out twice. Ids start with a tag drawn when the process
//! starts ([`process_tag`]): after a restart the count starts again, and
//! an id an app kept (to tell a redelivery from a new message, which the
//! sidecar's envelope ids derive from) must not name another message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, DeliveryOutcome, InPlace, InPlaceUpdate, InitContext, Message,
    Metadata, PubSub, PubSubError, PubSubSubscription, PublishRequest, StagedInPlace,
    SubscribeRequest, SubscriptionFeed,
};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::live::LiveMetadata;
use crate::pubsub::PublishGate;

/// Messages a subscription queues before publishes wait.
pub const QUEUE_CAPACITY: usize = 1024;
/// Bytes a subscription holds (queued, or delivered and not yet settled)
/// before publishes wait: payload, topic, content type and metadata.
pub const QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// How long a publish waits for room in the full queues of its topic (one
/// deadline for all of them).
pub const PUBLISH_WAIT: Duration = Duration::from_secs(5);
/// Deliveries of one subscription awaiting their outcome.
pub const MAX_IN_FLIGHT: usize = 64;
/// When a message settled `Retry` is delivered again.
pub const REDELIVER_AFTER: Duration = Duration::from_millis(500);

/// The memory broker's metadata: only what Dapr's and Layotto's
/// in-memory brokers accept, so their configurations load as they are.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPubSubMetadata {
    /// Accepted, and unused: in process, every subscription gets every
    /// message (Layotto's files set it).
    #[serde(rename = "consumerID", default)]
    pub consumer_id: Option<String>,
}

/// An in-process pub/sub broker.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(kind = "pubsub", type = "memory", example = "{}")]
pub struct MemoryPubSub {
    #[metadata]
    meta: LiveMetadata<MemoryPubSubMetadata>,
    topics: Arc<Topics>,
    gate: Arc<PublishGate>,
    /// Shared with the instances rebuilt from or into this one.
    ids: Arc<MessageIds>,
}

/// The last message id handed out by the component.
#[derive(Debug, Default)]
struct MessageIds(AtomicU64);

/// This process's tag in message ids, drawn once.
fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(new_tag)
}

/// 64 random bits in hex (std's per-process random hasher keys, the
/// time and the process id).
fn new_tag() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", hasher.finish())
}

impl MemoryPubSub {
    /// A broker with no subscription.
    pub fn new() -> Self {
        Self::default()
    }

    fn queues(&self, topic: &str) -> Vec<Queue> {
        let topics = lock(&self.topics);
        topics.get(topic).cloned().unwrap_or_default()
    }
}

/// The queues of each topic with a subscription: a topic is here only
/// while one of its subscriptions is fed (see [`Listed`]), so topics a
/// client subscribed to once (a reply topic per request, a stream opened
/// and closed) are not kept for the broker's life.
type Topics = Mutex<HashMap<String, Vec<Queue>>>;

fn lock(topics: &Topics) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Queue>>> {
    topics
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A subscription's place in its topic's list, taken out (and the topic
/// with it, when it was the last) when the subscription's feed ends.
struct Listed {
    topics: std::sync::Weak<Topics>,
    topic: String,
    /// The queue's own semaphore: what tells it from the topic's others.
    room: Arc<Semaphore>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        let Some(topics) = self.topics.upgrade() else {
            return;
        };
        let mut topics = lock(&topics);
        if let Some(queues) = topics.get_mut(&self.topic) {
            queues.retain(|q| !Arc::ptr_eq(&q.room, &self.room));
            if queues.is_empty() {
                topics.remove(&self.topic);
            }
        }
    }
}

/// One subscription's queue, and the bytes it may still take.
#[derive(Debug, Clone)]
struct Queue {
    sender: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
}

/// A message in one subscription's queue: shared with the other queues,
/// holding its bytes of this one until it is settled.
struct Queued {
    message: Arc<Message>,
    _bytes: OwnedSemaphorePermit,
}

impl Queue {
    fn new() -> (Self, mpsc::Receiver<Queued>) {
        let (sender, messages) = mpsc::channel(QUEUE_CAPACITY);
        let room = Arc::new(Semaphore::new(QUEUE_BYTES));
        (Self { sender, room }, messages)
    }

    /// Reserves room for one message of `cost` bytes: a place in the
    /// queue and its bytes, waiting for them; `None` when the
    /// subscription has ended (nobody to deliver to). Dropping the
    /// reservation gives the room back.
    async fn reserve(&self, cost: u32) -> Option<Reserved> {
        let room = async {
            let bytes = self.room.clone().acquire_many_owned(cost).await.ok()?;
            let place = self.sender.clone().reserve_owned().await.ok()?;
            Some(Reserved { place, bytes })
        };
        tokio::select! {
            reserved = room => reserved,
            () = self.sender.closed() => None,
        }
    }
}

/// Room taken in one queue for one message, not yet used.
struct Reserved {
    place: mpsc::OwnedPermit<Queued>,
    bytes: OwnedSemaphorePermit,
}

impl Reserved {
    /// Puts `message` in the room reserved for it.
    fn put(self, message: Arc<Message>) {
        self.place.send(Queued {
            message,
            _bytes: self.bytes,
        });
    }
}

/// Room for one message in every queue of `queues`, taken by `deadline`,
/// or none at all: a queue without room by then gives back what the others
/// reserved. A queue whose subscription ended is left out.
async fn reserve_all(
    queues: &[Queue],
    cost: u32,
    deadline: tokio::time::Instant,
) -> Option<Vec<Reserved>> {
    let mut reserved = Vec::with_capacity(queues.len());
    for queue in queues {
        match tokio::time::timeout_at(deadline, queue.reserve(cost)).await {
            Ok(Some(room)) => reserved.push(room),
            Ok(None) => {}
            Err(_) => return None,
        }
    }
    Some(reserved)
}

/// The bytes `message` counts for in a queue (a message larger than a
/// whole queue takes all of it: it gets in once the queue is empty).
fn cost_of(message: &Message) -> u32 {
    let metadata: usize = message
        .metadata
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let bytes = message.data.len()
        + message.topic.len()
        + message.id.len()
        + message.content_type.as_ref().map_or(0, String::len)
        + metadata;
    u32::try_from(bytes.clamp(1, QUEUE_BYTES)).unwrap_or(u32::MAX)
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryPubSub {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        self.ids = crate::memory::shared_with_predecessors(cx, self.ids.clone()).0;
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.gate.close().await;
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: a swap of settings, put in force at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryPubSub {
    /// Takes the new metadata; the queues and their subscriptions stay.
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.meta.replace(LiveMetadata::decode(metadata)?);
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new = LiveMetadata::decode(metadata)?;
        Ok(StagedInPlace::Deferred(self.meta.stage(new)))
    }
}

#[rewire_runtime::prelude::async_trait]
impl PubSub for MemoryPubSub {
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
        if req.topic.is_empty() {
            return Err(PubSubError::Invalid("the topic is empty".into()));
        }
        let _pass = self.gate.enter().await?;
        let id = self.ids.0.fetch_add(1, Ordering::Relaxed) + 1;
        let message = Arc::new(Message {
            id: format!("{}-{id}", process_tag()),
            topic: req.topic.clone(),
            data: req.data,
            content_type: req.content_type,
            metadata: req.metadata,
        });
        let cost = cost_of(&message);
        let deadline = tokio::time::Instant::now() + PUBLISH_WAIT;
        let Some(reserved) = reserve_all(&self.queues(&req.topic), cost, deadline).await else {
            return Err(PubSubError::Busy(format!(
                "a subscription of topic `{}` holds {QUEUE_CAPACITY} messages or {QUEUE_BYTES} bytes and had no room within {PUBLISH_WAIT:?}: the message was given to no subscription",
                req.topic
            )));
        };
        for room in reserved {
            room.put(message.clone());
        }
        Ok(())
    }

    async fn subscribe(&self, req: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        if req.topic.is_empty() {
            return Err(PubSubError::Invalid("the topic is empty".into()));
        }
        let (queue, messages) = Queue::new();
        let listed = Listed {
            topics: Arc::downgrade(&self.topics),
            topic: req.topic.clone(),
            room: queue.room.clone(),
        };
        lock(&self.topics).entry(req.topic).or_default().push(queue);
        let (subscription, feed) = PubSubSubscription::channel(MAX_IN_FLIGHT);
        tokio::spawn(deliver_queue(messages, feed, self.gate.clone(), listed));
        Ok(subscription)
    }
}

/// The gate closing for a drain, while the queue is still read.
type Closing = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Feeds one subscription from its queue until it is stopped, or drained:
/// then the broker's publishes are closed (the queue is read meanwhile: a
/// publish under way may be waiting for room in it), and what is queued
/// once they are is delivered.
async fn deliver_queue(
    mut messages: mpsc::Receiver<Queued>,
    feed: SubscriptionFeed,
    gate: Arc<PublishGate>,
    _listed: Listed,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (retry, mut retries) = mpsc::channel::<Queued>(MAX_IN_FLIGHT);
    let mut draining = false;
    let mut closing: Option<Closing> = None;
    loop {
        let next = tokio::select! {
            biased;
            () = feed.stopped() => return,
            () = feed.draining(), if !draining => {
                // A stopped (dropped) subscription is drained too, and
                // stopped first: looked at again now, it is never taken
                // for a drain, which closes the whole broker's publishes.
                if feed.is_stopped() {
                    return;
                }
                draining = true;
                let gate = gate.clone();
                closing = Some(Box::pin(async move { gate.close().await }));
                continue;
            }
            () = until_closed(&mut closing), if closing.is_some() => {
                closing = None;
                messages.close();
                continue;
            }
            Some(message) = retries.recv() => Some(message),
            message = messages.recv() => message,
        };
        let Some(message) = next else {
            // Drained: wait for what is in flight (its retries included).
            let all = u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX);
            tokio::select! {
                () = feed.stopped() => return,
                _ = in_flight.acquire_many(all) => {}
            }
            match retries.try_recv() {
                Ok(message) => {
                    if !send(&feed, &in_flight, &retry, message).await {
                        return;
                    }
                    continue;
                }
                Err(_) => return,
            }
        };
        if !send(&feed, &in_flight, &retry, message).await {
            return;
        }
    }
}

/// Resolves once the gate is closed (never without a close under way).
async fn until_closed(closing: &mut Option<Closing>) {
    match closing {
        Some(closing) => closing.await,
        None => std::future::pending().await,
    }
}

/// Delivers `message` (a copy of it) and, in the background, re-queues
/// it unless it is settled `Success` or `Drop`: its bytes stay held until
/// then. False when the subscription is gone.
async fn send(
    feed: &SubscriptionFeed,
    in_flight: &Arc<Semaphore>,
    retry: &mpsc::Sender<Queued>,
    message: Queued,
) -> bool {
    let Ok(permit) = in_flight.clone().acquire_owned().await else {
        return false;
    };
    let Some(outcome) = feed.deliver(Message::clone(&message.message)).await else {
        return false;
    };
    let retry = retry.clone();
    tokio::spawn(async move {
        let outcome = outcome.await.unwrap_or(DeliveryOutcome::Retry);
        if outcome == DeliveryOutcome::Retry {
            tokio::time::sleep(REDELIVER_AFTER).await;
            let _ = retry.try_send(message);
        }
        drop(permit);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(topic: &str, data: &str) -> PublishRequest {
        PublishRequest {
            topic: topic.into(),
            data: data.as_bytes().to_vec(),
            ..PublishRequest::default()
        }
    }

    /// A message's id carries the process's tag and its count: a
    /// restarted process (a new tag) never names another message with
    /// an id an app kept. Failed before: ids were the bare count from 1.
    #[tokio::test]
    async fn message_ids_carry_the_process_tag_so_a_restart_never_repeats_one() {
        let broker = MemoryPubSub::new();
        let mut sub = broker
            .subscribe(SubscribeRequest {
                topic: "t".into(),
                ..SubscribeRequest::default()
            })
            .await
            .expect("subscribed");
        broker.publish(publish("t", "x")).await.expect("published");
        let delivered = testkit::soon("a delivery", sub.deliveries.recv())
            .await
            .expect("delivered");
        assert_eq!(delivered.message.id, format!("{}-1", process_tag()));
        assert_eq!(process_tag().len(), 16);
        assert_ne!(new_tag(), new_tag(), "each process draws its own");
        delivered.settle(DeliveryOutcome::Success);
    }

    #[tokio::test]
    async fn fans_out_to_every_subscription_and_redelivers_a_retry() {
        let broker = MemoryPubSub::new();
        let req = SubscribeRequest {
            topic: "orders".into(),
            ..SubscribeRequest::default()
        };
        let mut a = broker.subscribe(req.clone()).await.expect("a");
        let mut b = broker.subscribe(req).await.expect("b");
        broker
            .publish(publish("orders", "1"))
            .await
            .expect("published");
        broker
            .publish(publish("other", "x"))
            .await
            .expect("published");
        let first = testkit::soon("a delivery", a.deliveries.recv())
            .await
            .expect("a gets it");
        assert_eq!(first.message.data, b"1");
        first.settle(DeliveryOutcome::Retry);
        let again = testkit::soon("a delivery", a.deliveries.recv())
            .await
            .expect("redelivered");
        assert_eq!(again.message.data, b"1");
        again.settle(DeliveryOutcome::Success);
        let to_b = testkit::soon("a delivery", b.deliveries.recv())
            .await
            .expect("b gets it");
        assert_eq!(to_b.message.data, b"1");
        to_b.settle(DeliveryOutcome::Success);
    }

    #[tokio::test]
    async fn a_drain_delivers_what_is_queued_then_refuses_publishes() {
        let broker = MemoryPubSub::new();
        let mut sub = broker
            .subscribe(SubscribeRequest {
                topic: "t".into(),
                ..SubscribeRequest::default()
            })
            .await
            .expect("subscribed");
        for i in 0..3 {
            broker
                .publish(publish("t", &i.to_string()))
                .await
                .expect("published");
        }
        sub.drain();
        let mut seen = Vec::new();
        while let Some(delivery) = testkit::soon("a delivery", sub.deliveries.recv()).await {
            seen.push(String::from_utf8_lossy(&delivery.message.data).to_string());
            delivery.settle(DeliveryOutcome::Success);
        }
        assert_eq!(seen, ["0", "1", "2"]);
        assert_eq!(
            broker.publish(publish("t", "late")).await,
            Err(PubSubError::Retired)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_keeps_reading_a_full_queue_so_a_waiting_publish_gets_in() {
        let broker = Arc::new(MemoryPubSub::new());
        let mut sub = broker
            .subscribe(SubscribeRequest {
                topic: "t".into(),
                ..SubscribeRequest::default()
            })
            .await
            .expect("subscribed");
        // Unread: the queue fills (and so do the deliveries handed out),
        // until a publish has to wait for room.
        let mut held = 0;
        let waiting = loop {
            let publishing = tokio::spawn({
                let broker = broker.clone();
                async move { broker.publish(publish("t", &held.to_string())).await }
            });
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            if !publishing.is_finished() {
                break publishing;
            }
            assert_eq!(publishing.await.expect("joined"), Ok(()));
            held += 1;
        };
        assert!(held >= QUEUE_CAPACITY);
        sub.drain();
        let mut seen = Vec::new();
        while let Some(delivery) = testkit::soon("a delivery", sub.deliveries.recv()).await {
            seen.push(String::from_utf8_lossy(&delivery.message.data).to_string());
            delivery.settle(DeliveryOutcome::Success);
        }
        let published = testkit::soon("the waiting publish", waiting)
            .await
            .expect("joined");
        assert_eq!(published, Ok(()));
        let expected: Vec<String> = (0..=held).map(|i| i.to_string()).collect();
        assert_eq!(seen, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_is_bounded_by_bytes_and_a_publish_beyond_them_fails_instead_of_dropping() {
        const MIB: usize = 1024 * 1024;
        let broker = MemoryPubSub::new();
        // Unread: nothing it holds is settled.
        let mut sub = broker
            .subscribe(SubscribeRequest {
                topic: "t".into(),
                ..SubscribeRequest::default()
            })
            .await
            .expect("subscribed");
        let big = |n: usize| PublishRequest {
            topic: "t".into(),
            data: vec![u8::try_from(n % 251).unwrap_or(0); MIB],
            ..PublishRequest::default()
        };
        let mut accepted = 0;
        let refused = loop {
            match broker.publish(big(accepted)).await {
                Ok(()) => accepted += 1,
                Err(err) => break err,
            }
            assert!(accepted <= QUEUE_CAPACITY, "not bounded by bytes");
        };
        // Far fewer than QUEUE_CAPACITY messages: the bytes are the bound.
        assert!(
            accepted < QUEUE_BYTES / MIB,
            "{accepted} messages of 1 MiB held"
        );
        assert!(
            matches!(&refused, PubSubError::Busy(m) if m.contains("bytes")),
            "{refused:?}"
        );
        // Settling one makes room: the next publish is taken.
        let first = testkit::soon("a delivery", sub.deliveries.recv())
            .await
            .expect("delivered");
        assert_eq!(first.message.data, big(0).data);
        first.settle(DeliveryOutcome::Success);
        broker
            .publish(big(accepted))
            .await
            .expect("room after a settle");
        accepted += 1;
        // Every acknowledged publish is delivered, in order.
        for n in 1..accepted {
            let delivery = testkit::soon("a delivery", sub.deliveries.recv())
                .await
                .expect("delivered");
            assert_eq!(delivery.message.data, big(n).data, "message {n}");
            delivery.settle(DeliveryOutcome::Success);
        }
    }

    #[tokio::test]
    async fn a_metadata_change_is_applied_in_place_and_keeps_the_subscriptions() {
        let broker = MemoryPubSub::new();
        let mut sub = broker
            .subscribe(SubscribeRequest {
                topic: "t".into(),
                ..SubscribeRequest::default()
            })
            .await
            .expect("subscribed");
        let metadata = Metadata::from(
            serde_json::json!({"consumerID": "other"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let in_place = broker.as_in_place().expect("updates in place");
        assert_eq!(
            in_place.update_in_place(&metadata).await.ok(),
            Some(InPlace::Applied)
        );
        assert_eq!(broker.meta.load().consumer_id.as_deref(), Some("other"));
        let unknown = Metadata::from(
            serde_json::json!({"queueDepth": "1"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        assert!(in_place.update_in_place(&unknown).await.is_err());
        broker
            .publish(publish("t", "after"))
            .await
            .expect("published");
        let delivery = testkit::soon("a delivery", sub.deliveries.recv())
            .await
            .expect("still subscribed");
        assert_eq!(delivery.message.data, b"after");
    }

    fn subscribe_to(topic: &str) -> SubscribeRequest {
        SubscribeRequest {
            topic: topic.into(),
            ..SubscribeRequest::default()
        }
    }

    /// Reads and settles every delivery of `sub`, recording its payload.
    fn read_all(mut sub: PubSubSubscription) -> Arc<Mutex<Vec<String>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Some(delivery) = sub.deliveries.recv().await {
                let text = String::from_utf8_lossy(&delivery.message.data).to_string();
                record.lock().unwrap_or_else(|p| p.into_inner()).push(text);
                delivery.settle(DeliveryOutcome::Success);
            }
        });
        seen
    }

    fn seen(seen: &Mutex<Vec<String>>) -> Vec<String> {
        seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Subscription A reads at once, B not at all: the publish B has no
    /// room for fails and leaves A without the message; its retry, once B
    /// has room, gives it to each once.
    #[tokio::test(start_paused = true)]
    async fn a_publish_one_queue_refuses_is_given_to_no_subscription() {
        let broker = MemoryPubSub::new();
        let a = read_all(broker.subscribe(subscribe_to("t")).await.expect("a"));
        let mut b = broker.subscribe(subscribe_to("t")).await.expect("b");
        let mut accepted = 0;
        let refused = loop {
            match broker.publish(publish("t", &accepted.to_string())).await {
                Ok(()) => accepted += 1,
                Err(err) => break err,
            }
            assert!(accepted <= 2 * QUEUE_CAPACITY, "B's queue never filled");
        };
        assert!(matches!(refused, PubSubError::Busy(_)), "{refused:?}");
        let failed = accepted.to_string();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let to_a = seen(&a);
        assert_eq!(to_a.len(), accepted, "A got every accepted message");
        assert!(!to_a.contains(&failed), "A got the refused message");
        // B settles one: room for the retry.
        let first = testkit::soon("a delivery", b.deliveries.recv())
            .await
            .expect("delivered");
        assert_eq!(first.message.data, b"0");
        first.settle(DeliveryOutcome::Success);
        broker
            .publish(publish("t", &failed))
            .await
            .expect("the retry is taken");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let to_a = seen(&a);
        assert_eq!(
            to_a.iter().filter(|m| **m == failed).count(),
            1,
            "once to A"
        );
        let expected: Vec<String> = (0..=accepted).map(|i| i.to_string()).collect();
        assert_eq!(to_a, expected);
        let mut to_b = vec!["0".to_string()];
        while to_b.len() <= accepted {
            let delivery = testkit::soon("a delivery", b.deliveries.recv())
                .await
                .expect("delivered");
            to_b.push(String::from_utf8_lossy(&delivery.message.data).to_string());
            delivery.settle(DeliveryOutcome::Success);
        }
        assert_eq!(to_b, expected, "every message once to B, in order");
    }

    /// A full until 4 s into the publish, B full throughout: the publish
    /// fails after one PUBLISH_WAIT in all, not a wait per full queue.
    #[tokio::test(start_paused = true)]
    async fn one_deadline_for_every_full_queue_of_a_publish() {
        let broker = MemoryPubSub::new();
        let mut a = broker.subscribe(subscribe_to("t")).await.expect("a");
        let _b = broker.subscribe(subscribe_to("t")).await.expect("b");
        let big = PublishRequest {
            topic: "t".into(),
            data: vec![7; QUEUE_BYTES / 4],
            ..PublishRequest::default()
        };
        let mut accepted = 0;
        while tokio::time::timeout(Duration::from_millis(10), broker.publish(big.clone()))
            .await
            .is_ok()
        {
            accepted += 1;
            assert!(accepted <= 8, "the queues never filled");
        }
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            if let Some(delivery) = a.deliveries.recv().await {
                delivery.settle(DeliveryOutcome::Success);
            }
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        let refused = broker.publish(big).await;
        let waited = started.elapsed();
        assert!(matches!(refused, Err(PubSubError::Busy(_))), "{refused:?}");
        assert!(
            waited >= PUBLISH_WAIT && waited < PUBLISH_WAIT + Duration::from_secs(1),
            "waited {waited:?}"
        );
    }

    /// A subscription dropped (a streamed subscriber gone) while its
    /// queue's task waits, woken on another worker, is never taken for a
    /// drain: the publishes of the whole broker stay open (closed, each
    /// was refused as retired until a reload rebuilt the broker).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_subscription_never_retires_the_broker() {
        let broker = MemoryPubSub::new();
        for i in 0..500 {
            let subscription = broker
                .subscribe(SubscribeRequest {
                    topic: "t".into(),
                    ..SubscribeRequest::default()
                })
                .await
                .expect("subscribed");
            // Its task waiting for the drain, or for a message.
            tokio::time::sleep(Duration::from_micros(200)).await;
            drop(subscription);
            assert_eq!(
                broker.publish(publish("t", "x")).await,
                Ok(()),
                "publish after {i} dropped subscriptions"
            );
        }
    }

    #[tokio::test]
    async fn a_topic_is_forgotten_once_its_last_subscription_ends() {
        let broker = MemoryPubSub::new();
        let subscribe = |topic: String| {
            broker.subscribe(SubscribeRequest {
                topic,
                ..SubscribeRequest::default()
            })
        };
        let mut kept = subscribe("kept".into()).await.expect("subscribed");
        let shared = subscribe("kept".into()).await.expect("subscribed");
        for i in 0..100 {
            drop(subscribe(format!("reply-{i}")).await.expect("subscribed"));
        }
        drop(shared);
        let listed = || {
            let mut topics: Vec<(String, usize)> = lock(&broker.topics)
                .iter()
                .map(|(topic, queues)| (topic.clone(), queues.len()))
                .collect();
            topics.sort();
            topics
        };
        testkit::soon("the ended subscriptions' topics forgotten", async {
            while listed() != [("kept".to_string(), 1)] {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        broker
            .publish(publish("kept", "still"))
            .await
            .expect("published");
        let delivery = testkit::soon("a delivery", kept.deliveries.recv())
            .await
            .expect("the live subscription still gets its topic");
        assert_eq!(delivery.message.data, b"still");
        delivery.settle(DeliveryOutcome::Success);
    }
}
