//! Precedence: the file, then the overlay (common key, then the app's own
//! key), then control-plane pushes. The effective configuration is
//! recomputed from the layers on every change, with the layer each value
//! came from.

use std::collections::BTreeMap;

use serde::Serialize;

use super::model::Config;
use super::patch::{ComponentPatch, ConfigPatch};
use crate::component::ComponentKey;

/// Where a value of the effective configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The configuration file (or `Runtime::apply`).
    File,
    /// The overlay's common key.
    Overlay,
    /// The overlay's app-specific key (`<key>.<appId>`).
    OverlayApp,
    /// A push through the Lifecycle API.
    ControlPlane,
}

/// A control-plane decision about one component.
#[derive(Debug, Clone, PartialEq)]
pub enum Push {
    /// The component is declared exactly so (replacing every lower layer).
    Declare(ComponentPatch),
    /// The component is removed, whatever lower layers say.
    Remove,
}

/// A change to one layer of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerChange {
    /// A new base configuration.
    File(Config),
    /// New overlay documents: the common key's, then the app-specific key's.
    Overlay(Option<ConfigPatch>, Option<ConfigPatch>),
    /// A control-plane decision about one component.
    Push(ComponentKey, Push),
}

/// Where each part of one component's effective declaration came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ComponentSources {
    /// The layer that set `type`.
    #[serde(rename = "type")]
    pub type_name: Option<Layer>,
    /// The layer that set each metadata field.
    pub metadata: BTreeMap<String, Layer>,
    /// The layer that set the refs.
    pub refs: Option<Layer>,
}

/// The layers of a runtime's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layers {
    /// The base configuration.
    pub file: Config,
    /// The overlay's common document.
    pub overlay: Option<ConfigPatch>,
    /// The overlay's app-specific document.
    pub overlay_app: Option<ConfigPatch>,
    /// Control-plane pushes, by component.
    pub pushes: BTreeMap<ComponentKey, Push>,
}

impl Layers {
    /// Layers holding only `file`.
    pub fn new(file: Config) -> Self {
        Self {
            file,
            ..Self::default()
        }
    }

    /// Lays `change` over these layers.
    pub fn apply(&mut self, change: LayerChange) {
        match change {
            LayerChange::File(file) => self.file = file,
            LayerChange::Overlay(common, app) => {
                self.overlay = common;
                self.overlay_app = app;
            }
            LayerChange::Push(key, push) => {
                self.pushes.insert(key, push);
            }
        }
    }

    /// The effective configuration and the source of each value.
    pub fn effective(&self) -> (Config, BTreeMap<ComponentKey, ComponentSources>) {
        let mut config = self.file.clone();
        let mut sources: BTreeMap<ComponentKey, ComponentSources> = config
            .components
            .iter()
            .map(|(key, spec)| (key.clone(), whole(spec.metadata.keys(), Layer::File)))
            .collect();
        for (layer, patch) in [
            (Layer::Overlay, &self.overlay),
            (Layer::OverlayApp, &self.overlay_app),
        ] {
            for (key, component) in patch.iter().flat_map(|p| p.components.iter()) {
                let source = sources.entry(key.clone()).or_default();
                match config.components.get_mut(key) {
                    Some(spec) => component.apply_to(spec),
                    None => {
                        config
                            .components
                            .insert(key.clone(), component.clone().into_spec(key.clone()));
                        *source = whole(std::iter::empty(), layer);
                    }
                }
                if component.type_name.is_some() {
                    source.type_name = Some(layer);
                }
                for (field, value) in &component.metadata {
                    if value.is_null() {
                        source.metadata.remove(field);
                    } else {
                        source.metadata.insert(field.clone(), layer);
                    }
                }
                let refs_given = component.component_refs.is_some()
                    || component.secret_refs.is_some()
                    || component.configuration_refs.is_some();
                if refs_given {
                    source.refs = Some(layer);
                }
            }
        }
        for (key, push) in &self.pushes {
            match push {
                Push::Declare(patch) => {
                    let spec = patch.clone().into_spec(key.clone());
                    sources.insert(
                        key.clone(),
                        whole(spec.metadata.keys(), Layer::ControlPlane),
                    );
                    config.components.insert(key.clone(), spec);
                }
                Push::Remove => {
                    config.components.remove(key);
                    sources.remove(key);
                }
            }
        }
        (config, sources)
    }
}

fn whole<'a>(fields: impl Iterator<Item = &'a String>, layer: Layer) -> ComponentSources {
    ComponentSources {
        type_name: Some(layer),
        metadata: fields.map(|f| (f.clone(), layer)).collect(),
        refs: Some(layer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, parse_patch};
    use serde_json::json;

    fn patch(text: &str) -> ConfigPatch {
        parse_patch(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"))
    }

    #[test]
    fn app_overlay_beats_common_overlay_beats_file_and_pushes_beat_all() {
        let file = parse(br#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": "file", "b": "file", "c": "file"}}, "t": {}}}}"#)
            .unwrap_or_else(|p| panic!("{p}"));
        let mut layers = Layers::new(file);
        layers.overlay = Some(patch(
            r#"{"components": {"state": {"s": {"metadata": {"a": "common", "b": "common"}}}}}"#,
        ));
        layers.overlay_app = Some(patch(
            r#"{"components": {"state": {"s": {"metadata": {"a": "app"}}}}}"#,
        ));
        let s = ComponentKey::new("state", "s");
        let (config, sources) = layers.effective();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"a": "app", "b": "common", "c": "file"})
        );
        assert_eq!(sources[&s].metadata["a"], Layer::OverlayApp);
        assert_eq!(sources[&s].metadata["b"], Layer::Overlay);
        assert_eq!(sources[&s].metadata["c"], Layer::File);
        let t = ComponentKey::new("state", "t");
        layers.pushes.insert(s.clone(), Push::Declare(patch(r#"{"components": {"state": {"s": {"type": "memory", "metadata": {"a": "push"}}}}}"#).components[&s].clone()));
        layers.pushes.insert(t.clone(), Push::Remove);
        let (config, sources) = layers.effective();
        assert_eq!(
            serde_json::Value::Object(config.components[&s].metadata.clone()),
            json!({"a": "push"})
        );
        assert_eq!(sources[&s].metadata["a"], Layer::ControlPlane);
        assert!(!config.components.contains_key(&t));
    }
}
