//! Which items of a memory config store a get or a delete is about, found
//! without walking the store: the work, done under the table's lock, is
//! about the items asked for, not about how many the store holds.

use std::collections::BTreeSet;

use rewire_runtime::ConfigQuery;

use super::{given, ConfigTable, ItemId, Stored};

impl ConfigTable {
    /// The items `query` covers on a get or a delete, ordered by key: its
    /// keys (all when none), and exactly its group and label: none (or
    /// empty) is the store's default group or label, not every one (as
    /// Layotto's API has it; a delete of `timeout` without a label left
    /// `prod` and `dev` alone). A key named twice is covered once; a key
    /// not held is simply absent.
    ///
    /// Each named key is looked up by its `(group, label, key)`; with no
    /// key, only the group's and label's items are walked (the table
    /// orders ids by group, label, then key, so they sit together).
    pub(super) fn covered(&self, query: &ConfigQuery) -> Vec<(&ItemId, &Stored)> {
        let group = given(query.group.clone());
        let label = given(query.label.clone());
        if query.keys.is_empty() {
            let first_of_scope: ItemId = (group.clone(), label.clone(), String::new());
            return self
                .items
                .range(first_of_scope..)
                .inspect(|_| visited())
                .take_while(|((g, l, _), _)| *g == group && *l == label)
                .collect();
        }
        let keys: BTreeSet<&String> = query.keys.iter().collect();
        keys.into_iter()
            .filter_map(|key| {
                visited();
                let id: ItemId = (group.clone(), label.clone(), key.clone());
                self.items.get_key_value(&id)
            })
            .collect()
    }
}

#[cfg(test)]
thread_local! {
    /// Items of the table [`ConfigTable::covered`] (or the staged view,
    /// see [`super::staged`]) looked at, on this thread: what tests bound
    /// to show a get or delete does not walk the store.
    pub(super) static VISITED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Copies of a whole table made on this thread: what tests bound to
    /// show a get during a staged reload does not copy the store.
    pub(super) static CLONED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one item looked at (in tests; nothing otherwise).
pub(super) fn visited() {
    #[cfg(test)]
    VISITED.with(|count| count.set(count.get() + 1));
}

/// Counts one copy of a whole table (tables are copied in tests only).
#[cfg(test)]
pub(super) fn cloned() {
    CLONED.with(|count| count.set(count.get() + 1));
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rewire_runtime::{ConfigItem, ConfigStore};

    use super::super::MemoryConfigStore;
    use super::*;

    /// Items looked at by [`ConfigTable::covered`] while `work` runs.
    async fn visits_during<F: std::future::Future>(work: F) -> (F::Output, usize) {
        VISITED.with(|count| count.set(0));
        let output = work.await;
        (output, VISITED.with(std::cell::Cell::get))
    }

    fn item(group: Option<&str>, label: Option<&str>, key: &str, value: &str) -> ConfigItem {
        ConfigItem {
            key: key.into(),
            value: value.into(),
            group: group.map(Into::into),
            label: label.map(Into::into),
            ..ConfigItem::default()
        }
    }

    fn query(keys: &[&str], group: Option<&str>, label: Option<&str>) -> ConfigQuery {
        ConfigQuery {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            group: group.map(Into::into),
            label: label.map(Into::into),
            ..ConfigQuery::default()
        }
    }

    /// A store holding `count` items of the default group and label,
    /// `key-0`... (and as many in group `g`).
    async fn store_of(count: usize) -> MemoryConfigStore {
        let store = MemoryConfigStore::default();
        let items: Vec<ConfigItem> = (0..count)
            .flat_map(|n| {
                let key = format!("key-{n}");
                [
                    item(None, None, &key, "v"),
                    item(Some("g"), None, &key, "g"),
                ]
            })
            .collect();
        store.set(items).await.unwrap_or_else(|e| panic!("{e}"));
        store
    }

    /// The rule before lookups (a walk over every item), kept as the
    /// oracle [`ConfigTable::covered`] must agree with.
    fn covers_by_walk(query: &ConfigQuery, (group, label, key): &ItemId) -> bool {
        (query.keys.is_empty() || query.keys.contains(key))
            && given(query.group.clone()) == *group
            && given(query.label.clone()) == *label
    }

    #[tokio::test]
    async fn a_get_of_three_keys_visits_three_items_not_the_store() {
        let store = store_of(50_000).await;
        assert_eq!(store.len(), 100_000);
        let asked = query(&["key-7", "key-49999", "missing"], None, None);
        let (got, visits) = visits_during(store.get(&asked)).await;
        let keys: Vec<String> = got
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|i| i.key)
            .collect();
        assert_eq!(keys, vec!["key-49999", "key-7"]);
        assert_eq!(visits, 3, "one lookup a key, not a walk of the store");
    }

    #[tokio::test]
    async fn a_delete_of_three_keys_visits_three_items_not_the_store() {
        let store = store_of(50_000).await;
        let doomed = query(&["key-7", "key-49999", "missing"], Some("g"), None);
        let (deleted, visits) = visits_during(store.delete(&doomed)).await;
        deleted.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(visits, 3, "one lookup a key, not a walk of the store");
        assert_eq!(store.len(), 100_000 - 2);
        let left = store
            .get(&query(&["key-7"], None, None))
            .await
            .unwrap_or_default();
        assert_eq!(left.len(), 1, "the default group's key-7 is kept");
    }

    #[tokio::test]
    async fn a_get_without_keys_walks_only_its_group_and_label() {
        let store = store_of(1_000).await;
        let labelled: Vec<ConfigItem> = (0..1_000)
            .map(|n| item(Some("g"), Some("prod"), &format!("key-{n}"), "p"))
            .collect();
        store.set(labelled).await.unwrap_or_else(|e| panic!("{e}"));
        let (got, visits) = visits_during(store.get(&query(&[], Some("g"), None))).await;
        let got = got.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.len(), 1_000);
        assert!(got.iter().all(|i| i.value == "g" && i.label.is_none()));
        assert!(visits <= 1_001, "{visits} items looked at of 3,000");
    }

    /// Lookups cover what the walk covered, in the same order: groups and
    /// labels given, none or empty, keys named twice or not held.
    #[test]
    fn lookups_cover_what_the_walk_covered_in_the_same_order() {
        let mut table = ConfigTable::default();
        for group in [None, Some("g"), Some("h")] {
            for label in [None, Some("prod")] {
                for key in ["a", "b", "c", "ab"] {
                    let id: ItemId = (group.map(Into::into), label.map(Into::into), key.into());
                    table.put(id, "v".into(), HashMap::new());
                }
            }
        }
        let queries = [
            query(&[], None, None),
            query(&[], Some(""), Some("")),
            query(&[], Some("g"), None),
            query(&[], Some("g"), Some("prod")),
            query(&[], Some("zz"), None),
            query(&["b", "a", "b", "zz"], None, None),
            query(&["ab", "c"], Some("h"), Some("prod")),
            query(&["a"], Some(""), Some("prod")),
            query(&["a"], Some("nope"), None),
        ];
        for asked in &queries {
            let walked: Vec<&ItemId> = table
                .items
                .keys()
                .filter(|id| covers_by_walk(asked, id))
                .collect();
            let looked_up: Vec<&ItemId> =
                table.covered(asked).into_iter().map(|(id, _)| id).collect();
            assert_eq!(looked_up, walked, "{asked:?}");
        }
    }
}
