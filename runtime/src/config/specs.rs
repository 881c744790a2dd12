//! Every declared component of a configuration, by key, with a digest of
//! each declaration made once: two configurations are then compared by
//! reading two small tables, not every string and map of every component
//! (see [`ConfigDiff`](super::ConfigDiff)). Each declaration is shared:
//! copying a configuration, or starting what it declares, copies none.

use std::collections::btree_map;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::model::ComponentSpec;
use crate::component::ComponentKey;

/// The declared components of a [`Config`](super::Config), by key.
///
/// Reads and writes as the `BTreeMap` it wraps (it dereferences to one).
/// Each declaration is held in an `Arc`, shared by every copy of the
/// configuration and by the component started from it; change one with
/// [`Arc::make_mut`], which copies it only while it is shared.
/// It also keeps a table of every declaration in key order with its
/// digest, made when the map is collected or first compared, and dropped
/// by any write through the map, so it never describes an older
/// declaration.
#[derive(Clone, Default)]
pub struct ComponentSpecs {
    map: BTreeMap<ComponentKey, Arc<ComponentSpec>>,
    table: OnceLock<Arc<Table>>,
}

/// The declarations in key order and the digest of each, side by side:
/// a comparison streams through the digests and reads a declaration only
/// where two differ.
struct Table {
    digests: Box<[Digest]>,
    specs: Box<[Arc<ComponentSpec>]>,
}

impl FromIterator<(Digest, Arc<ComponentSpec>)> for Table {
    fn from_iter<I: IntoIterator<Item = (Digest, Arc<ComponentSpec>)>>(items: I) -> Self {
        let (digests, specs): (Vec<_>, Vec<_>) = items.into_iter().unzip();
        Self {
            digests: digests.into(),
            specs: specs.into(),
        }
    }
}

/// One declaration, digested: its key and everything declared for it,
/// hashed twice with two keys drawn once per process (so no input can be
/// made to collide on purpose). Equal declarations give equal digests;
/// different ones give different digests but for a chance of 2^-128 per
/// pair compared.
pub(crate) type Digest = u128;

impl ComponentSpecs {
    /// The map itself.
    pub fn into_map(self) -> BTreeMap<ComponentKey, Arc<ComponentSpec>> {
        self.map
    }

    /// The digest of every declaration, in key order (made on first use).
    pub(crate) fn digests(&self) -> &[Digest] {
        &self.table().digests
    }

    /// Every declaration in key order, as [`digests`](Self::digests)
    /// (made on first use). A declaration's key is its key in the map.
    pub(crate) fn in_key_order(&self) -> &[Arc<ComponentSpec>] {
        &self.table().specs
    }

    /// [`in_key_order`](Self::in_key_order) if the table is made already.
    pub(crate) fn in_key_order_if_made(&self) -> Option<&[Arc<ComponentSpec>]> {
        self.table.get().map(|table| &*table.specs)
    }

    fn table(&self) -> &Table {
        self.table.get_or_init(|| {
            Arc::new(
                self.map
                    .iter()
                    .map(|(key, spec)| (digest(key, spec), Arc::clone(spec)))
                    .collect(),
            )
        })
    }
}

impl From<BTreeMap<ComponentKey, Arc<ComponentSpec>>> for ComponentSpecs {
    fn from(map: BTreeMap<ComponentKey, Arc<ComponentSpec>>) -> Self {
        Self {
            map,
            table: OnceLock::new(),
        }
    }
}

impl From<BTreeMap<ComponentKey, ComponentSpec>> for ComponentSpecs {
    fn from(map: BTreeMap<ComponentKey, ComponentSpec>) -> Self {
        Self::from(
            map.into_iter()
                .map(|(key, spec)| (key, Arc::new(spec)))
                .collect::<BTreeMap<_, _>>(),
        )
    }
}

impl FromIterator<(ComponentKey, ComponentSpec)> for ComponentSpecs {
    /// Collects the map, each declaration in its own `Arc`, digested as
    /// it passes (as the collection of shared declarations below).
    fn from_iter<I: IntoIterator<Item = (ComponentKey, ComponentSpec)>>(items: I) -> Self {
        items
            .into_iter()
            .map(|(key, spec)| (key, Arc::new(spec)))
            .collect()
    }
}

impl FromIterator<(ComponentKey, Arc<ComponentSpec>)> for ComponentSpecs {
    /// Collects the map; each declaration is digested as it passes, while
    /// it is still in cache. The table is kept when the items came in key
    /// order, once each (as from another map).
    fn from_iter<I: IntoIterator<Item = (ComponentKey, Arc<ComponentSpec>)>>(items: I) -> Self {
        let mut table = Vec::new();
        let items: Vec<(ComponentKey, Arc<ComponentSpec>)> = items
            .into_iter()
            .inspect(|(key, spec)| table.push((digest(key, spec), Arc::clone(spec))))
            .collect();
        let in_order = items.windows(2).all(|pair| pair[0].0 < pair[1].0);
        let specs = Self::from(items.into_iter().collect::<BTreeMap<_, _>>());
        if in_order {
            let _ = specs.table.set(Arc::new(table.into_iter().collect()));
        }
        specs
    }
}

impl Deref for ComponentSpecs {
    type Target = BTreeMap<ComponentKey, Arc<ComponentSpec>>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl DerefMut for ComponentSpecs {
    /// The map, to change: the table is dropped (made again when next
    /// compared), and with it its share of every declaration.
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.table.take();
        &mut self.map
    }
}

impl std::fmt::Debug for ComponentSpecs {
    /// As the map: the table is an internal cache.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.map.fmt(f)
    }
}

impl PartialEq for ComponentSpecs {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl IntoIterator for ComponentSpecs {
    type Item = (ComponentKey, Arc<ComponentSpec>);
    type IntoIter = btree_map::IntoIter<ComponentKey, Arc<ComponentSpec>>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
    }
}

impl<'a> IntoIterator for &'a ComponentSpecs {
    type Item = (&'a ComponentKey, &'a Arc<ComponentSpec>);
    type IntoIter = btree_map::Iter<'a, ComponentKey, Arc<ComponentSpec>>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

/// The process's two hash keys (random, drawn once).
fn hashers() -> &'static (std::hash::RandomState, std::hash::RandomState) {
    static KEYS: OnceLock<(std::hash::RandomState, std::hash::RandomState)> = OnceLock::new();
    KEYS.get_or_init(|| (std::hash::RandomState::new(), std::hash::RandomState::new()))
}

/// The digest of one declaration.
fn digest(key: &ComponentKey, spec: &ComponentSpec) -> Digest {
    let (first, second) = hashers();
    let (mut low, mut high) = (first.build_hasher(), second.build_hasher());
    hash_declaration(key, spec, &mut low);
    hash_declaration(key, spec, &mut high);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

fn hash_declaration<H: Hasher>(key: &ComponentKey, spec: &ComponentSpec, hasher: &mut H) {
    key.hash(hasher);
    spec.type_name.hash(hasher);
    hash_object(&spec.metadata, hasher);
    spec.component_refs.len().hash(hasher);
    for r in &spec.component_refs {
        r.key.hash(hasher);
    }
    spec.secret_refs.hash(hasher);
    spec.configuration_refs.hash(hasher);
    spec.scopes.hash(hasher);
}

fn hash_object<H: Hasher>(map: &serde_json::Map<String, Value>, hasher: &mut H) {
    map.len().hash(hasher);
    for (field, value) in map {
        field.hash(hasher);
        hash_value(value, hasher);
    }
}

/// Hashes a JSON value: every variant tagged, numbers by their exact
/// representation (an integer and a float are different values, as
/// `serde_json` compares them).
fn hash_value<H: Hasher>(value: &Value, hasher: &mut H) {
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => {
            2u8.hash(hasher);
            if let Some(u) = n.as_u64() {
                (0u8, u).hash(hasher);
            } else if let Some(i) = n.as_i64() {
                (1u8, i).hash(hasher);
            } else {
                (2u8, n.as_f64().map(f64::to_bits)).hash(hasher);
            }
        }
        Value::String(text) => (3u8, text).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            for item in items {
                hash_value(item, hasher);
            }
        }
        Value::Object(map) => {
            5u8.hash(hasher);
            hash_object(map, hasher);
        }
    }
}

#[cfg(test)]
mod tests;
