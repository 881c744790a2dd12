//! What a generation's components are read from: a map of its own, or a
//! map its owner already keeps, shared as it is (publishing a large
//! running set then copies nothing).

use std::collections::BTreeMap;
use std::fmt::Debug;

use super::Instance;
use crate::component::ComponentKey;

/// The components of a generation: each key's instance and configured
/// `type`.
pub(crate) trait Members: Debug + Send + Sync {
    /// The instance of `key`.
    fn instance(&self, key: &ComponentKey) -> Option<&Instance>;
    /// The configured `type` of `key` (empty when not described).
    fn type_name(&self, key: &ComponentKey) -> Option<&str>;
    /// Every component, in key order.
    fn each(&self) -> Box<dyn Iterator<Item = (&ComponentKey, &Instance)> + '_>;
    /// Number of components.
    fn count(&self) -> usize;
}

/// One component of a generation that owns its map.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) instance: Instance,
    /// Its `type`, as configured (empty in a staged generation).
    pub(crate) type_name: String,
}

impl Members for BTreeMap<ComponentKey, Entry> {
    fn instance(&self, key: &ComponentKey) -> Option<&Instance> {
        self.get(key).map(|entry| &entry.instance)
    }

    fn type_name(&self, key: &ComponentKey) -> Option<&str> {
        self.get(key).map(|entry| entry.type_name.as_str())
    }

    fn each(&self) -> Box<dyn Iterator<Item = (&ComponentKey, &Instance)> + '_> {
        Box::new(self.iter().map(|(key, entry)| (key, &entry.instance)))
    }

    fn count(&self) -> usize {
        self.len()
    }
}
