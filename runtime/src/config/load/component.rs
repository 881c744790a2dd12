//! One declared component, in rewire's or Layotto's spelling, turned into
//! a [`ComponentPatch`] with every problem reported.

use serde_json::{Map, Value};

use super::super::model::{ComponentRef, ConfigurationRef, SecretRef};
use super::super::patch::ComponentPatch;
use super::super::raw::{RawComponent, RawComponentRef, RawConfigurationRef, RawSecretRef};
use crate::component::ComponentKey;
use crate::problem::{Problem, Problems};

/// One component as declared, in either spelling, as a patch; every
/// problem is reported.
pub(super) fn to_patch(
    key: &ComponentKey,
    raw: RawComponent,
    problems: &mut Problems,
) -> ComponentPatch {
    let given_refs = raw.component_ref.is_some() || raw.component_ref_layotto.is_some();
    let component_refs =
        to_component_refs(key, raw.component_ref, raw.component_ref_layotto, problems);
    let given_secrets = raw.secret_ref.is_some() || raw.secret_ref_layotto.is_some();
    let given_configuration =
        raw.configuration_ref.is_some() || raw.configuration_ref_layotto.is_some();
    let secret_refs = raw
        .secret_ref
        .into_iter()
        .flatten()
        .chain(raw.secret_ref_layotto.into_iter().flatten())
        .enumerate()
        .filter_map(|(i, r)| to_secret_ref(key, i, r, problems))
        .collect::<Vec<_>>();
    let configuration_refs = raw
        .configuration_ref
        .into_iter()
        .flatten()
        .chain(raw.configuration_ref_layotto.into_iter().flatten())
        .enumerate()
        .filter_map(|(i, r)| to_configuration_ref(key, i, r, problems))
        .collect::<Vec<_>>();
    let scopes = raw.scopes.map(|scopes| to_scopes(key, &scopes, problems));
    ComponentPatch {
        scopes,
        type_name: raw.type_name,
        metadata: raw.metadata.unwrap_or_default(),
        component_refs: given_refs.then_some(component_refs),
        secret_refs: given_secrets.then_some(secret_refs),
        configuration_refs: given_configuration.then_some(configuration_refs),
    }
}

/// `componentRef` (rewire) and `component_ref` (Layotto) as refs.
fn to_component_refs(
    key: &ComponentKey,
    rewire: Option<Vec<RawComponentRef>>,
    layotto: Option<Map<String, Value>>,
    problems: &mut Problems,
) -> Vec<ComponentRef> {
    let mut component_refs = Vec::new();
    for (i, r) in rewire.into_iter().flatten().enumerate() {
        let kind = match (r.kind, r.kind_as_type) {
            (Some(a), Some(b)) if a != b => {
                problems.push(Problem::component(
                    key,
                    format!("componentRef[{i}]: `kind` ({a}) and `type` ({b}) disagree"),
                ));
                continue;
            }
            (Some(kind), _) | (None, Some(kind)) => kind,
            (None, None) => {
                problems.push(Problem::component(
                    key,
                    format!("componentRef[{i}]: missing `type` (the referenced component's kind)"),
                ));
                continue;
            }
        };
        component_refs.push(ComponentRef {
            key: ComponentKey::new(kind, r.name),
        });
    }
    for (kind, name) in layotto.into_iter().flatten() {
        match name {
            Value::String(name) => component_refs.push(ComponentRef {
                key: ComponentKey::new(kind, name),
            }),
            _ => problems.push(Problem::component(
                key,
                format!(
                    "component_ref.{kind}: expected the referenced component's name as a string"
                ),
            )),
        }
    }
    component_refs
}

/// `scopes`: component keys written `kind/name`.
fn to_scopes(key: &ComponentKey, scopes: &[String], problems: &mut Problems) -> Vec<ComponentKey> {
    scopes
        .iter()
        .enumerate()
        // A name never contains `/` but a custom kind may: split at the last one.
        .filter_map(|(i, scope)| match scope.rsplit_once('/') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {
                Some(ComponentKey::new(kind, name))
            }
            _ => {
                problems.push(Problem::component(
                    key,
                    format!("scopes[{i}]: `{scope}` is not a component key (expected `kind/name`)"),
                ));
                None
            }
        })
        .collect()
}

/// The value given in either spelling; `Err` (reported) when both are
/// given and disagree.
fn one_of(
    key: &ComponentKey,
    what: &str,
    a: Option<String>,
    b: Option<String>,
    problems: &mut Problems,
) -> Result<Option<String>, ()> {
    match (a, b) {
        (Some(a), Some(b)) if a != b => {
            problems.push(Problem::component(
                key,
                format!("{what}: two spellings disagree ({a} vs {b})"),
            ));
            Err(())
        }
        (Some(a), _) | (None, Some(a)) => Ok(Some(a)),
        (None, None) => Ok(None),
    }
}

/// The store (required) and `injectAs` of a secretRef/configurationRef,
/// each given in rewire's or Layotto's spelling (`store`/`store_name`,
/// `injectAs`/`inject_as`); `None` after reporting a problem.
fn store_and_inject_as(
    key: &ComponentKey,
    at: &str,
    [(store, store_name), (inject_as, inject_as_layotto)]: [(Option<String>, Option<String>); 2],
    what: &str,
    problems: &mut Problems,
) -> Option<(String, Option<String>)> {
    let store = one_of(key, &format!("{at}.store"), store, store_name, problems);
    let inject_as = one_of(
        key,
        &format!("{at}.injectAs"),
        inject_as,
        inject_as_layotto,
        problems,
    );
    let (Ok(store), Ok(inject_as)) = (store, inject_as) else {
        return None;
    };
    let Some(store) = store else {
        problems.push(Problem::component(
            key,
            format!("{at}: missing `store` (the {what}'s name)"),
        ));
        return None;
    };
    Some((store, inject_as))
}

fn to_secret_ref(
    key: &ComponentKey,
    i: usize,
    r: RawSecretRef,
    problems: &mut Problems,
) -> Option<SecretRef> {
    let at = format!("secretRef[{i}]");
    let spellings = [(r.store, r.store_name), (r.inject_as, r.inject_as_layotto)];
    let (store, inject_as) = store_and_inject_as(key, &at, spellings, "secret store", problems)?;
    // rewire: `name` is the secret, `key` the key inside it. Layotto: `key`
    // is the secret and `sub_key` the key inside it (defaulting to `key`).
    let (name, inner) = match (r.name, r.key, r.sub_key) {
        (Some(name), Some(inner), None) => (name, inner),
        (Some(name), None, None) => (name.clone(), name),
        (None, Some(name), sub_key) => (name.clone(), sub_key.unwrap_or(name)),
        (Some(_), _, Some(_)) => {
            problems.push(Problem::component(
                key,
                format!("{at}: give either `name` + `key` (rewire) or `key` + `sub_key` (Layotto), not both"),
            ));
            return None;
        }
        (None, None, _) => {
            problems.push(Problem::component(
                key,
                format!("{at}: missing `name` (the secret's name)"),
            ));
            return None;
        }
    };
    Some(SecretRef {
        store,
        inject_as: inject_as.unwrap_or_else(|| inner.clone()),
        name,
        key: inner,
        watch: r.watch,
    })
}

fn to_configuration_ref(
    key: &ComponentKey,
    i: usize,
    r: RawConfigurationRef,
    problems: &mut Problems,
) -> Option<ConfigurationRef> {
    let at = format!("configurationRef[{i}]");
    let spellings = [(r.store, r.store_name), (r.inject_as, r.inject_as_layotto)];
    let (store, inject_as) = store_and_inject_as(key, &at, spellings, "config store", problems)?;
    Some(ConfigurationRef {
        store,
        inject_as: inject_as.unwrap_or_else(|| r.key.clone()),
        key: r.key,
        group: r.group,
        label: r.label,
        watch: r.watch,
    })
}
