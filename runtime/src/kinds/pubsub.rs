//! Pub/sub brokers (`pubsub`, Layotto's `pub_subs`): publish to a topic,
//! subscribe with a per-message outcome (success / retry / drop), close.
//!
//! A subscription is a bounded channel of [`Delivery`]s. Each delivery
//! carries its own acknowledgement: the subscriber settles it with an
//! [`DeliveryOutcome`]; a delivery dropped unsettled counts as [`DeliveryOutcome::Retry`].
//! The broker side feeds a subscription through its [`SubscriptionFeed`],
//! which also tells it when to stop reading: after draining what is
//! already published ([`SubscriptionFeed::draining`]), or at once
//! ([`SubscriptionFeed::stopped`]).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::component::{Component, ComponentError};

/// A message to publish: the bytes as they are to be delivered (the
/// sidecar wraps them in a CloudEvent first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishRequest {
    /// The topic.
    pub topic: String,
    /// The payload.
    pub data: Vec<u8>,
    /// The content type of `data`, if known.
    pub content_type: Option<String>,
    /// Broker-specific options.
    pub metadata: HashMap<String, String>,
}

/// What to subscribe to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeRequest {
    /// The topic.
    pub topic: String,
    /// Broker-specific options.
    pub metadata: HashMap<String, String>,
}

/// A message delivered to a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The broker's id of the message (unique within the topic).
    pub id: String,
    /// The topic.
    pub topic: String,
    /// The payload, as published.
    pub data: Vec<u8>,
    /// The content type given at publish, if any.
    pub content_type: Option<String>,
    /// Broker-specific extra data.
    pub metadata: HashMap<String, String>,
}

/// What the subscriber did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryOutcome {
    /// Processed: the broker forgets the message.
    #[default]
    Success,
    /// Not processed: the broker delivers it again later.
    Retry,
    /// Not processed and not to be retried: the broker forgets it.
    Drop,
}

/// One message to process, with its acknowledgement.
#[derive(Debug)]
pub struct Delivery {
    /// The message.
    pub message: Message,
    ack: Option<oneshot::Sender<DeliveryOutcome>>,
    /// Told once the delivery is settled (after its outcome was sent) or
    /// dropped unsettled; none for most deliveries.
    watch: Option<SettleGuard>,
}

/// Told when a delivery it watches ([`Delivery::watched`]) is settled or
/// dropped: a count of deliveries awaiting their outcome, kept without a
/// task or a second channel per delivery.
pub(crate) trait SettleWatch: Send + Sync {
    /// The delivery was settled (its outcome sent) or dropped unsettled;
    /// called once per delivery watched.
    fn settled(&self);
}

/// Tells its watch when dropped (with the delivery holding it).
struct SettleGuard {
    watch: Arc<dyn SettleWatch>,
    /// A watch the delivery carried before this one (told after it).
    _earlier: Option<Box<SettleGuard>>,
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        self.watch.settled();
    }
}

impl std::fmt::Debug for SettleGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettleGuard")
    }
}

impl Delivery {
    /// A delivery of `message` and the receiver of its outcome.
    pub fn new(message: Message) -> (Self, oneshot::Receiver<DeliveryOutcome>) {
        let (ack, outcome) = oneshot::channel();
        (
            Self {
                message,
                ack: Some(ack),
                watch: None,
            },
            outcome,
        )
    }

    /// Settles the delivery (its watch, if any, is told after the outcome
    /// was sent).
    pub fn settle(mut self, outcome: DeliveryOutcome) {
        if let Some(ack) = self.ack.take() {
            let _ = ack.send(outcome);
        }
    }

    /// The delivery, telling `watch` once it is settled or dropped
    /// unsettled (with a watch it carried already, both are told).
    pub(crate) fn watched(mut self, watch: Arc<dyn SettleWatch>) -> Self {
        let earlier = self.watch.take().map(Box::new);
        self.watch = Some(SettleGuard {
            watch,
            _earlier: earlier,
        });
        self
    }
}

/// A live subscription: deliveries arrive on `deliveries` until the broker
/// stops (closed, drained, or the subscription dropped).
#[derive(Debug)]
pub struct PubSubSubscription {
    /// The stream of deliveries.
    pub deliveries: mpsc::Receiver<Delivery>,
    drain: CancellationToken,
    stop: CancellationToken,
}

impl PubSubSubscription {
    /// A subscription buffering up to `capacity` deliveries, and the feed
    /// its broker writes to.
    pub fn channel(capacity: usize) -> (Self, SubscriptionFeed) {
        let (sender, deliveries) = mpsc::channel(capacity.max(1));
        let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
        let feed = SubscriptionFeed {
            sender,
            drain: drain.clone(),
            stop: stop.clone(),
        };
        (
            Self {
                deliveries,
                drain,
                stop,
            },
            feed,
        )
    }

    /// Asks the broker to deliver what it already holds (and what publishes
    /// still under way add), then end the subscription.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Asks the broker to stop reading at once; deliveries already handed
    /// out can still be settled. Stopped before it is drained: a broker
    /// woken by the drain (on another worker) then already sees it
    /// stopped, and never takes it for a drain, which closes the whole
    /// broker's publishes (they would be refused as retired).
    pub fn stop(&self) {
        self.stop.cancel();
        self.drain.cancel();
    }
}

impl Drop for PubSubSubscription {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The broker's side of a [`PubSubSubscription`].
#[derive(Debug, Clone)]
pub struct SubscriptionFeed {
    sender: mpsc::Sender<Delivery>,
    drain: CancellationToken,
    stop: CancellationToken,
}

impl SubscriptionFeed {
    /// Hands `message` to the subscriber, waiting for room; the outcome
    /// arrives on the receiver (an error on it means [`DeliveryOutcome::Retry`]).
    /// `None` when the subscription is gone or stopped.
    pub async fn deliver(&self, message: Message) -> Option<oneshot::Receiver<DeliveryOutcome>> {
        let (delivery, outcome) = Delivery::new(message);
        tokio::select! {
            sent = self.sender.send(delivery) => sent.ok().map(|()| outcome),
            () = self.stop.cancelled() => None,
        }
    }

    /// Hands on a delivery received from another subscription (its
    /// acknowledgement still goes to the broker that made it); gives it
    /// back when the subscription is gone.
    pub async fn forward(&self, delivery: Delivery) -> Result<(), Delivery> {
        self.sender.send(delivery).await.map_err(|e| e.0)
    }

    /// The channel itself, for forwarders that wait for room while
    /// watching other events.
    pub(crate) fn sender(&self) -> &mpsc::Sender<Delivery> {
        &self.sender
    }

    /// Resolves when the subscriber asked for a drain: deliver what is
    /// already published, then end.
    pub async fn draining(&self) {
        self.drain.cancelled().await;
    }

    /// Whether a drain was asked for.
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Resolves when the subscriber asked to stop at once, or left.
    pub async fn stopped(&self) {
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = self.sender.closed() => {}
        }
    }

    /// Whether the subscriber asked to stop, or left.
    pub fn is_stopped(&self) -> bool {
        self.stop.is_cancelled() || self.sender.is_closed()
    }
}

/// Why a pub/sub operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PubSubError {
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The broker cannot take more right now (a full queue).
    #[error("{0}")]
    Busy(String),
    /// The broker was replaced by a reload and has stopped taking
    /// publishes: send it to the broker now serving.
    #[error("the pub/sub broker was replaced; publish to its successor")]
    Retired,
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
}

/// A pub/sub broker.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"pubsub\"` but does not implement `PubSub`",
    note = "add `#[async_trait] impl PubSub for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait PubSub: Component {
    /// Publishes a message; `Ok` only once the broker holds it for every
    /// subscription of the topic.
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError>;

    /// Subscribes to a topic. Messages published from now on (and, for a
    /// durable broker, those its consumer group has not yet processed) are
    /// delivered until the subscription ends.
    async fn subscribe(&self, req: SubscribeRequest) -> Result<PubSubSubscription, PubSubError>;

    /// Whether the broker takes `topic` at all, asked without publishing
    /// or subscribing: the same [`PubSubError::Invalid`] its
    /// [`publish`](Self::publish) and [`subscribe`](Self::subscribe) give
    /// a topic it never takes (the redis pub/sub's holding `||`). The
    /// sidecar asks it of a subscription's dead-letter topic when the
    /// subscription starts (refused as its topic would be, rather than
    /// failing every dead letter), and of a publish's topic before the
    /// guarded call (a refusal decided with no contact with the backend
    /// gives its circuit breaker no verdict). Local and quick: no I/O. By
    /// default every topic is taken.
    fn check_topic(&self, _topic: &str) -> Result<(), PubSubError> {
        Ok(())
    }
}

impl From<PubSubError> for ComponentError {
    fn from(err: PubSubError) -> Self {
        ComponentError::new(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unsettled_delivery_reads_as_an_error_and_a_settled_one_as_its_outcome() {
        let (mut subscription, feed) = PubSubSubscription::channel(2);
        let first = feed.deliver(Message::default()).await.expect("delivered");
        let second = feed.deliver(Message::default()).await.expect("delivered");
        // Both were sent when `deliver` returned: read without waiting.
        subscription
            .deliveries
            .try_recv()
            .expect("one")
            .settle(DeliveryOutcome::Drop);
        drop(subscription.deliveries.try_recv().expect("two"));
        assert_eq!(first.await, Ok(DeliveryOutcome::Drop));
        assert!(second.await.is_err());
        assert!(!feed.is_stopped());
        drop(subscription);
        assert!(feed.is_stopped() && feed.is_draining());
    }

    /// Records, when woken, whether the feed was stopped by then.
    struct SeesStopped {
        feed: SubscriptionFeed,
        stopped_when_woken: std::sync::Mutex<Option<bool>>,
    }

    impl std::task::Wake for SeesStopped {
        fn wake(self: std::sync::Arc<Self>) {
            let stopped = self.feed.is_stopped();
            let mut seen = self
                .stopped_when_woken
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *seen = Some(stopped);
        }
    }

    /// A broker woken by the drain of a subscription being stopped sees
    /// it stopped already: woken on another worker between the two, it
    /// took the stop for a drain and closed its publishes for good.
    #[test]
    fn a_broker_woken_by_a_stop_sees_it_stopped() {
        let (subscription, feed) = PubSubSubscription::channel(1);
        let waker = std::sync::Arc::new(SeesStopped {
            feed: feed.clone(),
            stopped_when_woken: std::sync::Mutex::new(None),
        });
        let mut draining = std::pin::pin!(feed.draining());
        let wakes = std::task::Waker::from(waker.clone());
        let mut cx = std::task::Context::from_waker(&wakes);
        assert!(std::future::Future::poll(draining.as_mut(), &mut cx).is_pending());
        subscription.stop();
        let seen = *waker
            .stopped_when_woken
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        assert_eq!(seen, Some(true), "stopped when the drain woke the broker");
    }
}
