//! A built component, typed by its kind.

use std::sync::Arc;

use crate::component::Component;
use crate::component::{CONFIG_STORE, LOCK, SECRET_STORE, STATE};
use crate::kinds::{ConfigStore, Lock, SecretStore, StateStore};

/// A running component instance, as the trait object of its kind.
#[derive(Clone)]
pub enum Instance {
    /// A `config_store`.
    ConfigStore(Arc<dyn ConfigStore>),
    /// A `secret_store`.
    SecretStore(Arc<dyn SecretStore>),
    /// A `state` store.
    State(Arc<dyn StateStore>),
    /// A `lock`.
    Lock(Arc<dyn Lock>),
    /// A component of a custom kind.
    Custom(Arc<dyn Component>),
}

impl Instance {
    /// The instance as a plain component (lifecycle hooks only).
    pub fn component(&self) -> Arc<dyn Component> {
        match self {
            Instance::ConfigStore(c) => c.clone(),
            Instance::SecretStore(c) => c.clone(),
            Instance::State(c) => c.clone(),
            Instance::Lock(c) => c.clone(),
            Instance::Custom(c) => c.clone(),
        }
    }

    /// Whether this instance is of `kind` (custom instances match any kind
    /// that is not one of the four built-in ones).
    pub fn is_of_kind(&self, kind: &str) -> bool {
        match self {
            Instance::ConfigStore(_) => kind == CONFIG_STORE,
            Instance::SecretStore(_) => kind == SECRET_STORE,
            Instance::State(_) => kind == STATE,
            Instance::Lock(_) => kind == LOCK,
            Instance::Custom(_) => ![CONFIG_STORE, SECRET_STORE, STATE, LOCK].contains(&kind),
        }
    }

    /// Whether two instances are the very same object.
    pub fn same_as(&self, other: &Instance) -> bool {
        std::ptr::addr_eq(
            Arc::as_ptr(&self.component()),
            Arc::as_ptr(&other.component()),
        )
    }

    /// How many holders the instance has (each generation and each loaded
    /// handle counts as one).
    pub fn holders(&self) -> usize {
        // `component()` makes one more holder for the duration of the call.
        Arc::strong_count(&self.component()) - 1
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Instance::ConfigStore(_) => "ConfigStore",
            Instance::SecretStore(_) => "SecretStore",
            Instance::State(_) => "State",
            Instance::Lock(_) => "Lock",
            Instance::Custom(_) => "Custom",
        };
        write!(f, "Instance::{kind}")
    }
}
