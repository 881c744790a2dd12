//! Putting one component's previous entry back after a commit: for a
//! component that kept its instance but not the change the reload
//! recorded for it (a staged in-place update that panicked when applied),
//! so what the running set says runs is what runs, and the next reload of
//! the same candidate sees the change again instead of nothing. And, after
//! a reload that rolled back, recording an update it could not undo
//! ([`RunningSet::keep_tried`]).

use std::sync::Arc;

use super::{Components, Mark, Running, RunningLayers, RunningSet, WatchPlan};
use crate::component::ComponentKey;
use crate::config::{ComponentSpec, DependencyGraph, ValidConfig};
use crate::handle::Instance;
use crate::metadata::Metadata;
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
    /// `previous_mark`: `previous` was itself not what its declaration
    /// says before the reload (marked, see [`Self::keep_new_refs`]); it is
    /// marked again so (the caller counts the failed retry in it), since
    /// the commit that tried its update cleared the mark and the layers
    /// may declare exactly what it declares.
    ///
    /// Refused, with why, when the key no longer runs that instance or the
    /// set is closed. Refused too when the previous declaration references
    /// a component that no longer runs (a ref store the same reload
    /// removed: the running configuration would name a store that is
    /// gone) or when its references would now make a cycle; then what is
    /// recorded still matches what runs (see [`Self::keep_new_refs`]).
    pub(crate) fn restore(
        &self,
        previous: Arc<Running>,
        previous_mark: Option<Mark>,
    ) -> Result<(), String> {
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
        let gone: Vec<String> = previous
            .spec
            .dependencies()
            .into_iter()
            .filter(|dependency| state.components.get(dependency).is_none())
            .map(|dependency| dependency.to_string())
            .collect();
        if !gone.is_empty() {
            let why = format!(
                "the previous references of {key} name what no longer runs: {}",
                gone.join(", ")
            );
            drop(state);
            return Err(self.keep_new_refs(previous, why, previous_mark));
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
                let why = format!("the previous references of {key} would make a cycle");
                drop(state);
                return Err(self.keep_new_refs(previous, why, previous_mark));
            }
            config.graph = graph;
        }
        if let RunningLayers::FileOnly(_) = state.layers {
            let file = state.layers.whole(&state.config.config);
            state.layers = RunningLayers::Laid(Arc::new(file));
        }
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), previous);
        state.config = Arc::new(config);
        state.components = Arc::new(components);
        if let Some(mark) = previous_mark {
            // Whatever marked it before, its entry is now its previous one.
            state.not_as_declared.insert(key.clone(), mark.put_back());
        }
        self.publish_plan_keeping_tried(&state, &key);
        Ok(())
    }

    /// When the previous declaration cannot be put back (`why`): the
    /// running entry keeps the committed declaration's references (what
    /// still runs) with the previous metadata as declared, and the
    /// previous assembled metadata (what the instance was given back, so
    /// its old secret values stay held). What is recorded is what runs,
    /// but not what its declaration says: the new references serve other
    /// values than those it runs with, and when only a reference moved,
    /// the declaration is the one the layers declare, so a diff sees no
    /// change. The component is marked not as declared (with
    /// `previous_mark`, when `previous` was marked already): the next
    /// reload re-resolves it and applies the update again, whatever it
    /// changes, and its commit clears the mark, until its retries failed
    /// too often in a row (see [`Mark::forces`]): then only a reload that
    /// names it does. Returns `why`, saying so.
    fn keep_new_refs(
        &self,
        previous: Arc<Running>,
        why: String,
        previous_mark: Option<Mark>,
    ) -> String {
        let key = previous.spec.key.clone();
        let mut state = self.state();
        let current = match state.components.get(&key) {
            Some(current) if !state.closed => Arc::clone(current),
            _ => return why,
        };
        if !current
            .assembled
            .instance
            .same_as(&previous.assembled.instance)
        {
            return why;
        }
        let spec = ComponentSpec {
            metadata: previous.spec.metadata.clone(),
            ..ComponentSpec::clone(&current.spec)
        };
        let spec = Arc::new(spec);
        let mut config = ValidConfig::clone(&state.config);
        config
            .config
            .components
            .insert(key.clone(), Arc::clone(&spec));
        if let RunningLayers::FileOnly(_) = state.layers {
            let file = state.layers.whole(&state.config.config);
            state.layers = RunningLayers::Laid(Arc::new(file));
        }
        let kept = Running {
            spec,
            assembled: previous.assembled.clone(),
        };
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), Arc::new(kept));
        state.config = Arc::new(config);
        state.components = Arc::new(components);
        let mark = previous_mark.map(Mark::put_back).unwrap_or_default();
        state.not_as_declared.insert(key.clone(), mark);
        self.publish_plan_keeping_tried(&state, &key);
        let retried = match mark.forces() {
            true => "the next reload applies the update again".to_string(),
            false => format!("it is not as declared: {}", mark.retried()),
        };
        format!(
            "{why}; the running declaration of {key} is the new one, its metadata the previous (what runs), and {retried}"
        )
    }

    /// Publishes the watch plan of `state`, keeping the values the commit
    /// tried for `key`'s refs: told the old value, the watch would ask for
    /// the one that panicked again at once.
    fn publish_plan_keeping_tried(&self, state: &super::State, key: &ComponentKey) {
        let number = self.generation_number();
        let plan = WatchPlan::of(number, &state.config, &state.layers, &state.components);
        let plan = plan.keeping_tried(key, &self.plan.borrow());
        self.plan.send_replace(Arc::new(plan));
    }

    /// After a reload that rolled back could not re-apply the previous
    /// metadata of `key`'s in-place update on `instance`: records its
    /// entry as running `tried` (the metadata the update tried, its secret
    /// values held with it), still holding the values it ran with before
    /// (the instance may use part of each), under the declaration in
    /// force, and marks it not as declared (its mark's failed retries
    /// kept, if it had one). So what is recorded is what may run, and the
    /// next reload re-resolves it and applies its declaration again, even
    /// one of the very configuration that runs (a diff sees no change).
    /// No generation is published (the instance did not change), nor a
    /// watch plan. Returns whether it was recorded: not once the set is
    /// closed, nor when the key no longer runs `instance`.
    pub(crate) fn keep_tried(
        &self,
        key: &ComponentKey,
        instance: &Instance,
        tried: Metadata,
    ) -> bool {
        let mut state = self.state();
        if state.closed {
            return false;
        }
        let Some(current) = state.components.get(key) else {
            return false;
        };
        if !current.assembled.instance.same_as(instance) {
            return false;
        }
        let mut kept = Running::clone(current);
        let ran = kept.assembled.resolved.held_secrets();
        kept.assembled.resolved = tried;
        kept.assembled.resolved.hold_secrets(ran);
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), Arc::new(kept));
        state.components = Arc::new(components);
        let mark = state.not_as_declared.get(key).unwrap_or_default();
        state.not_as_declared.insert(key.clone(), mark.unreverted());
        true
    }

    /// Makes the running entry of `key`, while it runs `instance`, hold
    /// `secrets` too: the values of an update being put back, which the
    /// instance may use until its revert answers (and after, should it
    /// fail), stay scrubbed meanwhile. Nothing else changes (no
    /// generation, no watch plan). Returns what [`Self::let_go`] takes to
    /// let go of them once the revert succeeded; `None` when the key no
    /// longer runs `instance`.
    pub(crate) fn hold_too(
        &self,
        key: &ComponentKey,
        instance: &Instance,
        secrets: HeldSecrets,
    ) -> Option<HeldToo> {
        let mut state = self.state();
        let current = state.components.get(key)?;
        if !current.assembled.instance.same_as(instance) {
            return None;
        }
        let before = Arc::clone(current);
        let mut holding = Running::clone(current);
        holding.assembled.resolved.hold_secrets(secrets);
        let holding = Arc::new(holding);
        let mut components = Components::clone(&state.components);
        components.insert(key.clone(), Arc::clone(&holding));
        state.components = Arc::new(components);
        Some(HeldToo { before, holding })
    }

    /// Lets go of what [`Self::hold_too`] added (the revert it waited for
    /// succeeded): its key's entry is the one before again, unless the
    /// entry changed since (then it is left as it is).
    pub(crate) fn let_go(&self, held: HeldToo) {
        let HeldToo { before, holding } = held;
        let key = before.spec.key.clone();
        let mut state = self.state();
        let Some(current) = state.components.get(&key) else {
            return;
        };
        if !Arc::ptr_eq(current, &holding) {
            return;
        }
        let mut components = Components::clone(&state.components);
        components.insert(key, before);
        state.components = Arc::new(components);
    }
}

/// An entry [`RunningSet::hold_too`] made hold more values, and the entry
/// before, for [`RunningSet::let_go`].
pub(crate) struct HeldToo {
    before: Arc<Running>,
    holding: Arc<Running>,
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::assemble::StartTimeouts;
    use crate::component::Component;
    use crate::config::{parse, validate};
    use crate::kinds::{SecretError, SecretMap, SecretStore, SecretString};
    use crate::redact::Redactor;
    use crate::registry::{Buildable, ComponentDescriptor, Inject, Registry};
    use crate::reload::tests::any_metadata;
    use crate::running::Commit;

    /// A secret store serving `pw` for every secret.
    struct Vault;

    #[async_trait]
    impl Component for Vault {}

    #[async_trait]
    impl SecretStore for Vault {
        async fn get_secret(
            &self,
            name: &str,
            _: &HashMap<String, String>,
        ) -> Result<SecretMap, SecretError> {
            Ok(SecretMap::from([(
                name.to_string(),
                SecretString::new("pw"),
            )]))
        }

        async fn bulk_get_secret(
            &self,
            _: &HashMap<String, String>,
        ) -> Result<BTreeMap<String, SecretMap>, SecretError> {
            Ok(BTreeMap::new())
        }
    }

    impl Inject for Vault {}

    impl Buildable for Vault {
        fn into_instance(self: Box<Self>) -> Instance {
            Instance::SecretStore(Arc::new(*self))
        }
    }

    /// Uses what it is given.
    struct User;

    #[async_trait]
    impl Component for User {}

    impl Inject for User {}

    impl Buildable for User {
        fn into_instance(self: Box<Self>) -> Instance {
            Instance::Custom(Arc::new(*self))
        }
    }

    fn registry() -> Registry {
        let mut registry = Registry::default();
        registry.register(ComponentDescriptor {
            kind: "secret_store",
            type_name: "vault",
            description: "",
            example_metadata: "{}",
            validate: any_metadata,
            build: |_| Ok(Box::new(Vault)),
            check_refs: None,
            in_place: None,
        });
        registry.register(ComponentDescriptor {
            kind: "custom",
            type_name: "user",
            description: "",
            example_metadata: "{}",
            validate: any_metadata,
            build: |_| Ok(Box::new(User)),
            check_refs: None,
            in_place: None,
        });
        registry
    }

    /// `custom/user`, reading `secret_store/vault` through a secretRef
    /// when `with_vault`; without it, neither the store nor the ref.
    fn config(with_vault: bool, registry: &Registry) -> ValidConfig {
        let text = match with_vault {
            true => json!({"components": {
                "secret_store": {"vault": {"type": "vault"}},
                "custom": {"user": {"type": "user", "metadata": {"rev": 1},
                    "secretRef": [{"store": "vault", "name": "p", "key": "p", "injectAs": "password"}]}}
            }}),
            false => json!({"components": {
                "custom": {"user": {"type": "user", "metadata": {"rev": 2, "password": "inline"}}}
            }}),
        };
        let config = parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        validate(config, registry).unwrap_or_else(|p| panic!("{p}"))
    }

    /// A reload removed the vault and updated the user (in place, its
    /// ref replaced by an inline value); the update panicked when applied:
    /// its previous declaration, reading the vault, is not put back.
    #[tokio::test]
    async fn a_previous_declaration_reading_a_removed_store_is_not_restored() {
        let registry = registry();
        let redactor = Redactor::default();
        let timeouts = StartTimeouts::default();
        let running = RunningSet::start(config(true, &registry), &registry, timeouts, &redactor)
            .await
            .unwrap_or_else(|f| panic!("{f:?}"));
        let user = ComponentKey::new("custom", "user");
        let vault = ComponentKey::new("secret_store", "vault");
        let before = running.snapshot();
        let previous = Arc::clone(before.components.get(&user).expect("custom/user runs"));

        let after = config(false, &registry);
        let mut components = Components::clone(&before.components);
        let retired = components.remove(&vault).expect("the vault runs");
        let updated = Running {
            spec: Arc::clone(&after.config.components[&user]),
            assembled: previous.assembled.clone(),
        };
        components.insert(user.clone(), Arc::new(updated));
        let committed = running.commit(Commit {
            config: after,
            layers: RunningLayers::started(),
            components: Arc::new(components),
            acted_on: BTreeSet::from([user.clone(), vault.clone()]),
            publish: true,
            marks_left: crate::running::MarksLeft::default(),
        });
        assert!(committed.is_ok(), "not committed");

        let refused = running
            .restore(previous, None)
            .expect_err("restored a declaration reading a removed store");
        assert!(refused.contains("secret_store/vault"), "{refused}");
        assert!(refused.contains("custom/user"), "{refused}");
        let config = running.config();
        assert!(config.config.components[&user].secret_refs.is_empty());
        let marked = running.snapshot().not_as_declared;
        assert_eq!(marked.keys(), BTreeSet::from([user.clone()]));
        running.close_all(None).await;
        drop(retired);
    }
}
