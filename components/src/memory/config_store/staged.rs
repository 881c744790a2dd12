//! What a get reads while a reload prepares a staged change of the
//! store's `items`: the items as they will be once the change is applied
//! ([`ConfigTable::reseed`]), worked out for the items asked for from the
//! live table and the staged seed, without copying the table. The work,
//! done under the table's lock, is about the keys asked for and the seeded
//! items, not about how many the store holds.

use std::collections::{BTreeMap, BTreeSet};

use rewire_runtime::{ConfigItem, ConfigQuery};

use super::selection::visited;
use super::{given, plain_id, to_item, ConfigTable, InitialItems, ItemId, Stored};

/// What reseeding makes of one seeded key (an item without group or
/// label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeedChange<'a> {
    /// Set to `value` (no metadata) with `version`.
    Set { value: &'a str, version: u64 },
    /// Deleted: it still held the value seeded before, and the new seed
    /// drops it.
    Removed,
}

impl ConfigTable {
    /// The items [`ConfigTable::covered`] would give for `query` once the
    /// table is reseeded with `staged`, as a get answers them (same values,
    /// versions and order), computed without reseeding (or copying) the
    /// table.
    ///
    /// Reseeding only touches items without group or label: a query of
    /// another group or label reads the live items; one of the default
    /// scope reads them with the seed's changes of the keys it asks for
    /// (all of them when it names none) laid over.
    pub(super) fn covered_as_seeded(
        &self,
        query: &ConfigQuery,
        staged: &InitialItems,
    ) -> Vec<ConfigItem> {
        let live = self.covered(query);
        let default_scope =
            given(query.group.clone()).is_none() && given(query.label.clone()).is_none();
        if !default_scope {
            return live
                .into_iter()
                .map(|(id, stored)| to_item(id, stored))
                .collect();
        }
        let changes = self.seed_changes(staged);
        let asked: BTreeSet<&str> = query.keys.iter().map(String::as_str).collect();
        let relevant = changes
            .into_iter()
            .filter(|(key, _)| asked.is_empty() || asked.contains(key));
        laid_over(live, relevant)
    }

    /// What [`ConfigTable::reseed`] with `staged` would change, by key,
    /// following its rules: a key whose staged value differs from the one
    /// seeded last (or that is new) is set, with the versions it would
    /// take (one after another, in key order, after the last given); a key
    /// seeded last, dropped from `staged`, whose item still holds the
    /// seeded value is deleted. Everything else is kept.
    fn seed_changes<'a>(&'a self, staged: &'a InitialItems) -> BTreeMap<&'a str, SeedChange<'a>> {
        let mut changes = BTreeMap::new();
        let mut version = self.last_version;
        for (key, value) in &staged.0 {
            if self.seeded.0.get(key) != Some(value) {
                version += 1;
                let value = value.as_str();
                changes.insert(key.as_str(), SeedChange::Set { value, version });
            }
        }
        for (key, seeded) in &self.seeded.0 {
            if staged.0.contains_key(key) {
                continue;
            }
            visited();
            let untouched = self
                .items
                .get(&plain_id(key))
                .is_some_and(|stored| &stored.value == seeded);
            if untouched {
                changes.insert(key.as_str(), SeedChange::Removed);
            }
        }
        changes
    }
}

/// `live` (items of the default scope, ordered by key) with `changes`
/// (ordered by key) laid over: a set key replaces the live item or joins
/// in its place, a removed one is left out.
fn laid_over<'a>(
    live: Vec<(&ItemId, &Stored)>,
    changes: impl Iterator<Item = (&'a str, SeedChange<'a>)>,
) -> Vec<ConfigItem> {
    let mut changes = changes.peekable();
    let mut items = Vec::with_capacity(live.len());
    for (id, stored) in live {
        let key = id.2.as_str();
        while let Some((before, change)) = changes.next_if(|(changed, _)| *changed < key) {
            items.extend(seeded_item(before, change));
        }
        match changes.next_if(|(changed, _)| *changed == key) {
            Some((_, change)) => items.extend(seeded_item(key, change)),
            None => items.push(to_item(id, stored)),
        }
    }
    items.extend(changes.filter_map(|(key, change)| seeded_item(key, change)));
    items
}

/// The item `change` leaves at `key`, as [`ConfigTable::reseed`] would
/// store it (no group, label or metadata); none when it removes it.
fn seeded_item(key: &str, change: SeedChange<'_>) -> Option<ConfigItem> {
    match change {
        SeedChange::Set { value, version } => Some(ConfigItem {
            key: key.to_string(),
            value: value.to_string(),
            version: version.to_string(),
            ..ConfigItem::default()
        }),
        SeedChange::Removed => None,
    }
}

#[cfg(test)]
mod tests;
