//! A built component, typed by its kind.

use std::sync::Arc;

use crate::component::Component;
use crate::component::Kind;
use crate::kinds::{ConfigStore, FileStore, Lock, PubSub, SecretStore, Sequencer, StateStore};

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
    /// A `sequencer`.
    Sequencer(Arc<dyn Sequencer>),
    /// A `file` store.
    File(Arc<dyn FileStore>),
    /// A `pubsub` broker.
    PubSub(Arc<dyn PubSub>),
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
            Instance::Sequencer(c) => c.clone(),
            Instance::File(c) => c.clone(),
            Instance::PubSub(c) => c.clone(),
            Instance::Custom(c) => c.clone(),
        }
    }

    /// The kind this instance serves; `None` for a custom instance, which
    /// serves whatever custom kind it was declared as.
    pub fn built_in_kind(&self) -> Option<Kind> {
        match self {
            Instance::ConfigStore(_) => Some(Kind::ConfigStore),
            Instance::SecretStore(_) => Some(Kind::SecretStore),
            Instance::State(_) => Some(Kind::State),
            Instance::Lock(_) => Some(Kind::Lock),
            Instance::Sequencer(_) => Some(Kind::Sequencer),
            Instance::File(_) => Some(Kind::File),
            Instance::PubSub(_) => Some(Kind::PubSub),
            Instance::Custom(_) => None,
        }
    }

    /// Whether this instance is of `kind` (custom instances match any kind
    /// that is not one of the built-in ones).
    pub fn is_of_kind(&self, kind: &Kind) -> bool {
        match self.built_in_kind() {
            Some(own) => own == *kind,
            None => matches!(kind, Kind::Custom(_)),
        }
    }

    /// Whether two instances are the very same object.
    pub fn same_as(&self, other: &Instance) -> bool {
        std::ptr::eq(self.address(), other.address())
    }

    /// Where the object lives (no reference count taken).
    fn address(&self) -> *const () {
        match self {
            Instance::ConfigStore(c) => Arc::as_ptr(c).cast(),
            Instance::SecretStore(c) => Arc::as_ptr(c).cast(),
            Instance::State(c) => Arc::as_ptr(c).cast(),
            Instance::Lock(c) => Arc::as_ptr(c).cast(),
            Instance::Sequencer(c) => Arc::as_ptr(c).cast(),
            Instance::File(c) => Arc::as_ptr(c).cast(),
            Instance::PubSub(c) => Arc::as_ptr(c).cast(),
            Instance::Custom(c) => Arc::as_ptr(c).cast(),
        }
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
            Instance::Sequencer(_) => "Sequencer",
            Instance::File(_) => "File",
            Instance::PubSub(_) => "PubSub",
            Instance::Custom(_) => "Custom",
        };
        write!(f, "Instance::{kind}")
    }
}
