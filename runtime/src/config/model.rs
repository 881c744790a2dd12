//! The typed configuration, after aliases are resolved.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{ComponentSpecs, Sections};
use crate::component::ComponentKey;
use crate::metadata::LendsMetadata;

/// A whole configuration: the app id, every component, the optional
/// overlay key and the other top-level sections.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The application id (`appId`).
    pub app_id: String,
    /// Every component, by key (a map, with a digest of each declaration).
    pub components: ComponentSpecs,
    /// Where overrides of this configuration live in a config store.
    pub overlay: Option<OverlaySpec>,
    /// The top-level sections beyond components (`subscriptions`, …).
    pub sections: Sections,
    /// The folder of the file it was read from: relative paths in component
    /// metadata resolve against it (see [`InitContext::resolve_path`](crate::InitContext::resolve_path)).
    /// `None` for a configuration that came from no file.
    pub base_dir: Option<PathBuf>,
}

/// One declared component. Its `Debug` shows the metadata as the status
/// does: fields named like a secret as `[secret]`, URLs without
/// credentials.
#[derive(Clone, PartialEq)]
pub struct ComponentSpec {
    /// Its kind and name.
    pub key: ComponentKey,
    /// The implementation (`type`; defaults to the component's name).
    pub type_name: String,
    /// Metadata as declared (before secretRef/configurationRef injection).
    pub metadata: Map<String, Value>,
    /// Components injected through setters.
    pub component_refs: Vec<ComponentRef>,
    /// Secrets injected into metadata.
    pub secret_refs: Vec<SecretRef>,
    /// Configuration values injected into metadata.
    pub configuration_refs: Vec<ConfigurationRef>,
    /// The components allowed to reference this one (componentRef, or
    /// secretRef/configurationRef of a store). `None`: every component.
    pub scopes: Option<Vec<ComponentKey>>,
}

impl std::fmt::Debug for ComponentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metadata = crate::redact::shown_fields(&self.metadata, &Default::default());
        f.debug_struct("ComponentSpec")
            .field("key", &self.key)
            .field("type_name", &self.type_name)
            .field("metadata", &metadata)
            .field("component_refs", &self.component_refs)
            .field("secret_refs", &self.secret_refs)
            .field("configuration_refs", &self.configuration_refs)
            .field("scopes", &self.scopes)
            .finish()
    }
}

/// A declaration lends its metadata to the component it starts.
impl LendsMetadata for ComponentSpec {
    fn metadata(&self) -> &Map<String, Value> {
        &self.metadata
    }
}

impl ComponentSpec {
    /// Whether `user` may reference this component.
    pub fn allows(&self, user: &ComponentKey) -> bool {
        self.scopes
            .as_ref()
            .is_none_or(|scopes| scopes.contains(user))
    }

    /// The metadata fields filled by secretRef and configurationRef.
    pub fn injected_fields(&self) -> Vec<String> {
        self.injected_refs()
            .map(|r| r.inject_as().to_string())
            .collect()
    }

    /// Every component this one depends on (refs and the stores its
    /// secretRef/configurationRef read from), without duplicates.
    pub fn dependencies(&self) -> Vec<ComponentKey> {
        let mut deps: Vec<ComponentKey> = self
            .component_refs
            .iter()
            .map(|r| r.key.clone())
            .chain(self.injected_refs().map(|r| r.store()))
            .collect();
        deps.sort();
        deps.dedup();
        deps
    }
}

/// `componentRef`: inject another component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentRef {
    /// The referenced component.
    pub key: ComponentKey,
}

/// `secretRef`: put key `key` of secret `name` from secret store `store`
/// into metadata field `inject_as`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    /// The secret store's name.
    pub store: String,
    /// The secret's name.
    pub name: String,
    /// The key inside the secret.
    pub key: String,
    /// The metadata field to fill.
    pub inject_as: String,
    /// Re-apply the component when the value changes.
    pub watch: bool,
}

/// `configurationRef`: put config value `key` from config store `store` into
/// metadata field `inject_as`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigurationRef {
    /// The config store's name.
    pub store: String,
    /// The configuration key.
    pub key: String,
    /// The group of the key, if the store has groups.
    pub group: Option<String>,
    /// The label of the key, if any.
    pub label: Option<String>,
    /// The metadata field to fill.
    pub inject_as: String,
    /// Re-apply the component when the value changes.
    pub watch: bool,
}

/// `overlay`: a config-store key whose value overrides components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlaySpec {
    /// The config store's name.
    pub store: String,
    /// The key; `<key>.<appId>` wins over it.
    pub key: String,
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn a_declarations_debug_shows_no_inline_secret() {
        let metadata = serde_json::json!({
            "redisPassword": "hunter2-inline",
            "redisHost": "redis://:hunter2-in-url@db:6379",
            "keyPrefix": "orders",
        });
        let spec = ComponentSpec {
            key: ComponentKey::new("state", "orders"),
            type_name: "redis".into(),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            component_refs: Vec::new(),
            secret_refs: Vec::new(),
            configuration_refs: Vec::new(),
            scopes: None,
        };
        let shown = format!("{spec:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("orders") && shown.contains("[secret]"),
            "{shown}"
        );
    }
}
