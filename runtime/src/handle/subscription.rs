//! Subscriptions through a [`ConfigStoreHandle`] that follow the store
//! across reloads.
//!
//! A subscription made on a store instance ends with that instance. One
//! made through the handle is forwarded by a task that, whenever a new
//! generation replaces the store, subscribes to the new instance and sends
//! the keys whose values differ from the last ones delivered — so the
//! subscriber sees every change, whichever instance made it. Each call
//! into a rebuilt store is bounded by [`STORE_CALL`]: one that does not
//! answer (a store electing a leader, a slow handshake) is tried again
//! with a backoff ([`Retry`]) until it answers, the store is replaced or
//! removed, or the subscriber leaves — a subscribe, or the read of the
//! differences to deliver (nothing is dropped for being slow). One that
//! fails is handled as before: a refused subscribe ends the subscription,
//! a failed read leaves the values known.

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ConfigStoreHandle;
use crate::kinds::{
    ConfigChange, ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription,
};

/// How many undelivered changes a handle subscription buffers.
const BUFFER: usize = 256;

/// How long the forwarder waits for one call into a rebuilt store
/// (subscribe, read): the bound the watches use for their store calls.
const STORE_CALL: Duration = crate::store_call::STORE_CALL_BOUND;

/// `call`, or `None` if it does not answer within [`STORE_CALL`] (it is
/// then abandoned).
async fn bounded<T>(
    call: impl Future<Output = Result<T, ConfigError>>,
) -> Option<Result<T, ConfigError>> {
    tokio::time::timeout(STORE_CALL, call).await.ok()
}

/// The wait before the first retry of a call that did not answer (doubled
/// after each, up to [`MAX_RETRY_WAIT`]).
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a call.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// The next try of a call into a rebuilt store that did not answer.
struct Retry {
    step: Step,
    /// When it is due.
    at: Instant,
    /// The wait after it, if it does not answer either.
    wait: Duration,
}

/// What is to be tried again.
enum Step {
    /// Subscribing to this instance (the one serving).
    Subscribe(Arc<dyn ConfigStore>),
    /// Reading the instance subscribed to, to deliver its differences.
    CatchUp,
}

impl Retry {
    /// The first retry of `step`, which just did not answer.
    fn first(step: Step) -> Self {
        Self {
            step,
            at: Instant::now() + FIRST_RETRY_WAIT,
            wait: (FIRST_RETRY_WAIT * 2).min(MAX_RETRY_WAIT),
        }
    }

    /// The retry after this one, which did not answer either.
    fn next(self, step: Step) -> Self {
        Self {
            step,
            at: Instant::now() + self.wait,
            wait: (self.wait * 2).min(MAX_RETRY_WAIT),
        }
    }
}

type ItemId = (Option<String>, Option<String>, String);

/// An item's group and label.
type Scope = (Option<String>, Option<String>);

fn id_of(item: &ConfigItem) -> ItemId {
    (item.group.clone(), item.label.clone(), item.key.clone())
}

fn same_instance(a: &Arc<dyn ConfigStore>, b: &Arc<dyn ConfigStore>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl ConfigStoreHandle {
    /// Subscribes to `query` through the handle: unlike a subscription on
    /// a loaded instance, it keeps delivering after the store is rebuilt by
    /// a reload. It ends when the store is removed or the runtime stops.
    ///
    /// Each call into the store is bounded by [`STORE_CALL`]: a subscribe
    /// that does not answer fails with [`ConfigError::Timeout`] (saying the
    /// call and the bound; the caller names the store, as it does for the
    /// store's own errors); a read that does not answer leaves what the
    /// subscriber knows unknown, as a failed one.
    pub async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let live = self
            .0
            .live()
            .cloned()
            .ok_or_else(|| ConfigError::Backend("handle not injected".into()))?;
        // Taken before the store is loaded: a generation published from
        // here on is seen by the forwarder, which then follows it.
        let published = live.changes();
        let store = self
            .load()
            .map_err(|e| ConfigError::Backend(e.to_string()))?;
        // Bounded as the forwarder's calls are: a hung store fails the
        // subscribe instead of holding its caller (and what the caller
        // booked for it) until the client leaves.
        let inner = match bounded(store.subscribe(query.clone())).await {
            Some(answer) => answer.map_err(own_timeout_only)?,
            None => return Err(unanswered("subscribe")),
        };
        // Unreadable now: what the subscriber knows is unknown (not
        // "nothing"), so a rebuild is not compared with it.
        let digests = Digests::new();
        let last = match bounded(snapshot(&store, &query)).await {
            Some(Ok(now)) => Some(digests.known(&now)),
            Some(Err(err)) => {
                tracing::warn!(error = %err, "Reading a config store to subscribe failed; a rebuild before it is read again delivers no differences.");
                None
            }
            None => {
                let err = unanswered("read");
                tracing::warn!(store = %self.named(), error = %err, "Reading a config store to subscribe did not answer in time; a rebuild before it is read again delivers no differences.");
                None
            }
        };
        let (sender, changes) = mpsc::channel(BUFFER);
        let id = inner.id.clone();
        let forwarder = Forwarder {
            handle: self.clone(),
            query,
            store,
            inner: Some(inner),
            digests,
            last,
            caught_up: BTreeMap::new(),
            retry: None,
            sender,
        };
        tokio::spawn(forwarder.run(published));
        Ok(ConfigSubscription { id, changes })
    }

    /// This handle's store, as logs name it.
    fn named(&self) -> String {
        self.key()
            .map_or_else(|| "?".to_string(), ToString::to_string)
    }
}

/// `Timeout` means the handle's own bound ran out (its callers ask
/// again); a store answering `Timeout` itself is a backend error, so a
/// store that fails fast with it is not asked again at once, for ever.
fn own_timeout_only(err: ConfigError) -> ConfigError {
    match err {
        ConfigError::Timeout(message) => ConfigError::Backend(message),
        other => other,
    }
}

/// The error of a `call` into a store that did not answer within
/// [`STORE_CALL`]: the call and the bound, not the store (its callers name
/// it, as they do for the store's own errors).
fn unanswered(call: &str) -> ConfigError {
    ConfigError::Timeout(format!(
        "{call} did not answer within {STORE_CALL:?} (the runtime's bound on a store call)"
    ))
}

/// Items by identity, whole (value, version, metadata).
type Items = BTreeMap<ItemId, ConfigItem>;

/// What a subscriber knows of items, by identity: a digest each, not the
/// values (thousands of subscriptions to a store of large values would
/// otherwise each hold a copy of it).
type Known = BTreeMap<ItemId, Seen>;

/// An item's value as a subscriber knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// The value's digest.
    digest: u128,
    /// Whether the value is empty (a deletion).
    empty: bool,
}

/// The digests of one subscription: 128 bits from two SipHash states
/// whose keys are secret (seeded from the OS's random source, as a
/// `HashMap`'s), so no value can be chosen to collide with another.
struct Digests(RandomState, RandomState);

impl Digests {
    fn new() -> Self {
        Self(RandomState::new(), RandomState::new())
    }

    /// The digest of `parts`, in order.
    fn of(&self, parts: &[&str]) -> u128 {
        (u128::from(self.0.hash_one(parts)) << 64) | u128::from(self.1.hash_one(parts))
    }

    /// How `item`'s value is known.
    fn seen(&self, item: &ConfigItem) -> Seen {
        Seen {
            digest: self.of(&[&item.value]),
            empty: item.value.is_empty(),
        }
    }

    /// How `items` are known.
    fn known(&self, items: &Items) -> Known {
        items
            .iter()
            .map(|(id, item)| (id.clone(), self.seen(item)))
            .collect()
    }

    /// The digest of `item`'s write: its version and value.
    fn write(&self, item: &ConfigItem) -> u128 {
        self.of(&[&item.version, &item.value])
    }
}

async fn snapshot(store: &Arc<dyn ConfigStore>, query: &ConfigQuery) -> Result<Items, ConfigError> {
    let items = store.get(query).await?;
    Ok(items.into_iter().map(|i| (id_of(&i), i)).collect())
}

struct Forwarder {
    handle: ConfigStoreHandle,
    query: ConfigQuery,
    store: Arc<dyn ConfigStore>,
    inner: Option<ConfigSubscription>,
    /// How this subscription digests values.
    digests: Digests,
    /// What the subscriber knows: the items last read or delivered; `None`
    /// while unknown (the store could not be read when subscribing).
    last: Option<Known>,
    /// The writes of the last catch-up that carry a version: the new
    /// instance's subscription may report the same write again (made
    /// between its subscribe and its read), which is not delivered twice.
    caught_up: BTreeMap<ItemId, u128>,
    /// A call into the store serving that did not answer, to try again.
    retry: Option<Retry>,
    sender: mpsc::Sender<ConfigChange>,
}

impl Forwarder {
    async fn run(mut self, mut published: tokio::sync::watch::Receiver<u64>) {
        loop {
            tokio::select! {
                change = next_change(&mut self.inner) => match change {
                    Some(mut change) => {
                        change.items.retain(|item| !self.repeats_catch_up(item));
                        if change.items.is_empty() {
                            continue;
                        }
                        if let Some(last) = &mut self.last {
                            for item in &change.items {
                                last.insert(id_of(item), self.digests.seen(item));
                            }
                        }
                        if !self.deliver(change) {
                            return;
                        }
                    }
                    // The instance closed its side. Replaced by a reload:
                    // move to its successor (now, or at its publish).
                    // Still the current one: it dropped this subscription
                    // (a slow reader) — end it too.
                    None => {
                        self.inner = None;
                        let current = self.handle.load();
                        let resubscribing = matches!(&self.retry, Some(Retry { step: Step::Subscribe(_), .. }));
                        if !resubscribing && current.is_ok_and(|c| same_instance(&c, &self.store)) {
                            tracing::warn!("Configuration subscription ended by its store (the subscriber fell behind).");
                            return;
                        }
                        if !self.follow().await {
                            return;
                        }
                    }
                },
                changed = published.changed() => {
                    if changed.is_err() || !self.follow().await {
                        return;
                    }
                }
                () = sleep_until(self.retry.as_ref().map(|r| r.at)) => {
                    if !self.try_again().await {
                        return;
                    }
                }
                () = self.sender.closed() => return,
            }
        }
    }

    /// Whether `item` is a write the last catch-up already delivered (same
    /// identity, value and non-empty version).
    fn repeats_catch_up(&mut self, item: &ConfigItem) -> bool {
        let id = id_of(item);
        let repeats = !item.version.is_empty()
            && self
                .caught_up
                .get(&id)
                .is_some_and(|&sent| sent == self.digests.write(item));
        if repeats {
            self.caught_up.remove(&id);
        }
        repeats
    }

    /// The instance being moved to: the one a subscribe is tried again
    /// on, else the one subscribed to.
    fn target(&self) -> &Arc<dyn ConfigStore> {
        match &self.retry {
            Some(Retry {
                step: Step::Subscribe(store),
                ..
            }) => store,
            _ => &self.store,
        }
    }

    /// After a publish: moves to the new instance if the store was
    /// replaced. Returns false when the subscription should end.
    async fn follow(&mut self) -> bool {
        let Ok(current) = self.handle.load() else {
            return false;
        };
        if same_instance(&current, self.target()) {
            return true;
        }
        // A retry pending was on a replaced instance: the new one is
        // compared with what the subscriber knows, as if it was not there.
        self.retry = None;
        self.subscribe_to(current, None).await
    }

    /// The retry due: tried on the instance serving (a new one is started
    /// on afresh). Returns false when the subscription should end.
    async fn try_again(&mut self) -> bool {
        let Some(retry) = self.retry.take() else {
            return true;
        };
        match &retry.step {
            Step::Subscribe(store) => {
                let Ok(current) = self.handle.load() else {
                    return false;
                };
                if same_instance(&current, store) {
                    self.subscribe_to(current, Some(retry)).await
                } else {
                    self.subscribe_to(current, None).await
                }
            }
            Step::CatchUp => self.read_rebuilt(Some(retry)).await,
        }
    }

    /// Subscribes to `current` and delivers its differences; a subscribe
    /// that does not answer is tried again after `retried` (the try that
    /// did not answer before, if any). False when the subscription ends.
    async fn subscribe_to(
        &mut self,
        current: Arc<dyn ConfigStore>,
        retried: Option<Retry>,
    ) -> bool {
        let inner = match bounded(current.subscribe(self.query.clone())).await {
            Some(Ok(inner)) => inner,
            Some(Err(err)) => {
                tracing::warn!(error = %err, "Re-subscribing to a rebuilt config store failed; subscription ended.");
                return false;
            }
            None => {
                // The old instance's subscription, if still open, is read
                // meanwhile: what it reports is delivered.
                self.retry = Some(match retried {
                    None => {
                        tracing::warn!(timeout = ?STORE_CALL, "Re-subscribing to a rebuilt config store did not answer in time; tried again until it does.");
                        Retry::first(Step::Subscribe(current))
                    }
                    Some(retry) => retry.next(Step::Subscribe(current)),
                });
                return true;
            }
        };
        if retried.is_some() {
            tracing::info!("Re-subscribed to a rebuilt config store that was slow to answer.");
        }
        self.store = current;
        self.inner = Some(inner);
        self.caught_up.clear();
        self.read_rebuilt(None).await
    }

    /// Reads the instance subscribed to and delivers its differences from
    /// what the subscriber knows; a read that does not answer is tried
    /// again after `retried` (until then, the values known stay as they
    /// are and changes are delivered as they come). False when the
    /// subscription ends.
    async fn read_rebuilt(&mut self, retried: Option<Retry>) -> bool {
        let store = Arc::clone(&self.store);
        let now = match bounded(snapshot(&store, &self.query)).await {
            Some(Ok(now)) => now,
            Some(Err(err)) => {
                // Not "every key deleted": the values last delivered stay
                // what the subscriber knows; changes made on the new
                // instance are delivered as they come.
                tracing::warn!(error = %err, "Reading a rebuilt config store failed; its differences from the old one are not delivered.");
                return true;
            }
            None => {
                self.read_again(retried);
                return true;
            }
        };
        let Some(last) = self.last.take() else {
            // What the subscriber knows is unknown: nothing to compare
            // with; the new instance's items are the record from here.
            self.last = Some(self.digests.known(&now));
            return true;
        };
        let (items, record, unanswered) =
            catch_up(&store, &self.query, &self.digests, &last, now).await;
        self.last = Some(record);
        // Cleared at the subscribe: a catch-up tried again adds to it.
        self.caught_up.extend(
            items
                .iter()
                .filter(|item| !item.version.is_empty())
                .map(|item| (id_of(item), self.digests.write(item))),
        );
        if unanswered {
            // What was read is delivered; the items not read stay known,
            // so the next try reads them again.
            self.read_again(retried);
        } else if retried.is_some() {
            tracing::info!(
                "A rebuilt config store slow to answer was read; its differences are delivered."
            );
        }
        items.is_empty() || self.deliver(ConfigChange { items })
    }

    /// Schedules another read of the instance subscribed to, after
    /// `retried` (logged at the first).
    fn read_again(&mut self, retried: Option<Retry>) {
        self.retry = Some(match retried {
            None => {
                tracing::warn!(timeout = ?STORE_CALL, "Reading a rebuilt config store did not answer in time; its differences from the old one are delivered once it does (tried again).");
                Retry::first(Step::CatchUp)
            }
            Some(retry) => retry.next(Step::CatchUp),
        });
    }

    /// Hands `change` to the subscriber without waiting: a subscriber that
    /// stopped reading (its buffer is full) is dropped, so it cannot make
    /// memory grow or hold up the store. False when the subscription ends.
    fn deliver(&self, change: ConfigChange) -> bool {
        match self.sender.try_send(change) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    buffer = BUFFER,
                    "Configuration subscriber dropped: it stopped reading."
                );
                false
            }
        }
    }
}

/// What differs between `last` (what the subscriber knows) and `now` (the
/// new instance's items for the query), as the items to deliver (whole, as
/// the store reads them; a deletion has an empty value), and the new
/// record of what the subscriber knows.
///
/// A store's get may see fewer items than its subscription reports (the
/// memory and etcd stores read only the default group and label when keys
/// are named, while a subscription reports every group's and label's
/// changes of them): an item known but missing from `now` is read again by
/// its own group and label before it is reported deleted, and one that
/// cannot be read is left as known. The first of these reads that does not
/// answer ends the catch-up (the groups after it are not read, each waited
/// for in turn): its items and those of the groups not read are left as
/// known, and the last value tells that the read is to be tried again.
async fn catch_up(
    store: &Arc<dyn ConfigStore>,
    query: &ConfigQuery,
    digests: &Digests,
    last: &Known,
    now: Items,
) -> (Vec<ConfigItem>, Known, bool) {
    let mut unanswered = false;
    let mut items: Vec<ConfigItem> = now
        .iter()
        .filter(|(id, item)| last.get(*id) != Some(&digests.seen(item)))
        .map(|(_, item)| item.clone())
        .collect();
    let mut record = digests.known(&now);
    drop(now);
    // Known (and not already reported deleted) but not read: by scope.
    let mut missing: BTreeMap<Scope, Vec<(&ItemId, Seen)>> = BTreeMap::new();
    for (id, &known) in last {
        if !known.empty && !record.contains_key(id) {
            missing
                .entry((id.0.clone(), id.1.clone()))
                .or_default()
                .push((id, known));
        }
    }
    let mut groups = missing.into_iter();
    while let Some(((group, label), known)) = groups.next() {
        let exact = ConfigQuery {
            keys: known.iter().map(|(id, _)| id.2.clone()).collect(),
            group: group.clone(),
            label: label.clone(),
            metadata: query.metadata.clone(),
        };
        let found = match bounded(store.get(&exact)).await {
            Some(Ok(found)) => found,
            Some(Err(err)) => {
                tracing::warn!(error = %err, "Reading a rebuilt config store's grouped or labelled items failed; their differences are not delivered.");
                record.extend(known.into_iter().map(|(id, seen)| (id.clone(), seen)));
                continue;
            }
            None => {
                // The first read that does not answer ends this try: the
                // groups not read yet are not waited on one after another
                // (each up to STORE_CALL, the new subscription unread
                // meanwhile); this one and those stay known, read again
                // at the next try.
                unanswered = true;
                let rest = std::iter::once(known).chain(groups.map(|(_, known)| known));
                record.extend(rest.flatten().map(|(id, seen)| (id.clone(), seen)));
                break;
            }
        };
        let found: Items = found
            .into_iter()
            .filter(|item| item.group == group && item.label == label)
            .map(|item| (id_of(&item), item))
            .collect();
        for (id, seen) in known {
            match found.get(id) {
                Some(read) => {
                    let read_seen = digests.seen(read);
                    if read_seen != seen {
                        items.push(read.clone());
                    }
                    record.insert(id.clone(), read_seen);
                }
                None => items.push(deletion_of(id)),
            }
        }
    }
    (items, record, unanswered)
}

/// The deletion of the item `id`: its identity with an empty value.
fn deletion_of(id: &ItemId) -> ConfigItem {
    ConfigItem {
        key: id.2.clone(),
        group: id.0.clone(),
        label: id.1.clone(),
        ..ConfigItem::default()
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_change(inner: &mut Option<ConfigSubscription>) -> Option<ConfigChange> {
    match inner {
        Some(subscription) => subscription.changes.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::component::{Component, ComponentKey, Kind};
    use crate::handle::{Generation, Instance, Live, LiveGeneration};
    use crate::kinds::SubscriptionHub;

    /// A config store serving `items`; the calls it is told to hang answer
    /// only at `answers_at` (never, if `None`).
    #[derive(Default)]
    struct TestStore {
        items: Vec<ConfigItem>,
        answers_at: Option<Instant>,
        hang_subscribe: bool,
        /// Answers every subscribe at once with `ConfigError::Timeout`.
        times_out_itself: bool,
        hang_get: bool,
        hang_grouped_get: bool,
        subscribed: AtomicUsize,
        /// The group of each grouped read, in order.
        grouped_gets: std::sync::Mutex<Vec<String>>,
        hub: SubscriptionHub,
    }

    #[async_trait]
    impl Component for TestStore {}

    #[async_trait]
    impl ConfigStore for TestStore {
        async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
            if let Some(group) = &query.group {
                self.grouped_gets.lock().unwrap().push(group.clone());
            }
            if self.hang_get || (self.hang_grouped_get && query.group.is_some()) {
                self.hang().await;
            }
            Ok(self.items.clone())
        }

        async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
            if self.hang_subscribe {
                self.hang().await;
            }
            if self.times_out_itself {
                return Err(ConfigError::Timeout("my client timed out".into()));
            }
            self.subscribed.fetch_add(1, Ordering::SeqCst);
            Ok(self.hub.subscribe(query))
        }
    }

    impl TestStore {
        async fn hang(&self) {
            match self.answers_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }

    fn item(value: &str, group: Option<&str>) -> ConfigItem {
        ConfigItem {
            key: "k".into(),
            value: value.into(),
            group: group.map(Into::into),
            ..ConfigItem::default()
        }
    }

    fn publish(live: &LiveGeneration, number: u64, store: &Arc<TestStore>) {
        let store: Arc<dyn ConfigStore> = store.clone();
        let key = ComponentKey::new(Kind::ConfigStore, "cfg");
        let instances = BTreeMap::from([(key, Instance::ConfigStore(store))]);
        live.publish(Generation::new(number, instances));
    }

    /// A subscription to `k` through the handle, made on `first`.
    async fn subscribed(first: TestStore) -> (LiveGeneration, ConfigSubscription) {
        let live = Live::new();
        publish(&live, 1, &Arc::new(first));
        let handle =
            ConfigStoreHandle::new(ComponentKey::new(Kind::ConfigStore, "cfg"), live.clone());
        let subscription = handle.subscribe(ConfigQuery::keys(["k"])).await;
        (live, subscription.expect("subscribed"))
    }

    /// Publishes `rebuilt`, waits until the forwarder subscribed to it,
    /// then writes `k` = "2" on it: the subscriber hears of it.
    async fn a_write_on_the_rebuilt_store_is_delivered(first: TestStore, rebuilt: TestStore) {
        let (live, mut subscription) = subscribed(first).await;
        let rebuilt = Arc::new(rebuilt);
        publish(&live, 2, &rebuilt);
        while rebuilt.subscribed.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rebuilt.hub.publish(&[item("2", None)]);
        let change = tokio::time::timeout(Duration::from_secs(60), subscription.changes.recv())
            .await
            .expect("the forwarder is stuck on the rebuilt store");
        let values: Vec<String> = change
            .into_iter()
            .flat_map(|c| c.items)
            .map(|i| i.value)
            .collect();
        assert_eq!(values, ["2"]);
    }

    /// A handle to `cfg`, published in a runtime of its own as `store`.
    fn handle_to(store: &Arc<TestStore>) -> ConfigStoreHandle {
        let live = Live::new();
        publish(&live, 1, store);
        ConfigStoreHandle::new(ComponentKey::new(Kind::ConfigStore, "cfg"), live)
    }

    /// A hung first subscribe fails in time as a timeout (failed before:
    /// `Backend`, which the sidecar answers `INTERNAL`), saying the call and
    /// the bound but not the store, which every caller names already.
    #[tokio::test(start_paused = true)]
    async fn a_first_subscribe_that_hangs_fails_in_time_as_a_timeout() {
        let handle = handle_to(&Arc::new(TestStore {
            hang_subscribe: true,
            ..TestStore::default()
        }));
        let subscribing = handle.subscribe(ConfigQuery::keys(["k"]));
        let answer = tokio::time::timeout(Duration::from_secs(60), subscribing)
            .await
            .unwrap_or_else(|_| panic!("the first subscribe is not bounded"));
        match answer {
            Ok(_) => panic!("a subscribe that never answered succeeded"),
            Err(ConfigError::Timeout(message)) => assert_eq!(
                message,
                "subscribe did not answer within 5s (the runtime's bound on a store call)"
            ),
            Err(other) => panic!("not a timeout: {other:?}"),
        }
    }

    /// `Timeout` from the handle means its own bound ran out (the overlay
    /// and watched-ref watches ask again at once); a store's own
    /// `Timeout` is a backend error, or those watches would spin on it.
    #[tokio::test]
    async fn a_stores_own_timeout_is_a_backend_error_not_the_handles() {
        let handle = handle_to(&Arc::new(TestStore {
            times_out_itself: true,
            ..TestStore::default()
        }));
        match handle.subscribe(ConfigQuery::keys(["k"])).await {
            Err(ConfigError::Backend(message)) => assert_eq!(message, "my client timed out"),
            other => panic!("not a backend error: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_read_that_hangs_still_subscribes_and_delivers() {
        let store = Arc::new(TestStore {
            items: vec![item("1", None)],
            hang_get: true,
            ..TestStore::default()
        });
        let handle = handle_to(&store);
        let subscribing = handle.subscribe(ConfigQuery::keys(["k"]));
        let mut subscription = tokio::time::timeout(Duration::from_secs(60), subscribing)
            .await
            .unwrap_or_else(|_| panic!("the first read is not bounded"))
            .unwrap_or_else(|err| panic!("subscribing failed: {err}"));
        store.hub.publish(&[item("2", None)]);
        assert_eq!(next_values(&mut subscription).await, ["2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_whose_read_hangs_does_not_stall_the_subscription() {
        let first = TestStore {
            items: vec![item("1", None)],
            ..TestStore::default()
        };
        let rebuilt = TestStore {
            hang_get: true,
            ..TestStore::default()
        };
        a_write_on_the_rebuilt_store_is_delivered(first, rebuilt).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_whose_grouped_read_hangs_does_not_stall_the_subscription() {
        // Known in group `g`, not read by the plain query: read by group.
        let first = TestStore {
            items: vec![item("1", Some("g"))],
            ..TestStore::default()
        };
        let rebuilt = TestStore {
            hang_grouped_get: true,
            ..TestStore::default()
        };
        a_write_on_the_rebuilt_store_is_delivered(first, rebuilt).await;
    }

    /// The values of the next change delivered (virtual time, bounded).
    async fn next_values(subscription: &mut ConfigSubscription) -> Vec<String> {
        let change = tokio::time::timeout(Duration::from_secs(120), subscription.changes.recv())
            .await
            .expect("no change delivered")
            .expect("the subscription ended");
        change.items.into_iter().map(|i| i.value).collect()
    }

    /// `k` = "1" before the rebuild; the rebuilt store (`k` = "2") answers
    /// the calls it hangs only 12 s after its publish, more than a call is
    /// waited for: the difference is delivered all the same, with no write.
    async fn a_slow_rebuilt_store_delivers_its_differences(
        group: Option<&str>,
        rebuilt: TestStore,
    ) -> ConfigSubscription {
        let (live, mut subscription) = subscribed(TestStore {
            items: vec![item("1", group)],
            ..TestStore::default()
        })
        .await;
        let rebuilt = TestStore {
            items: if group.is_some() {
                // A plain read does not see the grouped item: read by group.
                Vec::new()
            } else {
                vec![item("2", None)]
            },
            answers_at: Some(Instant::now() + Duration::from_secs(12)),
            ..rebuilt
        };
        let rebuilt = Arc::new(rebuilt);
        publish(&live, 2, &rebuilt);
        assert_eq!(
            next_values(&mut subscription).await,
            [if group.is_some() { "" } else { "2" }]
        );
        subscription
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_slow_to_answer_its_first_read_delivers_the_differences() {
        let rebuilt = TestStore {
            hang_get: true,
            ..TestStore::default()
        };
        a_slow_rebuilt_store_delivers_its_differences(None, rebuilt).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_slow_to_answer_a_grouped_read_delivers_the_differences() {
        // `k` in `g` is gone from the rebuilt store: reported deleted once
        // the grouped read answers (not left as known).
        let rebuilt = TestStore {
            hang_grouped_get: true,
            ..TestStore::default()
        };
        a_slow_rebuilt_store_delivers_its_differences(Some("g"), rebuilt).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_slow_to_answer_its_subscribe_is_subscribed_again() {
        let rebuilt = TestStore {
            hang_subscribe: true,
            ..TestStore::default()
        };
        let _subscription = a_slow_rebuilt_store_delivers_its_differences(None, rebuilt).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_store_whose_subscribe_hangs_keeps_the_subscription_for_the_next() {
        let (live, mut subscription) = subscribed(TestStore {
            items: vec![item("1", None)],
            ..TestStore::default()
        })
        .await;
        let hung = TestStore {
            hang_subscribe: true,
            ..TestStore::default()
        };
        publish(&live, 2, &Arc::new(hung));
        tokio::time::sleep(Duration::from_secs(60)).await;
        let next = Arc::new(TestStore {
            items: vec![item("3", None)],
            ..TestStore::default()
        });
        publish(&live, 3, &next);
        assert_eq!(next_values(&mut subscription).await, ["3"]);
        next.hub.publish(&[item("4", None)]);
        assert_eq!(next_values(&mut subscription).await, ["4"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_catch_up_waits_on_one_hanging_grouped_read_per_try_not_on_each() {
        // `k` known in `g1` and in `g2`, gone from the rebuilt store (a
        // plain read does not see them): each read by its group, both
        // hanging for 20 s after the publish.
        let (live, mut subscription) = subscribed(TestStore {
            items: vec![item("1", Some("g1")), item("1", Some("g2"))],
            ..TestStore::default()
        })
        .await;
        // Written on the rebuilt store once subscribed to, while the
        // catch-up waits on `g1`: its subscription reports it, the plain
        // read sees it (delivered once).
        let written = ConfigItem {
            version: "v2".into(),
            ..item("2", None)
        };
        let rebuilt = Arc::new(TestStore {
            items: vec![written.clone()],
            hang_grouped_get: true,
            answers_at: Some(Instant::now() + Duration::from_secs(20)),
            ..TestStore::default()
        });
        publish(&live, 2, &rebuilt);
        while rebuilt.grouped_gets.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Delivered once that one read gives up (5 s), not after `g2`'s
        // too (10 s): the new subscription is read meanwhile.
        rebuilt.hub.publish(&[written]);
        let written = Instant::now();
        assert_eq!(next_values(&mut subscription).await, ["2"]);
        assert!(
            written.elapsed() <= STORE_CALL + Duration::from_millis(100),
            "the new subscription was not read for {:?}",
            written.elapsed()
        );
        // Once the reads answer, both deletions are delivered; `g2` was
        // read only after `g1` answered: one hanging read per try.
        assert_eq!(next_values(&mut subscription).await, ["", ""]);
        let gets = rebuilt.grouped_gets.lock().unwrap().clone();
        let (last, tries) = gets.split_last().expect("read by group");
        assert_eq!(last, "g2", "{gets:?}");
        assert!(
            tries.len() >= 3 && tries.iter().all(|g| g == "g1"),
            "{gets:?}"
        );
    }
}
