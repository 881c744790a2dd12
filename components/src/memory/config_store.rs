//! The `memory` config store: keyed values with group and label, kept in
//! process, with change subscriptions.
//!
//! A value is identified by `(group, label, key)`; a get or delete without
//! a group or label reads or deletes the items without one (the default),
//! not those of every group or label (subscriptions still get every group's
//! and label's changes of their keys). A get or delete looks up the keys it
//! names (with none, walks only its group's and label's items), so its work
//! under the store's lock does not grow with the store. Every set or delete
//! gives the value a new version (increasing across the store) and is published to
//! the subscribers; a deleted key is published with an empty value. The
//! optional `items` metadata seeds the store; a metadata change is applied in
//! place: items whose value changed or that are new are set (and published);
//! items dropped from `items` are deleted if they still hold their seeded
//! value (so re-applying the previous metadata undoes a change exactly);
//! everything else, including values set since, is kept.
//!
//! What it holds is bounded: at most `maxKeys` items (default
//! [`DEFAULT_MAX_KEYS`]) and `maxTotalSize` bytes of keys, groups, labels,
//! values and item metadata (default [`DEFAULT_MAX_TOTAL_SIZE`]). A set
//! that would grow the store past either fails whole with a backend error
//! naming the store and the limit, and changes nothing; deletes and sets
//! that do not grow it pass, so a lowered bound keeps what is held. The
//! seeded `items` are the operator's and are not held to the bounds.
//!
//! A reload stages the change: the items change, and subscribers hear of
//! it, only once the new generation is published; until then only the
//! reload preparing it (a configurationRef read, a dependent's `init`)
//! reads the new items (worked out for the keys it asks for, without
//! copying the store), and a rollback leaves no trace.
//!
//! A rebuild of the same type (a new `appId`) takes over its predecessor's
//! items and subscribers (see [`crate::memory`]): values set through the
//! API stay, and subscribers hear nothing but real changes. Its own
//! `items`, if they differ from those seeded before, are applied as an
//! in-place change would (above) at its first operation — after the
//! swap, unless the reload reads the new instance before it; a rollback
//! after such a read keeps the new seeded values.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rewire_runtime::{
    Component, ComponentError, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, InPlace, InPlaceUpdate, InitContext, Metadata, PendingInPlace,
    StagedInPlace, SubscriptionHub,
};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tracing::info;

use crate::json_text::value_text;
use crate::live::LiveMetadata;

mod selection;
mod staged;

/// Default most items a memory config store holds (`maxKeys`).
pub const DEFAULT_MAX_KEYS: u64 = 1_000_000;
/// Default most bytes a memory config store holds (`maxTotalSize`): 256 MiB.
pub const DEFAULT_MAX_TOTAL_SIZE: u64 = 256 << 20;

/// Metadata of the `memory` config store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryConfigMetadata {
    /// Initial values (no group, no label).
    pub items: InitialItems,
    /// Most items held (at least 1; default [`DEFAULT_MAX_KEYS`]).
    #[serde(deserialize_with = "deserialize_positive")]
    pub max_keys: u64,
    /// Most bytes of keys, groups, labels, values and item metadata held
    /// (at least 1; default [`DEFAULT_MAX_TOTAL_SIZE`], 256 MiB).
    #[serde(deserialize_with = "deserialize_positive")]
    pub max_total_size: u64,
}

impl Default for MemoryConfigMetadata {
    fn default() -> Self {
        Self {
            items: InitialItems::default(),
            max_keys: DEFAULT_MAX_KEYS,
            max_total_size: DEFAULT_MAX_TOTAL_SIZE,
        }
    }
}

/// A bound: a whole number, at least 1.
fn deserialize_positive<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    match u64::deserialize(deserializer)? {
        0 => Err(serde::de::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

/// Initial key → value pairs: a JSON object, or a string holding one (as
/// the Lifecycle API's `map<string,string>` carries it). Values that are not
/// strings are stored as their JSON text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitialItems(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for InitialItems {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let object = match value {
            Value::Null => return Ok(Self::default()),
            Value::Object(object) => object,
            Value::String(text) => match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(object)) => object,
                _ => {
                    return Err(serde::de::Error::custom(
                        "expected a JSON object of key → value",
                    ))
                }
            },
            _ => {
                return Err(serde::de::Error::custom(
                    "expected a JSON object of key → value",
                ))
            }
        };
        Ok(Self(
            object
                .iter()
                .map(|(k, v)| (k.clone(), value_text(v)))
                .collect(),
        ))
    }
}

/// `(group, label, key)`.
type ItemId = (Option<String>, Option<String>, String);

#[derive(Debug, Clone)]
struct Stored {
    value: String,
    version: u64,
    metadata: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct ConfigTable {
    items: BTreeMap<ItemId, Stored>,
    last_version: u64,
    /// Bytes of the items held (see [`size_of`]).
    bytes: u64,
    /// The `items` seeded last, by whichever instance: what a change of
    /// them is measured against.
    seeded: InitialItems,
}

/// A copy of the whole table, in tests only (counted): no request path may
/// make one under the lock (a get during a staged reload works out the
/// staged view instead, see [`staged`]).
#[cfg(test)]
impl Clone for ConfigTable {
    fn clone(&self) -> Self {
        selection::cloned();
        Self {
            items: self.items.clone(),
            last_version: self.last_version,
            bytes: self.bytes,
            seeded: self.seeded.clone(),
        }
    }
}

/// The bytes an item counts for: its key, group, label, value and metadata.
fn size_of((group, label, key): &ItemId, value: &str, metadata: &HashMap<String, String>) -> u64 {
    let metadata: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    let text = key.len()
        + group.as_ref().map_or(0, String::len)
        + label.as_ref().map_or(0, String::len)
        + value.len();
    (text as u64).saturating_add(metadata as u64)
}

fn stored_size(id: &ItemId, stored: &Stored) -> u64 {
    size_of(id, &stored.value, &stored.metadata)
}

impl ConfigTable {
    fn put(&mut self, id: ItemId, value: String, metadata: HashMap<String, String>) -> ConfigItem {
        self.last_version += 1;
        let stored = Stored {
            value,
            version: self.last_version,
            metadata,
        };
        let item = to_item(&id, &stored);
        self.bytes += stored_size(&id, &stored);
        if let Some(old) = self.items.get(&id) {
            self.bytes -= stored_size(&id, old);
        }
        self.items.insert(id, stored);
        item
    }

    /// Refuses a set of `items` (with their ids) that would grow the table
    /// past `bounds` (`maxKeys`, `maxTotalSize`): the error says how.
    fn check_bounds(
        &self,
        items: &[(ItemId, ConfigItem)],
        bounds: (u64, u64),
    ) -> Result<(), String> {
        let (max_keys, max_total_size) = bounds;
        // The size each id will have: the last of the batch's writes.
        let mut after: HashMap<&ItemId, u64> = HashMap::new();
        for (id, item) in items {
            after.insert(id, size_of(id, &item.value, &item.metadata));
        }
        let held = self.items.len() as u64;
        let mut keys = held;
        let mut bytes = self.bytes;
        for (id, size) in after {
            match self.items.get(id) {
                Some(old) => bytes = bytes + size - stored_size(id, old),
                None => {
                    keys += 1;
                    bytes += size;
                }
            }
        }
        if keys > max_keys && keys > held {
            return Err(format!(
                "holds {held} items, its limit `maxKeys` is {max_keys}: the items were not set \
                 (delete some, or raise `maxKeys`)"
            ));
        }
        if bytes > max_total_size && bytes > self.bytes {
            return Err(format!(
                "holds {} bytes and would hold {bytes}, past its limit `maxTotalSize` of \
                 {max_total_size}: the items were not set (delete some, or raise `maxTotalSize`)",
                self.bytes
            ));
        }
        Ok(())
    }

    /// Deletes `id`; the deletion as published (empty value, new version).
    fn remove(&mut self, id: &ItemId) -> Option<ConfigItem> {
        let mut stored = self.items.remove(id)?;
        self.bytes -= stored_size(id, &stored);
        self.last_version += 1;
        stored.value.clear();
        stored.version = self.last_version;
        Some(to_item(id, &stored))
    }

    /// Brings the seeded items from those seeded last to `new`; the
    /// changes, as published.
    fn reseed(&mut self, new: &InitialItems) -> Vec<ConfigItem> {
        let old = std::mem::replace(&mut self.seeded, new.clone());
        let mut changed: Vec<ConfigItem> = new
            .0
            .iter()
            .filter(|(key, value)| old.0.get(*key) != Some(value))
            .map(|(key, value)| self.put(plain_id(key), value.clone(), HashMap::new()))
            .collect();
        for (key, seeded) in &old.0 {
            let untouched = self
                .items
                .get(&plain_id(key))
                .is_some_and(|s| &s.value == seeded);
            if !new.0.contains_key(key) && untouched {
                if let Some(removed) = self.remove(&plain_id(key)) {
                    changed.push(removed);
                }
            }
        }
        changed
    }
}

fn to_item((group, label, key): &ItemId, stored: &Stored) -> ConfigItem {
    ConfigItem {
        key: key.clone(),
        value: stored.value.clone(),
        version: stored.version.to_string(),
        group: group.clone(),
        label: label.clone(),
        metadata: stored.metadata.clone(),
    }
}

/// A group or label, empty taken as none.
fn given(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

fn plain_id(key: &str) -> ItemId {
    (None, None, key.to_string())
}

/// An in-process config store with groups, labels and subscriptions. Its
/// data survives every configuration change except a change of type.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "config_store",
    type = "memory",
    example = r#"{"items": {"greeting": "hello"}}"#
)]
pub struct MemoryConfigStore {
    #[metadata]
    settings: LiveMetadata<MemoryConfigMetadata>,
    /// Shared with a staged update, which applies to it at commit, and
    /// with the instances rebuilt from or into this one.
    shared: Arc<Shared>,
    /// Set by a rebuild that took over its predecessor's items: its own
    /// `items` are seeded at its first operation.
    seeds_pending: AtomicBool,
    /// The component (`configuration/settings`), for errors; empty outside
    /// a runtime.
    key: String,
}

/// What belongs to the component, not to one instance of it.
#[derive(Debug, Default)]
struct Shared {
    table: Mutex<ConfigTable>,
    hub: SubscriptionHub,
}

impl MemoryConfigStore {
    /// A store seeded with the `items` of `metadata`.
    pub fn new(metadata: MemoryConfigMetadata) -> Self {
        let store = Self {
            settings: LiveMetadata::new(metadata),
            ..Self::default()
        };
        store.seed();
        store
    }

    /// Number of stored values.
    pub fn len(&self) -> usize {
        self.table().items.len()
    }

    /// Whether the store holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Seeds the `items` in force (a change from those seeded last is
    /// published).
    fn seed(&self) {
        let settings = self.settings.load();
        let mut table = self.table();
        let changed = table.reseed(&settings.items);
        if !changed.is_empty() {
            self.shared.hub.publish(&changed);
        }
    }

    /// Seeds this instance's `items` if a rebuild left that to its first
    /// operation.
    fn seed_if_pending(&self) {
        if self.seeds_pending.swap(false, Ordering::AcqRel) {
            self.seed();
        }
    }

    fn table(&self) -> MutexGuard<'_, ConfigTable> {
        lock(&self.shared.table)
    }

    /// Checks `metadata` and stages it: its items are set, and published,
    /// when the returned update is applied.
    fn stage(&self, metadata: &Metadata) -> Result<PendingInPlace, ComponentError> {
        let new = LiveMetadata::<MemoryConfigMetadata>::decode(metadata)?;
        let shared = self.shared.clone();
        Ok(self.settings.stage_then(new, move |_, new| {
            let mut table = lock(&shared.table);
            let changed = table.reseed(&new.items);
            if !changed.is_empty() {
                shared.hub.publish(&changed);
            }
            info!(
                changed = changed.len(),
                keys = table.items.len(),
                "Memory config store metadata applied in place."
            );
        }))
    }
}

fn lock(table: &Mutex<ConfigTable>) -> MutexGuard<'_, ConfigTable> {
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryConfigStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        self.key = cx.key.to_string();
        let (shared, adopted) = crate::memory::shared_with_predecessors(cx, self.shared.clone());
        self.shared = shared;
        if adopted {
            // The predecessor still serves: its items change at the swap.
            *self.seeds_pending.get_mut() = true;
            info!(component = %cx.key, items = self.len(), "Memory config store rebuilt: it keeps its predecessor's items and subscribers.");
        } else {
            self.seed();
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Deferred: the change is put in force, and published, at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryConfigStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.stage(metadata)?.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        self.stage(metadata).map(StagedInPlace::Deferred)
    }
}

#[rewire_runtime::prelude::async_trait]
impl ConfigStore for MemoryConfigStore {
    /// A reload preparing a staged change reads the items as they will be
    /// (worked out for the items asked for, without copying the store).
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        self.seed_if_pending();
        let table = self.table();
        Ok(match self.settings.staged() {
            Some(staged) => table.covered_as_seeded(query, &staged.items),
            None => table
                .covered(query)
                .into_iter()
                .map(|(id, stored)| to_item(id, stored))
                .collect(),
        })
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        if items.iter().any(|item| item.key.is_empty()) {
            return Err(ConfigError::Invalid("an item has an empty key".into()));
        }
        self.seed_if_pending();
        let settings = self.settings.load();
        let batch: Vec<(ItemId, ConfigItem)> = items
            .into_iter()
            .map(|item| {
                let id = (
                    given(item.group.clone()),
                    given(item.label.clone()),
                    item.key.clone(),
                );
                (id, item)
            })
            .collect();
        let mut table = self.table();
        let bounds = (settings.max_keys, settings.max_total_size);
        if let Err(message) = table.check_bounds(&batch, bounds) {
            return Err(ConfigError::Backend(if self.key.is_empty() {
                format!("the memory config store {message}")
            } else {
                format!("the memory config store `{}` {message}", self.key)
            }));
        }
        let stored: Vec<ConfigItem> = batch
            .into_iter()
            .map(|(id, item)| table.put(id, item.value, item.metadata))
            .collect();
        self.shared.hub.publish(&stored);
        Ok(())
    }

    async fn delete(&self, query: &ConfigQuery) -> Result<(), ConfigError> {
        if query.keys.is_empty() {
            return Err(ConfigError::Invalid("delete needs at least one key".into()));
        }
        self.seed_if_pending();
        let mut table = self.table();
        let doomed: Vec<ItemId> = table
            .covered(query)
            .into_iter()
            .map(|(id, _)| id.clone())
            .collect();
        let removed: Vec<ConfigItem> = doomed.iter().filter_map(|id| table.remove(id)).collect();
        if !removed.is_empty() {
            self.shared.hub.publish(&removed);
        }
        Ok(())
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        self.seed_if_pending();
        Ok(self.shared.hub.subscribe(query))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(group: Option<&str>, key: &str, value: &str) -> ConfigItem {
        ConfigItem {
            key: key.into(),
            value: value.into(),
            group: group.map(Into::into),
            ..ConfigItem::default()
        }
    }

    fn metadata(value: Value) -> Metadata {
        Metadata::from(value.as_object().cloned().unwrap_or_default())
    }

    fn decoded(value: Value) -> MemoryConfigMetadata {
        metadata(value).decode().unwrap_or_else(|e| panic!("{e}"))
    }

    async fn values(store: &MemoryConfigStore, query: &ConfigQuery) -> Vec<(String, String)> {
        let items = store.get(query).await.unwrap_or_else(|e| panic!("{e}"));
        items.into_iter().map(|i| (i.key, i.value)).collect()
    }

    #[test]
    fn items_accept_an_object_or_a_json_string() {
        let from_object = decoded(json!({"items": {"a": "1", "n": 2}}));
        let from_text = decoded(json!({"items": "{\"a\": \"1\", \"n\": 2}"}));
        assert_eq!(from_object, from_text);
        assert_eq!(from_object.items.0.get("n").map(String::as_str), Some("2"));
        let err = metadata(json!({"items": "[1]"}))
            .decode::<MemoryConfigMetadata>()
            .expect_err("expected an error");
        assert!(err.to_string().contains("items"), "{err}");
    }

    #[tokio::test]
    async fn groups_and_labels_are_part_of_the_identity() {
        let store = MemoryConfigStore::default();
        let mut labelled = item(Some("g"), "k", "gl");
        labelled.label = Some("prod".into());
        let items = vec![
            item(None, "k", "plain"),
            item(Some("g"), "k", "g"),
            labelled,
        ];
        store.set(items).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.len(), 3);
        let query = ConfigQuery {
            keys: vec!["k".into()],
            group: Some("g".into()),
            label: Some("prod".into()),
            ..ConfigQuery::default()
        };
        assert_eq!(
            values(&store, &query).await,
            vec![("k".to_string(), "gl".to_string())]
        );
        // No group or label: the default's item, not every one.
        assert_eq!(
            values(&store, &ConfigQuery::keys(["k"])).await,
            vec![("k".to_string(), "plain".to_string())]
        );
        store
            .delete(&ConfigQuery::keys(["k"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.len(), 2, "the grouped and labelled items are kept");
    }

    #[tokio::test]
    async fn subscribers_see_sets_and_deletes_with_rising_versions() {
        let store = MemoryConfigStore::new(decoded(json!({"items": {"a": "1"}})));
        let mut sub = store
            .subscribe(ConfigQuery::keys(["a"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let before = store
            .get(&ConfigQuery::keys(["a"]))
            .await
            .unwrap_or_default();
        store
            .set(vec![item(None, "a", "2"), item(None, "b", "x")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(change.len(), 1);
        assert_eq!(change[0].value, "2");
        let version =
            |items: &[ConfigItem]| items.first().and_then(|i| i.version.parse::<u64>().ok());
        assert!(version(&change) > version(&before));
        store
            .delete(&ConfigQuery::keys(["a"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let deleted = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(
            (deleted[0].key.as_str(), deleted[0].value.as_str()),
            ("a", "")
        );
        assert!(version(&deleted) > version(&change));
        assert!(values(&store, &ConfigQuery::keys(["a"])).await.is_empty());
    }

    #[tokio::test]
    async fn apply_config_keeps_data_and_publishes_changed_items() {
        let store = MemoryConfigStore::new(decoded(json!({"items": {"a": "1", "b": "1"}})));
        store
            .set(vec![item(None, "b", "runtime")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut sub = store
            .subscribe(ConfigQuery::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let applied = store
            .update_in_place(&metadata(json!({"items": {"a": "2", "b": "1"}})))
            .await;
        assert_eq!(applied.ok(), Some(InPlace::Applied));
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(
            change.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
            vec!["a"]
        );
        let all = values(&store, &ConfigQuery::default()).await;
        assert_eq!(
            all,
            vec![("a".into(), "2".into()), ("b".into(), "runtime".into())]
        );
    }

    /// An instance of `config_store/settings` with `metadata`, initialised
    /// in the runtime whose handover area is `runtime`.
    async fn instance_in(runtime: &rewire_runtime::Handover, metadata: Value) -> MemoryConfigStore {
        let key = rewire_runtime::ComponentKey::new("config_store", "settings");
        let mut cx = InitContext::new(key, "app", super::tests::metadata(metadata.clone()));
        cx.handover = runtime.clone();
        let mut store = MemoryConfigStore {
            settings: LiveMetadata::new(decoded(metadata)),
            ..MemoryConfigStore::default()
        };
        store.init(&cx).await.unwrap_or_else(|e| panic!("{e}"));
        store
    }

    /// A rebuild keeps the values set through the API and the
    /// subscribers; its own changed `items` are applied, and heard, at its
    /// first operation (after the swap), not while it is built.
    #[tokio::test]
    async fn a_rebuild_keeps_values_and_subscribers_and_seeds_at_first_use() {
        let runtime = rewire_runtime::Handover::new();
        let old = instance_in(&runtime, json!({"items": {"a": "1", "b": "1"}})).await;
        old.set(vec![item(None, "set", "x")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut sub = old
            .subscribe(ConfigQuery::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let new = instance_in(&runtime, json!({"items": {"a": "2"}})).await;
        assert_eq!(
            values(&old, &ConfigQuery::keys(["a"])).await,
            vec![("a".into(), "1".into())],
            "nothing changes while the rebuilt instance is only built"
        );
        let all = values(&new, &ConfigQuery::default()).await;
        assert_eq!(
            all,
            vec![("a".into(), "2".into()), ("set".into(), "x".into())]
        );
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        let heard: Vec<(&str, &str)> = change
            .iter()
            .map(|i| (i.key.as_str(), i.value.as_str()))
            .collect();
        assert_eq!(heard, vec![("a", "2"), ("b", "")]);
        new.set(vec![item(None, "later", "y")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let change = testkit::soon("a change", sub.changes.recv())
            .await
            .map(|c| c.items)
            .unwrap_or_default();
        assert_eq!(change.first().map(|i| i.key.as_str()), Some("later"));
    }

    #[tokio::test]
    async fn malformed_writes_are_invalid() {
        let store = MemoryConfigStore::default();
        assert!(matches!(
            store.set(vec![item(None, "", "v")]).await,
            Err(ConfigError::Invalid(_))
        ));
        assert!(matches!(
            store.delete(&ConfigQuery::default()).await,
            Err(ConfigError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn a_set_past_a_bound_fails_whole_and_keeps_the_items() {
        let store = MemoryConfigStore::new(decoded(json!({"maxKeys": 2, "maxTotalSize": 20})));
        store
            .set(vec![item(None, "a", "1"), item(Some("g"), "a", "1")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.table().bytes, 2 + 3);
        let refused = store
            .set(vec![item(None, "a", "2"), item(None, "b", "1")])
            .await;
        assert!(
            matches!(&refused, Err(ConfigError::Backend(m)) if m.contains("memory config store") && m.contains("`maxKeys` is 2")),
            "{refused:?}"
        );
        let refused = store.set(vec![item(None, "a", &"x".repeat(20))]).await;
        assert!(
            matches!(&refused, Err(ConfigError::Backend(m)) if m.contains("`maxTotalSize` of 20")),
            "{refused:?}"
        );
        assert_eq!(
            values(&store, &ConfigQuery::default()).await,
            vec![("a".to_string(), "1".to_string())]
        );
        // Overwrites within the bounds pass; a delete makes room.
        store
            .set(vec![item(None, "a", &"x".repeat(10))])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store
            .delete(&ConfigQuery::keys(["a"]))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.table().bytes, 3);
        store
            .set(vec![item(None, "b", "1")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.len(), 2);
    }
}
