//! A model of a configuration document: what a test generated, its JSON,
//! and the typed spec `parse` must produce from it.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::sample::Index;
use rewire_runtime::config::{
    ComponentRef, ComponentSpec, Config, ConfigurationRef, OverlaySpec, SecretRef,
};
use rewire_runtime::ComponentKey;
use serde_json::{Map, Value};

use super::json::{nested_metadata, reparsed, scalar_metadata};

/// The built-in kinds, a custom one, and one with a `/` in it (kinds are
/// "any custom kind string"; only names must not contain `/`).
pub const KINDS: &[&str] = &[
    "state",
    "lock",
    "config_store",
    "secret_store",
    "custom",
    "acme.io/cache",
];

/// A component kind.
pub fn kind() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(KINDS).prop_map(str::to_string),
        1 => "[a-z][a-z0-9._-]{0,6}",
    ]
}

/// A component name: non-empty, no `/`.
pub fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9_.-]{0,6}",
        1 => "[^/]{1,5}",
    ]
}

/// A component name that validation accepts too: no `/`, no control
/// characters.
pub fn clean_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9_.-]{0,6}",
        1 => "[^/\\p{Cc}]{1,5}",
    ]
}

/// A short identifier (secret names, keys, inject targets...).
pub fn ident() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z][a-zA-Z0-9_.]{0,6}",
        1 => any::<String>(),
    ]
}

/// How one `componentRef` entry names the referenced kind.
#[derive(Debug, Clone, Copy)]
pub enum KindSpelling {
    /// `"type": kind`.
    Type,
    /// `"kind": kind`.
    Kind,
    /// Both, agreeing.
    Both,
}

/// A generated `secretRef`: the fields as written (absent ones default).
#[derive(Debug, Clone)]
pub struct GenSecretRef {
    pub store: String,
    pub name: String,
    pub key: Option<String>,
    pub inject_as: Option<String>,
    pub watch: Option<bool>,
}

/// A generated `configurationRef`.
#[derive(Debug, Clone)]
pub struct GenConfigurationRef {
    pub store: String,
    pub key: String,
    pub group: Option<String>,
    pub label: Option<String>,
    pub inject_as: Option<String>,
    pub watch: Option<bool>,
}

/// A generated component declaration.
#[derive(Debug, Clone)]
pub struct GenComponent {
    pub key: ComponentKey,
    pub type_name: Option<String>,
    pub metadata: Map<String, Value>,
    pub component_refs: Vec<(ComponentKey, KindSpelling)>,
    pub secret_refs: Vec<GenSecretRef>,
    pub configuration_refs: Vec<GenConfigurationRef>,
    pub scopes: Option<Vec<ComponentKey>>,
    /// Write refs under Layotto's list names (`secret_ref`, ...).
    pub layotto_lists: bool,
    /// Write ref fields in Layotto's spelling (`store_name`, `sub_key`, ...).
    pub layotto_fields: bool,
    /// Write empty lists / metadata instead of leaving them out.
    pub explicit_empty: bool,
}

impl GenComponent {
    /// A bare component: no type, metadata or refs.
    pub fn bare(key: ComponentKey) -> Self {
        Self {
            key,
            type_name: None,
            metadata: Map::new(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: Vec::new(),
            scopes: None,
            layotto_lists: false,
            layotto_fields: false,
            explicit_empty: false,
        }
    }

    /// The component's body as JSON.
    pub fn to_value(&self) -> Value {
        let mut body = Map::new();
        if let Some(t) = &self.type_name {
            body.insert("type".into(), Value::String(t.clone()));
        }
        if !self.metadata.is_empty() || self.explicit_empty {
            body.insert("metadata".into(), Value::Object(self.metadata.clone()));
        }
        if !self.component_refs.is_empty() || self.explicit_empty {
            let refs = self
                .component_refs
                .iter()
                .map(|(key, spelling)| {
                    let mut r = Map::new();
                    if matches!(spelling, KindSpelling::Type | KindSpelling::Both) {
                        r.insert("type".into(), Value::String(key.kind.to_string()));
                    }
                    if matches!(spelling, KindSpelling::Kind | KindSpelling::Both) {
                        r.insert("kind".into(), Value::String(key.kind.to_string()));
                    }
                    r.insert("name".into(), Value::String(key.name.to_string()));
                    Value::Object(r)
                })
                .collect();
            body.insert("componentRef".into(), Value::Array(refs));
        }
        let (store, inject_as) = if self.layotto_fields {
            ("store_name", "inject_as")
        } else {
            ("store", "injectAs")
        };
        if !self.secret_refs.is_empty() || self.explicit_empty {
            let refs = self
                .secret_refs
                .iter()
                .map(|s| {
                    let mut r = Map::new();
                    r.insert(store.into(), Value::String(s.store.clone()));
                    if self.layotto_fields {
                        r.insert("key".into(), Value::String(s.name.clone()));
                        if let Some(k) = &s.key {
                            r.insert("sub_key".into(), Value::String(k.clone()));
                        }
                    } else {
                        r.insert("name".into(), Value::String(s.name.clone()));
                        if let Some(k) = &s.key {
                            r.insert("key".into(), Value::String(k.clone()));
                        }
                    }
                    if let Some(i) = &s.inject_as {
                        r.insert(inject_as.into(), Value::String(i.clone()));
                    }
                    if let Some(w) = s.watch {
                        r.insert("watch".into(), Value::Bool(w));
                    }
                    Value::Object(r)
                })
                .collect();
            let list = if self.layotto_lists {
                "secret_ref"
            } else {
                "secretRef"
            };
            body.insert(list.into(), Value::Array(refs));
        }
        if !self.configuration_refs.is_empty() || self.explicit_empty {
            let refs = self
                .configuration_refs
                .iter()
                .map(|c| {
                    let mut r = Map::new();
                    r.insert(store.into(), Value::String(c.store.clone()));
                    r.insert("key".into(), Value::String(c.key.clone()));
                    if let Some(g) = &c.group {
                        r.insert("group".into(), Value::String(g.clone()));
                    }
                    if let Some(l) = &c.label {
                        r.insert("label".into(), Value::String(l.clone()));
                    }
                    if let Some(i) = &c.inject_as {
                        r.insert(inject_as.into(), Value::String(i.clone()));
                    }
                    if let Some(w) = c.watch {
                        r.insert("watch".into(), Value::Bool(w));
                    }
                    Value::Object(r)
                })
                .collect();
            let list = if self.layotto_lists {
                "configuration_ref"
            } else {
                "configurationRef"
            };
            body.insert(list.into(), Value::Array(refs));
        }
        if let Some(scopes) = &self.scopes {
            let scopes = scopes
                .iter()
                .map(|k| Value::String(k.to_string()))
                .collect();
            body.insert("scopes".into(), Value::Array(scopes));
        }
        Value::Object(body)
    }

    /// The spec `parse` must produce for this declaration.
    pub fn expected(&self) -> ComponentSpec {
        let mut metadata = reparsed(&self.metadata);
        metadata.retain(|_, v| !v.is_null());
        ComponentSpec {
            key: self.key.clone(),
            type_name: self
                .type_name
                .clone()
                .unwrap_or_else(|| self.key.name.to_string()),
            metadata,
            component_refs: self
                .component_refs
                .iter()
                .map(|(key, _)| ComponentRef { key: key.clone() })
                .collect(),
            secret_refs: self
                .secret_refs
                .iter()
                .map(|s| {
                    let key = s.key.clone().unwrap_or_else(|| s.name.clone());
                    SecretRef {
                        store: s.store.clone(),
                        name: s.name.clone(),
                        inject_as: s.inject_as.clone().unwrap_or_else(|| key.clone()),
                        key,
                        watch: s.watch.unwrap_or(false),
                    }
                })
                .collect(),
            configuration_refs: self
                .configuration_refs
                .iter()
                .map(|c| ConfigurationRef {
                    store: c.store.clone(),
                    key: c.key.clone(),
                    group: c.group.clone(),
                    label: c.label.clone(),
                    inject_as: c.inject_as.clone().unwrap_or_else(|| c.key.clone()),
                    watch: c.watch.unwrap_or(false),
                })
                .collect(),
            scopes: self.scopes.clone(),
        }
    }
}

/// A generated configuration document.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub app_id: Option<String>,
    /// Also write `app_id` (Layotto), with the same value.
    pub both_app_ids: bool,
    pub components: Vec<GenComponent>,
    pub overlay: Option<(String, String)>,
}

impl GenConfig {
    /// The document as JSON.
    pub fn to_value(&self) -> Value {
        let mut doc = Map::new();
        if let Some(app_id) = &self.app_id {
            doc.insert("appId".into(), Value::String(app_id.clone()));
            if self.both_app_ids {
                doc.insert("app_id".into(), Value::String(app_id.clone()));
            }
        }
        let mut components = Map::new();
        for c in &self.components {
            let named = components
                .entry(c.key.kind.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(named) = named {
                named.insert(c.key.name.to_string(), c.to_value());
            }
        }
        doc.insert("components".into(), Value::Object(components));
        if let Some((store, key)) = &self.overlay {
            let mut overlay = Map::new();
            overlay.insert("store".into(), Value::String(store.clone()));
            overlay.insert("key".into(), Value::String(key.clone()));
            doc.insert("overlay".into(), Value::Object(overlay));
        }
        Value::Object(doc)
    }

    /// The configuration `parse` must produce.
    pub fn expected(&self) -> Config {
        Config {
            app_id: self.app_id.clone().unwrap_or_default(),
            components: self
                .components
                .iter()
                .map(|c| (c.key.clone(), c.expected()))
                .collect(),
            overlay: self
                .overlay
                .clone()
                .map(|(store, key)| OverlaySpec { store, key }),
            sections: Default::default(),
            // Parsed text comes from no file.
            base_dir: None,
        }
    }
}

/// Distinct component keys, `1..=max` of them.
pub fn keys(max: usize) -> impl Strategy<Value = Vec<ComponentKey>> {
    prop::collection::btree_set((kind(), name()), 1..=max).prop_map(|set| {
        set.into_iter()
            .map(|(k, n)| ComponentKey::new(k, n))
            .collect()
    })
}

fn kind_spelling() -> impl Strategy<Value = KindSpelling> {
    prop_oneof![
        Just(KindSpelling::Type),
        Just(KindSpelling::Kind),
        Just(KindSpelling::Both)
    ]
}

/// A target among `keys` (by index) or a made-up one.
fn target(keys: Vec<ComponentKey>) -> impl Strategy<Value = ComponentKey> {
    prop_oneof![
        4 => any::<Index>().prop_map(move |i| i.get(&keys).clone()),
        1 => (kind(), name()).prop_map(|(k, n)| ComponentKey::new(k, n)),
    ]
}

/// A store name: mostly the name of one of `keys` (so secretRef and
/// configurationRef often reach a declared store), sometimes made up.
fn store(keys: Vec<ComponentKey>) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<Index>().prop_map(move |i| i.get(&keys).name.to_string()),
        1 => name(),
    ]
}

fn secret_ref(keys: Vec<ComponentKey>) -> impl Strategy<Value = GenSecretRef> {
    (
        store(keys),
        ident(),
        prop::option::of(ident()),
        prop::option::of(ident()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(store, name, key, inject_as, watch)| GenSecretRef {
            store,
            name,
            key,
            inject_as,
            watch,
        })
}

fn configuration_ref(keys: Vec<ComponentKey>) -> impl Strategy<Value = GenConfigurationRef> {
    (
        store(keys),
        ident(),
        prop::option::of(ident()),
        prop::option::of(ident()),
        prop::option::of(ident()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(store, key, group, label, inject_as, watch)| GenConfigurationRef {
                store,
                key,
                group,
                label,
                inject_as,
                watch,
            },
        )
}

/// A declaration of `key`, with refs among `keys`, metadata from
/// `metadata`.
pub fn component(
    key: ComponentKey,
    keys: Vec<ComponentKey>,
    metadata: BoxedStrategy<Map<String, Value>>,
) -> impl Strategy<Value = GenComponent> {
    (
        prop::option::of(ident()),
        metadata,
        prop::collection::vec((target(keys.clone()), kind_spelling()), 0..3),
        prop::collection::vec(secret_ref(keys.clone()), 0..3),
        prop::collection::vec(configuration_ref(keys.clone()), 0..3),
        prop::option::weighted(0.2, prop::collection::vec(target(keys), 0..3)),
        any::<(bool, bool, bool)>(),
    )
        .prop_map(
            move |(
                type_name,
                metadata,
                component_refs,
                secret_refs,
                configuration_refs,
                scopes,
                flags,
            )| GenComponent {
                key: key.clone(),
                type_name,
                metadata,
                component_refs,
                secret_refs,
                configuration_refs,
                scopes,
                layotto_lists: flags.0,
                layotto_fields: flags.1,
                explicit_empty: flags.2,
            },
        )
}

/// A whole valid document (valid for `parse`; refs may dangle, which is
/// `validate`'s business) of up to `max` components.
pub fn gen_config(
    max: usize,
    metadata: fn() -> BoxedStrategy<Map<String, Value>>,
) -> impl Strategy<Value = GenConfig> {
    keys(max).prop_flat_map(move |keys| {
        let components: Vec<_> = keys
            .iter()
            .map(|k| component(k.clone(), keys.clone(), metadata()))
            .collect();
        (
            prop::option::of(ident()),
            any::<bool>(),
            components,
            prop::option::of((store(keys.clone()), ident())),
        )
            .prop_map(|(app_id, both_app_ids, components, overlay)| GenConfig {
                app_id,
                both_app_ids,
                components,
                overlay,
            })
    })
}

/// Boxed [`scalar_metadata`], for [`gen_config`].
pub fn boxed_scalar_metadata() -> BoxedStrategy<Map<String, Value>> {
    scalar_metadata().boxed()
}

/// Boxed [`nested_metadata`], for [`gen_config`].
pub fn boxed_nested_metadata() -> BoxedStrategy<Map<String, Value>> {
    nested_metadata().boxed()
}

/// The keys of `config`'s components.
pub fn key_set(config: &Config) -> BTreeSet<ComponentKey> {
    config.components.keys().cloned().collect()
}
