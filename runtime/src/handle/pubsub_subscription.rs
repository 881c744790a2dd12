//! Pub/sub subscriptions through a [`PubSubHandle`] that follow the broker
//! across reloads without losing a message.
//!
//! A forwarder task owns the subscriptions it made on broker instances
//! (its *sources*) and hands their deliveries on unchanged, so each
//! acknowledgement goes back to the instance that made the delivery. When
//! a reload rebuilds the broker:
//!
//! 1. before the publish ([`warm`](super::warm)) the forwarder subscribes
//!    to the new instance, while the old one still takes every publish (a
//!    subscription made while a reload warms waits for its publish). A
//!    warmed source let go of before its publish (the reload ended without
//!    it) is stopped, never drained: a drain closes the publishes of a
//!    whole broker, which would refuse them all once it serves;
//! 2. at the publish, the old source is asked to drain: it delivers what it
//!    holds (read but unsettled, and what was published to it, including
//!    publishes still under way) and ends. Sources are read oldest first:
//!    a draining one runs dry, the new one may never;
//! 3. a new instance that refuses the subscribe is tried again with a
//!    backoff ([`Resubscribe`]) while the old one drains; after
//!    [`RESUBSCRIBE_DEADLINE`] of refusals the subscription ends once
//!    nothing drains. A retry coming due while a reload has warmed another
//!    broker waits for that publish, which supersedes it (up to
//!    [`WARMED_HOLD`]). A publish of the same broker meanwhile (another
//!    component reloaded) keeps its retry as it is: no second subscribe,
//!    no fresh deadline, no revival once given up. The subscription is
//!    never on one broker twice, and a source it no longer reads once its
//!    broker was published is drained, never dropped. A broker that does not answer is slow, not
//!    refusing: it is tried again with a bound growing from
//!    [`SUBSCRIBE_BOUND`] to [`SLOW_SUBSCRIBE_BOUND`], and a timeout does
//!    not count toward the deadline (it starts again). The bound grown is
//!    the slow broker's alone: another one is first waited on for
//!    [`SUBSCRIBE_BOUND`]. A subscribe under way does not hold the
//!    forwarder: the sources are read, the subscriber is served (and let
//!    go when it leaves) and a new publish is followed (a subscribe on a
//!    broker replaced meanwhile is abandoned) while it is waited for;
//! 4. a draining source is stopped once it has been silent for
//!    [`DRAIN_GRACE`], once it made no progress for [`DRAIN_LIMIT`] (no
//!    delivery of it read, no outcome of one of its deliveries; the time
//!    the subscriber is behind not counted), or once it is still draining
//!    [`DRAIN_CAP`] after its replacement, however steadily it delivers
//!    and however long its subscriber is behind (the delivery it is being
//!    given is kept, not what the source still holds); it is let go once
//!    its broker closes its side, or [`STOP_GRACE`] later (a subscriber
//!    stalled on one delivery holds no replaced broker past that). While
//!    it is draining, the runtime's close of the replaced instance waits
//!    for it ([`drained`]). Silent means: it delivered since the drain
//!    began (not counting what it had sent before; until then, the broker
//!    may be waiting for publishes under way to end, as a Redis one does:
//!    only the limits apply), none of its deliveries
//!    awaits its outcome (a broker such as Redis hands out `concurrency`
//!    deliveries, then waits for their outcomes before it sends more: a
//!    slow app holds it back), and its last delivery or outcome is
//!    [`DRAIN_GRACE`] old, not counting the time the subscriber is behind.
//!    A slow subscriber with a large backlog thus gets all of it, as long
//!    as the old broker keeps delivering, within the cap.

mod draining;
mod outstanding;
mod resubscribe;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use super::warm::WarmRequest;
use super::{Instance, PubSubHandle};
use crate::kinds::{Delivery, PubSub, PubSubError, PubSubSubscription, SubscribeRequest};
use draining::DrainMark;
pub(crate) use draining::{drained, undrained};
use outstanding::Outstanding;
pub use resubscribe::RESUBSCRIBE_DEADLINE;
use resubscribe::{Refused, Resubscribe};

/// Deliveries a handle subscription buffers for its subscriber.
pub const HANDLE_SUBSCRIPTION_BUFFER: usize = 64;
/// How long a replaced broker may go without a delivery or an outcome,
/// once it delivered since its drain began, while none of its deliveries
/// awaits its outcome and its subscriber keeps up, before it is stopped.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long a replaced broker may make no progress (no delivery of it
/// read, no outcome of one of its deliveries, not counting the time its
/// subscriber is behind) before it is stopped, whether or not it has
/// delivered since its drain began: also how long one is waited for that
/// never delivers after its drain began, or whose deliveries never
/// settle. The runtime closes a replaced broker no subscription drains
/// any more this long (and [`STOP_GRACE`]) after its replacement at the
/// latest.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// How long a replaced broker is read from at most, however steadily it
/// delivers: a backlog of up to this much app work (2,000 Redis entries
/// at 100 ms each with `concurrency` 1 take 200 s) is delivered whole,
/// and a broker redelivering a refused message forever still ends. The
/// runtime closes a replaced broker a subscription still drains this
/// long (and [`STOP_GRACE`]) after its replacement at the latest, and as
/// soon as none drains it. A Redis reader bounds its drain's reads by it
/// too ([`PubSubHandle::DRAIN_CAP`]).
pub const DRAIN_CAP: Duration = Duration::from_secs(30 * 60);
/// How long a stopped broker may take to close its side.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long the forwarder first waits for a new broker to answer a
/// subscribe (the bound of every store call the runtime makes in the
/// background); the only bound at warm-up, where the publish waits.
pub const SUBSCRIBE_BOUND: Duration = crate::store_call::STORE_CALL_BOUND;
/// The longest bound of one subscribe at the publish: after each one that
/// does not answer, the next is waited for twice as long, up to this. A
/// broker's subscribe is bounded by its own timeouts (a redis one by its
/// dialTimeout plus read/write timeouts), which may exceed
/// [`SUBSCRIBE_BOUND`]; the runtime cannot see them, so it grows its bound
/// instead of abandoning every attempt at the same point.
pub const SLOW_SUBSCRIBE_BOUND: Duration = Duration::from_secs(40);
/// How long a retry of a refusal waits, once a reload warmed another
/// broker, for that broker's publish (which supersedes the retry): the
/// publish follows within [`WARM_DEADLINE`](super::warm::WARM_DEADLINE)
/// of the warm; twice that leaves time for the commit. Past it, the
/// reload is taken to have ended without its publish: the warmed source is
/// stopped (never drained) and the retry goes on.
const WARMED_HOLD: Duration = Duration::from_secs(2 * super::warm::WARM_DEADLINE.as_secs());

/// What a subscribe answered; `None` if it did not answer in time.
type Answer = Option<Result<PubSubSubscription, PubSubError>>;

/// `broker`'s subscribe to `req`; `None` if it does not answer within
/// `bound` (it is then abandoned).
async fn subscribe_bounded(
    broker: &Arc<dyn PubSub>,
    req: &SubscribeRequest,
    bound: Duration,
) -> Option<Result<PubSubSubscription, PubSubError>> {
    tokio::time::timeout(bound, broker.subscribe(req.clone()))
        .await
        .ok()
}

fn same_broker(a: &Arc<dyn PubSub>, b: &Arc<dyn PubSub>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl PubSubHandle {
    /// [`DRAIN_CAP`], for brokers: how long a subscription through the
    /// handle reads from a replaced broker at most, and the runtime waits
    /// to close it.
    pub const DRAIN_CAP: Duration = DRAIN_CAP;

    /// Subscribes through the handle: the subscription keeps delivering
    /// across reloads that update or rebuild the broker (see the module
    /// docs). It ends when the broker is removed, the runtime stops, the
    /// subscription is dropped, or a rebuilt broker refuses it for
    /// [`RESUBSCRIBE_DEADLINE`].
    pub async fn subscribe(
        &self,
        req: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        let live = self
            .0
            .live()
            .cloned()
            .ok_or_else(|| PubSubError::Backend("handle not injected".into()))?;
        // Taken before the broker is loaded: a generation published or
        // warmed from here on is seen by the forwarder.
        let mut published = live.changes();
        let (warm, missed) = live.warmer();
        if let Some(replaced) = missed {
            // A reload is warming the subscriptions it knew of: subscribe
            // to what it publishes, not to what it replaces.
            let publish = published.wait_for(|number| *number > replaced);
            if tokio::time::timeout(super::warm::WARM_DEADLINE * 2, publish)
                .await
                .is_err()
            {
                tracing::warn!(topic = %req.topic, "A reload under way did not publish in time; subscribing to the broker serving.");
            }
        }
        let broker = self
            .load()
            .map_err(|e| PubSubError::Backend(e.to_string()))?;
        let subscription = broker.subscribe(req.clone()).await?;
        let (outer, feed) = PubSubSubscription::channel(HANDLE_SUBSCRIPTION_BUFFER);
        let settled = Arc::new(Notify::new());
        let forwarder = Forwarder {
            handle: self.clone(),
            req,
            current: Some(Source::new(broker, subscription, &settled)),
            settled,
            refused: None,
            subscribing: None,
            slow: None,
            warmed: None,
            draining: Vec::new(),
            feed,
        };
        tokio::spawn(forwarder.run(published, warm));
        Ok(outer)
    }
}

/// A subscribe at a publish, under way: waited for in the forwarder's
/// loop, with the rest.
struct Subscribing {
    broker: Arc<dyn PubSub>,
    /// The attempt it is (refusals so far, deadline).
    attempt: Resubscribe,
    /// How long it is waited for.
    bound: Duration,
    call: Pin<Box<dyn Future<Output = Answer> + Send>>,
}

/// A source made on a broker a reload is about to publish, before the
/// publish.
struct Warmed {
    source: Source,
    /// The number of the generation the reload replaces: once a later one
    /// is published, the warmed broker was published (or never will be).
    replaces: u64,
    /// When it was made: a retry of a refusal waits for its publish up to
    /// [`WARMED_HOLD`] from then.
    at: Instant,
}

/// A subscription on one broker instance.
struct Source {
    broker: Arc<dyn PubSub>,
    subscription: PubSubSubscription,
    /// Its deliveries handed on and not yet settled.
    outstanding: Arc<Outstanding>,
    /// When draining: when its grace ends (counted only while none of its
    /// deliveries awaits its outcome; `None` until it delivered since the
    /// drain began); once stopped, when it is let go.
    stop_at: Option<Instant>,
    /// When draining: when it is stopped however it delivers (its
    /// [`DRAIN_CAP`]).
    drain_until: Option<Instant>,
    /// When draining: when it is stopped if it makes no progress
    /// meanwhile (its [`DRAIN_LIMIT`]), within `drain_until`.
    stall_at: Option<Instant>,
    /// When draining: tells the runtime's close of its broker that it is
    /// drained (let go with the source).
    _drain_mark: Option<DrainMark>,
    /// When draining: how many of the deliveries still to be read it sent
    /// before the drain was asked for (they do not start its grace).
    sent_before_drain: usize,
    stopped: bool,
}

impl Source {
    /// A draining source delivered: its no-progress limit starts again,
    /// and its grace (within its cap), unless the delivery was sent before
    /// the drain was asked.
    fn drain_delivered(&mut self, now: Instant) {
        self.drain_moved(now);
        if self.sent_before_drain > 0 {
            self.sent_before_drain -= 1;
            return;
        }
        self.drain_progressed(now);
    }

    /// A draining source moved (a delivery of it read, or an outcome of
    /// one): its no-progress limit starts again (within its cap).
    fn drain_moved(&mut self, now: Instant) {
        if let (Some(cap), false) = (self.drain_until, self.stopped) {
            self.stall_at = Some((now + DRAIN_LIMIT).min(cap));
        }
    }

    /// A draining source made progress: its grace starts again (within
    /// its cap).
    fn drain_progressed(&mut self, now: Instant) {
        if let (Some(cap), false) = (self.drain_until, self.stopped) {
            self.stop_at = Some((now + DRAIN_GRACE).min(cap));
        }
    }

    /// One of a draining source's deliveries settled: its no-progress
    /// limit starts again, and its grace, once it delivered since the
    /// drain began.
    fn drain_settled(&mut self, now: Instant) {
        self.drain_moved(now);
        if self.stop_at.is_some() {
            self.drain_progressed(now);
        }
    }

    /// When a draining source is stopped (its grace, when it runs, its
    /// no-progress limit or its cap), or a stopped one let go; `None` when
    /// it is not draining. While its subscriber is `behind` (then no
    /// source is read), only its cap.
    fn deadline(&self, behind: bool) -> Option<Instant> {
        self.deadline_when(behind, self.outstanding.count() == 0)
    }

    /// [`deadline`](Self::deadline), its grace running when `idle` (none
    /// of its deliveries awaits its outcome).
    fn deadline_when(&self, behind: bool, idle: bool) -> Option<Instant> {
        if self.stopped {
            return self.stop_at;
        }
        let cap = self.drain_until?;
        if behind {
            // Its grace and limit wait for the subscriber; its cap does
            // not: a stalled subscriber holds no replaced broker past it.
            return Some(cap);
        }
        let limit = self.stall_at.map_or(cap, |stall| stall.min(cap));
        let grace = self.stop_at.filter(|_| idle);
        Some(grace.map_or(limit, |at| at.min(limit)))
    }

    /// [`deadline`](Self::deadline) at `now`, once the outcomes that
    /// arrived are seen to: its count is read first, then whether one
    /// settled (an outcome marks that before it lowers the count), so an
    /// outcome that brought the count to 0 restarts the grace before the
    /// grace is looked at, never a stale one running out.
    fn deadline_at(&mut self, behind: bool, now: Instant) -> Option<Instant> {
        let idle = self.outstanding.count() == 0;
        if self.outstanding.take_settled() {
            self.drain_settled(now);
        }
        self.deadline_when(behind, idle)
    }

    /// The forwarder waited `waited` on the subscriber, reading no source:
    /// that time does not count against a draining source's grace, nor
    /// its no-progress limit.
    fn drain_paused(&mut self, waited: Duration) {
        let Some(cap) = self.drain_until.filter(|_| !self.stopped) else {
            return;
        };
        if let Some(at) = self.stop_at {
            self.stop_at = Some((at + waited).min(cap));
        }
        if let Some(at) = self.stall_at {
            self.stall_at = Some((at + waited).min(cap));
        }
    }

    /// A source whose outcomes wake `settled`.
    fn new(
        broker: Arc<dyn PubSub>,
        subscription: PubSubSubscription,
        settled: &Arc<Notify>,
    ) -> Self {
        Self {
            broker,
            subscription,
            outstanding: Outstanding::new(settled.clone()),
            stop_at: None,
            drain_until: None,
            stall_at: None,
            _drain_mark: None,
            sent_before_drain: 0,
            stopped: false,
        }
    }
}

struct Forwarder {
    handle: PubSubHandle,
    req: SubscribeRequest,
    /// On the broker serving; `None` while it refuses the subscription.
    current: Option<Source>,
    /// Woken when the last delivery of a draining source awaiting its
    /// outcome settles.
    settled: Arc<Notify>,
    /// The broker serving that refused the subscription: its next try,
    /// or that it was given up on.
    refused: Option<Refused>,
    /// The subscribe under way at a publish, if any.
    subscribing: Option<Subscribing>,
    /// A broker that did not answer a subscribe in time, and how long its
    /// next one is waited for; any other broker is first waited on for
    /// [`SUBSCRIBE_BOUND`].
    slow: Option<(Weak<dyn PubSub>, Duration)>,
    /// On the broker a reload warmed, until its publish.
    warmed: Option<Warmed>,
    /// Oldest first.
    draining: Vec<Source>,
    feed: crate::kinds::SubscriptionFeed,
}

/// One of the forwarder's sources.
#[derive(Debug, Clone, Copy)]
enum Which {
    Current,
    Warmed,
    Draining(usize),
}

/// What woke the forwarder.
enum Event {
    Delivery(Delivery, Which),
    /// The subscriber took the pending delivery.
    HandedOn,
    /// The last delivery of a draining source awaiting its outcome
    /// settled.
    Settled,
    Ended(Which),
    /// The subscribe under way answered, or did not in time.
    Subscribed(Answer),
    Published,
    Warm(WarmRequest),
    Deadline,
    Leave,
}

impl Forwarder {
    async fn run(
        mut self,
        mut published: watch::Receiver<u64>,
        mut warm: mpsc::Receiver<WarmRequest>,
    ) {
        let mut pending: Option<Delivery> = None;
        // When `pending` was taken.
        let mut pending_since = Instant::now();
        loop {
            if self.spent() && pending.is_none() {
                tracing::warn!(topic = %self.req.topic, "Pub/sub subscription ended: no broker to read from.");
                return;
            }
            // While the subscriber is behind, no source is read: their
            // drain graces wait.
            let deadline = self.next_deadline(pending.is_some());
            let event = tokio::select! {
                biased;
                () = self.feed.stopped() => Event::Leave,
                changed = published.changed() => match changed {
                    Ok(()) => Event::Published,
                    Err(_) => Event::Leave,
                },
                Some(request) = warm.recv() => Event::Warm(request),
                () = self.settled.notified() => Event::Settled,
                () = sleep_until(deadline) => Event::Deadline,
                answer = subscribed(&mut self.subscribing), if self.subscribing.is_some() => Event::Subscribed(answer),
                permit = self.feed.sender().reserve(), if pending.is_some() => match (permit, pending.take()) {
                    (Ok(permit), Some(delivery)) => {
                        permit.send(delivery);
                        Event::HandedOn
                    }
                    _ => Event::Leave,
                },
                event = next_delivery(&mut self.current, &mut self.warmed, &mut self.draining), if pending.is_none() => event,
            };
            match event {
                Event::Delivery(delivery, which) => {
                    pending_since = Instant::now();
                    if let Which::Draining(i) = which {
                        self.draining[i].drain_delivered(pending_since);
                    }
                    pending = Some(match self.source(which) {
                        Some(source) => source.outstanding.watch(delivery),
                        None => delivery,
                    });
                }
                Event::HandedOn => self.subscriber_caught_up(pending_since.elapsed()),
                Event::Settled => self.drains_settled(),
                Event::Ended(which) => {
                    if !self.ended(which) {
                        return;
                    }
                }
                Event::Subscribed(answer) => self.subscribed(answer),
                Event::Published => {
                    if !self.follow() {
                        return;
                    }
                }
                Event::Warm(request) => {
                    let latest = *published.borrow();
                    self.warm(&request, latest).await;
                }
                Event::Deadline => {
                    self.expire(pending.is_some());
                    if !self.resubscribe_if_due() {
                        return;
                    }
                }
                Event::Leave => return,
            }
        }
    }

    /// The source `which` names.
    fn source(&self, which: Which) -> Option<&Source> {
        match which {
            Which::Current => self.current.as_ref(),
            Which::Warmed => self.warmed.as_ref().map(|warmed| &warmed.source),
            Which::Draining(i) => self.draining.get(i),
        }
    }

    /// Deliveries settled: the drains they were of start their grace again.
    fn drains_settled(&mut self) {
        let now = Instant::now();
        for source in &mut self.draining {
            if source.outstanding.take_settled() {
                source.drain_settled(now);
            }
        }
    }

    /// Nothing left to read from, nor to try again.
    fn spent(&self) -> bool {
        self.current.is_none()
            && self.retry().is_none()
            && self.subscribing.is_none()
            && self.warmed.is_none()
            && self.draining.is_empty()
    }

    /// A source ended. A draining one is let go; the current one ending
    /// means the broker was replaced (follow it) or gave up (end too).
    fn ended(&mut self, which: Which) -> bool {
        match which {
            Which::Current => {
                let replaced = self.handle.load().is_ok_and(|now| {
                    self.current
                        .as_ref()
                        .is_some_and(|current| !same_broker(&now, &current.broker))
                });
                if !replaced {
                    tracing::warn!(topic = %self.req.topic, "Pub/sub subscription ended by its broker.");
                    return false;
                }
                self.follow()
            }
            Which::Warmed => {
                self.warmed = None;
                true
            }
            Which::Draining(i) => {
                self.draining.remove(i);
                true
            }
        }
    }

    /// Subscribes to the instance about to be published, if it is a new
    /// one (not one subscribed or subscribing to, nor one whose refusal
    /// is being retried: a second subscription on it would deliver twice);
    /// the current source keeps serving until the publish. A request
    /// whose generation (or a later one) is already published is stale.
    async fn warm(&mut self, request: &WarmRequest, latest_published: u64) {
        if latest_published > request.replaces {
            return;
        }
        let Some(key) = self.handle.key() else { return };
        let Some(Instance::PubSub(next)) = request.next.get(key) else {
            return;
        };
        let warmed = self
            .warmed
            .as_ref()
            .is_some_and(|warmed| same_broker(next, &warmed.source.broker));
        if warmed || self.follows(next) {
            return;
        }
        let answer = subscribe_bounded(next, &self.req, SUBSCRIBE_BOUND).await;
        match answer.unwrap_or_else(|| {
            Err(PubSubError::Backend(format!(
                "the broker did not answer within {SUBSCRIBE_BOUND:?}"
            )))
        }) {
            Ok(subscription) => {
                // One warmed before, for a reload that did not publish it,
                // is dropped: stopped, not drained.
                self.warmed = Some(Warmed {
                    source: Source::new(next.clone(), subscription, &self.settled),
                    replaces: request.replaces,
                    at: Instant::now(),
                });
            }
            Err(err) => {
                tracing::warn!(topic = %self.req.topic, error = %err, "Subscribing to a rebuilt broker before its publish failed; retried at the publish.");
            }
        }
    }

    /// After a publish: moves to the broker now serving and drains the
    /// one it replaced; a subscribe under way on it is waited for, a retry
    /// of its refusal kept as it is (its count and deadline; given up
    /// stays given up); one on a broker replaced meanwhile is abandoned.
    /// False when the subscription should end.
    fn follow(&mut self) -> bool {
        let Ok(now) = self.handle.load() else {
            return false;
        };
        if self.follows(&now) {
            return true;
        }
        self.subscribing = None;
        self.refused = None;
        if let Some(old) = self.current.take() {
            self.retire(old);
        }
        self.subscribe_to(now, Resubscribe::now());
        true
    }

    /// Whether the subscription is on `broker` already: subscribed,
    /// subscribing, or retrying (or given up on) its refusal.
    fn follows(&self, broker: &Arc<dyn PubSub>) -> bool {
        let on = [
            self.current.as_ref().map(|source| &source.broker),
            self.subscribing.as_ref().map(|s| &s.broker),
        ];
        on.into_iter().flatten().any(|b| same_broker(broker, b))
            || self.refused.as_ref().is_some_and(|r| r.is_on(broker))
    }

    /// The next try at subscribing to a broker that refused, if any.
    fn retry(&self) -> Option<Resubscribe> {
        self.refused.as_ref().and_then(|refused| refused.next)
    }

    /// Tries again to subscribe to the broker serving, when it is time;
    /// another one serving now (its publish not yet seen to) is followed
    /// afresh. While a reload has warmed another broker, the retry waits
    /// for its publish (which supersedes it), up to [`WARMED_HOLD`]: a
    /// retry would let go of the warmed source. False when the
    /// subscription should end.
    fn resubscribe_if_due(&mut self) -> bool {
        let Some(attempt) = self.retry().filter(|r| r.at <= Instant::now()) else {
            return true;
        };
        let Ok(now) = self.handle.load() else {
            return false;
        };
        let Some(mut refused) = self.refused.take().filter(|refused| refused.is_on(&now)) else {
            return self.follow();
        };
        let held_until = self
            .warmed
            .as_ref()
            .filter(|warmed| !same_broker(&warmed.source.broker, &now))
            .map(|warmed| warmed.at + WARMED_HOLD)
            .filter(|until| *until > Instant::now());
        if let Some(until) = held_until {
            tracing::debug!(topic = %self.req.topic, "A reload warmed another broker: the retry of the refused one waits for its publish.");
            refused.next = Some(attempt.postponed_to(until));
            self.refused = Some(refused);
            return true;
        }
        self.subscribe_to(now, attempt);
        true
    }

    /// Makes a source on `now` current: the warmed one when it is on
    /// `now`, else a new subscription, started here and waited for in the
    /// loop (see [`subscribed`](Self::subscribed)). A retry pending is
    /// superseded; nothing is started when `now` is current already.
    fn subscribe_to(&mut self, now: Arc<dyn PubSub>, attempt: Resubscribe) {
        self.refused = None;
        if self
            .current
            .as_ref()
            .is_some_and(|current| same_broker(&current.broker, &now))
        {
            return;
        }
        match self.warmed.take() {
            Some(warmed) if same_broker(&warmed.source.broker, &now) => {
                self.make_current(warmed.source);
                self.slow = None;
                tracing::info!(topic = %self.req.topic, "Pub/sub subscription moved to the rebuilt broker; the old one drains.");
                return;
            }
            Some(stale) => self.let_go_of_warmed(stale),
            None => {}
        }
        // The bound grown for a slow broker is its own.
        let bound = match &self.slow {
            Some((slow, bound)) if std::ptr::addr_eq(slow.as_ptr(), Arc::as_ptr(&now)) => *bound,
            _ => SUBSCRIBE_BOUND,
        };
        let (broker, req) = (Arc::clone(&now), self.req.clone());
        let call = Box::pin(async move { subscribe_bounded(&broker, &req, bound).await });
        self.subscribing = Some(Subscribing {
            broker: now,
            attempt,
            bound,
            call,
        });
    }

    /// The subscribe under way answered (or did not in time): its source
    /// is made current; when refused, the attempt after it is scheduled
    /// (or given up past the deadline); when slow, the next one is waited
    /// for longer.
    fn subscribed(&mut self, answer: Answer) {
        let Some(Subscribing {
            broker: now,
            attempt,
            bound,
            ..
        }) = self.subscribing.take()
        else {
            return;
        };
        match answer {
            Some(Ok(subscription)) => {
                self.slow = None;
                self.make_current(Source::new(now, subscription, &self.settled));
                tracing::info!(topic = %self.req.topic, refused = attempt.refused, "Pub/sub subscription moved to the rebuilt broker; the old one drains.");
            }
            Some(Err(err)) => {
                let next = attempt.after_refusal();
                match next {
                    Some(next) => {
                        tracing::warn!(topic = %self.req.topic, error = %err, refused = next.refused, "Subscribing to a rebuilt broker failed; tried again.");
                    }
                    None => {
                        tracing::error!(topic = %self.req.topic, error = %err, deadline = ?RESUBSCRIBE_DEADLINE, "Subscribing to a rebuilt broker kept failing; the subscription ends once the old broker has drained.");
                    }
                }
                self.refused = Some(Refused::new(&now, next));
            }
            None => {
                // Slow, not refusing: the deadline starts again, and the
                // next attempt is waited for longer.
                if bound == SUBSCRIBE_BOUND {
                    tracing::warn!(topic = %self.req.topic, timeout = ?bound, "Subscribing to a rebuilt broker did not answer in time; tried again, waiting longer, until it answers.");
                } else {
                    tracing::debug!(topic = %self.req.topic, timeout = ?bound, "Subscribing to a rebuilt broker did not answer in time; tried again.");
                }
                self.slow = Some((Arc::downgrade(&now), (bound * 2).min(SLOW_SUBSCRIBE_BOUND)));
                let next = Resubscribe::now().after_refusal().map(|mut next| {
                    next.refused = attempt.refused;
                    next
                });
                self.refused = Some(Refused::new(&now, next));
            }
        }
    }

    /// Lets go of a warmed source not made current. Once a generation
    /// later than the one its reload replaced is published, its broker
    /// was published and replaced since (or will never serve): it is
    /// drained like any replaced source. Before that its publish may still
    /// come: it is stopped, never drained (a drain closes the publishes of
    /// a whole broker, such as a Redis one, which would then refuse every
    /// publish once it serves); what it read and did not hand on stays
    /// pending on its server, for a reclaim.
    fn let_go_of_warmed(&mut self, stale: Warmed) {
        let published = self
            .handle
            .0
            .live()
            .map_or(u64::MAX, |live| live.current().number);
        if published > stale.replaces {
            self.retire(stale.source);
            return;
        }
        tracing::warn!(topic = %self.req.topic, hold = ?WARMED_HOLD, "A broker warmed for a reload was not published in time; its subscription is stopped, not drained (what it did not hand on stays pending on its server).");
        stale.source.subscription.stop();
    }

    /// Makes `source` current; one current before it (never on the same
    /// broker: see [`follows`](Self::follows)) is drained, not dropped
    /// with what it holds.
    fn make_current(&mut self, source: Source) {
        if let Some(old) = self.current.replace(source) {
            self.retire(old);
        }
    }

    /// Asks `source` to drain; its grace starts at its first delivery
    /// sent from then on (those it already sent, waiting to be read, are
    /// counted out: a Redis broker sends nothing after them until it has
    /// closed its publishes); its no-progress limit at once; its broker
    /// is marked drained until it is let go.
    fn retire(&mut self, source: Source) {
        source.subscription.drain();
        source.outstanding.drain();
        let now = Instant::now();
        self.draining.push(Source {
            stop_at: None,
            drain_until: Some(now + DRAIN_CAP),
            stall_at: Some(now + DRAIN_LIMIT),
            _drain_mark: Some(DrainMark::new(&source.broker)),
            sent_before_drain: source.subscription.deliveries.len(),
            ..source
        });
    }

    /// The subscriber took a delivery after `waited`: no source was read
    /// meanwhile, so that time does not count against the drains.
    fn subscriber_caught_up(&mut self, waited: Duration) {
        for source in &mut self.draining {
            source.drain_paused(waited);
        }
    }

    /// The next drain, stop or retry deadline; only a drain's cap runs
    /// while the subscriber is `behind` (see [`Source::deadline`]).
    fn next_deadline(&self, behind: bool) -> Option<Instant> {
        let retry = self.retry().map(|r| r.at);
        self.draining
            .iter()
            .filter_map(|s| s.deadline(behind))
            .chain(retry)
            .min()
    }

    /// Stops sources past their drain grace or no-progress limit (unless
    /// the subscriber is `behind`) or their cap (even then: the delivery
    /// the subscriber is being given is kept); lets go of stopped ones
    /// past their stop grace.
    fn expire(&mut self, behind: bool) {
        let now = Instant::now();
        self.draining.retain_mut(|source| match source.deadline_at(behind, now) {
            Some(at) if at <= now && source.stopped => {
                tracing::warn!("A replaced broker did not close its subscription in time; let go.");
                false
            }
            Some(at) if at <= now => {
                tracing::warn!(grace = ?DRAIN_GRACE, limit = ?DRAIN_LIMIT, cap = ?DRAIN_CAP, outstanding = source.outstanding.count(), "A replaced broker was silent for the grace with nothing awaiting its outcome, made no progress for the limit, or drained past the cap; stopped.");
                source.subscription.stop();
                source.stopped = true;
                source.stop_at = Some(now + STOP_GRACE);
                true
            }
            _ => true,
        });
    }
}

/// The next delivery of any source, or which source ended: draining
/// sources first, oldest first, then the warmed one, then the current one.
async fn next_delivery(
    current: &mut Option<Source>,
    warmed: &mut Option<Warmed>,
    draining: &mut [Source],
) -> Event {
    poll_fn(|cx| {
        let sources = draining
            .iter_mut()
            .enumerate()
            .map(|(i, source)| (Which::Draining(i), source))
            .chain(
                warmed
                    .iter_mut()
                    .map(|warmed| (Which::Warmed, &mut warmed.source)),
            )
            .chain(current.iter_mut().map(|source| (Which::Current, source)));
        for (which, source) in sources {
            match source.subscription.deliveries.poll_recv(cx) {
                Poll::Ready(Some(delivery)) => {
                    return Poll::Ready(Event::Delivery(delivery, which))
                }
                Poll::Ready(None) => return Poll::Ready(Event::Ended(which)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// The answer of the subscribe under way (pending while there is none).
async fn subscribed(subscribing: &mut Option<Subscribing>) -> Answer {
    match subscribing {
        Some(subscribing) => (&mut subscribing.call).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
