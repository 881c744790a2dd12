//! [`KvCache`]: the watched prefix as last seen — key path → (value,
//! `mod_revision`) — so that a re-read after a compaction can publish just
//! what changed; and [`read_prefix`], the read that fills it.

use std::collections::{BTreeMap, HashMap};

use rewire_etcd::pb::KeyValue;
use rewire_etcd::Client;
use rewire_runtime::ConfigItem;

use super::keys::KeyLayout;

/// A value and the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The value (bytes that are not UTF-8 are replaced).
    pub(crate) value: String,
    /// The key's `mod_revision`.
    pub(crate) mod_revision: i64,
}

/// Every key under the prefix at one revision.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// The store's revision when it was read.
    pub(crate) revision: i64,
    /// Key path → entry.
    pub(crate) entries: BTreeMap<String, Entry>,
}

/// Reads every key under the layout's prefix, in one request.
pub(crate) async fn read_prefix(
    client: &Client,
    layout: &KeyLayout,
) -> Result<Snapshot, rewire_etcd::Error> {
    let response = client.get_prefix(layout.prefix()).await?;
    let revision = response.header.map_or(0, |h| h.revision);
    let entries = response.kvs.iter().filter_map(entry_of).collect();
    Ok(Snapshot { revision, entries })
}

/// The key path and entry of `kv`; `None` for a key that is not UTF-8.
pub(crate) fn entry_of(kv: &KeyValue) -> Option<(String, Entry)> {
    let path = std::str::from_utf8(&kv.key).ok()?.to_string();
    let entry = Entry {
        value: String::from_utf8_lossy(&kv.value).into_owned(),
        mod_revision: kv.mod_revision,
    };
    Some((path, entry))
}

/// The item stored at `path`, if the path fits the layout.
pub(crate) fn item_at(
    layout: &KeyLayout,
    path: &str,
    value: String,
    revision: i64,
) -> Option<ConfigItem> {
    let name = layout.parse(path)?;
    Some(ConfigItem {
        key: name.key,
        value,
        version: revision.to_string(),
        group: name.group,
        label: name.label,
        metadata: HashMap::new(),
    })
}

/// The cache shared by the watch task (its one writer) and the store,
/// which answers reads from it while no member of the cluster answers.
pub(crate) type SharedCache = std::sync::Arc<std::sync::Mutex<KvCache>>;

/// The watched prefix as last seen.
#[derive(Debug, Default)]
pub(crate) struct KvCache {
    entries: BTreeMap<String, Entry>,
}

/// One difference found by [`KvCache::replace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Difference {
    /// The key is new or has a new revision.
    Changed(String, Entry),
    /// The key is gone.
    Removed(String),
}

impl KvCache {
    /// A cache holding `snapshot`.
    pub(crate) fn new(snapshot: Snapshot) -> Self {
        Self {
            entries: snapshot.entries,
        }
    }

    /// Records a put.
    pub(crate) fn put(&mut self, path: String, entry: Entry) {
        self.entries.insert(path, entry);
    }

    /// Records a delete.
    pub(crate) fn remove(&mut self, path: &str) {
        self.entries.remove(path);
    }

    /// The entry at `path`, if any.
    pub(crate) fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Every `(path, entry)` whose path starts with `prefix`.
    pub(crate) fn under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Entry)> + 'a {
        self.entries
            .range(prefix.to_string()..)
            .take_while(move |(path, _)| path.starts_with(prefix))
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds exactly `entries`.
    pub(crate) fn holds(&self, entries: &BTreeMap<String, Entry>) -> bool {
        self.entries == *entries
    }

    /// Takes `entries` as the new content; returns what differs from the
    /// old one (a key whose value was rewritten counts as changed).
    pub(crate) fn replace(&mut self, entries: BTreeMap<String, Entry>) -> Vec<Difference> {
        let old = std::mem::replace(&mut self.entries, entries);
        let changed = self
            .entries
            .iter()
            .filter(|(path, entry)| old.get(*path) != Some(*entry))
            .map(|(path, entry)| Difference::Changed(path.clone(), entry.clone()));
        let removed = old
            .keys()
            .filter(|path| !self.entries.contains_key(*path))
            .map(|path| Difference::Removed(path.clone()));
        changed.chain(removed).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &str, mod_revision: i64) -> Entry {
        Entry {
            value: value.into(),
            mod_revision,
        }
    }

    #[test]
    fn replace_reports_changes_rewrites_and_removals() {
        let mut cache = KvCache::default();
        cache.put("a".into(), entry("1", 2));
        cache.put("b".into(), entry("1", 3));
        cache.put("c".into(), entry("1", 4));
        let new: BTreeMap<String, Entry> = [
            ("a".to_string(), entry("1", 2)),
            ("b".to_string(), entry("1", 7)),
            ("d".to_string(), entry("2", 8)),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            cache.replace(new),
            vec![
                Difference::Changed("b".into(), entry("1", 7)),
                Difference::Changed("d".into(), entry("2", 8)),
                Difference::Removed("c".into()),
            ]
        );
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn items_carry_group_label_and_revision() {
        let layout = KeyLayout::new("p/");
        let item = item_at(&layout, "p/g/k@l", "v".into(), 9).unwrap_or_default();
        assert_eq!(
            (
                item.group.as_deref(),
                item.key.as_str(),
                item.label.as_deref()
            ),
            (Some("g"), "k", Some("l"))
        );
        assert_eq!(item.version, "9");
        assert!(item_at(&layout, "q/k", String::new(), 1).is_none());
    }
}
