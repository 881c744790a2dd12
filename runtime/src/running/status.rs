//! What each running component is, how it is doing, and where each value
//! came from — with every secret value redacted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::task::JoinSet;

use crate::guarded::{guarded, Answer};

use crate::component::{ComponentKey, Kind, Readiness};
use crate::config::{ComponentSources, ComponentSpec, InjectedRef};
use crate::handle::resilience::BreakerStatus;
use crate::redact::{shown_fields, Redactor};

use super::{Mark, RunningSet};

/// How long a status waits for one component's readiness answer.
///
/// Ordered against the components' own limits: a component bounds its
/// readiness check below this wait (the etcd and redis stores within
/// 800 ms) and answers `Degraded` or `NotReady` itself, so the status shows
/// the component's own answer (e.g. etcd `degraded`, serving its last
/// values) rather than "no readiness answer", and redis's timed-out `PING`
/// gets to start following a failover. The sidecar's `/v1.0/healthz` waits
/// as long. A component that has not answered by then counts as not ready.
const READINESS_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// Set while it runs other values than its declaration says (an
    /// update of it failed and could not be put back): whether reloads
    /// still retry it, or what to do.
    #[serde(rename = "notAsDeclared", skip_serializing_if = "Option::is_none")]
    pub not_as_declared: Option<String>,
    /// Its effective metadata: declared values, configurationRef values as
    /// resolved, secretRef values replaced by where they come from.
    pub metadata: Map<String, Value>,
    /// The components injected into it (`kind/name`).
    #[serde(rename = "componentRefs")]
    pub component_refs: Vec<String>,
    /// The configuration layer each value came from.
    pub sources: ComponentSources,
    /// Its circuit breaker, when a resiliency policy gives it one.
    #[serde(rename = "circuitBreaker", skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<BreakerStatus>,
    /// The circuit breaker of a pub/sub's deliveries to the app, when an
    /// `inbound` resiliency policy gives it one.
    #[serde(
        rename = "inboundCircuitBreaker",
        skip_serializing_if = "Option::is_none"
    )]
    pub inbound_circuit_breaker: Option<BreakerStatus>,
}

/// What runs, as one generation runs it.
#[derive(Debug, Clone)]
pub(crate) struct Statuses {
    /// The number of the generation shown.
    pub(crate) generation: u64,
    /// The app id it serves.
    pub(crate) app_id: String,
    /// Each of its components' status.
    pub(crate) components: Vec<ComponentStatus>,
}

impl RunningSet {
    /// The app id and every running component's status, as
    /// [`generation_status`](Self::generation_status) shows them.
    #[cfg(test)]
    pub(crate) async fn statuses(&self, redactor: &Redactor) -> (String, Vec<ComponentStatus>) {
        let shown = self.generation_status(redactor).await;
        (shown.app_id, shown.components)
    }

    /// The generation serving, its app id and every component's status
    /// (asks each component for its readiness, each within a deadline).
    ///
    /// Everything shown is of one generation: its number, components, app
    /// id, sources, marks and circuit breakers are taken together under the
    /// state lock (a commit publishes under it) before readiness is asked
    /// of those very instances, so a reload committing while they answer
    /// shows in the next status, not half in this one.
    pub(crate) async fn generation_status(&self, redactor: &Redactor) -> Statuses {
        let (generation, components, sources, app_id, marks) = {
            let state = self.state();
            let (_, sources) = state.layers.whole(&state.config.config).effective();
            (
                self.live.load_full(),
                state.components.clone(),
                sources,
                state.config.config.app_id.clone(),
                state.not_as_declared.clone(),
            )
        };
        let mut readiness = readiness_of(&components).await;
        let mut statuses = Vec::with_capacity(components.len());
        for (key, running) in components.iter() {
            let answer = readiness.remove(key).unwrap_or(Answer::TimedOut);
            let (state, reason) = match answer {
                Answer::Answered(Ok(Readiness::Ready)) => ("ready", None),
                Answer::Answered(Ok(Readiness::Degraded(reason))) => {
                    ("degraded", Some(redactor.scrub(&reason)))
                }
                Answer::Answered(Ok(Readiness::NotReady(reason))) => {
                    ("not_ready", Some(redactor.scrub(&reason)))
                }
                Answer::Answered(Err(never)) => {
                    ("not_ready", Some(redactor.scrub(&never.to_string())))
                }
                Answer::TimedOut => (
                    "not_ready",
                    Some(format!("no readiness answer within {READINESS_TIMEOUT:?}")),
                ),
                Answer::Panicked(message) => (
                    "not_ready",
                    Some(format!("readiness panicked: {}", redactor.scrub(&message))),
                ),
                Answer::Cancelled => (
                    "not_ready",
                    Some("readiness check cancelled before it answered".to_string()),
                ),
            };
            statuses.push(ComponentStatus {
                metadata: shown_metadata(redactor, &running.spec, &running.assembled.resolved),
                component_refs: running
                    .spec
                    .component_refs
                    .iter()
                    .map(|r| r.key.to_string())
                    .collect(),
                sources: sources.get(key).cloned().unwrap_or_default(),
                circuit_breaker: generation
                    .policies()
                    .get(key)
                    .and_then(|applied| applied.breaker_status()),
                inbound_circuit_breaker: (key.kind == Kind::PubSub)
                    .then(|| generation.policies().inbound(&key.name))
                    .flatten()
                    .and_then(|applied| applied.breaker_status()),
                kind: key.kind.to_string(),
                name: key.name.to_string(),
                type_name: running.spec.type_name.clone(),
                state,
                reason,
                not_as_declared: marks.get(key).map(Mark::status_note),
            });
        }
        Statuses {
            generation: generation.number,
            app_id,
            components: statuses,
        }
    }
}

/// Every component's readiness, asked concurrently: the answer takes at
/// most [`READINESS_TIMEOUT`] however many components are slow. Each is
/// asked in a task of its own: a readiness that panics says so.
async fn readiness_of(components: &super::Components) -> BTreeMap<ComponentKey, Answer<Readiness>> {
    let mut asked = JoinSet::new();
    for (key, running) in components {
        let (key, component) = (key.clone(), running.assembled.instance.component());
        asked.spawn(async move {
            let ask = async move { Ok(component.readiness().await) };
            (key, guarded(ask, READINESS_TIMEOUT).await)
        });
    }
    let mut answers = BTreeMap::new();
    while let Some(joined) = asked.join_next().await {
        if let Ok((key, answer)) = joined {
            answers.insert(key, answer);
        }
    }
    answers
}

/// The metadata shown for a component: declared values, configurationRef
/// values as resolved, secretRef values replaced by where they come from,
/// and the value of every field named like a secret
/// ([`is_secret_field`](crate::is_secret_field)) as `[secret]`.
fn shown_metadata(
    redactor: &Redactor,
    spec: &ComponentSpec,
    resolved: &Map<String, Value>,
) -> Map<String, Value> {
    let mut declared: Map<String, Value> = spec.metadata.clone();
    let (secrets, configurations): (Vec<InjectedRef>, Vec<InjectedRef>) = spec
        .injected_refs()
        .partition(|r| matches!(r, InjectedRef::Secret(..)));
    for r in configurations {
        if let Some(value) = resolved.get(r.inject_as()) {
            declared.insert(r.inject_as().to_string(), value.clone());
        }
    }
    let mut shown = shown_fields(&declared, &BTreeSet::new());
    // Secrets last: where a field is injected twice, the secret's source
    // is what shows.
    for r in secrets {
        if let InjectedRef::Secret(_, s) = &r {
            let source = format!("[secret {}/{}#{}]", s.store, s.name, s.key);
            shown.insert(r.inject_as().to_string(), Value::String(source));
        }
    }
    scrub(redactor, Value::Object(shown))
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Redacts every remembered secret value found in any string of `value`.
fn scrub(redactor: &Redactor, value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(redactor.scrub(&s)),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| scrub(redactor, v)).collect())
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, scrub(redactor, v)))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::{ConfigurationRef, SecretRef};

    fn spec(metadata: Value) -> ComponentSpec {
        ComponentSpec {
            key: ComponentKey::new("state", "cache"),
            type_name: "redis".into(),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            component_refs: Vec::new(),
            secret_refs: vec![SecretRef {
                store: "vault".into(),
                name: "db".into(),
                key: "pw".into(),
                inject_as: "auth".into(),
                watch: false,
            }],
            configuration_refs: vec![ConfigurationRef {
                store: "settings".into(),
                key: "token".into(),
                group: None,
                label: None,
                inject_as: "apiToken".into(),
                watch: false,
            }],
            scopes: None,
        }
    }

    #[test]
    fn inline_secrets_show_as_secret_and_refs_as_their_source() {
        let spec = spec(json!({
            "redisHost": "redis://:hunter2@127.0.0.1:6379",
            "redisPassword": "hunter2",
            "clientKey": "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----",
            "keyPrefix": "app||",
        }));
        let resolved = json!({"auth": "from-vault", "apiToken": "from-settings"});
        let resolved = resolved.as_object().cloned().unwrap_or_default();
        let shown = shown_metadata(&Redactor::default(), &spec, &resolved);
        assert_eq!(
            Value::Object(shown),
            json!({
                "redisHost": "redis://:[redacted]@127.0.0.1:6379",
                "redisPassword": "[secret]",
                "clientKey": "[secret]",
                "keyPrefix": "app||",
                "auth": "[secret vault/db#pw]",
                "apiToken": "[secret]",
            })
        );
    }
}
