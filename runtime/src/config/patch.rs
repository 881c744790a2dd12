//! Partial configurations: overlays and control-plane pushes are patches
//! laid over the file.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::model::{ComponentRef, ComponentSpec, Config, ConfigurationRef, OverlaySpec, SecretRef};
use super::Sections;
use crate::component::ComponentKey;

/// A partial component declaration: what is absent is left as it was.
///
/// Its `Debug` shows the metadata as [`ComponentSpec`]'s does (fields
/// named like a secret as `[secret]`, URLs without credentials): a push
/// or an overlay may carry a password inline, and every type holding a
/// patch ([`ConfigPatch`], `Push`, `LayerChange`, `Layers`, a reload
/// request) derives its `Debug` from this one.
#[derive(Clone, Default, PartialEq)]
pub struct ComponentPatch {
    /// A new `type`, if given.
    pub type_name: Option<String>,
    /// Metadata fields to set; a `null` value removes the field.
    pub metadata: Map<String, Value>,
    /// New `componentRef`s, replacing the old ones, if given.
    pub component_refs: Option<Vec<ComponentRef>>,
    /// New `secretRef`s, replacing the old ones, if given.
    pub secret_refs: Option<Vec<SecretRef>>,
    /// New `configurationRef`s, replacing the old ones, if given.
    pub configuration_refs: Option<Vec<ConfigurationRef>>,
    /// New `scopes`, replacing the old ones, if given.
    pub scopes: Option<Vec<ComponentKey>>,
}

impl std::fmt::Debug for ComponentPatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let metadata = crate::redact::shown_fields(&self.metadata, &Default::default());
        f.debug_struct("ComponentPatch")
            .field("type_name", &self.type_name)
            .field("metadata", &metadata)
            .field("component_refs", &self.component_refs)
            .field("secret_refs", &self.secret_refs)
            .field("configuration_refs", &self.configuration_refs)
            .field("scopes", &self.scopes)
            .finish()
    }
}

impl ComponentPatch {
    /// The declaration this patch makes on its own (`type` defaults to the
    /// component's name, as in the file).
    pub fn into_spec(self, key: ComponentKey) -> ComponentSpec {
        let mut metadata = self.metadata;
        metadata.retain(|_, v| !v.is_null());
        ComponentSpec {
            type_name: self.type_name.unwrap_or_else(|| key.name.to_string()),
            metadata,
            component_refs: self.component_refs.unwrap_or_default(),
            secret_refs: self.secret_refs.unwrap_or_default(),
            configuration_refs: self.configuration_refs.unwrap_or_default(),
            scopes: self.scopes,
            key,
        }
    }

    /// Lays this patch over `spec`, field by field.
    pub fn apply_to(&self, spec: &mut ComponentSpec) {
        if let Some(type_name) = &self.type_name {
            spec.type_name = type_name.clone();
        }
        for (field, value) in &self.metadata {
            if value.is_null() {
                spec.metadata.remove(field);
            } else {
                spec.metadata.insert(field.clone(), value.clone());
            }
        }
        if let Some(refs) = &self.component_refs {
            spec.component_refs = refs.clone();
        }
        if let Some(refs) = &self.secret_refs {
            spec.secret_refs = refs.clone();
        }
        if let Some(refs) = &self.configuration_refs {
            spec.configuration_refs = refs.clone();
        }
        if let Some(scopes) = &self.scopes {
            spec.scopes = Some(scopes.clone());
        }
    }

    /// This patch with `later` laid over it: `later`'s metadata fields
    /// (a `null` among them removes the field), and each other part
    /// `later` gives.
    pub fn then(mut self, later: ComponentPatch) -> Self {
        self.metadata.extend(later.metadata);
        self.type_name = later.type_name.or(self.type_name);
        self.component_refs = later.component_refs.or(self.component_refs);
        self.secret_refs = later.secret_refs.or(self.secret_refs);
        self.configuration_refs = later.configuration_refs.or(self.configuration_refs);
        self.scopes = later.scopes.or(self.scopes);
        self
    }

    /// The patch that declares `spec` whole.
    pub fn from_spec(spec: &ComponentSpec) -> Self {
        Self {
            type_name: Some(spec.type_name.clone()),
            metadata: spec.metadata.clone(),
            component_refs: Some(spec.component_refs.clone()),
            secret_refs: Some(spec.secret_refs.clone()),
            configuration_refs: Some(spec.configuration_refs.clone()),
            scopes: spec.scopes.clone(),
        }
    }
}

/// A parsed document of the configuration's shape, every part optional.
/// Its `Debug` hides inline secrets (see [`ComponentPatch`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigPatch {
    /// `appId`, if given.
    pub app_id: Option<String>,
    /// Component patches, by key.
    pub components: BTreeMap<ComponentKey, ComponentPatch>,
    /// `overlay`, if given.
    pub overlay: Option<OverlaySpec>,
    /// Whether the document had a `components` object at all.
    pub has_components: bool,
    /// The top-level sections beyond components (read from the file layer
    /// only).
    pub sections: Sections,
}

impl ConfigPatch {
    /// The configuration this document declares on its own.
    pub fn into_config(self) -> Config {
        Config {
            app_id: self.app_id.unwrap_or_default(),
            components: self
                .components
                .into_iter()
                .map(|(key, patch)| (key.clone(), patch.into_spec(key)))
                .collect(),
            overlay: self.overlay,
            sections: self.sections,
            base_dir: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_patch;

    #[test]
    fn patch_sets_and_removes_fields_and_keeps_the_rest() {
        let base = crate::config::parse(
            br#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": 1, "b": 2},
                "componentRef": [{"type": "lock", "name": "l"}]}}}}"#,
        )
        .unwrap_or_else(|p| panic!("{p}"));
        let patch =
            parse_patch(br#"{"components": {"state": {"s": {"metadata": {"b": null, "c": 3}}}}}"#)
                .unwrap_or_else(|p| panic!("{p}"));
        let key = ComponentKey::new("state", "s");
        let mut spec = ComponentSpec::clone(&base.components[&key]);
        patch.components[&key].apply_to(&mut spec);
        assert_eq!(spec.type_name, "memory");
        assert_eq!(
            Value::Object(spec.metadata),
            serde_json::json!({"a": 1, "c": 3})
        );
        assert_eq!(
            spec.component_refs.len(),
            1,
            "refs not given in the patch are kept"
        );
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;
    use crate::config::{LayerChange, Layers, Push};
    use crate::reload::queue::Queued;
    use crate::reload::{ReloadRequest, Trigger};

    /// A patch of `state/orders` setting `field` to `value` inline, and a
    /// URL with credentials.
    fn patch_with(field: &str, value: &str) -> ComponentPatch {
        let metadata = serde_json::json!({
            field: value,
            "redisHost": format!("redis://:{value}-in-url@db:6379"),
            "redisDB": 3,
        });
        ComponentPatch {
            type_name: Some("redis".into()),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            ..ComponentPatch::default()
        }
    }

    #[test]
    fn no_type_holding_a_patch_shows_an_inline_secret_in_its_debug() {
        let key = ComponentKey::new("state", "orders");
        let patch = patch_with("redisPassword", "hunter2");
        let document = ConfigPatch {
            components: BTreeMap::from([(key.clone(), patch.clone())]),
            has_components: true,
            ..ConfigPatch::default()
        };
        let push = Push::Amend(patch.clone());
        let change = LayerChange::Push(key.clone(), push.clone());
        let layers = Layers {
            overlay: Some(document.clone()),
            pushes: BTreeMap::from([(key.clone(), Push::Declare(patch.clone()))]),
            ..Layers::default()
        };
        let request = ReloadRequest::of_changes(
            Trigger::Api,
            vec![
                change.clone(),
                LayerChange::Overlay {
                    common: Some(document.clone()),
                    read: None,
                },
                LayerChange::File(document.clone().into_config()),
            ],
        );
        let queued = Queued::Reload(request.clone());
        let shown = [
            ("ComponentPatch", format!("{patch:?}")),
            ("ConfigPatch", format!("{document:?}")),
            ("Push", format!("{push:?}")),
            ("LayerChange", format!("{change:?}")),
            ("Layers", format!("{layers:?}")),
            ("ReloadRequest", format!("{request:?}")),
            ("Queued", format!("{queued:#?}")),
        ];
        for (type_name, text) in shown {
            assert!(!text.contains("hunter2"), "{type_name}: {text}");
            assert!(text.contains("[secret]"), "{type_name}: {text}");
            // The rest is still there to debug with.
            assert!(
                text.contains("redisDB") && text.contains("db:6379"),
                "{type_name}: {text}"
            );
        }
    }
}
