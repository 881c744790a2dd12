//! The keys of a graph's nodes, held densely so finding one stays in cache
//! however many components there are.

use std::cmp::Ordering;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::component::{ComponentKey, Kind};

/// Every node's key, in key order (node `i` has the `i`-th key): each run
/// of one kind is held once, and every name sits in one string.
///
/// A lookup is a binary search that reads only this table: at ten
/// thousand components it is a few hundred kilobytes, where the keys'
/// own strings (one allocation each, spread over the heap) are not in
/// cache.
#[derive(Debug, Default)]
pub(super) struct KeyTable {
    /// Each kind, with the end of its run of nodes.
    kinds: Vec<(Kind, usize)>,
    /// Every name, one after another.
    names: String,
    /// Where each node's name ends in `names`.
    ends: Vec<usize>,
}

impl KeyTable {
    /// An empty table with room for `keys` keys of `name_bytes` bytes of
    /// names in all.
    pub(super) fn with_capacity(keys: usize, name_bytes: usize) -> Self {
        Self {
            kinds: Vec::new(),
            names: String::with_capacity(name_bytes),
            ends: Vec::with_capacity(keys),
        }
    }

    /// Appends `key`, which orders after every key appended before it.
    pub(super) fn push(&mut self, key: &ComponentKey) {
        debug_assert!(
            self.ends.is_empty()
                || self
                    .compare(self.ends.len() - 1, &key.kind, &key.name)
                    .is_lt(),
            "keys are appended in key order"
        );
        let next = self.ends.len() + 1;
        match self.kinds.last_mut() {
            Some((kind, end)) if *kind == key.kind => *end = next,
            _ => self.kinds.push((key.kind.clone(), next)),
        }
        self.names.push_str(&key.name);
        self.ends.push(self.names.len());
    }

    /// Number of keys.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The key of node `node` (made on demand: the table holds no
    /// `ComponentKey`).
    pub(super) fn key(&self, node: usize) -> ComponentKey {
        ComponentKey {
            kind: self.kind(node).clone(),
            name: self.name(node).into(),
        }
    }

    /// The node of the key `kind`/`name`, if the table has it.
    pub(super) fn find(&self, kind: &Kind, name: &str) -> Option<usize> {
        let run = self
            .kinds
            .binary_search_by(|(run_kind, _)| run_kind.cmp(kind))
            .ok()?;
        let (mut low, mut high) = (self.run_start(run), self.kinds[run].1);
        while low < high {
            let middle = low + (high - low) / 2;
            match self.name(middle).cmp(name) {
                Ordering::Less => low = middle + 1,
                Ordering::Greater => high = middle,
                Ordering::Equal => return Some(middle),
            }
        }
        None
    }

    /// An index that finds keys by hash, for many lookups in a row.
    pub(super) fn index(&self) -> KeyIndex<'_> {
        let hasher = foldhash::fast::RandomState::default();
        let mut nodes = HashTable::with_capacity(self.len());
        for (run, (kind, end)) in self.kinds.iter().enumerate() {
            for node in self.run_start(run)..*end {
                let hash = hasher.hash_one((kind, self.name(node)));
                // Room was made for every key: nothing is rehashed.
                nodes.insert_unique(hash, node, |_| hash);
            }
        }
        KeyIndex {
            table: self,
            nodes,
            hasher,
        }
    }

    fn run_start(&self, run: usize) -> usize {
        run.checked_sub(1).map_or(0, |before| self.kinds[before].1)
    }

    fn kind(&self, node: usize) -> &Kind {
        let run = self.kinds.partition_point(|(_, end)| *end <= node);
        &self.kinds[run].0
    }

    pub(super) fn name(&self, node: usize) -> &str {
        let start = node.checked_sub(1).map_or(0, |before| self.ends[before]);
        &self.names[start..self.ends[node]]
    }

    /// How node `node`'s key orders against `kind`/`name`.
    pub(super) fn compare(&self, node: usize, kind: &Kind, name: &str) -> Ordering {
        self.kind(node)
            .cmp(kind)
            .then_with(|| self.name(node).cmp(name))
    }
}

/// Finds the keys of a [`KeyTable`] by hash: built in one pass over its
/// names (one string), then a lookup is one hash and, mostly, one
/// comparison, where a binary search makes a dozen.
pub(super) struct KeyIndex<'t> {
    table: &'t KeyTable,
    /// Every node, placed by the hash of its key.
    nodes: HashTable<usize>,
    hasher: foldhash::fast::RandomState,
}

impl KeyIndex<'_> {
    /// The node of the key `kind`/`name`, if the table has it.
    pub(super) fn find(&self, kind: &Kind, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one((kind, name));
        self.nodes
            .find(hash, |&node| {
                self.table.name(node) == name && self.table.kind(node) == kind
            })
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_key_it_holds_and_no_other() {
        let mut keys: Vec<ComponentKey> = ["b", "a", "ab", "", "zz"]
            .iter()
            .flat_map(|name| {
                [
                    ComponentKey::new(Kind::State, *name),
                    ComponentKey::new(Kind::parse("acme.widget"), *name),
                    ComponentKey::new(Kind::ConfigStore, *name),
                ]
            })
            .collect();
        keys.sort();
        let mut table = KeyTable::with_capacity(keys.len(), 0);
        for key in &keys {
            table.push(key);
        }
        assert_eq!(table.len(), keys.len());
        let index = table.index();
        for (node, key) in keys.iter().enumerate() {
            assert_eq!(table.key(node), *key);
            assert_eq!(table.find(&key.kind, &key.name), Some(node), "{key}");
            assert_eq!(index.find(&key.kind, &key.name), Some(node), "{key}");
        }
        for (kind, name) in [(Kind::State, "c"), (Kind::Lock, "a"), (Kind::State, "aa")] {
            assert_eq!(table.find(&kind, name), None, "{kind}/{name}");
            assert_eq!(index.find(&kind, name), None, "{kind}/{name}");
        }
        assert_eq!(KeyTable::default().find(&Kind::State, "a"), None);
        assert_eq!(KeyTable::default().index().find(&Kind::State, "a"), None);
    }
}
