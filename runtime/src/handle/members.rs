//! What a generation's components are read from: a map of its own, or a
//! map its owner already keeps, shared as it is (publishing a large
//! running set then copies nothing).

use std::collections::BTreeMap;
use std::fmt::Debug;

use super::Instance;
use crate::component::{ComponentKey, KeyParts};

/// The components of a generation: each key's instance and configured
/// `type`.
pub(crate) trait Members: Debug + Send + Sync {
    /// The instance of `key`.
    fn instance(&self, key: &dyn KeyParts) -> Option<&Instance>;
    /// [`instance`](Self::instance) of a whole key: a map keyed by
    /// `ComponentKey` compares it directly, without a call through the
    /// parts' table per comparison.
    fn instance_of(&self, key: &ComponentKey) -> Option<&Instance> {
        self.instance(key)
    }
    /// The configured `type` of `key` (none when not described).
    fn type_name(&self, key: &dyn KeyParts) -> Option<&str>;
    /// Every component, in key order.
    fn each(&self) -> Box<dyn Iterator<Item = (&ComponentKey, &Instance)> + '_>;
    /// Number of components.
    fn count(&self) -> usize;
}

/// A generation's own map (a staged or an empty generation): instances
/// with no configured type to describe.
impl Members for BTreeMap<ComponentKey, Instance> {
    fn instance(&self, key: &dyn KeyParts) -> Option<&Instance> {
        self.get(key)
    }

    fn instance_of(&self, key: &ComponentKey) -> Option<&Instance> {
        self.get(key)
    }

    fn type_name(&self, _key: &dyn KeyParts) -> Option<&str> {
        None
    }

    fn each(&self) -> Box<dyn Iterator<Item = (&ComponentKey, &Instance)> + '_> {
        Box::new(self.iter())
    }

    fn count(&self) -> usize {
        self.len()
    }
}
