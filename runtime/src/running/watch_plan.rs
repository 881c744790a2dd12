//! What the triggers watch: derived from the running set at every commit
//! and handed to them, so they never reach into the runtime.

use serde_json::Value;

use super::Components;
use crate::component::ComponentKey;
use crate::config::{ConfigPatch, ConfigurationRef, Layers, OverlaySpec, SecretRef, ValidConfig};

/// A `watch: true` ref of a running component, and the value the
/// component was started with (it may be a secret: never show it).
#[derive(Clone)]
pub(crate) enum WatchedRef {
    /// A configurationRef: its store is subscribed to.
    Configuration(ComponentKey, ConfigurationRef, Option<Value>),
    /// A secretRef: its store is polled (secret stores cannot notify).
    Secret(ComponentKey, SecretRef, Option<Value>),
}

/// Everything the triggers need to know of the running set.
pub(crate) struct WatchPlan {
    /// The generation serving when the plan was made.
    pub(crate) generation: u64,
    /// The application id (it names the app-specific overlay key).
    pub(crate) app_id: String,
    /// Where the overlay lives, if there is one.
    pub(crate) overlay: Option<OverlaySpec>,
    /// The overlay documents in force: common, then app-specific.
    pub(crate) overlay_in_force: (Option<ConfigPatch>, Option<ConfigPatch>),
    /// Every watched ref.
    pub(crate) refs: Vec<WatchedRef>,
}

impl WatchPlan {
    /// The plan for a running set.
    pub(super) fn of(
        generation: u64,
        config: &ValidConfig,
        layers: &Layers,
        components: &Components,
    ) -> Self {
        let mut refs = Vec::new();
        for (key, running) in components {
            let resolved = &running.assembled.resolved;
            for r in running.spec.configuration_refs.iter().filter(|r| r.watch) {
                let value = resolved.get(&r.inject_as).cloned();
                refs.push(WatchedRef::Configuration(key.clone(), r.clone(), value));
            }
            for r in running.spec.secret_refs.iter().filter(|r| r.watch) {
                let value = resolved.get(&r.inject_as).cloned();
                refs.push(WatchedRef::Secret(key.clone(), r.clone(), value));
            }
        }
        Self {
            generation,
            app_id: config.config.app_id.clone(),
            overlay: config.config.overlay.clone(),
            overlay_in_force: (layers.overlay.clone(), layers.overlay_app.clone()),
            refs,
        }
    }
}
