//! [`Deliveries`]: the app's running subscriptions, kept equal to what is
//! wanted — the app's own (asked once) plus the declared ones of the
//! current generation (`subscriptions` section, those whose `scopes` take
//! this app) — as generations are published.
//!
//! A subscription is started when it appears and stopped when it goes,
//! without touching the others. A change of routes or of the dead-letter
//! topic is applied in place (no message moves); a change of pub/sub,
//! topic or metadata starts the new subscription, then *retires* the old
//! one: it delivers what its broker holds for it (a slow app's backlog)
//! until it reaches events the new one delivered (and has read again
//! each failed event it handed back to its broker since, or its broker
//! gave it nothing for 5 s: the memory broker gives one again to it
//! alone), or within the runtime's
//! drain bounds (5 s with nothing delivered nor in flight, 120 s at most),
//! so nothing published before or meanwhile is missed (a CloudEvent
//! comes again when its delivery failed, or when the new one, behind on
//! a fan-out broker such as memory, reads one the old one delivered after
//! the hand-over ended and its lineage forgot; a payload that is no
//! CloudEvent may come twice). One that
//! could not start (its pub/sub is missing or refused, or its broker
//! never takes its dead-letter topic, also when a reload sets that topic
//! on one running: that one stops), or whose delivery
//! ended on its own (its broker ended the subscription), is started again
//! at each generation and every [`RETRY_EVERY`].
//!
//! One subscription runs per pub/sub and topic, as in Dapr (a second one
//! would have a memory broker deliver each event twice, and split a
//! redis consumer group's events between two routes): the app's own
//! (and those given in code) win over declared ones, the last listed of
//! them wins, and among declared ones the first by name; the others are
//! not started, each said once in the log ([`one_per_topic`]). When a
//! reload has another subscription run for a pub/sub and topic (the one
//! that ran is removed, or another now wins over it), it *takes over*
//! as a changed subscription does: the new one starts, then the old one
//! retires (were it stopped first, a memory broker would give what is
//! published meanwhile to nobody, and drop the old one's backlog).
//!
//! The subscriptions of one pub/sub and topic share a [`Lineage`]: while
//! one of them retires, an event is sent by one of them only (however
//! many reloads took the topic over in a row), and a retiring one ends
//! once it reaches what a later one delivered. A retiring one delivers by
//! the routes of the one that runs (set before that one subscribes, also
//! when it replaced one of the same id whose metadata changed), and one
//! taken over again while it retires goes on for the new taker, by its
//! routes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::config::SubscriptionRoutes;
use rewire_runtime::Runtime;
use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::routed::{AppTarget, RoutedSink};
use super::AppSubscription;
use crate::dapr::handover::{Lineage, Retire};
use crate::dapr::TopicDelivery;

/// How often subscriptions that could not start, or ended on their own,
/// are started again.
pub const RETRY_EVERY: Duration = Duration::from_secs(5);
/// How long a stopped subscription may take to let go of its broker
/// subscription (deliveries already handed to the app finish on their own).
const STOP_WAIT: Duration = Duration::from_secs(5);

/// What a broker subscription is made of: a change here needs a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Feed {
    pubsub_name: String,
    topic: String,
    metadata: BTreeMap<String, String>,
}

impl Feed {
    /// The pub/sub and topic: what a [`Lineage`] is of.
    fn lineage_key(&self) -> (String, String) {
        (self.pubsub_name.clone(), self.topic.clone())
    }

    fn of(subscription: &AppSubscription) -> Self {
        Self {
            pubsub_name: subscription.pubsub_name.clone(),
            topic: subscription.topic.clone(),
            metadata: subscription.metadata.clone(),
        }
    }
}

/// One running subscription.
struct Running {
    feed: Feed,
    routes: watch::Sender<Arc<SubscriptionRoutes>>,
    dead_letter_topic: watch::Sender<Option<String>>,
    retire: watch::Sender<bool>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Routes what it still delivers as its taker does: one subscription
    /// taking over another of the same pub/sub and topic (on a broker whose
    /// consumers share a group, such as Redis Streams, both read new
    /// entries until the old one retires) sends every event by the taker's
    /// rules and dead-letter topic, not by those the reload removed.
    fn route_as(&self, routes: &Arc<SubscriptionRoutes>, dead_letter_topic: &Option<String>) {
        self.routes.send_replace(routes.clone());
        self.dead_letter_topic
            .send_replace(dead_letter_topic.clone());
    }
}

/// A replaced subscription delivering what it holds, for the running
/// subscription `id`.
struct Retired {
    id: String,
    running: Running,
}

impl Running {
    /// Stops reading: once this returns, no new event of it reaches the app.
    async fn stop(self) {
        self.stop.cancel();
        if tokio::time::timeout(STOP_WAIT, self.task).await.is_err() {
            tracing::warn!(topic = %self.feed.topic, "A stopped subscription did not end in time.");
        }
    }
}

/// The app's subscriptions as they run, by id (`app#N` for the app's
/// own, `given#N` for those given in code, the name for declared ones,
/// `declared#NAME` when it has a `#`: see [`declared_id`]).
pub(super) struct Deliveries {
    runtime: Runtime,
    app: AppTarget,
    shutdown: CancellationToken,
    running: HashMap<String, Running>,
    /// Replaced subscriptions still delivering what they hold.
    retired: Vec<Retired>,
    /// The lineage of each pub/sub and topic running or retiring.
    lineages: HashMap<(String, String), Arc<Lineage>>,
    /// Why each wanted subscription is not running (said once per reason).
    refused: HashMap<String, String>,
    /// Subscriptions left out for another of the same pub/sub and topic:
    /// the id of the one that runs (said once per change).
    shadowed: HashMap<String, String>,
    /// The ids running, told after each change.
    subscribed: watch::Sender<BTreeSet<String>>,
    /// Told when a delivery task ends (stopped, or on its own).
    ended: Arc<Notify>,
}

impl Deliveries {
    pub(super) fn new(
        runtime: Runtime,
        app: AppTarget,
        shutdown: CancellationToken,
        subscribed: watch::Sender<BTreeSet<String>>,
    ) -> Self {
        Self {
            runtime,
            app,
            shutdown,
            running: HashMap::new(),
            retired: Vec::new(),
            lineages: HashMap::new(),
            refused: HashMap::new(),
            shadowed: HashMap::new(),
            subscribed,
            ended: Arc::new(Notify::new()),
        }
    }

    /// Follows the generations until `shutdown`: `fixed` (the app's own
    /// and those given in code) plus the declared ones of each generation.
    pub(super) async fn follow(mut self, fixed: impl Into<Arc<[(String, AppSubscription)]>>) {
        let fixed = fixed.into();
        let mut changes = self.runtime.generation_changes();
        let mut reconcile = true;
        loop {
            if reconcile {
                changes.borrow_and_update();
                let wanted = self.wanted(&fixed);
                self.reconcile(wanted).await;
            }
            self.retired
                .retain(|retired| !retired.running.task.is_finished());
            self.remember_while_retiring();
            let ended = self.running.values().any(|r| r.task.is_finished());
            self.tell_subscribed();
            let retry = ended || !self.refused.is_empty();
            reconcile = tokio::select! {
                () = self.shutdown.cancelled() => break,
                changed = changes.changed() => if changed.is_err() { break } else { true },
                () = tokio::time::sleep(RETRY_EVERY), if retry => true,
                // A delivery that ended: started again after RETRY_EVERY.
                () = self.ended.notified(), if !ended => false,
            };
        }
        for (_, running) in self.running.drain() {
            running.stop().await;
        }
        for retired in std::mem::take(&mut self.retired) {
            retired.running.stop().await;
        }
        self.subscribed.send_replace(BTreeSet::new());
    }

    /// Tells the ids running (their delivery not ended) to `subscribed`.
    fn tell_subscribed(&self) {
        self.subscribed.send_replace(
            self.running
                .iter()
                .filter(|(_, r)| !r.task.is_finished())
                .map(|(id, _)| id.clone())
                .collect(),
        );
    }

    /// Each lineage remembers while one of it retires; one with nothing
    /// running nor retiring is let go.
    fn remember_while_retiring(&mut self) {
        let retiring: BTreeSet<(String, String)> = self
            .retired
            .iter()
            .map(|retired| retired.running.feed.lineage_key())
            .collect();
        let running: BTreeSet<(String, String)> = self
            .running
            .values()
            .map(|running| running.feed.lineage_key())
            .collect();
        self.lineages.retain(|key, lineage| {
            lineage.remember(retiring.contains(key));
            retiring.contains(key) || running.contains(key)
        });
    }

    /// `fixed` plus the current generation's declared subscriptions for
    /// this app, one per pub/sub and topic ([`one_per_topic`]).
    fn wanted(&mut self, fixed: &[(String, AppSubscription)]) -> BTreeMap<String, AppSubscription> {
        let generation = self.runtime.generation();
        let declared = AppSubscription::declared_for(&generation)
            .map(|(name, declared)| (name.to_string(), declared))
            .collect();
        let (wanted, shadowed) = one_per_topic(fixed, declared);
        for (id, (winner, subscription)) in &shadowed {
            if self.shadowed.get(id) != Some(winner) {
                tracing::warn!(subscription = %id, pubsub = %subscription.pubsub_name, topic = %subscription.topic, running = %winner, "Another subscription of the app has the same pub/sub and topic; only one runs, as in Dapr: this one is not started.");
            }
        }
        self.shadowed = shadowed
            .into_iter()
            .map(|(id, (winner, _))| (id, winner))
            .collect();
        wanted
    }

    /// Starts, updates and stops subscriptions so that `wanted` run.
    async fn reconcile(&mut self, wanted: BTreeMap<String, AppSubscription>) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !wanted.contains_key(*id))
            .cloned()
            .collect();
        // What a wanted subscription of the same pub/sub and topic takes
        // over, by the id of the one taking over: retired once that one
        // runs, not stopped before it starts (the memory broker gives a
        // publish only to the subscriptions there when it is made, and
        // drops a stopped one's backlog).
        let mut taken: HashMap<String, Vec<(String, Running)>> = HashMap::new();
        for id in gone {
            let Some(running) = self.running.remove(&id) else {
                continue;
            };
            let taker = wanted
                .iter()
                .find(|(_, s)| {
                    s.pubsub_name == running.feed.pubsub_name && s.topic == running.feed.topic
                })
                .map(|(taker, _)| taker.clone());
            match taker {
                Some(taker) if !running.task.is_finished() => {
                    tracing::info!(subscription = %id, pubsub = %running.feed.pubsub_name, topic = %running.feed.topic, successor = %taker, "App subscription replaced by another of the same pub/sub and topic; it retires once that one runs.");
                    taken.entry(taker).or_default().push((id, running));
                }
                _ => {
                    tracing::info!(subscription = %id, pubsub = %running.feed.pubsub_name, topic = %running.feed.topic, "App subscription stopped.");
                    running.stop().await;
                }
            }
        }
        // A subscription no longer wanted: what it replaced stops too,
        // unless another takes it over (then what it replaced goes on
        // retiring, for that one, by its routes once it runs).
        let takers: BTreeSet<String> = taken.keys().cloned().collect();
        let (keep, stop): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
            .into_iter()
            .map(|mut retired| {
                if let Some(taker) = taken
                    .iter()
                    .find(|(_, old)| old.iter().any(|(id, _)| *id == retired.id))
                    .map(|(taker, _)| taker.clone())
                {
                    retired.id = taker;
                }
                retired
            })
            .partition(|retired| wanted.contains_key(&retired.id));
        self.retired = keep;
        for retired in stop {
            retired.running.stop().await;
        }
        self.refused.retain(|id, _| wanted.contains_key(id));
        // Those to start, in order, and what each takes over: started at
        // most STARTING_AT_ONCE at a time (a broker that never answers
        // holds its own start, for SUBSCRIBE_WITHIN, not all the others).
        let mut to_start = Vec::new();
        let mut starting = HashMap::new();
        for (id, subscription) in wanted {
            let feed = Feed::of(&subscription);
            let routes = Arc::new(subscription.routes.clone());
            // A dead-letter topic its broker never takes (set by this
            // reload, or the broker now serving refuses it) refuses the
            // subscription, as at its start: what runs stops, and it is
            // tried again at each reload. Asked before anything of the
            // new settings applies: the subscription it replaces (its
            // metadata changed) or takes over keeps its routes and its
            // valid dead-letter topic until it is stopped, rather than
            // dead-letter what it holds to the refused topic (each such
            // event refused and handed back).
            if let Err(refused) = TopicDelivery::check_dead_letter_topic(
                &self.runtime,
                &subscription.pubsub_name,
                &subscription.topic,
                subscription.dead_letter_topic.as_deref(),
            ) {
                let taken_over = taken.remove(&id).unwrap_or_default();
                let booked = Starting {
                    subscription,
                    taken_over,
                };
                self.started(id, booked, Err(refused.to_string())).await;
                continue;
            }
            if let Some(running) = self.running.get(&id) {
                if running.task.is_finished() {
                    tracing::warn!(subscription = %id, pubsub = %running.feed.pubsub_name, topic = %running.feed.topic, "App subscription's delivery ended; starting it again.");
                } else if running.feed == feed {
                    if **running.routes.borrow() != *routes {
                        tracing::info!(subscription = %id, "App subscription's routes changed.");
                        running.routes.send_replace(routes);
                    }
                    if *running.dead_letter_topic.borrow() != subscription.dead_letter_topic {
                        tracing::info!(subscription = %id, "App subscription's dead-letter topic changed.");
                        running
                            .dead_letter_topic
                            .send_replace(subscription.dead_letter_topic.clone());
                    }
                    // Runs already (not expected: one per pub/sub and
                    // topic ran): what it takes over retires for it.
                    let (routes, dead_letter) = (
                        running.routes.borrow().clone(),
                        subscription.dead_letter_topic.clone(),
                    );
                    for (_, old) in taken.remove(&id).unwrap_or_default() {
                        old.route_as(&routes, &dead_letter);
                        self.retire(&id, old).await;
                    }
                    continue;
                }
            }
            let taken_over = taken.remove(&id).unwrap_or_default();
            if !taken_over.is_empty() || self.running.contains_key(&id) {
                // A hand-over: its lineage claims each event from the
                // new subscription's first on.
                self.lineage(&feed).remember(true);
            }
            // What it replaces in its lineage (same pub/sub and topic)
            // or takes over goes by its routes before it subscribes: an
            // event the old routes leave aside is the new one's to send.
            let replaced = self.running.get(&id);
            let same_lineage = replaced.filter(|r| r.feed.lineage_key() == feed.lineage_key());
            for old in same_lineage
                .into_iter()
                .chain(taken_over.iter().map(|(_, old)| old))
            {
                old.route_as(&routes, &subscription.dead_letter_topic);
            }
            let prepared = self.prepare(&subscription, routes);
            to_start.push((id.clone(), prepared));
            starting.insert(
                id,
                Starting {
                    subscription,
                    taken_over,
                },
            );
        }
        if !self.start_all(to_start, starting).await {
            return;
        }
        // What retired for one taken over now goes on by the taker's
        // routes (not by those the reload removed).
        for retired in self.retired.iter().filter(|r| takers.contains(&r.id)) {
            if let Some(taker) = self.running.get(&retired.id) {
                let routes = taker.routes.borrow().clone();
                let dead_letter_topic = taker.dead_letter_topic.borrow().clone();
                retired.running.route_as(&routes, &dead_letter_topic);
            }
        }
    }

    /// Retires `replaced` for the running subscription `id`: it delivers
    /// what its broker holds for it until it reaches events a later one of
    /// its lineage delivered (or within the drain bounds), then ends. One
    /// whose delivery already ended just stops.
    async fn retire(&mut self, id: &str, replaced: Running) {
        if replaced.task.is_finished() {
            replaced.stop().await;
            return;
        }
        self.lineage(&replaced.feed).remember(true);
        replaced.retire.send_replace(true);
        self.retired.push(Retired {
            id: id.to_string(),
            running: replaced,
        });
    }

    /// The lineage of `feed`'s pub/sub and topic.
    fn lineage(&mut self, feed: &Feed) -> Arc<Lineage> {
        self.lineages.entry(feed.lineage_key()).or_default().clone()
    }

    /// Starts each of `to_start` (in order, at most [`STARTING_AT_ONCE`]
    /// at a time, each in a task of its own) and books each as it ends
    /// ([`Self::started`]), `starting` holding what each takes over.
    /// `false` when shutdown came first: the starts still running are
    /// abandoned (their delivery stops with the shutdown), what they were
    /// taking over is stopped with the retired ones
    /// ([`Self::stop_with_the_retired`]), and nothing more of the pass is
    /// done.
    async fn start_all(
        &mut self,
        to_start: Vec<(String, Prepared)>,
        mut starting: HashMap<String, Starting>,
    ) -> bool {
        let mut queue = to_start.into_iter();
        let mut tasks = JoinSet::new();
        loop {
            while tasks.len() < STARTING_AT_ONCE {
                let Some((id, prepared)) = queue.next() else {
                    break;
                };
                let runtime = self.runtime.clone();
                tasks.spawn(async move { (id, prepared.start(&runtime).await) });
            }
            let joined = tokio::select! {
                () = self.shutdown.cancelled() => None,
                joined = tasks.join_next() => Some(joined),
            };
            let Some(joined) = joined else {
                self.stop_with_the_retired(starting);
                return false;
            };
            let Some(joined) = joined else {
                break;
            };
            match joined {
                Ok((id, started)) => {
                    if let Some(booked) = starting.remove(&id) {
                        self.started(id, booked, started).await;
                        self.tell_subscribed();
                    }
                }
                // Booked below, as refused.
                Err(err) => {
                    tracing::error!(error = %err, "Starting an app subscription failed.");
                }
            }
        }
        for (id, booked) in starting {
            let failed = Err("its start failed".to_string());
            self.started(id, booked, failed).await;
        }
        true
    }

    /// What the abandoned starts `starting` were taking over, among the
    /// retired: stopped, and waited for (within [`STOP_WAIT`]), when the
    /// shutdown stops those, so no delivery of theirs still reaches the
    /// app, or acknowledges to a broker already closed, once
    /// [`Self::follow`] returned.
    fn stop_with_the_retired(&mut self, starting: HashMap<String, Starting>) {
        for (id, booked) in starting {
            for (_, running) in booked.taken_over {
                self.retired.push(Retired {
                    id: id.clone(),
                    running,
                });
            }
        }
    }

    /// Books how the start of `id` went: running (what it replaces or
    /// takes over retires), or refused (tried again at each reload and
    /// every [`RETRY_EVERY`]; what ran for it stops).
    async fn started(&mut self, id: String, booked: Starting, started: Result<Running, String>) {
        let Starting {
            subscription,
            taken_over,
        } = booked;
        match started {
            Ok(started) => {
                tracing::info!(subscription = %id, pubsub = %subscription.pubsub_name, topic = %subscription.topic, "App subscribed.");
                self.refused.remove(&id);
                // It runs: what it replaces delivers what it holds,
                // then ends.
                if let Some(replaced) = self.running.insert(id.clone(), started) {
                    self.retire(&id, replaced).await;
                }
                for (_, old) in taken_over {
                    self.retire(&id, old).await;
                }
            }
            Err(err) => {
                if self.refused.get(&id) != Some(&err) {
                    tracing::warn!(subscription = %id, pubsub = %subscription.pubsub_name, topic = %subscription.topic, error = %err, "App subscription refused; tried again at each reload.");
                }
                // What ran for the old settings stops: it is not wanted.
                if let Some(replaced) = self.running.remove(&id) {
                    replaced.stop().await;
                }
                for (old_id, old) in taken_over {
                    tracing::info!(subscription = %old_id, pubsub = %old.feed.pubsub_name, topic = %old.feed.topic, "App subscription stopped.");
                    old.stop().await;
                }
                self.refused.insert(id, err);
            }
        }
    }

    /// What starting `subscription` needs, made here (its lineage is
    /// this one's): the start itself runs apart ([`Prepared::start`]).
    fn prepare(
        &mut self,
        subscription: &AppSubscription,
        routes: Arc<SubscriptionRoutes>,
    ) -> Prepared {
        let (routes_tx, routes_rx) = watch::channel(routes);
        let sink = Arc::new(RoutedSink {
            app: self.app.clone(),
            routes: routes_rx,
        });
        let (dead_letter_tx, dead_letter_rx) =
            watch::channel(subscription.dead_letter_topic.clone());
        let (retire_tx, retire) = Retire::channel();
        let feed = Feed::of(subscription);
        let delivery = TopicDelivery {
            pubsub_name: subscription.pubsub_name.clone(),
            topic: subscription.topic.clone(),
            dead_letter_topic: dead_letter_rx,
            retire,
            delivered: self.lineage(&feed).member(),
        };
        Prepared {
            feed,
            delivery,
            sink,
            metadata: subscription.metadata.clone().into_iter().collect(),
            routes: routes_tx,
            dead_letter_topic: dead_letter_tx,
            retire: retire_tx,
            stop: self.shutdown.child_token(),
            ended: self.ended.clone(),
        }
    }
}

/// How many subscriptions start at once, at most: each start may wait
/// for its broker up to `SUBSCRIBE_WITHIN` (40 s), so one after another,
/// k brokers that never answer held every other start, and every other
/// change, k × 40 s.
const STARTING_AT_ONCE: usize = 8;

/// A subscription being started: what it takes over (retired once it
/// runs, stopped if it is refused).
struct Starting {
    subscription: AppSubscription,
    taken_over: Vec<(String, Running)>,
}

/// What starting one subscription needs ([`Deliveries::prepare`]).
struct Prepared {
    feed: Feed,
    delivery: TopicDelivery,
    sink: Arc<RoutedSink>,
    metadata: HashMap<String, String>,
    routes: watch::Sender<Arc<SubscriptionRoutes>>,
    dead_letter_topic: watch::Sender<Option<String>>,
    retire: watch::Sender<bool>,
    stop: CancellationToken,
    ended: Arc<Notify>,
}

impl Prepared {
    /// Subscribes with the broker (bounded by `SUBSCRIBE_WITHIN`), then
    /// delivers in the background: the running subscription, or why not.
    async fn start(self, runtime: &Runtime) -> Result<Running, String> {
        let delivering = self
            .delivery
            .start(runtime, self.sink, self.metadata, self.stop.clone())
            .await
            .map_err(|err| err.to_string())?;
        let ended = self.ended;
        let task = tokio::spawn(async move {
            let _ = delivering.await;
            ended.notify_one();
        });
        Ok(Running {
            feed: self.feed,
            routes: self.routes,
            dead_letter_topic: self.dead_letter_topic,
            retire: self.retire,
            stop: self.stop,
            task,
        })
    }
}

/// The id of the declared subscription `name`, never one of the app's
/// own or given ids (`app#N`, `given#N`, which all have a `#`): the name
/// itself when it has no `#`, else `declared#NAME`. One id per name: a
/// declared `app#0` no longer replaces (and silently drops) the app's own.
fn declared_id(name: String) -> String {
    if name.contains('#') {
        format!("declared#{name}")
    } else {
        name
    }
}

/// What runs of `fixed` (the app's own and those given in code, in
/// order) and `declared` (by name, each given its id by [`declared_id`]):
/// one subscription per pub/sub and topic, chosen as Dapr does (its
/// component store's `ListSubscriptionsAppByPubSub`): among declared ones
/// the first, and the app's own over those, the last of them listed. Also
/// the others, each with the id of the one that runs instead.
pub(super) fn one_per_topic(
    fixed: &[(String, AppSubscription)],
    declared: Vec<(String, AppSubscription)>,
) -> (
    BTreeMap<String, AppSubscription>,
    BTreeMap<String, (String, AppSubscription)>,
) {
    let mut chosen: HashMap<(String, String), String> = HashMap::new();
    let mut all: BTreeMap<String, AppSubscription> = BTreeMap::new();
    for (name, subscription) in declared {
        let id = declared_id(name);
        let topic = (subscription.pubsub_name.clone(), subscription.topic.clone());
        chosen.entry(topic).or_insert_with(|| id.clone());
        all.insert(id, subscription);
    }
    for (id, subscription) in fixed.iter().cloned() {
        let topic = (subscription.pubsub_name.clone(), subscription.topic.clone());
        chosen.insert(topic, id.clone());
        all.insert(id, subscription);
    }
    let mut wanted = BTreeMap::new();
    let mut shadowed = BTreeMap::new();
    for (id, subscription) in all {
        let topic = (subscription.pubsub_name.clone(), subscription.topic.clone());
        match chosen.get(&topic) {
            Some(winner) if *winner != id => {
                shadowed.insert(id, (winner.clone(), subscription));
            }
            _ => {
                wanted.insert(id, subscription);
            }
        }
    }
    (wanted, shadowed)
}

#[cfg(test)]
mod tests;
