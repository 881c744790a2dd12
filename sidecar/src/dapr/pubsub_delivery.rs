//! The delivery engine behind every way of subscribing (a gRPC stream, an
//! app's HTTP routes, an app's gRPC callback): it reads a subscription made
//! through the pub/sub's handle (so it follows the broker across reloads),
//! turns each message into its CloudEvent, hands it to an [`EventSink`]
//! and settles the message with the sink's answer.
//!
//! Bounds: at most [`MAX_IN_FLIGHT`] events per subscription await their
//! answer; each attempt gets [`ANSWER_WITHIN`]; an event answered `RETRY`
//! (or not answered in time) is tried again with a backoff, up to
//! [`MAX_ATTEMPTS`] times in all; then it goes to the dead-letter topic
//! when one is set (and is acknowledged), else back to the broker, which
//! delivers it again later. `DROP` acknowledges it (after sending it to
//! the dead-letter topic, when one is set). The dead-letter topic can be
//! changed while the subscription runs.
//!
//! A `resiliency` policy targeted at the pub/sub's deliveries
//! (`targets.components.NAME.inbound`, read from the generation at each
//! event) replaces those defaults: its `timeout` bounds each attempt, its
//! `retry` sets the waits and the number of attempts (`maxRetries: -1`:
//! until the subscription stops), and while its circuit breaker is open
//! no event is sent to the app: events wait (without using up attempts)
//! until it half-opens.
//!
//! A subscription replaced by another (its settings changed) is *retired*
//! ([`Retire`]) rather than stopped: it goes on delivering what its broker
//! holds for it, and ends once it reaches events its successor already
//! delivered (the same CloudEvent `source` and `id`), once its broker has delivered nothing for [`HANDOVER_GRACE`]
//! with nothing in flight, or [`HANDOVER_LIMIT`] after it was retired
//! (the runtime's drain bounds for a replaced broker); then it waits for
//! what it has in flight (within the same limit).

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::resilience::{Applied, Failure, Guarded, Refusal};
use rewire_runtime::{
    Backoff, Delivery, DeliveryOutcome, PubSubHandle, PubSubSubscription, PublishRequest, Runtime,
    SubscribeRequest,
};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handover::{event_key, Delivered, Retire};
use super::pubsub_event::{TopicEvent, CLOUD_EVENT_CONTENT_TYPE};
use super::PubSubOpError;

/// Events of one subscription awaiting the subscriber's answer.
pub const MAX_IN_FLIGHT: usize = 32;
/// Attempts at one event before it is dead-lettered or handed back.
pub const MAX_ATTEMPTS: u32 = 5;
/// How long a subscriber on a stream has to take an event off it and to
/// answer it (what an app gets to answer an event delivered over HTTP).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// The first wait between attempts (doubled each time, up to 5 s).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between attempts without a retry policy.
const LAST_BACKOFF: Duration = Duration::from_secs(5);
/// How often an event waiting on an open circuit breaker asks it again.
const BREAKER_POLL: Duration = Duration::from_millis(250);
/// A retired subscription whose broker delivers nothing for this long,
/// with nothing in flight, ends (the runtime's drain grace).
pub const HANDOVER_GRACE: Duration = Duration::from_secs(5);
/// A retired subscription ends this long after it was retired at most,
/// however steadily it delivers (the runtime's drain limit).
pub const HANDOVER_LIMIT: Duration = Duration::from_secs(120);

/// Where the events of a subscription go.
#[tonic::async_trait]
pub trait EventSink: Send + Sync + 'static {
    /// Hands `event` to the subscriber; its answer (`RETRY` when none
    /// comes `within`).
    async fn send(&self, event: &TopicEvent, within: Duration) -> DeliveryOutcome;

    /// Resolves when the subscriber is gone for good.
    async fn closed(&self);
}

/// One subscription being delivered to a sink.
pub struct TopicDelivery {
    /// The pub/sub's name.
    pub pubsub_name: String,
    /// The topic.
    pub topic: String,
    /// Where events that fail for good go, if anywhere (read at each
    /// event: it may change while the subscription runs).
    pub dead_letter_topic: watch::Receiver<Option<String>>,
    /// Told when the subscription is replaced: it then retires (see the
    /// module docs).
    pub retire: Retire,
    /// What this subscription delivered, for the one it replaces.
    pub delivered: Arc<Delivered>,
}

/// Where a retiring subscription is.
struct Retiring {
    successor: Arc<Delivered>,
    until: Instant,
}

impl TopicDelivery {
    /// Subscribes through `runtime`'s handle of the pub/sub and delivers to
    /// `sink` in the background until the sink closes, `shutdown` is
    /// cancelled, or the pub/sub is removed. Fails when the pub/sub does
    /// not exist or refuses the subscription.
    pub async fn start(
        self,
        runtime: &Runtime,
        sink: Arc<dyn EventSink>,
        metadata: std::collections::HashMap<String, String>,
        shutdown: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, PubSubOpError> {
        if self.pubsub_name.is_empty() {
            return Err(PubSubOpError::NameEmpty);
        }
        if self.topic.is_empty() {
            return Err(PubSubOpError::TopicEmpty(self.pubsub_name));
        }
        let handle = runtime.pubsub(&self.pubsub_name);
        if handle.load().is_err() {
            return Err(PubSubOpError::NotFound(self.pubsub_name));
        }
        let request = SubscribeRequest {
            topic: self.topic.clone(),
            metadata,
        };
        let subscription =
            handle
                .subscribe(request)
                .await
                .map_err(|source| PubSubOpError::Publish {
                    pubsub: self.pubsub_name.clone(),
                    topic: self.topic.clone(),
                    source,
                })?;
        let this = Arc::new(self);
        let runtime = runtime.clone();
        Ok(tokio::spawn(this.run(
            runtime,
            handle,
            subscription,
            sink,
            shutdown,
        )))
    }

    async fn run(
        self: Arc<Self>,
        runtime: Runtime,
        handle: PubSubHandle,
        mut subscription: PubSubSubscription,
        sink: Arc<dyn EventSink>,
        shutdown: CancellationToken,
    ) {
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let mut retire = self.retire.clone();
        let mut retiring: Option<Retiring> = None;
        loop {
            let until = retiring.as_ref().map(|r| r.until);
            let idle = in_flight.available_permits() == MAX_IN_FLIGHT;
            // Biased: once stopped, no further event is taken.
            let permit = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = sink.closed() => return,
                () = sleep_until(until) => break,
                successor = retire.retired(), if retiring.is_none() => {
                    retiring = Some(Retiring { successor, until: Instant::now() + HANDOVER_LIMIT });
                    continue;
                }
                permit = in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let delivery = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = sink.closed() => return,
                () = sleep_until(until) => break,
                // Retired, its broker silent and nothing of it in flight:
                // it holds nothing more.
                () = tokio::time::sleep(HANDOVER_GRACE), if retiring.is_some() && idle => break,
                successor = retire.retired(), if retiring.is_none() => {
                    retiring = Some(Retiring { successor, until: Instant::now() + HANDOVER_LIMIT });
                    continue;
                }
                delivery = subscription.deliveries.recv() => match delivery {
                    Some(delivery) => delivery,
                    None => {
                        tracing::info!(pubsub = %self.pubsub_name, topic = %self.topic, "Pub/sub subscription ended.");
                        return;
                    }
                },
            };
            if let Some(retiring) = &retiring {
                let key = event_key(&delivery.message);
                if key.is_some_and(|key| retiring.successor.contains(key)) {
                    // Its successor delivered this event: what it holds
                    // from before the change is delivered.
                    delivery.settle(DeliveryOutcome::Success);
                    break;
                }
            }
            let (this, sink, handle) = (self.clone(), sink.clone(), handle.clone());
            let policy = runtime.generation().policies().inbound(&self.pubsub_name);
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let to = Subscriber {
                    sink: sink.as_ref(),
                    policy: policy.as_deref(),
                    shutdown: &stop,
                };
                let outcome = this.deliver(&delivery, to, &handle).await;
                if outcome != DeliveryOutcome::Retry {
                    this.delivered.record_message(&delivery.message);
                }
                delivery.settle(outcome);
                drop(permit);
            });
        }
        // Retired: what is in flight is settled before the subscription
        // is let go (within the limit).
        let all = u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX);
        let until = retiring.map(|r| r.until);
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = sleep_until(until) => {}
            _ = in_flight.acquire_many(all) => {}
        }
        tracing::info!(pubsub = %self.pubsub_name, topic = %self.topic, "A replaced subscription delivered what it held; ended.");
    }

    /// Delivers one message with retries; the outcome for the broker.
    async fn deliver(
        &self,
        delivery: &Delivery,
        to: Subscriber<'_>,
        handle: &PubSubHandle,
    ) -> DeliveryOutcome {
        let event = TopicEvent::of(&delivery.message, &self.pubsub_name, &self.topic);
        if super::event_expiry::has_expired(&event.cloud_event) {
            // As Dapr: acknowledged, neither delivered nor dead-lettered.
            tracing::warn!(pubsub = %self.pubsub_name, topic = %self.topic, id = %event.id, "Dropping an event past its expiration.");
            return DeliveryOutcome::Success;
        }
        let (mut backoff, attempts) = to.policy.and_then(Applied::retries).unwrap_or((
            Backoff::new(FIRST_BACKOFF, LAST_BACKOFF),
            Some(MAX_ATTEMPTS),
        ));
        let mut attempt: u32 = 0;
        loop {
            let outcome = match to.attempt(&event).await {
                Some(outcome) => outcome,
                None => {
                    // The breaker is open: the event waits, its attempts
                    // kept, until it lets calls through again.
                    if !to.wait(BREAKER_POLL).await {
                        return DeliveryOutcome::Retry;
                    }
                    continue;
                }
            };
            attempt = attempt.saturating_add(1);
            match outcome {
                DeliveryOutcome::Success => return DeliveryOutcome::Success,
                DeliveryOutcome::Drop => {
                    tracing::warn!(pubsub = %self.pubsub_name, topic = %self.topic, id = %event.id, "Subscriber dropped an event.");
                    self.dead_letter(delivery, handle).await;
                    return DeliveryOutcome::Drop;
                }
                DeliveryOutcome::Retry if attempts.is_none_or(|most| attempt < most) => {
                    if !to.wait(backoff.next_wait()).await {
                        return DeliveryOutcome::Retry;
                    }
                }
                DeliveryOutcome::Retry => break,
            }
        }
        if self.dead_letter(delivery, handle).await {
            DeliveryOutcome::Success
        } else {
            DeliveryOutcome::Retry
        }
    }

    /// Publishes the message to the dead-letter topic, if one is set.
    async fn dead_letter(&self, delivery: &Delivery, handle: &PubSubHandle) -> bool {
        let Some(topic) = self.dead_letter_topic.borrow().clone() else {
            return false;
        };
        let request = PublishRequest {
            topic: topic.clone(),
            data: delivery.message.data.clone(),
            content_type: Some(CLOUD_EVENT_CONTENT_TYPE.into()),
            metadata: Default::default(),
        };
        let published = match handle.load() {
            Ok(broker) => broker.publish(request).await,
            Err(err) => Err(rewire_runtime::PubSubError::Backend(err.to_string())),
        };
        match published {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(pubsub = %self.pubsub_name, topic = %topic, error = %err, "Sending an event to the dead-letter topic failed.");
                false
            }
        }
    }
}

/// Where one event goes: the sink, under the pub/sub's inbound policy if
/// it has one, until the subscription stops.
#[derive(Clone, Copy)]
struct Subscriber<'a> {
    sink: &'a dyn EventSink,
    policy: Option<&'a Applied>,
    shutdown: &'a CancellationToken,
}

/// An answer that asks for the event again: a failed attempt, for the
/// policy's breaker.
struct AskedAgain;

impl Failure for AskedAgain {
    fn is_failure(&self) -> bool {
        true
    }
}

impl Subscriber<'_> {
    /// One attempt at `event`: the subscriber's answer (`RETRY` when it
    /// does not come within the policy's timeout, else [`ANSWER_WITHIN`]);
    /// `None` when the policy's breaker is open and nothing was sent.
    async fn attempt(&self, event: &TopicEvent) -> Option<DeliveryOutcome> {
        let Some(policy) = self.policy else {
            return Some(self.sink.send(event, ANSWER_WITHIN).await);
        };
        let within = policy.timeout().unwrap_or(ANSWER_WITHIN);
        let sent = policy.run_once(async {
            match self.sink.send(event, within).await {
                DeliveryOutcome::Retry => Err(AskedAgain),
                answer => Ok(answer),
            }
        });
        match sent.await {
            Ok(answer) => Some(answer),
            Err(Guarded::Refused(Refusal::BreakerOpen { .. })) => None,
            Err(_) => Some(DeliveryOutcome::Retry),
        }
    }

    /// Waits `wait`; false when the subscriber or the subscription is gone
    /// first (the event then goes back to the broker).
    async fn wait(&self, wait: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = self.sink.closed() => false,
            () = self.shutdown.cancelled() => false,
        }
    }
}

/// Resolves at `until`, never without one.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}
