//! Property tests of `ConfigDiff`: for two configurations drawn from one
//! pool of component keys, the diff classifies every key as a reference
//! model says, applying it to the old configuration gives the new one, and
//! the order of object keys in the text never makes a change.

use crate::prop_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use rewire_runtime::config::ConfigDiff;
use rewire_runtime::config::{parse, ComponentSpec, Config, ConfigurationRef, SecretRef};
use rewire_runtime::ComponentKey;
use serde_json::Value;

use prop_support::{
    boxed_nested_metadata, component, config, gen_config, ident, key_set, keys, kind, name,
    small_json_value, to_text, GenComponent, GenConfig, KindSpelling,
};

/// A small edit of one declaration.
#[derive(Debug, Clone)]
enum Tweak {
    Type(String),
    SetMetadata(String, Value),
    RemoveMetadata(Index),
    AddComponentRef(ComponentKey),
    /// The componentRefs in the other order: a change (refs are offered to
    /// the `#[inject]` fields in order, so the order binds them).
    ReverseComponentRefs,
    /// A componentRef given twice: a change too (validation refuses it;
    /// the diff compares the lists as written).
    RepeatComponentRef(Index),
    FlipSecretWatch(Index),
    ConfigurationInjectAs(Index, String),
    /// `scopes` only decide who may reference: not a change.
    Scopes(Option<Vec<ComponentKey>>),
}

fn tweak() -> impl Strategy<Value = Tweak> {
    let key = || (kind(), name()).prop_map(|(k, n)| ComponentKey::new(k, n));
    prop_oneof![
        ident().prop_map(Tweak::Type),
        (
            prop_oneof![Just("a".to_string()), ident()],
            small_json_value()
        )
            .prop_map(|(f, v)| Tweak::SetMetadata(f, v)),
        any::<Index>().prop_map(Tweak::RemoveMetadata),
        key().prop_map(Tweak::AddComponentRef),
        Just(Tweak::ReverseComponentRefs),
        any::<Index>().prop_map(Tweak::RepeatComponentRef),
        any::<Index>().prop_map(Tweak::FlipSecretWatch),
        (any::<Index>(), ident()).prop_map(|(i, s)| Tweak::ConfigurationInjectAs(i, s)),
        prop::option::of(prop::collection::vec(key(), 0..3)).prop_map(Tweak::Scopes),
    ]
}

impl Tweak {
    fn apply(&self, c: &mut GenComponent) {
        match self {
            Tweak::Type(t) => c.type_name = Some(t.clone()),
            Tweak::SetMetadata(f, v) => {
                c.metadata.insert(f.clone(), v.clone());
            }
            Tweak::RemoveMetadata(i) => {
                let fields: Vec<String> = c.metadata.keys().cloned().collect();
                if !fields.is_empty() {
                    c.metadata.remove(i.get(&fields));
                }
            }
            Tweak::AddComponentRef(key) => c.component_refs.push((key.clone(), KindSpelling::Kind)),
            Tweak::ReverseComponentRefs => c.component_refs.reverse(),
            Tweak::RepeatComponentRef(i) => {
                if !c.component_refs.is_empty() {
                    let again = i.get(&c.component_refs).clone();
                    c.component_refs.push(again);
                }
            }
            Tweak::FlipSecretWatch(i) => {
                if !c.secret_refs.is_empty() {
                    let at = i.index(c.secret_refs.len());
                    let watch = c.secret_refs[at].watch.unwrap_or(false);
                    c.secret_refs[at].watch = Some(!watch);
                }
            }
            Tweak::ConfigurationInjectAs(i, s) => {
                if !c.configuration_refs.is_empty() {
                    let at = i.index(c.configuration_refs.len());
                    c.configuration_refs[at].inject_as = Some(s.clone());
                }
            }
            Tweak::Scopes(scopes) => c.scopes = scopes.clone(),
        }
    }
}

/// What becomes of one pool key's declaration in the new configuration.
#[derive(Debug, Clone)]
enum Change {
    Same,
    Fresh(GenComponent),
    Tweaked(Vec<Tweak>),
}

/// One pool key: whether each side declares it, and how.
#[derive(Debug, Clone)]
struct Slot {
    in_old: bool,
    in_new: bool,
    old: GenComponent,
    change: Change,
}

/// Old and new configurations over one pool of keys, and the seeds that
/// shuffle their texts' object keys.
#[derive(Debug, Clone)]
struct Pair {
    slots: Vec<Slot>,
    old_seed: u64,
    new_seed: u64,
}

impl Pair {
    fn side(&self, new: bool) -> GenConfig {
        let components = self
            .slots
            .iter()
            .filter(|s| if new { s.in_new } else { s.in_old })
            .map(|s| {
                if !new {
                    return s.old.clone();
                }
                match &s.change {
                    Change::Same => s.old.clone(),
                    Change::Fresh(c) => c.clone(),
                    Change::Tweaked(tweaks) => {
                        let mut c = s.old.clone();
                        for t in tweaks {
                            t.apply(&mut c);
                        }
                        c
                    }
                }
            })
            .collect();
        GenConfig {
            app_id: None,
            both_app_ids: false,
            components,
            overlay: None,
        }
    }

    fn parse(&self, new: bool) -> Result<Config, TestCaseError> {
        let seed = if new { self.new_seed } else { self.old_seed };
        let text = to_text(&self.side(new).to_value(), seed);
        parse(text.as_bytes()).map_err(|p| TestCaseError::fail(format!("{p}\nin {text}")))
    }
}

fn pair() -> impl Strategy<Value = Pair> {
    keys(8).prop_flat_map(|keys| {
        let slots: Vec<_> = keys
            .iter()
            .map(|key| {
                let declaration = || component(key.clone(), keys.clone(), boxed_nested_metadata());
                let change = prop_oneof![
                    2 => Just(Change::Same),
                    1 => declaration().prop_map(Change::Fresh),
                    3 => prop::collection::vec(tweak(), 1..3).prop_map(Change::Tweaked),
                ];
                (any::<(bool, bool)>(), declaration(), change).prop_map(
                    |((in_old, in_new), old, change)| Slot {
                        in_old,
                        in_new,
                        old,
                        change,
                    },
                )
            })
            .collect();
        (slots, any::<u64>(), any::<u64>()).prop_map(|(slots, old_seed, new_seed)| Pair {
            slots,
            old_seed,
            new_seed,
        })
    })
}

/// A declaration as the diff must see it: type, metadata as JSON (object
/// key order does not matter), the *list* of componentRefs (order and
/// repetition: they bind fields in order), secretRefs and
/// configurationRefs. `scopes` are left out: they only decide who may
/// reference the component, which validation checks.
#[derive(Debug, PartialEq)]
struct Declared {
    type_name: String,
    metadata: Value,
    component_refs: Vec<ComponentKey>,
    secret_refs: Vec<SecretRef>,
    configuration_refs: Vec<ConfigurationRef>,
}

fn declared(spec: &ComponentSpec) -> Declared {
    Declared {
        type_name: spec.type_name.clone(),
        metadata: Value::Object(spec.metadata.clone()),
        component_refs: spec.component_refs.iter().map(|r| r.key.clone()).collect(),
        secret_refs: spec.secret_refs.clone(),
        configuration_refs: spec.configuration_refs.clone(),
    }
}

fn declared_all(
    components: &BTreeMap<ComponentKey, Arc<ComponentSpec>>,
) -> BTreeMap<ComponentKey, Declared> {
    components
        .iter()
        .map(|(k, s)| (k.clone(), declared(s)))
        .collect()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn diff_classifies_every_key_and_applies_to_the_new_configuration(pair in pair()) {
        let old = pair.parse(false)?;
        let new = pair.parse(true)?;
        let diff = ConfigDiff::between(&old, &new);
        let (old_keys, new_keys) = (key_set(&old), key_set(&new));

        prop_assert_eq!(&diff.added, &new_keys.difference(&old_keys).cloned().collect());
        prop_assert_eq!(&diff.removed, &old_keys.difference(&new_keys).cloned().collect());
        for key in old_keys.intersection(&new_keys) {
            let (a, b) = (declared(&old.components[key]), declared(&new.components[key]));
            let change = diff.changed.get(key);
            prop_assert_eq!(change.is_some(), a != b, "`{}`: {:?}\nvs {:?}", key, a, b);
            if let Some(change) = change {
                prop_assert_eq!(change.type_changed, a.type_name != b.type_name);
                prop_assert_eq!(change.component_refs_changed, a.component_refs != b.component_refs);
                prop_assert_eq!(
                    change.metadata_changed,
                    a.metadata != b.metadata
                        || a.secret_refs != b.secret_refs
                        || a.configuration_refs != b.configuration_refs
                );
                prop_assert!(change.any());
            }
        }
        for key in diff.changed.keys() {
            prop_assert!(old_keys.contains(key) && new_keys.contains(key), "changed `{key}` not in both");
        }
        let touched: BTreeSet<ComponentKey> = diff.added.iter().chain(diff.changed.keys()).cloned().collect();
        prop_assert_eq!(diff.touched(), touched);

        // Old, minus removed, plus added, with changed ones replaced, is new.
        let mut applied = old.components.clone();
        for key in &diff.removed {
            applied.remove(key);
        }
        for key in diff.added.iter().chain(diff.changed.keys()) {
            applied.insert(key.clone(), new.components[key].clone());
        }
        prop_assert_eq!(declared_all(&applied), declared_all(&new.components));
    }

    #[test]
    fn diff_of_a_configuration_with_itself_is_empty(
        generated in gen_config(8, boxed_nested_metadata),
        seeds in any::<(u64, u64)>(),
    ) {
        let value = generated.to_value();
        let a = parse(to_text(&value, seeds.0).as_bytes()).map_err(|p| TestCaseError::fail(p.to_string()))?;
        let b = parse(to_text(&value, seeds.1).as_bytes()).map_err(|p| TestCaseError::fail(p.to_string()))?;
        prop_assert!(ConfigDiff::between(&a, &a).is_empty());
        // Written with object keys in another order: still no change.
        let diff = ConfigDiff::between(&a, &b);
        prop_assert!(diff.is_empty(), "{diff:?}");
        prop_assert!(ConfigDiff::between(&b, &a).is_empty());
    }

    #[test]
    fn diff_is_antisymmetric(pair in pair()) {
        let old = pair.parse(false)?;
        let new = pair.parse(true)?;
        let forward = ConfigDiff::between(&old, &new);
        let backward = ConfigDiff::between(&new, &old);
        prop_assert_eq!(&forward.added, &backward.removed);
        prop_assert_eq!(&forward.removed, &backward.added);
        prop_assert_eq!(
            forward.changed.keys().collect::<Vec<_>>(),
            backward.changed.keys().collect::<Vec<_>>()
        );
        for (key, change) in &forward.changed {
            prop_assert_eq!(change, &backward.changed[key]);
        }
    }
}
