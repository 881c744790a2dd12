//! One `kind: Component` document as a rewire component: `metadata.name`,
//! `spec.type` mapped to a kind and type, `spec.metadata` (see
//! `spec_metadata`), `auth.secretStore`, `scopes`.

use std::collections::BTreeMap;

use serde_json::Map;

use super::types::{implemented, kind_of, rewire_kind_and_type};
use super::yaml::{Entry, Node, NodeValue};
use super::{Found, Origin};
use crate::component::ComponentKey;
use crate::config::model::ComponentSpec;
use crate::registry::Registry;

/// Dapr's secret store when a component names none.
pub(crate) const DEFAULT_SECRET_STORE: &str = "kubernetes";

/// The one `apiVersion` Dapr components use.
const API_VERSION: &str = "dapr.io/v1alpha1";

/// A manifest's component, before its `scopes` are checked against the
/// app id.
pub(super) struct Mapped {
    pub spec: ComponentSpec,
    pub origin: Origin,
    /// App ids allowed to load it (`scopes`); `None`: every app.
    pub app_scopes: Option<Vec<String>>,
}

/// Maps the component document `doc` (its entries) found in `file`.
pub(super) fn map_component(
    entries: &[Entry],
    file: &str,
    doc_line: usize,
    registry: &Registry,
    found: &mut Found,
) -> Option<Mapped> {
    let at = |line: usize| format!("{file}:{line}");
    let field = |name: &str| entries.iter().find(|e| e.key == name);
    let spec = field("spec");
    let dapr_type = spec
        .and_then(|s| child(&s.value, "type"))
        .and_then(|t| t.as_text());
    let name = field("metadata")
        .and_then(|m| child(&m.value, "name"))
        .and_then(|n| n.as_text());
    let kind = dapr_type
        .as_deref()
        .map_or_else(|| "component".to_string(), kind_of);
    let Some(name) = name.filter(|n| !n.is_empty() && !n.contains('/')) else {
        found.problem_at(
            at(doc_line),
            None,
            "a Component needs `metadata.name` (non-empty, no `/`)",
        );
        return None;
    };
    let key = ComponentKey::new(kind, &name);
    let mut cx = Mapping {
        key: key.clone(),
        file,
        found,
        ok: true,
    };
    for entry in entries {
        match entry.key.as_str() {
            "apiVersion" if entry.value.as_text().as_deref() == Some(API_VERSION) => {}
            "apiVersion" => cx.problem(entry.line, format!("apiVersion must be `{API_VERSION}`")),
            "kind" | "spec" | "auth" | "scopes" => {}
            "metadata" => cx.check_object_meta(&entry.value),
            other => cx.problem(entry.line, format!("unsupported field `{other}`")),
        }
    }
    let Some(spec) = spec else {
        cx.problem(doc_line, "missing `spec`");
        return None;
    };
    let Some(dapr_type) = dapr_type else {
        cx.problem(spec.line, "missing `spec.type` (such as `state.redis`)");
        return None;
    };
    let Some((_, type_name)) = rewire_kind_and_type(&dapr_type, registry) else {
        let line = child(&spec.value, "type").map_or(spec.line, |t| t.line);
        cx.problem(
            line,
            format!(
                "unsupported type {dapr_type} (rewire implements: {})",
                implemented(registry).join(", ")
            ),
        );
        return None;
    };
    let store = field("auth").and_then(|auth| cx.secret_store(&auth.value));
    let mut origin = Origin {
        location: at(doc_line),
        fields: BTreeMap::new(),
        defaulted_store: None,
    };
    let mut metadata = Map::new();
    let mut secret_refs = Vec::new();
    for entry in map_entries(&spec.value) {
        match entry.key.as_str() {
            "type" => {}
            "version" => match entry.value.as_text().as_deref() {
                Some("v1" | "") | None => {}
                Some(v) => cx.problem(entry.line, format!("unsupported spec.version `{v}` (rewire implements v1)")),
            },
            "ignoreErrors" => match entry.value.as_text().as_deref() {
                Some("false") | None => {}
                _ => cx.problem(entry.line, "spec.ignoreErrors: true is not supported (rewire does not run with a component that failed to start)"),
            },
            "initTimeout" => cx.found.note(format!(
                "{}:{}: {}: spec.initTimeout ignored (rewire's start-up timeout applies)",
                file, entry.line, cx.key
            )),
            "metadata" => {
                let items = cx.metadata_items(&entry.value, &dapr_type, store.as_deref(), &mut origin);
                metadata = items.0;
                secret_refs = items.1;
            }
            other => cx.problem(entry.line, format!("unsupported field `spec.{other}`")),
        }
    }
    let app_scopes = field("scopes").and_then(|s| cx.app_scopes(&s.value));
    if !cx.ok {
        return None;
    }
    Some(Mapped {
        spec: ComponentSpec {
            key,
            type_name,
            metadata,
            component_refs: Vec::new(),
            secret_refs,
            configuration_refs: Vec::new(),
            scopes: None,
        },
        origin,
        app_scopes,
    })
}

/// The entry `name` of a mapping node.
pub(super) fn child<'a>(node: &'a Node, name: &str) -> Option<&'a Node> {
    map_entries(node)
        .iter()
        .find(|e| e.key == name)
        .map(|e| &e.value)
}

pub(super) fn map_entries(node: &Node) -> &[Entry] {
    match &node.value {
        NodeValue::Map(entries) => entries,
        _ => &[],
    }
}

/// One component being mapped: where problems go.
pub(super) struct Mapping<'a> {
    pub(super) key: ComponentKey,
    pub(super) file: &'a str,
    pub(super) found: &'a mut Found,
    pub(super) ok: bool,
}

impl Mapping<'_> {
    pub(super) fn problem(&mut self, line: usize, message: impl Into<String>) {
        self.ok = false;
        self.found
            .problem_at(format!("{}:{line}", self.file), Some(&self.key), message);
    }

    /// `metadata`: the object's `name`; `namespace`, `labels`,
    /// `annotations` are accepted and mean nothing here.
    fn check_object_meta(&mut self, node: &Node) {
        if !matches!(node.value, NodeValue::Map(_)) {
            return self.problem(node.line, "`metadata` must be a mapping");
        }
        for entry in map_entries(node) {
            if !matches!(
                entry.key.as_str(),
                "name" | "namespace" | "labels" | "annotations"
            ) {
                self.problem(
                    entry.line,
                    format!("unsupported field `metadata.{}`", entry.key),
                );
            }
        }
    }

    /// `auth`: `secretStore` only.
    fn secret_store(&mut self, node: &Node) -> Option<String> {
        let mut store = None;
        for entry in map_entries(node) {
            match (entry.key.as_str(), entry.value.as_text()) {
                ("secretStore", Some(name)) if !name.is_empty() => store = Some(name),
                ("secretStore", _) => {
                    self.problem(entry.line, "auth.secretStore must name a secret store")
                }
                (other, _) => self.problem(entry.line, format!("unsupported field `auth.{other}`")),
            }
        }
        store
    }

    /// `scopes`: a list of app ids.
    fn app_scopes(&mut self, node: &Node) -> Option<Vec<String>> {
        let NodeValue::List(items) = &node.value else {
            self.problem(node.line, "`scopes` must be a list of app ids");
            return None;
        };
        let mut ids = Vec::new();
        for item in items {
            match item.as_text() {
                Some(id) => ids.push(id),
                None => self.problem(item.line, "`scopes` must be a list of app ids"),
            }
        }
        Some(ids)
    }
}
