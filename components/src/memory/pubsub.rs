//! The `memory` pub/sub broker: in process, each topic fanned out to every
//! subscription, each subscription with a bounded queue.
//!
//! A publish waits (up to [`PUBLISH_WAIT`]) for room in every queue of the
//! topic and succeeds once the message is in all of them, so an
//! acknowledged publish is delivered to every subscription that existed
//! when it was made. A message settled `Retry` (or not settled) is
//! delivered again after [`REDELIVER_AFTER`]; at most
//! [`MAX_IN_FLIGHT`] deliveries per subscription await their outcome.
//!
//! Every metadata change is applied in place, so only a change of `type`
//! rebuilds the broker (and moves its subscriptions).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, DeliveryOutcome, InPlace, InPlaceUpdate, Message, Metadata, PubSub,
    PubSubError, PubSubSubscription, PublishRequest, StagedInPlace, SubscribeRequest,
    SubscriptionFeed,
};
use tokio::sync::{mpsc, Semaphore};

use crate::live::LiveMetadata;
use crate::pubsub::PublishGate;

/// Messages a subscription queues before publishes wait.
pub const QUEUE_CAPACITY: usize = 1024;
/// How long a publish waits for room in a full queue.
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
    topics: Arc<Mutex<HashMap<String, Vec<mpsc::Sender<Message>>>>>,
    gate: Arc<PublishGate>,
    next_id: AtomicU64,
}

impl MemoryPubSub {
    /// A broker with no subscription.
    pub fn new() -> Self {
        Self::default()
    }

    fn queues(&self, topic: &str) -> Vec<mpsc::Sender<Message>> {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match topics.get_mut(topic) {
            Some(queues) => {
                queues.retain(|q| !q.is_closed());
                queues.clone()
            }
            None => Vec::new(),
        }
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryPubSub {
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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let message = Message {
            id: id.to_string(),
            topic: req.topic.clone(),
            data: req.data,
            content_type: req.content_type,
            metadata: req.metadata,
        };
        for queue in self.queues(&req.topic) {
            match queue.send_timeout(message.clone(), PUBLISH_WAIT).await {
                Ok(()) => {}
                // The subscription ended meanwhile: nobody to deliver to.
                Err(mpsc::error::SendTimeoutError::Closed(_)) => {}
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                    return Err(PubSubError::Busy(format!(
                        "a subscription of topic `{}` has {QUEUE_CAPACITY} messages waiting and took none for {PUBLISH_WAIT:?}",
                        req.topic
                    )))
                }
            }
        }
        Ok(())
    }

    async fn subscribe(&self, req: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        if req.topic.is_empty() {
            return Err(PubSubError::Invalid("the topic is empty".into()));
        }
        let (queue, messages) = mpsc::channel(QUEUE_CAPACITY);
        self.topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(req.topic)
            .or_default()
            .push(queue);
        let (subscription, feed) = PubSubSubscription::channel(MAX_IN_FLIGHT);
        tokio::spawn(deliver_queue(messages, feed, self.gate.clone()));
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
    mut messages: mpsc::Receiver<Message>,
    feed: SubscriptionFeed,
    gate: Arc<PublishGate>,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let (retry, mut retries) = mpsc::channel::<Message>(MAX_IN_FLIGHT);
    let mut draining = false;
    let mut closing: Option<Closing> = None;
    loop {
        let next = tokio::select! {
            biased;
            () = feed.stopped() => return,
            () = feed.draining(), if !draining => {
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

/// Delivers `message` and, in the background, re-queues it unless it is
/// settled `Success` or `Drop`. False when the subscription is gone.
async fn send(
    feed: &SubscriptionFeed,
    in_flight: &Arc<Semaphore>,
    retry: &mpsc::Sender<Message>,
    message: Message,
) -> bool {
    let Ok(permit) = in_flight.clone().acquire_owned().await else {
        return false;
    };
    let Some(outcome) = feed.deliver(message.clone()).await else {
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
}
