//! One call's view of the runtime: the generation serving when the call
//! came in (loaded once and used throughout, so a call sees one consistent
//! component set even while a reload swaps instances), the store it found,
//! and the runtime's secret scrubbing.

use std::sync::{Arc, OnceLock};

use rewire_runtime::{ComponentKey, Generation, Instance, Kind, Runtime};

/// The store a call used, for its request metric. Set once the store is
/// found in the generation, so a caller naming random stores cannot grow the
/// metric without bound: an unknown store leaves it empty.
#[derive(Debug, Clone, Default)]
pub struct StoreLabel(Arc<OnceLock<String>>);

impl StoreLabel {
    /// Records the store the call uses (the first one set wins).
    pub fn set(&self, store: &str) {
        let _ = self.0.set(store.to_string());
    }

    /// The store recorded, or `""`.
    pub fn get(&self) -> &str {
        self.0.get().map_or("", String::as_str)
    }
}

/// One call's view of the runtime.
#[derive(Clone)]
pub struct Call {
    generation: Arc<Generation>,
    runtime: Runtime,
    label: StoreLabel,
}

impl Call {
    /// A call on the generation `runtime` serves now; the store it finds is
    /// recorded in `label`.
    pub fn new(runtime: &Runtime, label: StoreLabel) -> Self {
        Self {
            generation: runtime.generation(),
            runtime: runtime.clone(),
            label,
        }
    }

    /// The generation the whole call uses.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }

    /// The runtime served.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Records `store` as the call's store (the first one set wins). Only
    /// names of running components should be set.
    pub fn label(&self, store: &str) {
        self.label.set(store);
    }

    /// `text` with every secret value the runtime has seen replaced.
    pub fn scrub(&self, text: &str) -> String {
        self.runtime.redact(text)
    }

    /// The instance `kind/name` of the call's generation; labels the call
    /// with `name` when found.
    pub(super) fn instance(&self, kind: Kind, name: &str) -> Option<&Instance> {
        let key = ComponentKey::new(kind, name);
        let instance = self.generation.get(&key)?;
        self.label(name);
        crate::telemetry::propagation::record_component(
            &key,
            self.generation.type_name(&key).unwrap_or_default(),
        );
        Some(instance)
    }
}
