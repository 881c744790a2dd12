//! What the triggers watch: derived from the running set at every commit
//! and handed to them, so they never reach into the runtime.

use serde_json::Value;

use super::{Components, RunningLayers};
use crate::component::ComponentKey;
use crate::config::{ConfigPatch, InjectedRef, OverlaySpec, ValidConfig};

/// A `watch: true` ref of a running component, and the value the
/// component was started with (it may be a secret: never show it).
#[derive(Clone, PartialEq)]
pub(crate) struct WatchedRef {
    /// The component to re-apply when the value changes.
    pub(crate) component: ComponentKey,
    /// The ref.
    pub(crate) reference: InjectedRef,
    /// The value the component was started with.
    pub(crate) resolved: Option<Value>,
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
    /// Whether `other` watches the same things the same way (any field of
    /// a ref — `watch`, `store`, `injectAs`, the key — or of the overlay):
    /// if not, the watches must be rebuilt even when no instance changed.
    pub(crate) fn watches_as(&self, other: &WatchPlan) -> bool {
        self.app_id == other.app_id && self.overlay == other.overlay && self.refs == other.refs
    }

    /// Takes, for `component`'s refs that `published` watched too, the
    /// values `published` had for them: after a put-back, the value the
    /// commit tried stays the one the watch takes as asked for, so it
    /// does not ask for it again at once (a later value still asks).
    pub(super) fn keeping_tried(mut self, component: &ComponentKey, published: &WatchPlan) -> Self {
        for watched in self.refs.iter_mut().filter(|w| w.component == *component) {
            let tried = published
                .refs
                .iter()
                .find(|p| p.component == watched.component && p.reference == watched.reference);
            if let Some(tried) = tried {
                watched.resolved = tried.resolved.clone();
            }
        }
        self
    }

    /// The plan for a running set.
    pub(super) fn of(
        generation: u64,
        config: &ValidConfig,
        layers: &RunningLayers,
        components: &Components,
    ) -> Self {
        let mut refs = Vec::new();
        for (key, running) in components.watching() {
            for reference in running.spec.injected_refs().filter(InjectedRef::watch) {
                refs.push(WatchedRef {
                    component: key.clone(),
                    resolved: running
                        .assembled
                        .resolved
                        .get(reference.inject_as())
                        .cloned(),
                    reference,
                });
            }
        }
        Self {
            generation,
            app_id: config.config.app_id.clone(),
            overlay: config.config.overlay.clone(),
            overlay_in_force: layers.overlays(),
            refs,
        }
    }
}
