//! Component identity: a kind and a name, written `kind/name`.

use std::fmt;

/// Kind of the components that serve configuration (`config_store`).
pub const CONFIG_STORE: &str = "config_store";
/// Kind of the components that serve secrets (`secret_store`).
pub const SECRET_STORE: &str = "secret_store";
/// Kind of state stores (`state`).
pub const STATE: &str = "state";
/// Kind of distributed locks (`lock`).
pub const LOCK: &str = "lock";

/// Identifies one declared component: `state/orders`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentKey {
    /// The component kind (`state`, `config_store`, or any custom kind).
    pub kind: String,
    /// The component name, unique within its kind.
    pub name: String,
}

impl ComponentKey {
    /// Builds a key from a kind and a name.
    pub fn new(kind: impl Into<String>, name: impl Into<String>) -> Self {
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
