//! Component identity: a kind and a name, written `kind/name`.

use std::fmt;

use super::Kind;

/// Identifies one declared component: `state/orders`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentKey {
    /// The component kind (`state`, `config_store`, or any custom kind).
    pub kind: Kind,
    /// The component name, unique within its kind.
    pub name: String,
}

impl ComponentKey {
    /// Builds a key from a kind (a [`Kind`] or its spelling) and a name.
    pub fn new(kind: impl Into<Kind>, name: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ComponentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}
