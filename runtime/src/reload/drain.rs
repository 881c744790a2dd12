//! Retiring replaced instances: each is closed once its last in-flight user
//! has let go, or after a grace period. A replaced pub/sub broker is held
//! by the subscriptions still draining it, which let go of it as soon as
//! its backlog is delivered or it stops making progress: its grace
//! stretches to their no-progress limit, and past it for as long as one
//! still drains it (up to their cap), so the drain, not the clock, decides
//! when it closes. Past its usual grace such a broker's close waits on its
//! own (woken when its drain ends), while the instances retired with it
//! are closed in turn. Drains are kept: a shutdown hurries them and waits
//! for their closes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::closing::{close_one, Closed, CLOSE_TIMEOUT};
use crate::component::ComponentKey;
use crate::handle::{
    pubsub_drained, pubsub_undrained, Instance, PUBSUB_DRAIN_CAP, PUBSUB_DRAIN_LIMIT,
    PUBSUB_STOP_GRACE,
};
use crate::running::Running;

/// How often the holders of a retired instance are counted.
const POLL: Duration = Duration::from_millis(5);

/// How long [`Drains::finish`] waits for the drains: once hurried, a
/// drain closes what it has left at once, each close bounded by
/// `CLOSE_TIMEOUT`, so every close ends (or is abandoned) within it; the
/// margin is for scheduling. Past it (a `close` that blocks its thread),
/// the drains are left behind.
const FINISH_WITHIN: Duration = CLOSE_TIMEOUT.saturating_add(Duration::from_secs(1));

/// The drains under way: each runs in the background until [`finish`]
/// (at shutdown) stops their waits for users and waits for their closes.
///
/// [`finish`]: Drains::finish
#[derive(Default)]
pub(crate) struct Drains {
    /// Each drain, answering how many of its closes were abandoned.
    tasks: Mutex<JoinSet<usize>>,
    /// Cancelled by `finish`: no drain waits for users any longer.
    hurry: CancellationToken,
}

impl Drains {
    /// Closes `retired` (in the order given), each after its users let go
    /// or `grace` passes (at once, once hurried). Runs in the background.
    pub(crate) fn spawn(&self, retired: Vec<(ComponentKey, Arc<Running>)>, grace: Duration) {
        if retired.is_empty() {
            return;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        // The drains that ended are let go of here: the set stays small.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(drain(retired, grace, self.hurry.clone()));
    }

    /// Stops every drain's wait for users, so each closes what it has
    /// left at once, and waits for their closes (up to [`FINISH_WITHIN`]:
    /// every one has ended or been abandoned by then). Returns how many
    /// closes of the drains still under way were abandoned, counting a
    /// drain left behind as one. Drains that ended before are not counted
    /// (their abandoned closes were logged then): the count does not
    /// depend on whether a later reload happened to let go of them.
    /// With `by`, it waits no later than then either.
    pub(crate) async fn finish(&self, by: Option<tokio::time::Instant>) -> usize {
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        while tasks.try_join_next().is_some() {}
        self.hurry.cancel();
        let mut abandoned = 0;
        let started = tokio::time::Instant::now();
        let until = by.map_or(started + FINISH_WITHIN, |by| {
            by.min(started + FINISH_WITHIN)
        });
        let joined = tokio::time::timeout_at(until, async {
            while let Some(drained) = tasks.join_next().await {
                abandoned += drained.unwrap_or(1);
            }
        });
        if joined.await.is_err() {
            tracing::warn!(waited = ?started.elapsed(), "Replaced instances still closing at shutdown; left to close in the background.");
            abandoned += tasks.len();
            tasks.detach_all();
        }
        abandoned
    }
}

impl Drop for Drains {
    /// A runtime dropped without a shutdown: its drains go on (a dropped
    /// set would abort them, and what they retire would never close).
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        tasks.detach_all();
    }
}

/// Closes `retired` (in the order given), each after its users let go,
/// `grace` passes or `hurry` is cancelled. A pub/sub broker a handle
/// subscription still drains past its grace is handed to a close of its
/// own, which waits for that drain ([`close_once_undrained`]): the
/// instances after it are not held behind a drain of up to
/// `PUBSUB_DRAIN_CAP`. Once hurried, what is left is closed at once,
/// alongside a close under way: they are all retired instances, reaching
/// others only through handles, which resolve in the generation in force.
/// Returns how many closes were abandoned.
async fn drain(
    retired: Vec<(ComponentKey, Arc<Running>)>,
    grace: Duration,
    hurry: CancellationToken,
) -> usize {
    let mut closing = JoinSet::new();
    // The brokers whose close waits for their drain, alongside the rest.
    let mut outlasting = JoinSet::new();
    let mut abandoned = 0;
    for (key, running) in retired {
        if !hurry.is_cancelled() {
            let started = tokio::time::Instant::now();
            let instance = &running.assembled.instance;
            if wait_for_users(&key, instance, grace, &hurry).await == Waited::StillDrained {
                let until = started + PUBSUB_DRAIN_CAP + PUBSUB_STOP_GRACE;
                let close = close_once_undrained(key, running, until, hurry.clone());
                outlasting.spawn(close.in_current_span());
                continue;
            }
        }
        closing.spawn(close_retired(key, running).in_current_span());
        if hurry.is_cancelled() {
            continue;
        }
        // One at a time until hurried: `closing` holds this close alone.
        tokio::select! {
            closed = closing.join_next() => abandoned += closed.map_or(0, |c| c.unwrap_or(Closed::Abandoned).abandoned()),
            () = hurry.cancelled() => {}
        }
    }
    // Each close is bounded (and a panic caught) in `close_one`; a wait
    // for a drain by its cap and `hurry`.
    while let Some(closed) = closing.join_next().await {
        abandoned += closed.unwrap_or(Closed::Abandoned).abandoned();
    }
    while let Some(closed) = outlasting.join_next().await {
        abandoned += closed.unwrap_or(Closed::Abandoned).abandoned();
    }
    abandoned
}

/// How a wait for the users of a retired instance ended.
#[derive(Debug, PartialEq, Eq)]
enum Waited {
    /// Its users let go, its grace passed, or it was hurried: it is
    /// closed now.
    Over,
    /// Its grace passed while a handle subscription still drains it (a
    /// pub/sub broker): its close waits for the drain.
    StillDrained,
}

/// Waits until the users of `instance` let go of it, its grace passes or
/// `hurry` is cancelled; warns when closing it still in use. A pub/sub
/// broker a subscription still drains at the end of its grace is not
/// closed yet ([`Waited::StillDrained`]).
async fn wait_for_users(
    key: &ComponentKey,
    instance: &Instance,
    grace: Duration,
    hurry: &CancellationToken,
) -> Waited {
    let deadline = crate::deadline::deadline_after(grace_for(instance, grace));
    // One holder is the `Running` itself.
    while instance.holders() > 1 && tokio::time::Instant::now() < deadline && !hurry.is_cancelled()
    {
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = hurry.cancelled() => {}
        }
    }
    if instance.holders() > 1 && !hurry.is_cancelled() && still_drained(instance) {
        return Waited::StillDrained;
    }
    warn_if_in_use(key, instance, grace);
    Waited::Over
}

/// Closes a retired pub/sub broker once no handle subscription drains it
/// any more, `until` passes (its drain's cap and stop grace, counted from
/// its retirement) or `hurry` is cancelled (a shutdown: at once).
async fn close_once_undrained(
    key: ComponentKey,
    running: Arc<Running>,
    until: tokio::time::Instant,
    hurry: CancellationToken,
) -> Closed {
    if let Instance::PubSub(broker) = &running.assembled.instance {
        tokio::select! {
            () = pubsub_undrained(broker) => {}
            () = tokio::time::sleep_until(until) => {}
            () = hurry.cancelled() => {}
        }
    }
    warn_if_in_use(&key, &running.assembled.instance, PUBSUB_DRAIN_CAP);
    close_retired(key, running).await
}

/// Warns when `instance` is closed while still in use (`grace`, the wait
/// that ended, is logged).
fn warn_if_in_use(key: &ComponentKey, instance: &Instance, grace: Duration) {
    let holders = instance.holders();
    if holders > 1 {
        tracing::warn!(component = %key, holders = holders - 1, ?grace, "Closing a replaced instance still in use (its grace period over, or at shutdown).");
    }
}

/// Closes one retired instance.
async fn close_retired(key: ComponentKey, running: Arc<Running>) -> Closed {
    let assembled = &running.assembled;
    close_one(&key, &assembled.instance, &assembled.shutdown).await
}

/// Whether `instance` is a pub/sub broker a handle subscription still
/// drains (its close waits for the drain, up to the drain's cap).
fn still_drained(instance: &Instance) -> bool {
    match instance {
        Instance::PubSub(broker) => pubsub_drained(broker),
        _ => false,
    }
}

/// How long the users of `instance` are waited for: `grace`, or for a
/// pub/sub broker, as long as its subscriptions may drain it without
/// progress (longer while one still drains it: [`still_drained`]).
fn grace_for(instance: &Instance, grace: Duration) -> Duration {
    match instance {
        Instance::PubSub(_) => grace.max(PUBSUB_DRAIN_LIMIT + PUBSUB_STOP_GRACE),
        _ => grace,
    }
}

#[cfg(test)]
mod tests {
    //! Paused clock: every wait is virtual.

    use async_trait::async_trait;
    use tokio_util::sync::CancellationToken;

    use std::collections::BTreeMap;

    use super::*;
    use crate::assemble::Assembled;
    use crate::component::Component;
    use crate::handle::{Generation, Live, PubSubHandle};
    use crate::kinds::{DeliveryOutcome, Message};
    use crate::kinds::{PubSub, PubSubError, PubSubSubscription, PublishRequest, SubscribeRequest};
    use crate::metadata::Metadata;

    struct Broker;
    impl Component for Broker {}
    #[async_trait]
    impl PubSub for Broker {
        async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
            Ok(())
        }
        async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
            Err(PubSubError::Backend("not in this test".into()))
        }
    }

    struct Plain;
    impl Component for Plain {}

    /// A component whose `close` never ends, or panics.
    struct BadClose {
        panics: bool,
    }
    #[async_trait]
    impl Component for BadClose {
        async fn close(&self) -> Result<(), crate::component::ComponentError> {
            if self.panics {
                panic!("close exploded");
            }
            std::future::pending().await
        }
    }

    fn retired(name: &str, instance: Instance) -> (ComponentKey, Arc<Running>) {
        let text = format!(r#"{{"components": {{"custom": {{"{name}": {{}}}}}}}}"#);
        let config = crate::config::parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let key = ComponentKey::new("custom", name);
        let spec = config.components[&key].clone();
        let assembled = Assembled {
            instance,
            shutdown: CancellationToken::new(),
            resolved: Metadata::default(),
        };
        (key, Arc::new(Running { spec, assembled }))
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_still_drained_outlives_the_grace_and_closes_when_let_go() {
        let grace = Duration::from_secs(10);
        let broker: Arc<dyn PubSub> = Arc::new(Broker);
        let (key, running) = retired("orders", Instance::PubSub(broker.clone()));
        let closed = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], grace);
        tokio::time::sleep(grace * 3).await;
        assert!(
            !closed.is_cancelled(),
            "closed while a subscription drains it"
        );
        drop(broker);
        tokio::time::sleep(POLL * 2).await;
        assert!(closed.is_cancelled(), "not closed once let go");
    }

    /// A broker whose subscriptions, once asked to drain, deliver one
    /// message every [`Backlog::EVERY`] for [`Backlog::FOR`], then end.
    struct Backlog;
    impl Backlog {
        /// Within the drains' grace (5 s of silence).
        const EVERY: Duration = Duration::from_secs(2);
        /// Past the drain's no-progress limit, twice over.
        const FOR: Duration = Duration::from_secs(300);
    }
    impl Component for Backlog {}
    #[async_trait]
    impl PubSub for Backlog {
        async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
            Ok(())
        }
        async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
            let (subscription, feed) = PubSubSubscription::channel(1);
            tokio::spawn(async move {
                feed.draining().await;
                let mut sent = Duration::ZERO;
                while sent < Backlog::FOR {
                    tokio::time::sleep(Backlog::EVERY).await;
                    sent += Backlog::EVERY;
                    if feed.deliver(Message::default()).await.is_none() {
                        return;
                    }
                }
            });
            Ok(subscription)
        }
    }

    /// Subscribes through a handle to a [`Backlog`] broker and replaces
    /// it: the old one drains for [`Backlog::FOR`]. Returns the old broker
    /// and the task settling every delivery.
    async fn a_draining_backlog(
        key: &ComponentKey,
    ) -> (Arc<dyn PubSub>, tokio::task::JoinHandle<()>) {
        let old: Arc<dyn PubSub> = Arc::new(Backlog);
        let live = Live::new();
        let instances = |broker: &Arc<dyn PubSub>| {
            BTreeMap::from([(key.clone(), Instance::PubSub(broker.clone()))])
        };
        live.publish(Generation::new(1, instances(&old)));
        let handle = PubSubHandle::new(key.clone(), live.clone());
        let mut sub = handle
            .subscribe(SubscribeRequest::default())
            .await
            .expect("subscribed");
        let reading = tokio::spawn(async move {
            while let Some(delivery) = sub.deliveries.recv().await {
                delivery.settle(DeliveryOutcome::Success);
            }
        });
        let new: Arc<dyn PubSub> = Arc::new(Backlog);
        live.publish(Generation::new(2, instances(&new)));
        (old, reading)
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_is_closed_once_its_subscriptions_drain_ends_not_while_it_progresses() {
        let key = ComponentKey::new("pubsub", "orders");
        let (old, reading) = a_draining_backlog(&key).await;
        // The test holds the old broker too: only the drain decides.
        let (_, running) = retired("orders", Instance::PubSub(old.clone()));
        let closed = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], Duration::from_secs(10));
        tokio::time::sleep(Backlog::FOR - Backlog::EVERY).await;
        assert!(!closed.is_cancelled(), "closed while its drain progresses");
        tokio::time::sleep(Backlog::EVERY + PUBSUB_STOP_GRACE + POLL * 2).await;
        assert!(closed.is_cancelled(), "held once its drain ended");
        reading.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn instances_retired_after_a_broker_still_draining_are_closed_without_waiting_for_it() {
        let key = ComponentKey::new("pubsub", "orders");
        let (old, reading) = a_draining_backlog(&key).await;
        // Retired together (a rotated secret both used), the broker first.
        let (_, broker) = retired("orders", Instance::PubSub(old.clone()));
        let broker_closed = broker.assembled.shutdown.clone();
        let (lock_key, lock) = retired("lock", Instance::Custom(Arc::new(Plain)));
        let lock_closed = lock.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(
            vec![(key, broker), (lock_key, lock)],
            Duration::from_secs(10),
        );
        tokio::time::sleep(PUBSUB_DRAIN_LIMIT + PUBSUB_STOP_GRACE + POLL * 4).await;
        assert!(pubsub_drained(&old), "the broker's drain ended too soon");
        assert!(
            !broker_closed.is_cancelled(),
            "closed while its drain progresses"
        );
        assert!(lock_closed.is_cancelled(), "held behind a draining broker");
        // A shutdown still closes the broker at once.
        let asked = tokio::time::Instant::now();
        drains.finish(None).await;
        assert!(
            broker_closed.is_cancelled(),
            "not closed when finish returned"
        );
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "finish waited for the drain"
        );
        reading.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_never_let_go_is_closed_after_the_longest_drain() {
        let grace = Duration::from_secs(10);
        let broker: Arc<dyn PubSub> = Arc::new(Broker);
        let (key, running) = retired("orders", Instance::PubSub(broker.clone()));
        let closed = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], grace);
        tokio::time::sleep(PUBSUB_DRAIN_LIMIT + PUBSUB_STOP_GRACE + POLL * 2).await;
        assert!(closed.is_cancelled(), "a held broker is never closed");
    }

    #[tokio::test(start_paused = true)]
    async fn other_instances_are_closed_after_the_grace_even_if_held() {
        let grace = Duration::from_secs(10);
        let plain = Arc::new(Plain);
        let (key, running) = retired("plain", Instance::Custom(plain.clone()));
        let closed = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], grace);
        tokio::time::sleep(grace + POLL * 2).await;
        assert!(closed.is_cancelled(), "held past the grace");
        drop(plain);
    }

    #[tokio::test(start_paused = true)]
    async fn drains_go_on_once_their_set_is_dropped_and_a_finish_hurries_them() {
        let grace = Duration::from_secs(10);
        let plain = Arc::new(Plain);
        let (key, running) = retired("plain", Instance::Custom(plain.clone()));
        let dropped = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], grace);
        drop(drains);
        tokio::time::sleep(grace + POLL * 2).await;
        assert!(dropped.is_cancelled(), "a dropped set's drain was aborted");

        let (key, running) = retired("plain", Instance::Custom(plain.clone()));
        let finished = running.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![(key, running)], grace);
        let asked = tokio::time::Instant::now();
        drains.finish(None).await;
        assert!(finished.is_cancelled(), "not closed when finish returned");
        assert!(asked.elapsed() < grace, "finish waited for the user");
        drop(plain);
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_that_hangs_or_panics_does_not_keep_the_next_ones_open() {
        let grace = Duration::from_secs(1);
        let hangs = retired(
            "hangs",
            Instance::Custom(Arc::new(BadClose { panics: false })),
        );
        let panics = retired(
            "panics",
            Instance::Custom(Arc::new(BadClose { panics: true })),
        );
        let (key, plain) = retired("plain", Instance::Custom(Arc::new(Plain)));
        let closed = plain.assembled.shutdown.clone();
        let drains = Drains::default();
        drains.spawn(vec![hangs, panics, (key, plain)], grace);
        tokio::time::sleep((grace + crate::closing::CLOSE_TIMEOUT) * 3).await;
        assert!(closed.is_cancelled(), "left open behind a bad close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finish_counts_the_closes_it_abandoned() {
        let hangs = retired(
            "hangs",
            Instance::Custom(Arc::new(BadClose { panics: false })),
        );
        let panics = retired(
            "panics",
            Instance::Custom(Arc::new(BadClose { panics: true })),
        );
        let plain = retired("plain", Instance::Custom(Arc::new(Plain)));
        let drains = Drains::default();
        drains.spawn(vec![hangs, panics, plain], Duration::from_secs(10));
        assert_eq!(drains.finish(None).await, 2, "hung and panicked closes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finish_does_not_count_a_drain_that_ended_before_it() {
        let grace = Duration::from_secs(1);
        let hangs = || {
            retired(
                "hangs",
                Instance::Custom(Arc::new(BadClose { panics: false })),
            )
        };
        let ended = (grace + crate::closing::CLOSE_TIMEOUT) * 2;
        // Alone, and with a later reload's drain that lets go of it.
        let drains = Drains::default();
        drains.spawn(vec![hangs()], grace);
        tokio::time::sleep(ended).await;
        let alone = drains.finish(None).await;
        let drains = Drains::default();
        drains.spawn(vec![hangs()], grace);
        tokio::time::sleep(ended).await;
        drains.spawn(
            vec![retired("plain", Instance::Custom(Arc::new(Plain)))],
            grace,
        );
        let after_another = drains.finish(None).await;
        assert_eq!(
            (alone, after_another),
            (0, 0),
            "a close abandoned before the shutdown counted by it"
        );
    }
}
