//! Keeps the watches of the running configuration in place: `watch: true`
//! configurationRefs (subscribed; polled when their store refuses to
//! subscribe), `watch: true` secretRefs (polled, since secret stores
//! cannot notify), and the overlay keys. Whenever a new
//! generation is committed the watches follow its plan: a watch that
//! stays keeps its subscription and compares what arrives with the value
//! its component now runs with; a new watch subscribes, then compares the
//! store's current value, so no change is missed in between. A value asks
//! for one reload (until the component's value moves on).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod polled_configuration;

use self::polled_configuration::poll_configuration;
use super::overlay::watch_overlay;
use super::poll_period::secret_poll_period;
#[cfg(test)]
use super::poll_period::MIN_SECRET_POLL;
use super::resubscribe::Resubscribe;
use super::store_calls::store_call_bound;
use super::TriggerContext;
use crate::assemble::is_the_ref;
use crate::component::{ComponentKey, Kind};
use crate::config::{ConfigurationRef, InjectedRef, SecretRef};
use crate::handle::{ConfigStoreHandle, SecretStoreHandle};
use crate::kinds::ConfigQuery;
use crate::reload::{ReloadRequest, Trigger};
use crate::running::{WatchPlan, WatchedRef};

/// Starts the watches; they end at shutdown or when the plans stop. A
/// commit that changes what is watched (or publishes a generation)
/// updates them: a ref still watched keeps its running watch (its
/// subscription stays, so no change is missed) and is told the value its
/// component now runs with; a ref no longer watched stops; a new one starts
/// (subscribes, then compares the store's current value). The overlay
/// watch is restarted (flipping `watch` alone changes no instance, so the
/// check is on the plan, not on the generation).
pub(crate) fn spawn_watched_refs(mut cx: TriggerContext) {
    tokio::spawn(async move {
        let mut watching: Option<Arc<WatchPlan>> = None;
        let mut running: Vec<RunningWatch> = Vec::new();
        let mut overlay_round: Option<CancellationToken> = None;
        loop {
            let plan = cx.plan.borrow_and_update().clone();
            let rebuild = match &watching {
                Some(current) => {
                    current.generation != plan.generation || !current.watches_as(&plan)
                }
                None => true,
            };
            if rebuild {
                watching = Some(Arc::clone(&plan));
                running = follow_plan(&cx, running, &plan);
                if let Some(round) = overlay_round.take() {
                    round.cancel();
                }
                if let Some(spec) = plan.overlay.clone() {
                    let round = cx.stopped.child_token();
                    let app_id = plan.app_id.clone();
                    tokio::spawn(watch_overlay(cx.clone(), spec, app_id, round.clone()));
                    overlay_round = Some(round);
                }
                let stopped = cx.stopped.clone();
                tokio::select! {
                    changed = next_change(&mut cx, &plan) => if changed.is_err() { break },
                    () = stopped.cancelled() => break,
                }
            } else if cx.plan.changed().await.is_err() {
                break;
            }
        }
        for watch in running {
            watch.stop.cancel();
        }
        if let Some(round) = overlay_round {
            round.cancel();
        }
    });
}

/// The running watch of one ref.
struct RunningWatch {
    component: ComponentKey,
    reference: InjectedRef,
    /// The value the component runs with (what a change is compared to).
    expected: watch::Sender<Option<Value>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningWatch {
    fn start(cx: &TriggerContext, watched: WatchedRef) -> Self {
        let (expected, receiver) = watch::channel(watched.resolved.clone());
        let stop = cx.stopped.child_token();
        let task = tokio::spawn(run_watch(
            cx.clone(),
            watched.component.clone(),
            watched.reference.clone(),
            receiver,
            stop.clone(),
        ));
        Self {
            component: watched.component,
            reference: watched.reference,
            expected,
            stop,
            task,
        }
    }

    fn watches(&self, watched: &WatchedRef) -> bool {
        self.component == watched.component
            && self.reference == watched.reference
            && !self.task.is_finished()
    }
}

/// The watches for `plan`: the running ones it still wants (told their
/// component's value now), new ones for the rest; the others stop.
fn follow_plan(
    cx: &TriggerContext,
    mut running: Vec<RunningWatch>,
    plan: &WatchPlan,
) -> Vec<RunningWatch> {
    let mut next = Vec::with_capacity(plan.refs.len());
    for watched in &plan.refs {
        match running.iter().position(|r| r.watches(watched)) {
            Some(i) => {
                let kept = running.swap_remove(i);
                // Sent even when unchanged: a new generation resets what
                // the watch asked for.
                kept.expected.send_replace(watched.resolved.clone());
                next.push(kept);
            }
            None => next.push(RunningWatch::start(cx, watched.clone())),
        }
    }
    for gone in running {
        gone.stop.cancel();
    }
    next
}

/// Waits for a plan that calls for other watches than `plan`.
async fn next_change(
    cx: &mut TriggerContext,
    plan: &WatchPlan,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    loop {
        cx.plan.changed().await?;
        let next = cx.plan.borrow();
        if next.generation != plan.generation || !next.watches_as(plan) {
            return Ok(());
        }
    }
}

async fn run_watch(
    cx: TriggerContext,
    component: ComponentKey,
    reference: InjectedRef,
    expected: watch::Receiver<Option<Value>>,
    stop: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = watch(&cx, component, reference, expected) => {}
    }
}

async fn watch(
    cx: &TriggerContext,
    component: ComponentKey,
    reference: InjectedRef,
    expected: watch::Receiver<Option<Value>>,
) {
    match reference {
        InjectedRef::Configuration(_, r) => watch_configuration(cx, component, r, expected).await,
        InjectedRef::Secret(_, r) => watch_secret(cx, component, r, expected).await,
    }
}

fn force(cx: &TriggerContext, component: ComponentKey) {
    tracing::info!(component = %component, "Watched value changed.");
    cx.request(ReloadRequest {
        forced: BTreeSet::from([component]),
        ..ReloadRequest::of_changes(Trigger::WatchedRef, Vec::new())
    });
}

/// The ticks of a watch that polls its store (a secretRef; a
/// configurationRef whose store cannot subscribe): one read per secret
/// poll period, each bounded, and the values already asked for forgotten
/// once the component's value moves on.
struct Polling {
    ticks: tokio::time::Interval,
    /// How long one read may take.
    within: std::time::Duration,
    forced: Forced,
}

impl Polling {
    fn every(cx: &TriggerContext) -> Self {
        let period = secret_poll_period(cx.secret_poll_interval);
        let mut ticks = tokio::time::interval(period);
        // After a read abandoned at `within`, the next one waits a period
        // (not a burst of the ticks missed meanwhile).
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            ticks,
            within: store_call_bound(Some(period)),
            forced: Forced::default(),
        }
    }

    fn period(&self) -> std::time::Duration {
        self.ticks.period()
    }

    /// Waits for the next read's turn.
    async fn tick(&mut self, expected: &mut watch::Receiver<Option<Value>>) {
        self.ticks.tick().await;
        if expected.has_changed().unwrap_or(false) {
            expected.mark_unchanged();
            self.forced = Forced::default();
        }
    }
}

/// What a watch saw last and asked to apply, so that one new value asks
/// once (until the component's value moves on, or the store's value comes
/// back to the component's: a later change away from it asks again).
#[derive(Default)]
struct Forced(Option<Value>);

impl Forced {
    /// Asks for a reload of `component` if `now` differs from what it runs
    /// with and was not asked for already.
    fn check(
        &mut self,
        cx: &TriggerContext,
        component: &ComponentKey,
        expected: &watch::Receiver<Option<Value>>,
        now: Value,
    ) {
        if self.asks(expected.borrow().as_ref(), now) {
            force(cx, component.clone());
        }
    }

    /// Whether `now` asks for a reload, given the value the component
    /// runs with; notes what was asked for.
    fn asks(&mut self, expected: Option<&Value>, now: Value) -> bool {
        if expected == Some(&now) {
            // Back to the value in force: whatever was asked for is moot
            // (its reload may keep this value and publish nothing).
            self.0 = None;
            return false;
        }
        if self.0.as_ref() == Some(&now) {
            return false;
        }
        self.0 = Some(now);
        true
    }
}

async fn watch_configuration(
    cx: &TriggerContext,
    component: ComponentKey,
    r: ConfigurationRef,
    mut expected: watch::Receiver<Option<Value>>,
) {
    let handle = ConfigStoreHandle::new(
        ComponentKey::new(Kind::ConfigStore, &r.store),
        cx.live.clone(),
    );
    let query = ConfigQuery {
        keys: vec![r.key.clone()],
        group: r.group.clone(),
        label: r.label.clone(),
        metadata: HashMap::new(),
    };
    let within = store_call_bound(None);
    let mut subscription = match subscribe_configuration(&handle, &query, &component, &r).await {
        Ok(subscription) => subscription,
        Err(refused) => {
            return poll_configuration(cx, &component, &handle, &query, &r, &refused, expected)
                .await
        }
    };
    let mut forced = Forced::default();
    let mut resubscribe = Resubscribe::default();
    // The store's value as the watch last learned it.
    let mut seen = None;
    // Whether the store's current value is to be read: at first (a change
    // between the component's start and the subscription), and when the
    // component moved to a value the watch did not see. A read the store
    // fails or does not answer is tried again a bound later: the change
    // it would have found may be the last one written for a while.
    let mut to_read = true;
    loop {
        if to_read {
            match read_configuration(&handle, &query, &r, within).await {
                Read::Value(now) => {
                    to_read = false;
                    seen = Some(now.clone());
                    forced.check(cx, &component, &expected, now);
                }
                Read::Absent => to_read = false,
                Read::Failed => {}
            }
        }
        tokio::select! {
            change = subscription.changes.recv() => {
                let Some(change) = change else {
                    // The store let the subscription go (it fell behind,
                    // a burst of writes while this task waited): subscribe
                    // again, a moment later, and read what was missed.
                    let wait = resubscribe.next_wait();
                    tracing::warn!(component = %component, store = %r.store, key = %r.key, after = ?wait, "The watched configurationRef's subscription ended; subscribing again.");
                    tokio::time::sleep(wait).await;
                    match subscribe_configuration(&handle, &query, &component, &r).await {
                        Ok(again) => subscription = again,
                        Err(refused) => {
                            return poll_configuration(cx, &component, &handle, &query, &r, &refused, expected)
                                .await
                        }
                    }
                    to_read = true;
                    continue;
                };
                // It works: a next end is waited for from the start.
                resubscribe = Resubscribe::default();
                // A subscription may report every group's and label's
                // writes of the key; the component reads only its own.
                for item in change.items.into_iter().filter(|i| is_the_ref(&r, i)) {
                    let now = Value::String(item.value);
                    // The store told what is current: no read is owed.
                    to_read = false;
                    seen = Some(now.clone());
                    forced.check(cx, &component, &expected, now);
                }
            }
            moved = expected.changed() => {
                if moved.is_err() {
                    return;
                }
                forced = Forced::default();
                // The component now runs with the value the store last
                // reported (the usual case: the reload this watch asked
                // for): nothing to read, later changes come through the
                // subscription. Else it may already be stale (a value that
                // moved on while its reload read it, a flip back
                // included): the store says what is current.
                if seen.is_none() || expected.borrow().as_ref() != seen.as_ref() {
                    to_read = true;
                }
            }
            () = tokio::time::sleep(within), if to_read => {}
        }
    }
}

/// Subscribes to the watched configurationRef `r`; a subscribe that does
/// not answer is abandoned and asked again (a store that hangs once does
/// not end the watch). The store's error when it refuses (it cannot
/// watch, or it is gone): the value is polled instead.
async fn subscribe_configuration(
    handle: &ConfigStoreHandle,
    query: &ConfigQuery,
    component: &ComponentKey,
    r: &ConfigurationRef,
) -> Result<crate::kinds::ConfigSubscription, crate::kinds::ConfigError> {
    let within = store_call_bound(None);
    loop {
        match tokio::time::timeout(within, handle.subscribe(query.clone())).await {
            // The handle's own bound on the call: as no answer.
            Ok(Err(crate::kinds::ConfigError::Timeout(_))) | Err(_) => {
                tracing::warn!(component = %component, store = %r.store, key = %r.key, timeout = ?within, "Subscribing to a watched configurationRef did not answer in time; asking again.");
            }
            Ok(answer) => return answer,
        }
    }
}

/// What reading a watched configurationRef found.
enum Read {
    /// The store's current value.
    Value(Value),
    /// The key is absent, or the store is not running (reading again finds
    /// the same: the subscription reports what comes next).
    Absent,
    /// The store failed or did not answer within the bound (worth reading
    /// again).
    Failed,
}

/// The store's current value of `r`, read within `within`.
async fn read_configuration(
    handle: &ConfigStoreHandle,
    query: &ConfigQuery,
    r: &ConfigurationRef,
    within: std::time::Duration,
) -> Read {
    let Ok(store) = handle.load() else {
        return Read::Absent;
    };
    let items = match tokio::time::timeout(within, store.get(query)).await {
        Ok(Ok(items)) => items,
        Ok(Err(err)) => {
            tracing::debug!(store = %r.store, key = %r.key, error = %err, "Reading a watched configurationRef failed; read again a bound later.");
            return Read::Failed;
        }
        Err(_) => {
            tracing::debug!(store = %r.store, key = %r.key, timeout = ?within, "Reading a watched configurationRef did not answer in time; read again a bound later.");
            return Read::Failed;
        }
    };
    match items.into_iter().find(|i| is_the_ref(r, i)) {
        Some(item) => Read::Value(Value::String(item.value)),
        None => Read::Absent,
    }
}

async fn watch_secret(
    cx: &TriggerContext,
    component: ComponentKey,
    r: SecretRef,
    mut expected: watch::Receiver<Option<Value>>,
) {
    let handle = SecretStoreHandle::new(
        ComponentKey::new(Kind::SecretStore, &r.store),
        cx.live.clone(),
    );
    let mut polling = Polling::every(cx);
    let within = polling.within;
    loop {
        polling.tick(&mut expected).await;
        let Ok(store) = handle.load() else {
            return;
        };
        // Errors (store briefly unavailable) and reads that do not answer
        // within `within` (abandoned) are retried at the next tick.
        let read = tokio::time::timeout(within, store.get_secret_for_ref(&r.name)).await;
        if read.is_err() {
            tracing::debug!(component = %component, store = %r.store, timeout = ?within, "Polling a watched secretRef did not answer in time; retried at the next tick.");
        }
        if let Ok(Ok(secret)) = read {
            if let Some(now) = secret.get(&r.key) {
                polling.forced.check(
                    cx,
                    &component,
                    &expected,
                    Value::String(now.expose().to_string()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::super::store_calls::MIN_STORE_CALL;
    use super::*;
    use crate::component::Component;
    use crate::handle::{Generation, Instance, Live};
    use crate::kinds::{ConfigError, ConfigItem, ConfigStore, ConfigSubscription, SubscriptionHub};
    use crate::reload::queue::Queued;

    /// A config store holding one key's value, set without telling the
    /// subscribers; its next get, once told so, fails; it refuses to
    /// subscribe when told so.
    #[derive(Default)]
    struct FlakyStore {
        value: Mutex<String>,
        fail_next: AtomicBool,
        refuses_subscribe: bool,
        hub: SubscriptionHub,
    }

    #[async_trait]
    impl Component for FlakyStore {}

    #[async_trait]
    impl ConfigStore for FlakyStore {
        async fn get(&self, _: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(ConfigError::Backend("invalid auth token".into()));
            }
            Ok(vec![ConfigItem {
                key: "k".into(),
                value: self.value.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                ..ConfigItem::default()
            }])
        }

        async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
            if self.refuses_subscribe {
                return Err(ConfigError::Unsupported("subscribe".into()));
            }
            Ok(self.hub.subscribe(query))
        }
    }

    /// A watch of `cfg`'s `k` (`store`, holding A) by `state/s`, which
    /// runs with A: what steers it and what it sends.
    struct Watching {
        runs_with: watch::Sender<Option<Value>>,
        queued: crate::reload::queue::QueueReceiver,
        component: ComponentKey,
        /// How often a polled value is read.
        poll_interval: Duration,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn watching_k(store: &Arc<FlakyStore>) -> Watching {
        *store.value.lock().unwrap_or_else(|p| p.into_inner()) = "A".into();
        let live = Live::new();
        let instance: Arc<dyn ConfigStore> = store.clone();
        live.publish(Generation::new(
            1,
            BTreeMap::from([(
                ComponentKey::new(Kind::ConfigStore, "cfg"),
                Instance::ConfigStore(instance),
            )]),
        ));
        let (cx, queued) = TriggerContext::for_tests(live, "shop");
        let poll_interval = cx.secret_poll_interval;
        let reference = ConfigurationRef {
            store: "cfg".into(),
            key: "k".into(),
            group: None,
            label: None,
            inject_as: "v".into(),
            watch: true,
        };
        let component = ComponentKey::new("state", "s");
        let (runs_with, expected) = watch::channel(Some(Value::from("A")));
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_watch(
            cx,
            component.clone(),
            InjectedRef::Configuration(0, reference),
            expected,
            stop.clone(),
        ));
        Watching {
            runs_with,
            queued,
            component,
            poll_interval,
            stop,
            task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_whose_store_refuses_to_subscribe_is_polled() {
        let store = Arc::new(FlakyStore {
            refuses_subscribe: true,
            ..FlakyStore::default()
        });
        let Watching {
            runs_with: _runs_with,
            mut queued,
            component,
            poll_interval,
            stop,
            task: watching,
        } = watching_k(&store);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(queued.try_recv().is_err(), "A is in force");
        // The value moves on; the store tells nobody.
        *store.value.lock().unwrap_or_else(|p| p.into_inner()) = "B".into();
        let within = 2 * poll_interval;
        match tokio::time::timeout(within, queued.recv()).await {
            Ok(Some(Queued::Reload(request))) => {
                assert_eq!(request.trigger, Trigger::WatchedRef);
                assert_eq!(request.forced, BTreeSet::from([component]));
            }
            other => panic!("B not asked for within {within:?}: {other:?}"),
        }
        // Asked once: later polls of the same value ask nothing more.
        tokio::time::sleep(3 * poll_interval).await;
        assert!(queued.try_recv().is_err(), "B asked for again");
        assert!(!watching.is_finished(), "the watch goes on polling");
        stop.cancel();
        let _ = watching.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_whose_read_the_store_fails_after_the_component_moved_is_read_again() {
        let store = Arc::new(FlakyStore::default());
        let Watching {
            runs_with,
            mut queued,
            component,
            stop,
            task: watching,
            ..
        } = watching_k(&store);
        // Subscribed, and the store's A read: nothing to ask.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            queued.try_recv().is_err(),
            "A is what the component runs with"
        );
        // The component moves to B, while the store already holds C, and
        // the store fails the read that would find it.
        *store.value.lock().unwrap_or_else(|p| p.into_inner()) = "C".into();
        store.fail_next.store(true, Ordering::SeqCst);
        runs_with.send_replace(Some(Value::from("B")));
        let within = 2 * MIN_STORE_CALL;
        match tokio::time::timeout(within, queued.recv()).await {
            Ok(Some(Queued::Reload(request))) => {
                assert_eq!(request.forced, BTreeSet::from([component]));
            }
            other => panic!("C not asked for within {within:?}: {other:?}"),
        }
        stop.cancel();
        let _ = watching.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_subscription_the_store_dropped_subscribes_again() {
        let store = Arc::new(FlakyStore::default());
        let Watching {
            runs_with: _runs_with,
            mut queued,
            component,
            stop,
            task: watching,
            ..
        } = watching_k(&store);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(queued.try_recv().is_err(), "A is in force");
        // A burst of writes of the value in force while the watch cannot
        // run: the store drops it as a subscriber that stopped reading.
        let a = ConfigItem {
            key: "k".into(),
            value: "A".into(),
            ..ConfigItem::default()
        };
        for _ in 0..1_000 {
            store.hub.publish(std::slice::from_ref(&a));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Then the value moves on.
        *store.value.lock().unwrap_or_else(|p| p.into_inner()) = "C".into();
        store.hub.publish(&[ConfigItem {
            value: "C".into(),
            ..a
        }]);
        let within = super::super::resubscribe::RESUBSCRIBE_AFTER + 2 * MIN_STORE_CALL;
        match tokio::time::timeout(within, queued.recv()).await {
            Ok(Some(Queued::Reload(request))) => {
                assert_eq!(request.forced, BTreeSet::from([component]));
            }
            other => panic!("C not asked for within {within:?}: {other:?}"),
        }
        stop.cancel();
        let _ = watching.await;
    }

    #[tokio::test]
    async fn a_zero_poll_interval_is_raised_to_the_minimum() {
        let period = secret_poll_period(std::time::Duration::ZERO);
        assert_eq!(period, MIN_SECRET_POLL);
        // What the watch does with it (a zero period panics).
        let mut ticks = tokio::time::interval(period);
        ticks.tick().await;
        assert_eq!(
            secret_poll_period(std::time::Duration::from_secs(3)),
            std::time::Duration::from_secs(3)
        );
    }

    #[test]
    fn a_value_that_flips_back_and_forth_asks_again() {
        let (a, b) = (Value::from("A"), Value::from("B"));
        let mut forced = Forced::default();
        assert!(forced.asks(Some(&a), b.clone()), "A -> B");
        assert!(!forced.asks(Some(&a), b.clone()), "asked once");
        // Back to A before the reload read B: the reload keeps A and
        // publishes nothing, so nothing resets the watch from outside.
        assert!(!forced.asks(Some(&a), a.clone()), "B -> A");
        assert!(forced.asks(Some(&a), b.clone()), "A -> B again");
        assert!(forced.asks(Some(&a), Value::from("C")), "another value");
    }
}
