//! Putting one component's previous entry back after a commit: for a
//! component that kept its instance but not the change the reload
//! recorded for it (a staged in-place update that panicked when applied),
//! so what the running set says runs is what runs, and the next reload of
//! the same candidate sees the change again instead of nothing.

use std::sync::Arc;

use super::{Components, Running, RunningLayers, RunningSet, WatchPlan};
use crate::component::ComponentKey;
use crate::config::{DependencyGraph, Layers, ValidConfig};
use crate::handle::Instance;
use crate::redact::HeldSecrets;

impl RunningSet {
    /// Makes `previous` (the entry its key had before the last commit, with
    /// the same instance) the running entry of its key again, and its
    /// declaration that of the running configuration; the layers stay as
    /// committed (a bare file, which is otherwise the running
    /// configuration itself, is kept apart), so they still declare the
    /// change and the next reload laid from them tries it again. No
    /// generation is published (the instance did not change); the watch
    /// plan is, with the values the commit tried for the refs it watched:
    /// a watched value that panicked is asked for again only once the
    /// store's value moves on, or by the next reload (not back to back).
    ///
    /// Refused, with why, when the key no longer runs that instance or the
    /// set is closed, or when the previous declaration's references would
    /// now make a cycle.
    pub(crate) fn restore(&self, previous: Arc<Running>) -> Result<(), String> {
        let key = previous.spec.key.clone();
        let mut state = self.state();
        if state.closed {
            return Err("the runtime is shutting down".to_string());
        }
        let Some(current) = state.components.get(&key) else {
            return Err(format!("{key} no longer runs"));
        };
        if !current
            .assembled
            .instance
            .same_as(&previous.assembled.instance)
        {
            return Err(format!("{key} runs another instance"));
        }
        let same_refs = current.spec.component_refs == previous.spec.component_refs
            && current.spec.secret_refs == previous.spec.secret_refs
            && current.spec.configuration_refs == previous.spec.configuration_refs;
        let mut config = ValidConfig::clone(&state.config);
        config
            .config
            .components
            .insert(key.clone(), Arc::clone(&previous.spec));
        if !same_refs {
            let graph = DependencyGraph::build(&config.config);
            if !graph.cycles().is_empty() {
                return Err(format!(
                    "the previous references of {key} would make a cycle"
                ));
            }
            config.graph = graph;
        }
        if let RunningLayers::FileOnly = state.layers {
            let file = Layers::new(state.config.config.clone());
            state.layers = RunningLayers::Laid(Arc::new(file));
        }
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), previous);
        state.config = Arc::new(config);
        state.components = Arc::new(components);
        let number = self.generation_number();
        let plan = WatchPlan::of(number, &state.config, &state.layers, &state.components);
        // The watch's view of its values stays the commit's: told the old
        // value, it would ask for the one that panicked again at once.
        let plan = plan.keeping_tried(&key, &self.plan.borrow());
        self.plan.send_replace(Arc::new(plan));
        Ok(())
    }

    /// Makes the running entry of `key`, while it runs `instance`, hold
    /// `secrets` too: the values of an update put back but not reverted,
    /// which the instance may still use, stay scrubbed as long as it runs.
    /// Nothing else changes (no generation, no watch plan).
    pub(crate) fn hold_too(&self, key: &ComponentKey, instance: &Instance, secrets: HeldSecrets) {
        let mut state = self.state();
        let Some(current) = state.components.get(key) else {
            return;
        };
        if !current.assembled.instance.same_as(instance) {
            return;
        }
        let mut holding = Running::clone(current);
        holding.assembled.resolved.hold_secrets(secrets);
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), Arc::new(holding));
        state.components = Arc::new(components);
    }
}
