//! What is running, where each value came from, and what the last reloads
//! did — with every secret value redacted.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::component::Readiness;
use crate::config::{ComponentSources, ComponentSpec};
use crate::reload::ReloadRecord;
use crate::runtime::Runtime;

/// How long a status waits for one component's readiness answer.
const READINESS_TIMEOUT: Duration = Duration::from_secs(1);

/// A snapshot of the runtime, safe to show (no secret values).
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The generation serving.
    pub generation: u64,
    /// The application id.
    #[serde(rename = "appId")]
    pub app_id: String,
    /// Every running component.
    pub components: Vec<ComponentStatus>,
    /// The last reloads, oldest first.
    pub reloads: Vec<ReloadRecord>,
}

/// One running component.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentStatus {
    /// Its kind.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `ready`, `degraded` or `not_ready`.
    pub state: &'static str,
    /// Why it is degraded or not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its effective metadata: declared values, configurationRef values as
    /// resolved, secretRef values replaced by where they come from.
    pub metadata: Map<String, Value>,
    /// The components injected into it (`kind/name`).
    #[serde(rename = "componentRefs")]
    pub component_refs: Vec<String>,
    /// The configuration layer each value came from.
    pub sources: ComponentSources,
}

impl Runtime {
    /// The runtime's status (asks each component for its readiness).
    pub async fn status(&self) -> Status {
        let (running, sources, app_id) = {
            let state = self.inner.state();
            let (_, sources) = state.layers.effective();
            (
                state.running.clone(),
                sources,
                state.config.config.app_id.clone(),
            )
        };
        let generation = self.inner.live.current().number;
        let mut components = Vec::with_capacity(running.len());
        for (key, running) in running {
            let readiness = tokio::time::timeout(
                READINESS_TIMEOUT,
                running.assembled.instance.component().readiness(),
            )
            .await;
            let (state, reason) = match readiness {
                Ok(Readiness::Ready) => ("ready", None),
                Ok(Readiness::Degraded(reason)) => ("degraded", Some(self.redact(&reason))),
                Ok(Readiness::NotReady(reason)) => ("not_ready", Some(self.redact(&reason))),
                Err(_) => (
                    "not_ready",
                    Some(format!("no readiness answer within {READINESS_TIMEOUT:?}")),
                ),
            };
            components.push(ComponentStatus {
                metadata: self.shown_metadata(&running.spec, &running.assembled.resolved.0),
                component_refs: running
                    .spec
                    .component_refs
                    .iter()
                    .map(|r| r.key.to_string())
                    .collect(),
                sources: sources.get(&key).cloned().unwrap_or_default(),
                kind: key.kind,
                name: key.name,
                type_name: running.spec.type_name,
                state,
                reason,
            });
        }
        Status {
            generation,
            app_id,
            components,
            reloads: self.history(),
        }
    }

    fn shown_metadata(
        &self,
        spec: &ComponentSpec,
        resolved: &Map<String, Value>,
    ) -> Map<String, Value> {
        let mut shown: Map<String, Value> = spec.metadata.clone();
        for r in &spec.configuration_refs {
            if let Some(value) = resolved.get(&r.inject_as) {
                shown.insert(r.inject_as.clone(), value.clone());
            }
        }
        for r in &spec.secret_refs {
            let source = format!("[secret {}/{}#{}]", r.store, r.name, r.key);
            shown.insert(r.inject_as.clone(), Value::String(source));
        }
        scrub(self, Value::Object(shown))
            .as_object()
            .cloned()
            .unwrap_or_default()
    }
}

/// Redacts every remembered secret value found in any string of `value`.
fn scrub(runtime: &Runtime, value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(runtime.redact(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| scrub(runtime, v)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, scrub(runtime, v)))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect(),
        ),
        other => other,
    }
}
