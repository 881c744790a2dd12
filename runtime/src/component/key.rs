//! Component identity: a kind and a name, written `kind/name`.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use super::Kind;

/// Identifies one declared component: `state/orders`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentKey {
    /// The component kind (`state`, `config_store`, or any custom kind).
    pub kind: Kind,
    /// The component name, unique within its kind.
    /// Shared: a copy of the key costs a reference count, not a string.
    pub name: Arc<str>,
}

impl ComponentKey {
    /// Builds a key from a kind (a [`Kind`] or its spelling) and a name.
    pub fn new(kind: impl Into<Kind>, name: impl AsRef<str>) -> Self {
        Self {
            kind: kind.into(),
            name: Arc::from(name.as_ref()),
        }
    }
}

impl fmt::Display for ComponentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// A key's kind and name, however they are held: a map keyed by
/// [`ComponentKey`] is searched with a borrowed [`KeyRef`] through it,
/// without building (and allocating) a key per lookup.
pub(crate) trait KeyParts {
    /// The kind and the name.
    fn parts(&self) -> (&Kind, &str);
}

impl KeyParts for ComponentKey {
    fn parts(&self) -> (&Kind, &str) {
        (&self.kind, &self.name)
    }
}

/// A key made of borrowed parts, for lookups.
pub(crate) struct KeyRef<'a> {
    /// The kind.
    pub kind: &'a Kind,
    /// The name.
    pub name: &'a str,
}

impl KeyParts for KeyRef<'_> {
    fn parts(&self) -> (&Kind, &str) {
        (self.kind, self.name)
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for ComponentKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

// Ordered and compared as `ComponentKey` is (kind, then name), so a map's
// order holds for both.
impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl PartialOrd for dyn KeyParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn KeyParts + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts().cmp(&other.parts())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_borrowed_key_finds_what_the_owned_key_finds() {
        let keys = [
            ComponentKey::new(Kind::State, "b"),
            ComponentKey::new(Kind::State, "a"),
            ComponentKey::new(Kind::Lock, "a"),
            ComponentKey::new("zz_custom", "a"),
            ComponentKey::new(Kind::ConfigStore, "state"),
        ];
        let map: BTreeMap<ComponentKey, usize> = keys
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, k)| (k, i))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let borrowed = KeyRef {
                kind: &key.kind,
                name: &key.name,
            };
            assert_eq!(map.get(&borrowed as &dyn KeyParts), Some(&i), "{key}");
        }
        let absent = KeyRef {
            kind: &Kind::State,
            name: "c",
        };
        assert_eq!(map.get(&absent as &dyn KeyParts), None);
        // The two orders agree on every pair.
        for x in &keys {
            for y in &keys {
                let (bx, by): (&dyn KeyParts, &dyn KeyParts) = (x, y);
                assert_eq!(x.cmp(y), bx.cmp(by), "{x} vs {y}");
            }
        }
    }
}
