//! The delivery engine behind every way of subscribing (a gRPC stream, an
//! app's HTTP routes, an app's gRPC callback): it reads a subscription made
//! through the pub/sub's handle (so it follows the broker across reloads),
//! turns each message into its CloudEvent, hands it to an [`EventSink`]
//! and settles the message with the sink's answer.
//!
//! Bounds: the broker answers the subscribe within [`SUBSCRIBE_WITHIN`]
//! (else it is refused, and its caller tries again later); at most
//! [`MAX_IN_FLIGHT`] events per subscription await their answer; each
//! attempt gets [`ANSWER_WITHIN`] (a stream instead ends once its client
//! makes no progress for that long); an event answered `RETRY`
//! (or not answered in time) is tried again with a backoff, up to
//! [`MAX_ATTEMPTS`] times in all; then it goes to the dead-letter topic
//! when one is set (and is acknowledged), else back to the broker, which
//! delivers it again later. A send that could not reach the subscriber
//! at all (nothing listens on the app's port: a restart, a deploy; see
//! [`EventSink::send_if_reachable`]) is no attempt: the event waits until
//! the app listens again ([`EventSink::reachable`]), its attempts kept,
//! however long that takes (the subscription's stop, shutdown and the
//! end of a hand-over still end the wait, the event then going back to
//! the broker), so an app that is down briefly does not have the events
//! in flight and those read meanwhile dead-lettered within seconds.
//! `DROP` acknowledges it once the dead-letter
//! topic, when one is set, took it; one it did not take goes back to the
//! broker (as Dapr: acknowledged, it was in neither topic). An event past
//! its `expiration` or one no route of the sink takes (asked before every
//! attempt: a reload may change the routes while an event is retried) is
//! not sent (again), goes to the dead-letter topic when one is set, and
//! is acknowledged (as Dapr), also when its dead-letter publish fails (as
//! Dapr, which ignores that error: handed back, the event would come back
//! and fail the same way for ever), with a warning naming it. A dead
//! letter is the message as it came (content type and metadata kept) and
//! follows its broker across a reload as the publish API does. The
//! dead-letter topic can be changed while the subscription runs. One its
//! broker never takes ([`PubSub::check_topic`]: the redis pub/sub's
//! holding `||`) refuses the subscription as its topic would be
//! ([`TopicDelivery::check_dead_letter_topic`]), rather than have every
//! dead letter refused and its event delivered and failed again for ever.
//!
//! A `resiliency` policy targeted at the pub/sub's deliveries
//! (`targets.components.NAME.inbound`, read from the generation at each
//! attempt) replaces those defaults: its `timeout` bounds each attempt, its
//! `retry` sets the waits and the number of attempts (`maxRetries: -1`:
//! until the subscription stops), and while its circuit breaker is open
//! no event is sent to the app: events wait (without using up attempts)
//! until it half-opens. (Dapr instead ends such an event's retries, to the
//! dead-letter topic or back to the broker; holding the at most
//! [`MAX_IN_FLIGHT`] events taken keeps an app's outage from emptying the
//! topic into its dead letters, and the broker keeps the rest.)
//!
//! Each attempt runs in a delivery span, a child of the trace the event
//! carries (as Dapr's); an app's HTTP headers and gRPC metadata carry that
//! span's context, never the event's trace fields unchecked (any writer
//! of the topic may fill them). The event itself is not altered: the
//! gRPC `extensions` and a streamed subscriber's message carry its fields
//! as they came (in the message body, where no header limit applies).
//!
//! Every event's retries end with its subscription: when the delivery
//! loop ends (stopped, its sink gone, or retired and done), an event
//! waiting for its next attempt goes back to the broker; an attempt
//! already sent ends within its bound and settles the event with the
//! subscriber's answer.
//!
//! A subscription replaced by another (its settings changed) is *retired*
//! ([`Retire`]) rather than stopped: it goes on delivering what its broker
//! holds for it, and ends once it reaches an event a later subscription of
//! its lineage delivered (the same CloudEvent, by its bytes; see
//! [`handover`](super::handover), which also keeps the two from sending
//! the same event) and has read again every event it handed back to its
//! broker since it was retired (or, owing one, its broker gave it nothing
//! for [`HANDOVER_GRACE`] while it could take one: the memory broker
//! gives a failed event again to the subscription that failed it alone;
//! see the `retiring` module); or once its broker has delivered nothing
//! for [`HANDOVER_GRACE`] with nothing in flight (counted from when its
//! last event in flight settled); or [`HANDOVER_LIMIT`] after it was
//! retired (the runtime's drain bounds for a replaced broker); then it
//! waits for what it has in flight (within the same limit), and reads
//! again when one of those was handed back meanwhile.

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::config::resiliency::RetryPolicy;
use rewire_runtime::resilience::{Applied, Failure, Guarded, Refusal};
use rewire_runtime::{
    echoed, Backoff, Delivery, DeliveryOutcome, PubSub, PubSubError, PubSubHandle,
    PubSubSubscription, PublishRequest, Runtime, SubscribeRequest,
};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::handover::{Delivered, Retire, Taken};
use super::pubsub::{follow_retired, NotPublished};
use super::pubsub_event::TopicEvent;
use super::PubSubOpError;
use retiring::Handover;

mod retiring;

/// Events of one subscription awaiting the subscriber's answer.
pub const MAX_IN_FLIGHT: usize = 32;
/// Attempts at one event before it is dead-lettered or handed back.
pub const MAX_ATTEMPTS: u32 = 5;
/// How long an app has to answer an event delivered to its callback, and
/// how long a streamed subscriber with events outstanding may go without
/// taking or answering any (not a bound per event: its client handles
/// them one at a time while the rest wait in the stream).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How long the broker has to answer a subscription's subscribe: the
/// longest bound the runtime gives a slow broker's subscribe (its
/// `SLOW_SUBSCRIBE_BOUND`), which also covers a reload's warm-up that a
/// subscribe made meanwhile waits for (up to 10 s). A broker slow to
/// answer but answering (a raised `dialTimeout`, a failover) is
/// subscribed; only one that does not answer at all is given up on.
pub const SUBSCRIBE_WITHIN: Duration = Duration::from_secs(40);
/// The first wait between attempts (doubled each time, up to 5 s).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between attempts without a retry policy.
const LAST_BACKOFF: Duration = Duration::from_secs(5);
/// How long a dead letter's publish may take (the broker's, followed
/// across a reload): one that hangs (a black-holed server with no read
/// timeout) fails, and the event goes back to its broker, as any failed
/// dead letter; the drain of a replaced broker waits for it no longer.
pub(crate) const DEAD_LETTER_WITHIN: Duration = Duration::from_secs(30);
/// How often an event waiting on an open circuit breaker asks it again.
const BREAKER_POLL: Duration = Duration::from_millis(250);
/// The longest wait between sends to a subscriber that could not be
/// reached (starting at [`FIRST_BACKOFF`], doubled each time it still
/// cannot be), besides the wait for [`EventSink::reachable`].
pub const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_secs(5);
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

    /// The bound on one attempt when no inbound policy sets a timeout:
    /// [`ANSWER_WITHIN`]. A sink that bounds its subscriber's progress
    /// rather than each event (a stream, whose SDK client handles one
    /// event at a time while the rest wait in the stream) answers `None`,
    /// and its attempts then get [`Duration::MAX`].
    fn default_within(&self) -> Option<Duration> {
        Some(ANSWER_WITHIN)
    }

    /// [`send`](Self::send), saying when nothing of the event reached the
    /// subscriber at all (`None`): it could not be connected to (nothing
    /// listens on its port, the connection was refused or not made in
    /// time), so it cannot have seen the event. Such a send is no
    /// attempt: the event waits for [`reachable`](Self::reachable), its
    /// attempts kept. An answer of any kind, and a failure once the
    /// request may have reached the subscriber, is `Some` (a `RETRY`
    /// spends an attempt). By default every send is taken to have reached
    /// it.
    async fn send_if_reachable(
        &self,
        event: &TopicEvent,
        within: Duration,
    ) -> Option<DeliveryOutcome> {
        Some(self.send(event, within).await)
    }

    /// Resolves once a subscriber that
    /// [`send_if_reachable`](Self::send_if_reachable) could not reach may
    /// be reached again (its port takes connections). Need not end by
    /// itself: the engine ends the wait when the subscription stops, and
    /// spaces sends to a subscriber still unreachable by a backoff (up to
    /// [`UNREACHABLE_BACKOFF_MAX`]). By default at once.
    async fn reachable(&self) {}

    /// Resolves when the subscriber is gone for good.
    async fn closed(&self);

    /// Whether `event` would be sent to the subscriber at all: one no
    /// route takes is not sent, but goes to the dead-letter topic when one
    /// is set, else is acknowledged (as Dapr); it is neither counted by an
    /// inbound circuit breaker nor held by it.
    fn takes(&self, _event: &TopicEvent) -> bool {
        true
    }
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
    /// This subscription in its lineage (the subscriptions of its topic
    /// handing over): how it claims the events it sends.
    pub delivered: Arc<Delivered>,
}

impl TopicDelivery {
    /// Subscribes through `runtime`'s handle of the pub/sub and delivers to
    /// `sink` in the background until the sink closes, `shutdown` is
    /// cancelled, or the pub/sub is removed. Fails when the pub/sub does
    /// not exist, refuses the subscription, or does not answer it within
    /// [`SUBSCRIBE_WITHIN`].
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
        // The name is the client's (a streamed subscription's): cut.
        if self.topic.is_empty() {
            let name = echoed(&self.pubsub_name).into_owned();
            return Err(PubSubOpError::TopicEmpty(name));
        }
        let handle = runtime.pubsub(&self.pubsub_name);
        if handle.load().is_err() {
            let name = echoed(&self.pubsub_name).into_owned();
            return Err(PubSubOpError::NotFound(name));
        }
        let dead_letter_topic = self.dead_letter_topic.borrow().clone();
        Self::check_dead_letter_topic(
            runtime,
            &self.pubsub_name,
            &self.topic,
            dead_letter_topic.as_deref(),
        )?;
        // As Dapr's subscriber: a value that is no boolean is not one.
        let raw_payload =
            super::pubsub::parse_raw_payload(metadata.get("rawPayload").map(String::as_str))
                .unwrap_or(false);
        let request = SubscribeRequest {
            topic: self.topic.clone(),
            metadata,
        };
        // A broker that never answers (a server that took the connection
        // and went silent) must not hold the caller: an app's
        // subscriptions start one after another, and a refused one is
        // started again later.
        let subscribed = tokio::time::timeout(SUBSCRIBE_WITHIN, handle.subscribe(request))
            .await
            .unwrap_or_else(|_| {
                Err(PubSubError::Backend(format!(
                    "subscribing: the broker did not answer within {SUBSCRIBE_WITHIN:?}"
                )))
            });
        let subscription = subscribed.map_err(|source| PubSubOpError::Subscribe {
            pubsub: echoed(&self.pubsub_name).into_owned(),
            topic: echoed(&self.topic).into_owned(),
            source: match source {
                PubSubError::Invalid(m) => PubSubError::Invalid(runtime.redact(&m)),
                PubSubError::Busy(m) => PubSubError::Busy(runtime.redact(&m)),
                PubSubError::Backend(m) => PubSubError::Backend(runtime.redact(&m)),
                PubSubError::Retired => PubSubError::Retired,
            },
        })?;
        let this = Arc::new(self);
        let runtime = runtime.clone();
        Ok(tokio::spawn(this.run(
            runtime,
            handle,
            subscription,
            sink,
            raw_payload,
            shutdown,
        )))
    }

    /// Refuses a subscription to `topic` of `pubsub_name` whose
    /// `dead_letter_topic` its broker never takes
    /// ([`PubSub::check_topic`]: the redis pub/sub's holding `||`), as the
    /// topic itself would be ([`PubSubOpError::Subscribe`] with the
    /// broker's [`PubSubError::Invalid`], redacted and said to be of the
    /// dead-letter topic): running, every dead letter of it would be
    /// refused and its event handed back to the broker, delivered and
    /// failed again for ever. Asked where a subscription starts, of an
    /// app's running subscription at each reload (which may change its
    /// dead-letter topic, or its broker) before anything of the reload
    /// applies to it, and of a streamed one at each reload (whose broker
    /// may change: its stream then ends `INVALID_ARGUMENT`). `Ok` with none, or when the
    /// pub/sub is not in the generation (its start says so).
    pub fn check_dead_letter_topic(
        runtime: &Runtime,
        pubsub_name: &str,
        topic: &str,
        dead_letter_topic: Option<&str>,
    ) -> Result<(), PubSubOpError> {
        let Some(dead_letter_topic) = dead_letter_topic else {
            return Ok(());
        };
        let Ok(broker) = runtime.pubsub(pubsub_name).load() else {
            return Ok(());
        };
        broker.check_topic(dead_letter_topic).map_err(|refused| {
            let why = match refused {
                PubSubError::Invalid(m) | PubSubError::Busy(m) | PubSubError::Backend(m) => m,
                PubSubError::Retired => PubSubError::Retired.to_string(),
            };
            PubSubOpError::Subscribe {
                pubsub: echoed(pubsub_name).into_owned(),
                topic: echoed(topic).into_owned(),
                source: PubSubError::Invalid(format!(
                    "its dead-letter topic is refused: {}",
                    runtime.redact(&why)
                )),
            }
        })
    }

    async fn run(
        self: Arc<Self>,
        runtime: Runtime,
        handle: PubSubHandle,
        mut subscription: PubSubSubscription,
        sink: Arc<dyn EventSink>,
        raw_payload: bool,
        shutdown: CancellationToken,
    ) {
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        // The events' own stop: cancelled however this loop ends, so no
        // event is retried for a subscription that is gone.
        let events = shutdown.child_token();
        let _events_end = events.clone().drop_guard();
        let mut retire = self.retire.clone();
        // Retired: until when it may deliver.
        let mut until: Option<Instant> = None;
        let handover = Arc::new(Handover::new());
        let waiting = Arc::new(WaitingForApp::default());
        'delivering: loop {
            // How many events it had handed back when it stopped reading.
            let read_until = loop {
                // Biased: once stopped, no further event is taken.
                let permit = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    () = sink.closed() => return,
                    () = sleep_until(until) => break handover.handed_back_count(),
                    () = retire.retired(), if until.is_none() => {
                        until = Some(Instant::now() + HANDOVER_LIMIT);
                        handover.retire();
                        continue;
                    }
                    permit = in_flight.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                };
                // Owing an event it handed back, it never ends over a
                // delivery already queued (that event may be it): its ends
                // are off while the queue holds one, and checked again once
                // they fire. Owing none, what is queued is newer than what
                // the later subscription delivered, which has it too: it
                // ends over it rather than send it by its old settings.
                let owing = until.is_some() && !handover.owes_nothing();
                let delivery = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    () = sink.closed() => return,
                    () = sleep_until(until) => break handover.handed_back_count(),
                    seen = handover.caught_up_and_owing_nothing(),
                        if until.is_some() && (!owing || subscription.deliveries.is_empty()) =>
                    {
                        match owing && !subscription.deliveries.is_empty() {
                            false => break seen,
                            true => continue,
                        }
                    }
                    // Retired, its broker silent and nothing of it in flight:
                    // it holds nothing more. The grace starts once the last
                    // event in flight settled, also while this waits.
                    () = settled_then_silent(&in_flight, HANDOVER_GRACE),
                        if until.is_some() && (!owing || subscription.deliveries.is_empty()) =>
                    {
                        match owing && !subscription.deliveries.is_empty() {
                            false => break handover.handed_back_count(),
                            true => continue,
                        }
                    }
                    () = retire.retired(), if until.is_none() => {
                        until = Some(Instant::now() + HANDOVER_LIMIT);
                        handover.retire();
                        continue;
                    }
                    delivery = subscription.deliveries.recv() => match delivery {
                        Some(delivery) => delivery,
                        None => {
                            tracing::info!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), "Pub/sub subscription ended.");
                            return;
                        }
                    },
                };
                if until.is_some() {
                    handover.read_again(&delivery.message);
                }
                let (this, sink, handle) = (self.clone(), sink.clone(), handle.clone());
                let (runtime, stop, handover) = (runtime.clone(), events.clone(), handover.clone());
                let waiting = waiting.clone();
                tokio::spawn(async move {
                    let to = Subscriber {
                        sink: sink.as_ref(),
                        runtime: &runtime,
                        pubsub_name: &this.pubsub_name,
                        raw_payload,
                        stop: &stop,
                        waiting: &waiting,
                    };
                    this.settle(delivery, to, &handle, &handover).await;
                    drop(permit);
                });
            };
            // Retired: what is in flight is settled before the subscription
            // is let go (within the limit).
            let all = u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break 'delivering,
                () = sleep_until(until) => break 'delivering,
                _ = in_flight.acquire_many(all) => {}
            }
            // One handed back since it stopped reading may come back to
            // this subscription alone: it reads again for it (within the
            // limit), until it has read it again or its broker is quiet.
            if handover.handed_back_count() == read_until {
                break;
            }
        }
        tracing::info!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), "A replaced subscription delivered what it held; ended.");
    }

    /// Claims, delivers and settles one message; one handed back to the
    /// broker is told to `handover` before it is settled.
    async fn settle(
        &self,
        delivery: Delivery,
        to: Subscriber<'_>,
        handle: &PubSubHandle,
        handover: &Handover,
    ) {
        let claim = match self.delivered.take(&delivery.message, to.stop).await {
            Some(Taken::Send(claim)) => claim,
            Some(Taken::DeliveredBy { later }) => {
                // Not sent again. Delivered by a later subscription: what
                // this one held from before the change is delivered.
                if later {
                    handover.caught_up.cancel();
                }
                delivery.settle(DeliveryOutcome::Success);
                return;
            }
            // Stopped while another one had it in flight.
            None => {
                handover.handed_back(&delivery.message);
                delivery.settle(DeliveryOutcome::Retry);
                return;
            }
        };
        let Handled { outcome, unrouted } = self.deliver(&delivery, to, handle).await;
        if let Some(claim) = claim {
            // One its routes do not take is not delivered for the
            // lineage: each other one decides by its own.
            claim.answer(!unrouted && outcome != DeliveryOutcome::Retry);
        }
        if outcome == DeliveryOutcome::Retry {
            handover.handed_back(&delivery.message);
        }
        delivery.settle(outcome);
    }

    /// Delivers one message with retries.
    async fn deliver(
        &self,
        delivery: &Delivery,
        to: Subscriber<'_>,
        handle: &PubSubHandle,
    ) -> Handled {
        let event = match to.raw_payload {
            true => TopicEvent::of_raw_payload(&delivery.message, &self.pubsub_name, &self.topic),
            false => TopicEvent::of(&delivery.message, &self.pubsub_name, &self.topic),
        };
        self.deliver_routed(&event, delivery, to, handle).await
    }

    /// Whether `event` is past its `expiration`, said in the log when it
    /// is: as Dapr, it is then not delivered (see [`Self::set_aside`]).
    fn expired(&self, event: &TopicEvent) -> bool {
        let expired = super::event_expiry::has_expired(event.expiration().as_deref());
        if expired {
            tracing::warn!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), id = %logged(&event.id), "Dropping an event past its expiration.");
        }
        expired
    }

    /// Sends an event by the sink's routes, with retries: set aside as
    /// unrouted once no route takes it, asked before every attempt (a
    /// reload may change the routes while the event is retried) and once
    /// its attempts ran out; set aside as expired once past its
    /// `expiration`, also asked before every send (an event that waited
    /// for an app that was down, or on an open breaker, for longer than
    /// its time to live is not delivered late).
    async fn deliver_routed(
        &self,
        event: &TopicEvent,
        delivery: &Delivery,
        to: Subscriber<'_>,
        handle: &PubSubHandle,
    ) -> Handled {
        // The retry policy the waits follow (`None`: the defaults); a
        // reload that changes it applies from the next attempt.
        let mut retry: Option<RetryPolicy> = None;
        let mut backoff = default_backoff();
        let mut attempt: u32 = 0;
        // The spacing of sends that could not reach the subscriber: they
        // spend no attempt, so they are spaced apart by their own waits.
        let mut unreachable_backoff = Backoff::new(FIRST_BACKOFF, UNREACHABLE_BACKOFF_MAX);
        // Since when it waits for the subscriber (counted while it does).
        let mut waiting: Option<(WaitingEvent<'_>, Instant, std::time::SystemTime)> = None;
        loop {
            if self.expired(event) {
                // As Dapr: not delivered; sent to the dead-letter topic
                // when one is set, and acknowledged.
                return self.set_aside(event, delivery, handle).await.into();
            }
            if !to.sink.takes(event) {
                return self.unrouted(event, delivery, handle).await;
            }
            let policy = to.policy();
            let current = policy.as_deref().and_then(Applied::retry_policy);
            if current != retry.as_ref() {
                retry = current.cloned();
                backoff = retry
                    .as_ref()
                    .map_or_else(default_backoff, Applied::backoff);
            }
            let attempts = retry.as_ref().map_or(Some(MAX_ATTEMPTS), |policy| {
                policy.max_retries.map(|most| most.saturating_add(1))
            });
            let outcome = match to.attempt(event, policy.as_deref()).await {
                Attempt::Answered(outcome) => {
                    // Reached: it no longer waits for the subscriber.
                    waiting = None;
                    outcome
                }
                Attempt::Held => {
                    // The breaker is open: the event waits, its attempts
                    // kept, until it lets calls through again.
                    if !to.wait(BREAKER_POLL).await {
                        return DeliveryOutcome::Retry.into();
                    }
                    continue;
                }
                Attempt::Unreachable => {
                    // Nothing reached the subscriber (the app is down: a
                    // restart, a deploy): no attempt was spent. The event
                    // waits, its attempts kept, until it listens again.
                    tracing::debug!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), id = %logged(&event.id), "The subscriber could not be reached; the event waits for it.");
                    let (_, since, at) = waiting.get_or_insert_with(|| {
                        (
                            to.waiting.wait(),
                            Instant::now(),
                            std::time::SystemTime::now(),
                        )
                    });
                    // Said once for the subscription when it has waited
                    // long (also while this wait goes on).
                    let wait = to.wait_reachable(unreachable_backoff.next_wait());
                    tokio::pin!(wait);
                    let reached = tokio::select! {
                        reached = &mut wait => reached,
                        () = tokio::time::sleep_until(*since + WARN_WAITING_AFTER) => {
                            to.waiting.warn_once(&self.pubsub_name, &self.topic, *at);
                            wait.await
                        }
                    };
                    if !reached {
                        return DeliveryOutcome::Retry.into();
                    }
                    continue;
                }
            };
            attempt = attempt.saturating_add(1);
            match outcome {
                DeliveryOutcome::Success => return DeliveryOutcome::Success.into(),
                DeliveryOutcome::Drop => {
                    tracing::warn!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), id = %logged(&event.id), "Subscriber dropped an event.");
                    // As Dapr: one its dead-letter topic did not take goes
                    // back to the broker (acknowledged, it was in neither
                    // topic).
                    let outcome = match self.dead_letter(event, delivery, handle).await {
                        DeadLetter::Failed => DeliveryOutcome::Retry,
                        DeadLetter::NoTopic | DeadLetter::Sent => DeliveryOutcome::Drop,
                    };
                    return outcome.into();
                }
                DeliveryOutcome::Retry if attempts.is_none_or(|most| attempt < most) => {
                    if !to.wait(backoff.next_wait()).await {
                        return DeliveryOutcome::Retry.into();
                    }
                }
                DeliveryOutcome::Retry => break,
            }
        }
        // Its routes changed during the last attempt (the sink answers
        // RETRY to one it finds no route for when sending).
        if !to.sink.takes(event) {
            return self.unrouted(event, delivery, handle).await;
        }
        let outcome = match self.dead_letter(event, delivery, handle).await {
            DeadLetter::Sent => DeliveryOutcome::Success,
            DeadLetter::NoTopic | DeadLetter::Failed => DeliveryOutcome::Retry,
        };
        outcome.into()
    }

    /// An event no route of the sink takes (and with no default route),
    /// as Dapr: not delivered; it goes to the dead-letter topic when one
    /// is set, and is acknowledged, but is not delivered for the rest of
    /// its lineage (each decides by its own routes).
    async fn unrouted(
        &self,
        event: &TopicEvent,
        delivery: &Delivery,
        handle: &PubSubHandle,
    ) -> Handled {
        tracing::debug!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), id = %logged(&event.id), "No route takes the event.");
        Handled {
            outcome: self.set_aside(event, delivery, handle).await,
            unrouted: true,
        }
    }

    /// The outcome of an event that is not delivered at all (past its
    /// expiration, or no route takes it): sent to the dead-letter topic
    /// when one is set, and acknowledged, also when that send fails (with
    /// a warning naming the event), as Dapr's subscription handler
    /// (`_ = s.sendToDeadLetter(...)`, then `nil`): handed back, it would
    /// expire or go unrouted again, and its dead-letter send fail again,
    /// for ever.
    async fn set_aside(
        &self,
        event: &TopicEvent,
        delivery: &Delivery,
        handle: &PubSubHandle,
    ) -> DeliveryOutcome {
        // A failed send is said in the log; the event is let go.
        self.dead_letter(event, delivery, handle).await;
        DeliveryOutcome::Success
    }

    /// Publishes the message to the dead-letter topic, if one is set, as
    /// it came (its content type and metadata, as Dapr's
    /// `sendToDeadLetter`: a raw payload stays one, not read as a
    /// CloudEvent), following the broker across a reload as the publish
    /// API does. A failed publish is said in the log, naming the event,
    /// its topic and the dead-letter topic.
    async fn dead_letter(
        &self,
        event: &TopicEvent,
        delivery: &Delivery,
        handle: &PubSubHandle,
    ) -> DeadLetter {
        let Some(topic) = self.dead_letter_topic.borrow().clone() else {
            return DeadLetter::NoTopic;
        };
        let request = PublishRequest {
            topic: topic.clone(),
            data: delivery.message.data.clone(),
            content_type: delivery.message.content_type.clone(),
            metadata: delivery.message.metadata.clone(),
        };
        let published = match handle.load() {
            Ok(broker) => {
                let serving = || handle.load().ok();
                let publish = |broker: Arc<dyn PubSub>| {
                    let request = request.clone();
                    async move { broker.publish(request).await }
                };
                let following = follow_retired(broker, serving, publish);
                match tokio::time::timeout(DEAD_LETTER_WITHIN, following).await {
                    Ok(published) => published,
                    Err(_) => Err(NotPublished::Refused(PubSubError::Backend(format!(
                        "the dead-letter topic's broker did not answer within \
                         {DEAD_LETTER_WITHIN:?}"
                    )))),
                }
            }
            Err(err) => Err(NotPublished::Refused(PubSubError::Backend(err.to_string()))),
        };
        let err = match published {
            Ok(()) => return DeadLetter::Sent,
            Err(NotPublished::Gone) => PubSubError::Backend("the pub/sub was removed".into()),
            Err(NotPublished::Refused(err)) => err,
        };
        tracing::warn!(pubsub = %self.pubsub_name, topic = %logged(&self.topic), id = %logged(&event.id), dead_letter_topic = %logged(&topic), error = %logged(&err.to_string()), "Sending an event to the dead-letter topic failed.");
        DeadLetter::Failed
    }
}

/// What became of an event sent to the dead-letter topic.
enum DeadLetter {
    /// None is set.
    NoTopic,
    /// The broker took it.
    Sent,
    /// The publish failed.
    Failed,
}

/// What became of one event.
struct Handled {
    /// Its outcome for the broker.
    outcome: DeliveryOutcome,
    /// No route of the sink took it (so it was not sent): it counts as
    /// delivered for the broker, not for the rest of its lineage, whose
    /// routes may take it.
    unrouted: bool,
}

impl From<DeliveryOutcome> for Handled {
    fn from(outcome: DeliveryOutcome) -> Self {
        Self {
            outcome,
            unrouted: false,
        }
    }
}

/// The waits between attempts without a retry policy.
fn default_backoff() -> Backoff {
    Backoff::new(FIRST_BACKOFF, LAST_BACKOFF)
}

/// Where one event goes: the sink, under the pub/sub's inbound policy of
/// the generation serving, until the subscription stops.
#[derive(Clone, Copy)]
struct Subscriber<'a> {
    sink: &'a dyn EventSink,
    runtime: &'a Runtime,
    pubsub_name: &'a str,
    /// The subscription's `rawPayload`: each message is the payload as
    /// published, wrapped as Dapr's `FromRawPayload` wraps it.
    raw_payload: bool,
    stop: &'a CancellationToken,
    /// The subscription's events waiting for an app that is down.
    waiting: &'a WaitingForApp,
}

/// How long the subscription's events wait for an app that cannot be
/// reached before one warning says so.
const WARN_WAITING_AFTER: Duration = Duration::from_secs(30);

/// The events of one subscription waiting for an app that cannot be
/// reached: one warning once one waited [`WARN_WAITING_AFTER`], again
/// only after none waited.
#[derive(Default)]
struct WaitingForApp {
    /// How many events wait.
    count: std::sync::atomic::AtomicUsize,
    /// Whether the warning was given since none waited.
    warned: std::sync::atomic::AtomicBool,
}

impl WaitingForApp {
    /// One more event waits (until the guard is dropped).
    fn wait(&self) -> WaitingEvent<'_> {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        WaitingEvent(self)
    }

    /// Warns, once, that events have waited since `since`.
    fn warn_once(&self, pubsub: &str, topic: &str, since: std::time::SystemTime) {
        if self.warned.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let waiting = self.count.load(std::sync::atomic::Ordering::SeqCst);
        let since = since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let since = rewire_runtime::rfc3339_utc(since);
        tracing::warn!(pubsub = %pubsub, topic = %logged(topic), waiting, since = %since, "{waiting} events are waiting for the app, which cannot be reached, since {since}.");
    }
}

/// One event waiting for the app ([`WaitingForApp::wait`]).
struct WaitingEvent<'a>(&'a WaitingForApp);

impl Drop for WaitingEvent<'_> {
    fn drop(&mut self) {
        let ordering = std::sync::atomic::Ordering::SeqCst;
        if self.0.count.fetch_sub(1, ordering) == 1 {
            self.0.warned.store(false, ordering);
        }
    }
}

/// How one attempt at an event ended.
enum Attempt {
    /// The subscriber answered (`RETRY` too when it did not in time).
    Answered(DeliveryOutcome),
    /// The inbound breaker let nothing through: nothing was sent.
    Held,
    /// The subscriber could not be reached at all: nothing of the event
    /// reached it ([`EventSink::send_if_reachable`]).
    Unreachable,
}

/// A send that did not settle the event, for the policy's breaker: a
/// failed call either way (an app that is down is failing).
enum NotSettled {
    /// The subscriber asked for the event again (or did not answer).
    AskedAgain,
    /// The subscriber could not be reached.
    Unreachable,
}

impl Failure for NotSettled {
    fn is_failure(&self) -> bool {
        true
    }
}

impl Subscriber<'_> {
    /// The pub/sub's inbound policy now, if it has one.
    fn policy(&self) -> Option<Arc<Applied>> {
        self.runtime
            .generation()
            .policies()
            .inbound(self.pubsub_name)
    }

    /// One attempt at `event` under `policy`: its timeout (else the
    /// sink's [`EventSink::default_within`]) is the sink's to keep, so a
    /// sink that ends its own wait cleans up after it; its breaker admits
    /// the attempt and counts how it ended. Not cut when the subscription
    /// stops: an attempt sent ends within its bound with the subscriber's
    /// answer, which settles the event (cut, a subscriber that handled it
    /// would get it again).
    async fn attempt(&self, event: &TopicEvent, policy: Option<&Applied>) -> Attempt {
        let within = policy
            .and_then(Applied::timeout)
            .or_else(|| self.sink.default_within())
            .unwrap_or(Duration::MAX);
        let Some(policy) = policy.filter(|_| self.sink.takes(event)) else {
            return match self.send(event, within).await {
                Some(answer) => Attempt::Answered(answer),
                None => Attempt::Unreachable,
            };
        };
        let admitted = policy.run_admitted(async {
            match self.send(event, within).await {
                Some(DeliveryOutcome::Retry) => Err(NotSettled::AskedAgain),
                Some(answer) => Ok(answer),
                None => Err(NotSettled::Unreachable),
            }
        });
        match admitted.await {
            Ok(answer) => Attempt::Answered(answer),
            Err(Guarded::Refused(Refusal::BreakerOpen { .. })) => Attempt::Held,
            Err(Guarded::Failed(NotSettled::Unreachable)) => Attempt::Unreachable,
            Err(_) => Attempt::Answered(DeliveryOutcome::Retry),
        }
    }

    /// Sends `event` to the sink within its delivery span, which the
    /// sink's trace headers continue (as Dapr's: a child of the event's
    /// trace, when it carries a valid one); `None` when it could not reach
    /// the subscriber ([`EventSink::send_if_reachable`]).
    async fn send(&self, event: &TopicEvent, within: Duration) -> Option<DeliveryOutcome> {
        let (traceparent, tracestate) = (
            event.cloud_event.text("traceparent"),
            event.cloud_event.text("tracestate"),
        );
        let span = crate::telemetry::propagation::delivery_span(
            self.pubsub_name,
            &event.topic,
            traceparent.as_deref(),
            tracestate.as_deref(),
        );
        self.sink
            .send_if_reachable(event, within)
            .instrument(span)
            .await
    }

    /// Waits `wait`; false when the subscriber or the subscription is gone
    /// first (the event then goes back to the broker).
    async fn wait(&self, wait: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = self.sink.closed() => false,
            () = self.stop.cancelled() => false,
        }
    }

    /// Waits until the subscriber may be reached again
    /// ([`EventSink::reachable`]) and at least `at_least`; false when the
    /// subscriber or the subscription is gone first (the event then goes
    /// back to the broker).
    async fn wait_reachable(&self, at_least: Duration) -> bool {
        let reachable = async {
            tokio::join!(self.sink.reachable(), tokio::time::sleep(at_least));
        };
        tokio::select! {
            () = reachable => true,
            () = self.sink.closed() => false,
            () = self.stop.cancelled() => false,
        }
    }
}

/// Resolves once no event is in flight (`in_flight` has every permit
/// back but the one the delivery loop holds for its next event) and
/// `grace` has passed since.
async fn settled_then_silent(in_flight: &Semaphore, grace: Duration) {
    let others = u32::try_from(MAX_IN_FLIGHT.saturating_sub(1)).unwrap_or(u32::MAX);
    match in_flight.acquire_many(others).await {
        // Given back at once: only the loop, waiting here, takes permits.
        Ok(settled) => drop(settled),
        // Never closed; were it, nothing would settle any more.
        Err(_) => std::future::pending::<()>().await,
    }
    tokio::time::sleep(grace).await;
}

/// `text` as a delivery's log line shows it: cut by [`echoed`], control
/// characters escaped. An event's `id` is whatever its publisher wrote
/// (of any length, `\n` included), and a log writer escapes no newline:
/// raw, one id could forge log lines or write a MiB per warning.
pub(crate) fn logged(text: &str) -> String {
    let mut shown = String::new();
    for c in echoed(text).chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Resolves at `until`, never without one.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{
        Component, PubSub, PubSubError, Registry, RuntimeOptions, SubscriptionFeed,
    };

    use super::*;
    use crate::dapr::pubsub_event::CLOUD_EVENT_CONTENT_TYPE;

    /// The feed of each subscription made to [`FedBroker`], by topic.
    static FEEDS: Mutex<Vec<(String, SubscriptionFeed)>> = Mutex::new(Vec::new());
    /// The topics published to [`FedBroker`] (dead letters), in order.
    static PUBLISHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub(crate) fn published_to(topic: &str) -> usize {
        let published = PUBLISHED.lock().unwrap_or_else(|p| p.into_inner());
        published.iter().filter(|t| *t == topic).count()
    }

    /// The feed of the subscription to `topic` (each test its own topic).
    fn feed_of(topic: &str) -> SubscriptionFeed {
        let feeds = FEEDS.lock().unwrap_or_else(|p| p.into_inner());
        let found = feeds.iter().find(|(t, _)| t == topic);
        found
            .map(|(_, feed)| feed.clone())
            .unwrap_or_else(|| panic!("no subscription to {topic}"))
    }

    /// A broker that delivers what the test hands its feed, and refuses
    /// publishes to a topic ending in `-refused` (recorded all the same);
    /// as the redis pub/sub, it never takes a topic holding `||`.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "pubsub", type = "test.delivery.fed")]
    struct FedBroker {}

    #[async_trait]
    impl Component for FedBroker {}

    #[async_trait]
    impl PubSub for FedBroker {
        async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
            let refused = request.topic.ends_with("-refused");
            let mut published = PUBLISHED.lock().unwrap_or_else(|p| p.into_inner());
            published.push(request.topic);
            if refused {
                return Err(PubSubError::Backend("the broker refuses the topic".into()));
            }
            Ok(())
        }

        async fn subscribe(
            &self,
            request: SubscribeRequest,
        ) -> Result<PubSubSubscription, PubSubError> {
            let (subscription, feed) = PubSubSubscription::channel(4);
            let mut feeds = FEEDS.lock().unwrap_or_else(|p| p.into_inner());
            feeds.push((request.topic, feed));
            Ok(subscription)
        }

        fn check_topic(&self, topic: &str) -> Result<(), PubSubError> {
            match topic.contains("||") {
                true => Err(PubSubError::Invalid(format!(
                    "topic `{topic}` can't contain `||`"
                ))),
                false => Ok(()),
            }
        }
    }

    /// A runtime whose pub/sub `p` is a [`FedBroker`], with `resiliency`.
    pub(crate) async fn runtime_with(resiliency: serde_json::Value) -> Runtime {
        let file = parse(
            serde_json::json!({"appId": "app",
                "components": {"pubsub": {"p": {"type": "test.delivery.fed"}}},
                "resiliency": resiliency})
            .to_string()
            .as_bytes(),
        )
        .unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Delivers to `sink` the subscription to `topic` of `runtime`'s `p`,
    /// retired when told; the delivery's task and the retiring signal.
    async fn deliver_to(
        runtime: &Runtime,
        topic: &str,
        sink: Arc<dyn EventSink>,
    ) -> (tokio::task::JoinHandle<()>, watch::Sender<bool>) {
        deliver_with_dead_letters(runtime, topic, None, sink).await
    }

    /// [`deliver_to`], with `dead_letter_topic`.
    pub(crate) async fn deliver_with_dead_letters(
        runtime: &Runtime,
        topic: &str,
        dead_letter_topic: Option<&str>,
        sink: Arc<dyn EventSink>,
    ) -> (tokio::task::JoinHandle<()>, watch::Sender<bool>) {
        deliver_in(runtime, topic, dead_letter_topic, Default::default(), sink).await
    }

    /// [`deliver_with_dead_letters`], as `delivered` of its lineage.
    async fn deliver_in(
        runtime: &Runtime,
        topic: &str,
        dead_letter_topic: Option<&str>,
        delivered: Arc<Delivered>,
        sink: Arc<dyn EventSink>,
    ) -> (tokio::task::JoinHandle<()>, watch::Sender<bool>) {
        let (retire, retired) = Retire::channel();
        let delivery = TopicDelivery {
            pubsub_name: "p".into(),
            topic: topic.into(),
            dead_letter_topic: watch::channel(dead_letter_topic.map(str::to_string)).1,
            retire: retired,
            delivered,
        };
        let task = delivery
            .start(runtime, sink, Default::default(), CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        (task, retire)
    }

    /// Feeds event `id` to the subscription to `topic`; its settlement.
    pub(crate) async fn feed_event(
        topic: &str,
        id: &str,
    ) -> tokio::sync::oneshot::Receiver<DeliveryOutcome> {
        feed_of(topic)
            .deliver(event_message(topic, id))
            .await
            .unwrap_or_else(|| panic!("subscribed"))
    }

    /// Feeds `event` to the subscription to `topic`; its settlement.
    pub(crate) async fn feed_cloud_event(
        topic: &str,
        event: serde_json::Value,
    ) -> tokio::sync::oneshot::Receiver<DeliveryOutcome> {
        feed_of(topic)
            .deliver(cloud_event_message(topic, &event))
            .await
            .unwrap_or_else(|| panic!("subscribed"))
    }

    /// The message of event `id` on `topic`, as [`feed_event`] feeds it.
    fn event_message(topic: &str, id: &str) -> rewire_runtime::Message {
        let event = serde_json::json!({"specversion": "1.0", "id": id, "source": "s",
            "type": "t", "data": "x"});
        cloud_event_message(topic, &event)
    }

    fn cloud_event_message(topic: &str, event: &serde_json::Value) -> rewire_runtime::Message {
        rewire_runtime::Message {
            id: String::new(),
            topic: topic.into(),
            data: event.to_string().into_bytes(),
            content_type: Some(CLOUD_EVENT_CONTENT_TYPE.into()),
            metadata: Default::default(),
        }
    }

    /// Retires the subscription, waits for its task to end at the limit,
    /// and the settlement of the event `outcome` is for.
    pub(crate) async fn retired_and_settled(
        retire: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
        outcome: tokio::sync::oneshot::Receiver<DeliveryOutcome>,
    ) -> Option<DeliveryOutcome> {
        let _ = retire.send(true);
        tokio::time::timeout(HANDOVER_LIMIT * 2, task)
            .await
            .unwrap_or_else(|_| panic!("the retired subscription ended at its limit"))
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::timeout(Duration::from_secs(60), outcome)
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// A subscriber that asks for every event again, counting the asks.
    #[derive(Default)]
    struct AlwaysRetry {
        sent: AtomicU32,
    }

    #[tonic::async_trait]
    impl EventSink for AlwaysRetry {
        async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
            self.sent.fetch_add(1, Ordering::SeqCst);
            DeliveryOutcome::Retry
        }

        async fn closed(&self) {
            std::future::pending().await
        }
    }

    /// A replaced subscription retrying an event without limit (an
    /// inbound `maxRetries: -1`) stops asking the app once it has ended at
    /// the handover limit: the event goes back to its broker instead of
    /// being retried for good by a task nobody holds.
    #[tokio::test(start_paused = true)]
    async fn a_retired_subscription_stops_retrying_its_events_when_it_ends() {
        let runtime = runtime_with(serde_json::json!({
            "policies": {"retries": {"forever": {"policy": "constant", "duration": "1s"}}},
            "targets": {"components": {"p": {"inbound": {"retry": "forever"}}}}
        }))
        .await;
        let sink = Arc::new(AlwaysRetry::default());
        let (task, retire) = deliver_to(&runtime, "t", sink.clone()).await;
        let outcome = feed_event("t", "1").await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(sink.sent.load(Ordering::SeqCst) >= 5, "retried meanwhile");
        assert_eq!(
            retired_and_settled(retire, task, outcome).await,
            Some(DeliveryOutcome::Retry),
            "handed back to the broker"
        );
        let after_end = sink.sent.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            sink.sent.load(Ordering::SeqCst),
            after_end,
            "nothing sent once ended"
        );
        runtime.shutdown().await;
    }

    /// A subscriber that answers SUCCESS after `after`.
    struct SlowSuccess {
        after: Duration,
    }

    #[tonic::async_trait]
    impl EventSink for SlowSuccess {
        async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
            tokio::time::sleep(self.after).await;
            DeliveryOutcome::Success
        }

        async fn closed(&self) {
            std::future::pending().await
        }
    }

    /// An attempt already sent when a retired subscription ends at its
    /// limit is not cut: the subscriber's answer settles the event (cut,
    /// it went back to the broker and a subscriber that had handled it got
    /// it again).
    #[tokio::test(start_paused = true)]
    async fn an_attempt_in_flight_when_its_subscription_ends_settles_with_its_answer() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let sink = Arc::new(SlowSuccess {
            after: HANDOVER_LIMIT + Duration::from_secs(10),
        });
        let (task, retire) = deliver_to(&runtime, "slow", sink).await;
        let outcome = feed_event("slow", "2").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            retired_and_settled(retire, task, outcome).await,
            Some(DeliveryOutcome::Success),
            "settled with the subscriber's answer"
        );
        runtime.shutdown().await;
    }

    /// A subscriber that holds every event until `open` is told, then
    /// answers SUCCESS; tells `sent` of each event it got.
    struct Gated {
        sent: tokio::sync::mpsc::UnboundedSender<()>,
        open: watch::Receiver<bool>,
    }

    #[tonic::async_trait]
    impl EventSink for Gated {
        async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
            let _ = self.sent.send(());
            let _ = self.open.clone().wait_for(|open| *open).await;
            DeliveryOutcome::Success
        }

        async fn closed(&self) {
            std::future::pending().await
        }
    }

    /// A retired subscription whose broker has nothing more ends once
    /// what it had in flight settled and [`HANDOVER_GRACE`] passed, also
    /// when that settled while it already waited for its broker, and its
    /// broker subscription is let go (the grace ran only if nothing was in
    /// flight when it started waiting: it waited for [`HANDOVER_LIMIT`],
    /// its broker queueing for it meanwhile).
    #[tokio::test(start_paused = true)]
    async fn a_retired_subscription_ends_a_grace_after_its_last_event_settled() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let (sent, mut got) = tokio::sync::mpsc::unbounded_channel();
        let (open, gate) = watch::channel(false);
        let sink = Arc::new(Gated { sent, open: gate });
        let (task, retire) = deliver_to(&runtime, "settles-late", sink).await;
        let outcome = feed_event("settles-late", "1").await;
        tokio::time::timeout(Duration::from_secs(60), got.recv())
            .await
            .unwrap_or_else(|_| panic!("sent within a minute"));
        // Retired with the event in flight: it waits for its broker.
        let _ = retire.send(true);
        tokio::time::sleep(Duration::from_millis(10)).await;
        open.send_replace(true);
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
        tokio::time::timeout(HANDOVER_GRACE * 2, task)
            .await
            .unwrap_or_else(|_| panic!("the retired subscription outlived its grace"))
            .unwrap_or_else(|e| panic!("{e}"));
        let feed = feed_of("settles-late");
        let let_go = async {
            while !feed.is_stopped() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(HANDOVER_GRACE, let_go)
            .await
            .unwrap_or_else(|_| panic!("the broker subscription was held on"));
        runtime.shutdown().await;
    }

    /// A subscriber whose routes take no event (no rule matches and there
    /// is no default route), counting what is sent to it.
    #[derive(Default)]
    struct NoRoute {
        sent: AtomicU32,
    }

    #[tonic::async_trait]
    impl EventSink for NoRoute {
        async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
            self.sent.fetch_add(1, Ordering::SeqCst);
            DeliveryOutcome::Success
        }

        async fn closed(&self) {
            std::future::pending().await
        }

        fn takes(&self, _: &TopicEvent) -> bool {
            false
        }
    }

    /// A subscriber that takes every event and counts them.
    #[derive(Default)]
    struct Counting {
        sent: AtomicU32,
    }

    #[tonic::async_trait]
    impl EventSink for Counting {
        async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
            self.sent.fetch_add(1, Ordering::SeqCst);
            DeliveryOutcome::Success
        }

        async fn closed(&self) {
            std::future::pending().await
        }
    }

    pub(crate) async fn settled(
        outcome: tokio::sync::oneshot::Receiver<DeliveryOutcome>,
    ) -> DeliveryOutcome {
        tokio::time::timeout(Duration::from_secs(60), outcome)
            .await
            .unwrap_or_else(|_| panic!("settled within a minute"))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// As Dapr: an event no route takes goes to the subscription's
    /// dead-letter topic when it has one (then is acknowledged), and is
    /// acknowledged without one; it never reaches the app.
    #[tokio::test]
    async fn an_event_no_route_takes_goes_to_the_dead_letter_topic_when_one_is_set() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let sink = Arc::new(NoRoute::default());
        let (_task, _retire) =
            deliver_with_dead_letters(&runtime, "unrouted", Some("unrouted-dead"), sink.clone())
                .await;
        let outcome = feed_event("unrouted", "u1").await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
        assert_eq!(published_to("unrouted-dead"), 1, "dead-lettered");

        let (_task, _retire) = deliver_to(&runtime, "unrouted-plain", sink.clone()).await;
        let outcome = feed_event("unrouted-plain", "u2").await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
        assert_eq!(sink.sent.load(Ordering::SeqCst), 0, "sent to the app");
        runtime.shutdown().await;
    }

    /// As Dapr: an event past its expiration goes to the subscription's
    /// dead-letter topic when it has one (then is acknowledged), and is
    /// acknowledged without one; it never reaches the app.
    #[tokio::test]
    async fn an_expired_event_goes_to_the_dead_letter_topic_when_one_is_set() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let sink = Arc::new(Counting::default());
        let expired = |id: &str| {
            serde_json::json!({"specversion": "1.0", "id": id, "source": "s", "type": "t",
                "data": "x", "expiration": "2001-01-01T00:00:00Z"})
        };
        let (_task, _retire) =
            deliver_with_dead_letters(&runtime, "expiring", Some("expiring-dead"), sink.clone())
                .await;
        let outcome = feed_cloud_event("expiring", expired("x1")).await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
        assert_eq!(published_to("expiring-dead"), 1, "dead-lettered");

        let (_task, _retire) = deliver_to(&runtime, "expiring-plain", sink.clone()).await;
        let outcome = feed_cloud_event("expiring-plain", expired("x2")).await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
        assert_eq!(sink.sent.load(Ordering::SeqCst), 0, "sent to the app");
        runtime.shutdown().await;
    }

    /// As Dapr (`_ = s.sendToDeadLetter(...)`, then acknowledged): an
    /// expired event, and one no route takes, whose dead-letter publish
    /// fails are acknowledged with a warning, once, not handed back to
    /// expire (or go unrouted) and fail again for ever.
    #[tokio::test]
    async fn a_set_aside_event_whose_dead_letter_publish_fails_is_still_acknowledged() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let expired = serde_json::json!({"specversion": "1.0", "id": "f1", "source": "s",
            "type": "t", "data": "x", "expiration": "2001-01-01T00:00:00Z"});
        let counting = Arc::new(Counting::default());
        let (_task, _retire) = deliver_with_dead_letters(
            &runtime,
            "expiring-failing",
            Some("expiring-failing-refused"),
            counting.clone(),
        )
        .await;
        let outcome = feed_cloud_event("expiring-failing", expired).await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);

        let unrouted = Arc::new(NoRoute::default());
        let (_task, _retire) = deliver_with_dead_letters(
            &runtime,
            "unrouted-failing",
            Some("unrouted-failing-refused"),
            unrouted.clone(),
        )
        .await;
        let outcome = feed_event("unrouted-failing", "f2").await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);

        // Tried once each; neither reached the app.
        assert_eq!(published_to("expiring-failing-refused"), 1);
        assert_eq!(published_to("unrouted-failing-refused"), 1);
        assert_eq!(counting.sent.load(Ordering::SeqCst), 0, "sent to the app");
        assert_eq!(unrouted.sent.load(Ordering::SeqCst), 0, "sent to the app");
        runtime.shutdown().await;
    }

    /// An event the retiring subscription's routes do not take (routes
    /// a reload replaced) is set aside there, but not counted delivered
    /// for its lineage: the running one, reading the same CloudEvent,
    /// sends it by its own routes (it was acknowledged unsent, and lost).
    #[tokio::test]
    async fn an_event_a_retiring_subscription_sets_aside_reaches_the_running_one() {
        let runtime = runtime_with(serde_json::json!({})).await;
        let lineage = Arc::new(crate::dapr::handover::Lineage::default());
        let (old_sink, new_sink) = (Arc::new(NoRoute::default()), Arc::new(Counting::default()));
        let (_old, _retire_old) = deliver_in(
            &runtime,
            "lineage-old",
            None,
            lineage.member(),
            old_sink.clone(),
        )
        .await;
        let (_new, _retire_new) = deliver_in(
            &runtime,
            "lineage-new",
            None,
            lineage.member(),
            new_sink.clone(),
        )
        .await;
        lineage.remember(true);

        let set_aside = feed_event("lineage-old", "h1").await;
        assert_eq!(settled(set_aside).await, DeliveryOutcome::Success);
        let sent = feed_event("lineage-new", "h1").await;
        assert_eq!(settled(sent).await, DeliveryOutcome::Success);
        assert_eq!(old_sink.sent.load(Ordering::SeqCst), 0, "no route took it");
        assert_eq!(
            new_sink.sent.load(Ordering::SeqCst),
            1,
            "the running one sent it"
        );
        runtime.shutdown().await;
    }

    mod answer_bounds;
    mod dead_letters;
    mod handed_back;
    mod handed_back_while_busy;
    mod logged_ids;
    mod raw_payload;
}
