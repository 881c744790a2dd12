//! [`LiveNamespaces`]: the configuration of every served namespace, where
//! it came from, and the subscribers to its changes.
//!
//! Two views are served. A query with a group reads that namespace alone;
//! its items carry the group. A query without group reads the namespaces
//! merged in the configured order — a key is taken from the first namespace
//! that has it — and its items carry no group (the namespace they came from
//! is in `metadata["namespace"]`). Each view has its own subscribers, so a
//! change hidden by an earlier namespace reaches only the subscribers of
//! that namespace's group.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use rewire_runtime::{ConfigItem, ConfigQuery, ConfigSubscription, Readiness, SubscriptionHub};

use super::client::Notification;
use super::notified::Notified;
use super::release_messages::ReleaseMessages;

/// The readiness reason while a namespace is served from the backup cache.
pub(crate) const BACKUP_REASON: &str = "serving from backup cache: config service unreachable";

/// Where a namespace's configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Nothing loaded yet.
    Pending,
    /// The config service's release.
    Server,
    /// The config service said the namespace has no release (served empty).
    NotReleased,
    /// The config service answered 404 for a namespace with a release
    /// held (deleted in the portal, or an instance that lost it): its last
    /// release is kept, as the Java client keeps it, until a release (or
    /// an instance that has the one held) answers.
    Missing,
    /// The backup cache; the config service has not answered yet.
    Backup,
}

#[derive(Debug)]
struct Namespace {
    values: BTreeMap<String, String>,
    release_key: String,
    notified: Notified,
    source: Source,
}

/// `namespace` as the config service's long poll names it: without a
/// `.properties` suffix (any case), which Apollo strips from the names it
/// is sent (`NamespaceUtil.filterNamespaceName`) and does not restore in
/// its answer.
pub(crate) fn notification_name(namespace: &str) -> &str {
    const SUFFIX: &str = ".properties";
    let cut = namespace.len().saturating_sub(SUFFIX.len());
    match namespace.get(cut..) {
        Some(tail) if cut > 0 && tail.eq_ignore_ascii_case(SUFFIX) => &namespace[..cut],
        _ => namespace,
    }
}

/// Since when, and why, something has been failing, if it is.
type Failing = Mutex<Option<(Instant, String)>>;

/// Key → (value, namespace, release key) of the merged view.
type Merged = BTreeMap<String, (String, String, String)>;

/// The served namespaces, in lookup order.
#[derive(Debug)]
pub(crate) struct LiveNamespaces {
    order: Vec<String>,
    state: Mutex<Vec<Namespace>>,
    /// The merged view, kept by [`apply`](Self::apply) (under `state`'s
    /// lock, which is taken first), so that a `get` without group reads
    /// its keys directly without merging or copying the namespaces.
    merged: Mutex<Merged>,
    /// Since when, and why, the long poll has been failing, if it is.
    poll_failing: Failing,
    /// Since when, and why, the periodic refresh has been failing, if it is.
    refresh_failing: Failing,
    /// Since when, and why, the backup cache has not been written, if so.
    backup_failing: Failing,
    merged_hub: SubscriptionHub,
    grouped_hub: SubscriptionHub,
}

/// What [`LiveNamespaces::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    /// The source before.
    pub previous: Source,
    /// Keys of the namespace whose value changed (removals included).
    pub changed: usize,
}

impl LiveNamespaces {
    /// `order` with nothing loaded.
    pub(crate) fn new(order: Vec<String>) -> Self {
        let state = order
            .iter()
            .map(|_| Namespace {
                values: BTreeMap::new(),
                release_key: String::new(),
                notified: Notified::default(),
                source: Source::Pending,
            })
            .collect();
        Self {
            order,
            state: Mutex::new(state),
            merged: Mutex::new(Merged::new()),
            poll_failing: Mutex::new(None),
            refresh_failing: Mutex::new(None),
            backup_failing: Mutex::new(None),
            merged_hub: SubscriptionHub::default(),
            grouped_hub: SubscriptionHub::default(),
        }
    }

    /// The namespaces, in lookup order.
    pub(crate) fn order(&self) -> &[String] {
        &self.order
    }

    /// Whether `namespace` is served.
    pub(crate) fn contains(&self, namespace: &str) -> bool {
        self.index(namespace).is_some()
    }

    /// Takes `values` at `release_key` from `source` for `namespace`, and
    /// publishes what changed to both views' subscribers.
    pub(crate) fn apply(
        &self,
        namespace: &str,
        values: BTreeMap<String, String>,
        release_key: &str,
        source: Source,
    ) -> Applied {
        let Some(index) = self.index(namespace) else {
            return Applied {
                previous: Source::Pending,
                changed: 0,
            };
        };
        let mut state = self.state();
        let mut merged_view = self.merged_view();
        let merged_before = std::mem::take(&mut *merged_view);
        let entry = &mut state[index];
        let previous = entry.source;
        let mut grouped = Vec::new();
        for (key, value) in &values {
            if entry.values.get(key) != Some(value) {
                grouped.push(item(key, value, Some(namespace), namespace, release_key));
            }
        }
        for key in entry.values.keys().filter(|k| !values.contains_key(*k)) {
            grouped.push(item(key, "", Some(namespace), namespace, release_key));
        }
        entry.values = values;
        entry.release_key = release_key.to_string();
        entry.source = source;
        let merged_after = self.merged(&state);
        let mut merged = Vec::new();
        for (key, (value, from, version)) in &merged_after {
            if merged_before.get(key).map(|(v, _, _)| v) != Some(value) {
                merged.push(item(key, value, None, from, version));
            }
        }
        for (key, (_, from, _)) in &merged_before {
            if !merged_after.contains_key(key) {
                merged.push(item(key, "", None, from, release_key));
            }
        }
        // Published under the lock, so subscribers see changes in order.
        if !grouped.is_empty() {
            self.grouped_hub.publish(&grouped);
        }
        if !merged.is_empty() {
            self.merged_hub.publish(&merged);
        }
        *merged_view = merged_after;
        Applied {
            previous,
            changed: grouped.len(),
        }
    }

    /// Records that the config service confirmed the release we hold.
    pub(crate) fn confirm(&self, namespace: &str) -> Source {
        let Some(index) = self.index(namespace) else {
            return Source::Pending;
        };
        let mut state = self.state();
        let previous = state[index].source;
        if matches!(previous, Source::Backup | Source::Pending | Source::Missing) {
            state[index].source = if state[index].release_key.is_empty() {
                Source::NotReleased
            } else {
                Source::Server
            };
        }
        previous
    }

    /// Records that the config service answered 404 for `namespace`
    /// while a release is held: the release stays served (see
    /// [`Source::Missing`]). Returns the source before.
    pub(crate) fn missing(&self, namespace: &str) -> Source {
        let Some(index) = self.index(namespace) else {
            return Source::Pending;
        };
        let mut state = self.state();
        std::mem::replace(&mut state[index].source, Source::Missing)
    }

    /// Where the configuration served for `namespace` came from.
    pub(crate) fn source(&self, namespace: &str) -> Source {
        match self.index(namespace) {
            Some(index) => self.state()[index].source,
            None => Source::Pending,
        }
    }

    /// The value of `key` in the release held for `namespace`, if any.
    pub(crate) fn value(&self, namespace: &str, key: &str) -> Option<String> {
        let index = self.index(namespace)?;
        self.state()[index].values.get(key).cloned()
    }

    /// The release key held for `namespace`, if any.
    pub(crate) fn release_key(&self, namespace: &str) -> Option<String> {
        let index = self.index(namespace)?;
        Some(self.state()[index].release_key.clone()).filter(|k| !k.is_empty())
    }

    /// The namespaces the config service has not answered for yet.
    pub(crate) fn unconfirmed(&self) -> Vec<String> {
        let state = self.state();
        self.order
            .iter()
            .zip(state.iter())
            .filter(|(_, ns)| matches!(ns.source, Source::Backup | Source::Pending))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The notification ids to long-poll with.
    pub(crate) fn notifications(&self) -> Vec<Notification> {
        let state = self.state();
        self.order
            .iter()
            .zip(state.iter())
            .map(|(name, ns)| Notification {
                namespace_name: notification_name(name).to_string(),
                notification_id: ns.notified.id,
                messages: None,
            })
            .collect()
    }

    /// Records the notification id of `namespace` once its release is in
    /// (or its 404 taken). Returns the id held when it was last forgotten
    /// by [`forget_notification_id`](Self::forget_notification_id), if it
    /// was since the last id: the caller compares the two.
    pub(crate) fn set_notification_id(&self, namespace: &str, id: i64) -> Option<i64> {
        let index = self.index(namespace)?;
        self.state()[index].notified.learn(id)
    }

    /// Takes in the release `messages` of a notification of `namespace`
    /// (merged into those held), to be sent with its every fetch.
    pub(crate) fn note_messages(&self, namespace: &str, messages: &ReleaseMessages) {
        if let Some(index) = self.index(namespace) {
            self.state()[index].notified.note(messages);
        }
    }

    /// The release messages to send with a fetch of `namespace`, if any.
    pub(crate) fn messages(&self, namespace: &str) -> Option<ReleaseMessages> {
        let index = self.index(namespace)?;
        Some(self.state()[index].notified.messages.clone()).filter(|m| !m.is_empty())
    }

    /// Drops the release messages of `namespace`: a config service
    /// refused a fetch carrying them (see
    /// [`Refresher`](super::refresh::Refresher)).
    pub(crate) fn drop_messages(&self, namespace: &str) {
        if let Some(index) = self.index(namespace) {
            self.state()[index].notified.drop_messages();
        }
    }

    /// Forgets the notification id of `namespace` (back to -1; its
    /// messages are kept, see [`Notified::forget`]), so that the next long poll is answered at once with the
    /// config service's current id: after a release the poll had not
    /// announced, the service's ids may be below ours (a restored
    /// database, another Apollo), and it would answer a poll only past
    /// ours — or the poll was just late (see
    /// [`set_notification_id`](Self::set_notification_id)).
    ///
    /// [`Notified::forget`]: super::notified::Notified::forget
    pub(crate) fn forget_notification_id(&self, namespace: &str) {
        if let Some(index) = self.index(namespace) {
            self.state()[index].notified.forget();
        }
    }

    /// Forgets every notification id and messages: the store moved to
    /// other config service instances.
    pub(crate) fn forget_notification_ids(&self) {
        for ns in self.state().iter_mut() {
            ns.notified.reset();
        }
    }

    /// The served namespaces a notification for `name` is about: those
    /// whose name is `name` once a `.properties` suffix is stripped from
    /// both (Apollo answers `application` for `application.properties`),
    /// exactly, or else ignoring case as Apollo does. Empty when none is.
    pub(crate) fn resolve(&self, name: &str) -> Vec<&str> {
        let wanted = notification_name(name);
        let matching = |same: &dyn Fn(&str) -> bool| -> Vec<&str> {
            self.order
                .iter()
                .map(String::as_str)
                .filter(|n| same(notification_name(n)))
                .collect()
        };
        let exact = matching(&|n| n == wanted);
        if exact.is_empty() {
            matching(&|n| n.eq_ignore_ascii_case(wanted))
        } else {
            exact
        }
    }

    /// Records that the long poll failed with `reason` (the streak's
    /// start is kept).
    pub(crate) fn poll_failed(&self, reason: &str) {
        let mut failing = self.poll_failing.lock().unwrap_or_else(|p| p.into_inner());
        let since = failing
            .as_ref()
            .map_or_else(Instant::now, |(since, _)| *since);
        *failing = Some((since, reason.to_string()));
    }

    /// Records that the long poll succeeded.
    pub(crate) fn poll_recovered(&self) {
        *self.poll_failing.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Records that the periodic refresh failed with `reason` (the
    /// streak's start is kept), or, with `None`, that it succeeded.
    pub(crate) fn refresh_failed(&self, reason: Option<&str>) {
        failing_since(&self.refresh_failing, reason);
    }

    /// Records that the backup cache could not be written, with `reason`,
    /// or, with `None`, that every release served is written.
    pub(crate) fn backup_failed(&self, reason: Option<&str>) {
        failing_since(&self.backup_failing, reason);
    }

    /// Ready unless a namespace is served from the backup cache, the long
    /// poll or the periodic refresh keeps failing (degraded: the last
    /// releases are served, new ones may not be followed), the backup
    /// cache is behind the releases served, or a namespace's release is
    /// gone from the config service (degraded: its last release is
    /// served, the others are followed as usual).
    pub(crate) fn readiness(&self) -> Readiness {
        let state = self.state();
        if state.iter().any(|ns| ns.source == Source::Backup) {
            return Readiness::Degraded(BACKUP_REASON.to_string());
        }
        if state.iter().any(|ns| ns.source == Source::Pending) {
            return Readiness::NotReady("waiting for the config service's first answer".into());
        }
        let missing: Vec<String> = self
            .order
            .iter()
            .zip(state.iter())
            .filter(|(_, ns)| ns.source == Source::Missing)
            .map(|(name, _)| format!("`{name}`"))
            .collect();
        drop(state);
        let troubles: [(&Failing, &str, &str); 3] = [
            (
                &self.poll_failing,
                "long polling failing",
                "serving the last releases, new ones are not followed",
            ),
            (
                &self.refresh_failing,
                "periodic refresh failing",
                "serving the last releases",
            ),
            (
                &self.backup_failing,
                "backup cache behind",
                "the releases are served; a start without config service would serve older ones",
            ),
        ];
        for (slot, what, meaning) in troubles {
            let failing = slot.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((since, reason)) = &*failing {
                return Readiness::Degraded(format!(
                    "{what} for {}s: {reason}; {meaning}",
                    since.elapsed().as_secs()
                ));
            }
        }
        if !missing.is_empty() {
            return Readiness::Degraded(format!(
                "namespace(s) {} answered HTTP 404 (no release at the config service: deleted, or an instance that lost it); serving their last release, the other namespaces are followed",
                missing.join(", ")
            ));
        }
        Readiness::Ready
    }

    /// The items matching `query` (group already checked to be served),
    /// in the order of its keys (every key when it names none). The
    /// requested keys are looked up directly and only the matches copied,
    /// under the lock; the items are built after it is released.
    pub(crate) fn get(&self, query: &ConfigQuery) -> Vec<ConfigItem> {
        match &query.group {
            Some(group) => {
                let Some(index) = self.index(group) else {
                    return Vec::new();
                };
                let (found, release_key) = {
                    let state = self.state();
                    let ns = &state[index];
                    (pick(&ns.values, &query.keys), ns.release_key.clone())
                };
                found
                    .into_iter()
                    .map(|(k, v)| item(&k, &v, Some(group), group, &release_key))
                    .collect()
            }
            None => {
                let found = pick(&self.merged_view(), &query.keys);
                found
                    .into_iter()
                    .map(|(k, (v, from, version))| item(&k, &v, None, &from, &version))
                    .collect()
            }
        }
    }

    /// Subscribes to the view `query` reads.
    pub(crate) fn subscribe(&self, query: ConfigQuery) -> ConfigSubscription {
        if query.group.is_some() {
            self.grouped_hub.subscribe(query)
        } else {
            self.merged_hub.subscribe(query)
        }
    }

    fn merged_view(&self) -> MutexGuard<'_, Merged> {
        self.merged.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn merged(&self, state: &[Namespace]) -> Merged {
        let mut merged = Merged::new();
        for (name, ns) in self.order.iter().zip(state.iter()) {
            for (key, value) in &ns.values {
                merged
                    .entry(key.clone())
                    .or_insert_with(|| (value.clone(), name.clone(), ns.release_key.clone()));
            }
        }
        merged
    }

    fn index(&self, namespace: &str) -> Option<usize> {
        self.order.iter().position(|n| n == namespace)
    }

    fn state(&self) -> MutexGuard<'_, Vec<Namespace>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Sets `slot` to `reason` (keeping the start of a streak already going
/// on), or clears it with `None`.
fn failing_since(slot: &Failing, reason: Option<&str>) {
    let mut failing = slot.lock().unwrap_or_else(|p| p.into_inner());
    *failing = reason.map(|reason| {
        let since = failing
            .as_ref()
            .map_or_else(Instant::now, |(since, _)| *since);
        (since, reason.to_string())
    });
}

/// The entries of `map` named by `keys`, in their order (a key named
/// twice comes twice), or every entry when `keys` is empty: copies.
fn pick<V: Clone>(map: &BTreeMap<String, V>, keys: &[String]) -> Vec<(String, V)> {
    if keys.is_empty() {
        return map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    keys.iter()
        .filter_map(|key| Some((key.clone(), map.get(key)?.clone())))
        .collect()
}

fn item(
    key: &str,
    value: &str,
    group: Option<&str>,
    namespace: &str,
    release_key: &str,
) -> ConfigItem {
    ConfigItem {
        key: key.to_string(),
        value: value.to_string(),
        version: release_key.to_string(),
        group: group.map(str::to_string),
        label: None,
        metadata: HashMap::from([("namespace".to_string(), namespace.to_string())]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pairs(items: &[ConfigItem]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|i| (i.key.clone(), i.value.clone()))
            .collect()
    }

    fn live() -> LiveNamespaces {
        let live = LiveNamespaces::new(vec!["app".into(), "common".into()]);
        live.apply(
            "app",
            values(&[("a", "1"), ("shared", "app")]),
            "r1",
            Source::Server,
        );
        live.apply(
            "common",
            values(&[("b", "2"), ("shared", "common")]),
            "c1",
            Source::Server,
        );
        live
    }

    #[test]
    fn notifications_and_answers_ignore_the_properties_suffix() {
        let live = LiveNamespaces::new(vec![
            "application.properties".into(),
            "common".into(),
            "Mixed.PROPERTIES".into(),
        ]);
        let sent: Vec<String> = live
            .notifications()
            .into_iter()
            .map(|n| n.namespace_name)
            .collect();
        assert_eq!(sent, vec!["application", "common", "Mixed"]);
        assert_eq!(live.resolve("application"), vec!["application.properties"]);
        assert_eq!(
            live.resolve("application.properties"),
            vec!["application.properties"]
        );
        assert_eq!(live.resolve("mixed"), vec!["Mixed.PROPERTIES"]);
        assert_eq!(live.resolve("COMMON"), vec!["common"]);
        assert!(live.resolve("other").is_empty());
        assert_eq!(notification_name(".properties"), ".properties");
        assert_eq!(notification_name("a.yaml"), "a.yaml");
    }

    #[test]
    fn first_namespace_wins_without_group() {
        let live = live();
        let merged = live.get(&ConfigQuery::keys(["shared", "b", "absent"]));
        assert_eq!(
            pairs(&merged),
            vec![("shared".into(), "app".into()), ("b".into(), "2".into())]
        );
        assert_eq!(merged[0].group, None);
        assert_eq!(merged[0].version, "r1");
        assert_eq!(
            merged[1].metadata.get("namespace").map(String::as_str),
            Some("common")
        );
        let grouped = live.get(&ConfigQuery {
            keys: vec!["shared".into()],
            group: Some("common".into()),
            ..ConfigQuery::default()
        });
        assert_eq!(pairs(&grouped), vec![("shared".into(), "common".into())]);
        assert_eq!(grouped[0].group.as_deref(), Some("common"));
    }

    #[tokio::test]
    async fn hidden_changes_reach_only_their_group() {
        let live = live();
        let mut merged = live.subscribe(ConfigQuery::default());
        let mut common = live.subscribe(ConfigQuery {
            group: Some("common".into()),
            ..ConfigQuery::default()
        });
        live.apply(
            "common",
            values(&[("b", "2"), ("shared", "new")]),
            "c2",
            Source::Server,
        );
        let change = testkit::soon("a change", common.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(pairs(&change), vec![("shared".into(), "new".into())]);
        assert!(
            merged.changes.try_recv().is_err(),
            "a hidden change reached the merged view"
        );

        // Removing the key from the first namespace uncovers the second one.
        live.apply("app", values(&[("a", "1")]), "r2", Source::Server);
        let change = testkit::soon("a change", merged.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(pairs(&change), vec![("shared".into(), "new".into())]);
        assert_eq!(change[0].version, "c2");
    }

    #[tokio::test]
    async fn removed_keys_are_published_empty() {
        let live = live();
        let mut sub = live.subscribe(ConfigQuery::default());
        live.apply(
            "common",
            values(&[("shared", "common")]),
            "c2",
            Source::Server,
        );
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(pairs(&change), vec![("b".into(), String::new())]);
        assert_eq!(change[0].version, "c2");
    }

    #[test]
    fn a_large_query_looks_its_keys_up_directly() {
        let entries: BTreeMap<String, String> = (0..20_000)
            .map(|n| (format!("key-{n:05}"), format!("v{n}")))
            .collect();
        let live = LiveNamespaces::new(vec!["app".into(), "common".into()]);
        live.apply("common", entries.clone(), "c1", Source::Server);
        live.apply("app", values(&[("key-00003", "app")]), "r1", Source::Server);
        let mut keys: Vec<String> = (0..20_000).rev().map(|n| format!("key-{n:05}")).collect();
        keys.push("absent".into());
        keys.push("key-00003".into());
        for group in [None, Some("common".to_string())] {
            let query = ConfigQuery {
                keys: keys.clone(),
                group: group.clone(),
                ..ConfigQuery::default()
            };
            let began = Instant::now();
            let items = live.get(&query);
            let took = began.elapsed();
            // Searching the entries for each key (4 × 10^8 comparisons) took
            // seconds in a debug build; direct lookups take milliseconds.
            assert!(took < std::time::Duration::from_millis(500), "{took:?}");
            assert_eq!(
                items.len(),
                20_001,
                "in the keys' order, the absent one left out"
            );
            assert_eq!(items[0].key, "key-19999");
            let last = &items[20_000];
            let expected = if group.is_some() { "v3" } else { "app" };
            assert_eq!(
                (last.key.as_str(), last.value.as_str()),
                ("key-00003", expected)
            );
        }
        assert_eq!(live.get(&ConfigQuery::default()).len(), 20_000);
    }

    #[test]
    fn readiness_is_degraded_while_the_long_poll_fails() {
        let live = live();
        assert_eq!(live.readiness(), Readiness::Ready);
        live.poll_failed("HTTP 401");
        live.poll_failed("HTTP 401 again");
        match live.readiness() {
            Readiness::Degraded(reason) => {
                assert!(reason.starts_with("long polling failing for "), "{reason}");
                assert!(reason.contains("HTTP 401 again"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        live.poll_recovered();
        assert_eq!(live.readiness(), Readiness::Ready);
    }

    #[test]
    fn a_missing_release_is_kept_reported_and_cleared_by_an_answer() {
        let live = LiveNamespaces::new(vec!["app".into(), "common".into()]);
        live.apply("app", values(&[("a", "1")]), "r1", Source::Server);
        live.apply("common", values(&[("c", "1")]), "c1", Source::Server);
        assert_eq!(live.missing("app"), Source::Server);
        assert_eq!(live.missing("app"), Source::Missing);
        assert_eq!(live.value("app", "a").as_deref(), Some("1"));
        assert_eq!(live.release_key("app").as_deref(), Some("r1"));
        assert!(live.unconfirmed().is_empty(), "not fetched every round");
        match live.readiness() {
            Readiness::Degraded(reason) => {
                assert!(reason.contains("`app`"), "{reason}");
                assert!(!reason.contains("`common`"), "{reason}");
                assert!(!reason.contains('1'), "no values: {reason}");
            }
            other => panic!("{other:?}"),
        }
        // An instance that has the release (304) or a new release clears it.
        assert_eq!(live.confirm("app"), Source::Missing);
        assert_eq!(live.readiness(), Readiness::Ready);
        live.missing("app");
        live.apply("app", values(&[("a", "2")]), "r2", Source::Server);
        assert_eq!(live.readiness(), Readiness::Ready);
    }

    #[test]
    fn readiness_follows_the_sources() {
        let live = LiveNamespaces::new(vec!["app".into()]);
        assert!(matches!(live.readiness(), Readiness::NotReady(_)));
        live.apply("app", values(&[("a", "1")]), "r1", Source::Backup);
        assert_eq!(live.readiness(), Readiness::Degraded(BACKUP_REASON.into()));
        assert_eq!(live.unconfirmed(), vec!["app".to_string()]);
        assert_eq!(live.confirm("app"), Source::Backup);
        assert_eq!(live.readiness(), Readiness::Ready);
        assert!(live.unconfirmed().is_empty());
        assert_eq!(live.release_key("app").as_deref(), Some("r1"));
    }
}
