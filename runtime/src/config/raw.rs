//! The configuration as written, with every accepted spelling (rewire's and
//! Layotto's), before it is turned into the typed model.
//!
//! Each spelling is its own field (not a serde alias) so that an unknown
//! field gets a suggestion among all of them, and so both spellings of one
//! thing given together can be reported.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The top level of the file.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `appId`, `components` and `overlay`")]
pub(super) struct RawFile {
    #[serde(rename = "appId", default)]
    pub app_id: Option<String>,
    #[serde(rename = "app_id", default)]
    pub app_id_layotto: Option<String>,
    #[serde(default)]
    pub components: Option<Map<String, Value>>,
    #[serde(default)]
    pub overlay: Option<RawOverlay>,
    /// The `resiliency` section, decoded by its own module.
    #[serde(default)]
    pub resiliency: Option<Value>,
    /// `tracing`, decoded by [`crate::sections`].
    #[serde(default)]
    pub tracing: Option<Value>,
    /// The `subscriptions` section, decoded by its own module.
    #[serde(default)]
    pub subscriptions: Option<Value>,
    /// The `secrets` section (secret scopes), decoded by its own module.
    #[serde(default)]
    pub secrets: Option<Value>,
}

/// `overlay`.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `store` and `key`")]
pub(super) struct RawOverlay {
    pub store: String,
    pub key: String,
}

/// One component.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `type` and `metadata`")]
pub(super) struct RawComponent {
    #[serde(rename = "type", default)]
    pub type_name: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(rename = "componentRef", default)]
    pub component_ref: Option<Vec<RawComponentRef>>,
    /// Layotto: `{"config_store": "name", "secret_store": "name"}`.
    #[serde(rename = "component_ref", default)]
    pub component_ref_layotto: Option<Map<String, Value>>,
    #[serde(rename = "secretRef", default)]
    pub secret_ref: Option<Vec<RawSecretRef>>,
    #[serde(rename = "secret_ref", default)]
    pub secret_ref_layotto: Option<Vec<RawSecretRef>>,
    #[serde(rename = "configurationRef", default)]
    pub configuration_ref: Option<Vec<RawConfigurationRef>>,
    #[serde(rename = "configuration_ref", default)]
    pub configuration_ref_layotto: Option<Vec<RawConfigurationRef>>,
    /// Who may reference this component (`kind/name` each); absent: anyone.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
}

/// One `componentRef` entry.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `type` and `name`")]
pub(super) struct RawComponentRef {
    #[serde(rename = "type", default)]
    pub kind_as_type: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
}

/// One `secretRef` entry, in rewire's form (`store`, `name`, `key`,
/// `injectAs`) or Layotto's (`store_name`, `key` = secret name, `sub_key`,
/// `inject_as`).
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `store`, `name`, `key`, `injectAs`")]
pub(super) struct RawSecretRef {
    #[serde(default)]
    pub store: Option<String>,
    #[serde(default)]
    pub store_name: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub sub_key: Option<String>,
    #[serde(rename = "injectAs", default)]
    pub inject_as: Option<String>,
    #[serde(rename = "inject_as", default)]
    pub inject_as_layotto: Option<String>,
    #[serde(default)]
    pub watch: bool,
}

/// One `configurationRef` entry.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object with `store`, `key`, `injectAs`")]
pub(super) struct RawConfigurationRef {
    #[serde(default)]
    pub store: Option<String>,
    #[serde(default)]
    pub store_name: Option<String>,
    pub key: String,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(rename = "injectAs", default)]
    pub inject_as: Option<String>,
    #[serde(rename = "inject_as", default)]
    pub inject_as_layotto: Option<String>,
    #[serde(default)]
    pub watch: bool,
}
