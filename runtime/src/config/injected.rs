//! secretRef and configurationRef seen as one thing: a value read from a
//! store and injected into a metadata field. Code that treats both alike
//! (graph, validation, start, watches, status) goes through
//! [`InjectedRef`]; only reading the value differs.

use super::model::{ComponentSpec, ConfigurationRef, SecretRef};
use crate::component::{ComponentKey, Kind};

/// One secretRef or configurationRef of a component, with its position in
/// its own list (`secretRef[1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectedRef {
    /// A secretRef.
    Secret(usize, SecretRef),
    /// A configurationRef.
    Configuration(usize, ConfigurationRef),
}

impl InjectedRef {
    /// The store it reads from.
    pub fn store(&self) -> ComponentKey {
        ComponentKey::new(self.store_kind(), self.store_name())
    }

    /// The kind of the store it reads from.
    pub fn store_kind(&self) -> Kind {
        match self {
            InjectedRef::Secret(..) => Kind::SecretStore,
            InjectedRef::Configuration(..) => Kind::ConfigStore,
        }
    }

    /// The store's name.
    pub fn store_name(&self) -> &str {
        match self {
            InjectedRef::Secret(_, r) => &r.store,
            InjectedRef::Configuration(_, r) => &r.store,
        }
    }

    /// The metadata field it fills.
    pub fn inject_as(&self) -> &str {
        match self {
            InjectedRef::Secret(_, r) => &r.inject_as,
            InjectedRef::Configuration(_, r) => &r.inject_as,
        }
    }

    /// Whether the component is re-applied when the value changes.
    pub fn watch(&self) -> bool {
        match self {
            InjectedRef::Secret(_, r) => r.watch,
            InjectedRef::Configuration(_, r) => r.watch,
        }
    }

    /// Where it is declared, as problems name it: `secretRef[0]`.
    pub fn position(&self) -> String {
        match self {
            InjectedRef::Secret(i, _) => format!("secretRef[{i}]"),
            InjectedRef::Configuration(i, _) => format!("configurationRef[{i}]"),
        }
    }
}

impl ComponentSpec {
    /// Every secretRef, then every configurationRef.
    pub fn injected_refs(&self) -> impl Iterator<Item = InjectedRef> + '_ {
        let secrets = self.secret_refs.iter().enumerate();
        let configuration = self.configuration_refs.iter().enumerate();
        secrets
            .map(|(i, r)| InjectedRef::Secret(i, r.clone()))
            .chain(configuration.map(|(i, r)| InjectedRef::Configuration(i, r.clone())))
    }
}
