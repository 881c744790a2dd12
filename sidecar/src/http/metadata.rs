//! `GET /v1.0/metadata`, in Dapr's shape: the shared
//! [`metadata()`](crate::dapr::metadata()) of the generation serving (app id,
//! runtime version, components with Dapr-style types, the app's
//! subscriptions and connection) as JSON, with the sidecar's extended
//! metadata, which `PUT /v1.0/metadata/{key}` sets. As Dapr's HTTP answer,
//! a subscription's `rules` is a plain list (gRPC nests it in `rules.rules`),
//! and `appConnectionProperties` and `actorRuntime` are always there.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::error::HttpError;
use super::input::{body_bytes, RawBody};
use super::path_params::PathParams;
use crate::dapr::{
    metadata, AppConnection, Call, ExtendedMetadata, ListedSubscription, APP_MAX_CONCURRENCY,
};
use crate::ApiState;

/// The answer, as Dapr's `GetMetadata`.
#[derive(Debug, Serialize)]
pub struct Metadata {
    id: String,
    #[serde(rename = "runtimeVersion")]
    runtime_version: &'static str,
    components: Vec<RegisteredComponent>,
    extended: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    subscriptions: Vec<Subscription>,
    #[serde(rename = "appConnectionProperties")]
    app_connection_properties: AppConnectionProperties,
    #[serde(rename = "actorRuntime")]
    actor_runtime: ActorRuntime,
}

/// The actor runtime, as Dapr's HTTP answer: the status as a name, no
/// `activeActors` (none).
#[derive(Debug, Serialize)]
pub struct ActorRuntime {
    #[serde(rename = "runtimeStatus")]
    runtime_status: &'static str,
    #[serde(rename = "hostReady")]
    host_ready: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    placement: &'static str,
}

/// One subscription, as Dapr's `PubsubSubscription` in its HTTP answer.
#[derive(Debug, Serialize)]
pub struct Subscription {
    pubsubname: String,
    topic: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rules: Vec<SubscriptionRule>,
    #[serde(rename = "deadLetterTopic")]
    dead_letter_topic: String,
    #[serde(rename = "type")]
    origin: &'static str,
}

/// One routing rule: the default route has no `match`.
#[derive(Debug, Serialize)]
pub struct SubscriptionRule {
    #[serde(rename = "match", skip_serializing_if = "String::is_empty")]
    matcher: String,
    path: String,
}

/// How the app is reached, as Dapr's `AppConnectionProperties` (no
/// `health`: rewire has no app health checks; `maxConcurrency` always
/// [`APP_MAX_CONCURRENCY`]); empty fields left out, as Dapr's `omitempty`
/// (no `port` without an app).
#[derive(Debug, Serialize)]
pub struct AppConnectionProperties {
    #[serde(skip_serializing_if = "is_zero")]
    port: u16,
    #[serde(skip_serializing_if = "str::is_empty")]
    protocol: &'static str,
    #[serde(rename = "channelAddress", skip_serializing_if = "String::is_empty")]
    channel_address: String,
    #[serde(rename = "maxConcurrency")]
    max_concurrency: i32,
}

/// Whether a port is unset.
fn is_zero(port: &u16) -> bool {
    *port == 0
}

impl From<ListedSubscription> for Subscription {
    fn from(listed: ListedSubscription) -> Self {
        Self {
            pubsubname: listed.pubsub_name,
            topic: listed.topic,
            metadata: listed.metadata,
            rules: listed
                .rules
                .into_iter()
                .map(|(matcher, path)| SubscriptionRule { matcher, path })
                .collect(),
            dead_letter_topic: listed.dead_letter_topic.unwrap_or_default(),
            origin: listed.origin.dapr_name(),
        }
    }
}

impl From<AppConnection> for AppConnectionProperties {
    fn from(connection: AppConnection) -> Self {
        Self {
            port: connection.port,
            protocol: connection.protocol,
            channel_address: connection.channel_address,
            max_concurrency: APP_MAX_CONCURRENCY,
        }
    }
}

/// One component, as Dapr's `RegisteredComponents`.
#[derive(Debug, Serialize)]
pub struct RegisteredComponent {
    name: String,
    #[serde(rename = "type")]
    type_name: String,
    version: &'static str,
    capabilities: Vec<String>,
}

/// `PUT /v1.0/metadata/{key}`: the body (its text) becomes the value of
/// extended metadata entry `key`, 204; over a bound is a 400
/// `ERR_MALFORMED_REQUEST`.
pub async fn put(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
    body: RawBody,
) -> Result<StatusCode, HttpError> {
    let value = body_bytes(body, state.options.max_request_bytes)?;
    ExtendedMetadata::of(&state.metrics)
        .set(key, String::from_utf8_lossy(&value).into_owned())
        .map_err(|e| HttpError::Invalid(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1.0/metadata`.
pub async fn get(State(state): State<ApiState>, call: Call) -> Json<Metadata> {
    let metadata = metadata(&call, &state);
    let components = metadata
        .components
        .into_iter()
        .map(|component| RegisteredComponent {
            name: component.name,
            type_name: component.type_name,
            version: "v1",
            capabilities: component.capabilities,
        })
        .collect();
    let extended = ExtendedMetadata::of(&state.metrics).entries(metadata.generation);
    Json(Metadata {
        id: metadata.app_id,
        runtime_version: metadata.runtime_version,
        components,
        extended,
        subscriptions: metadata.subscriptions.into_iter().map(Into::into).collect(),
        app_connection_properties: metadata
            .app_connection
            .unwrap_or_else(AppConnection::without_app)
            .into(),
        actor_runtime: ActorRuntime {
            runtime_status: metadata.actor_runtime.status,
            host_ready: metadata.actor_runtime.host_ready,
            placement: metadata.actor_runtime.placement,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dapr::StreamingSubscriptions;

    /// 1,024 topic streams, each with 16 KiB of metadata of control
    /// characters (six bytes each in JSON, about 100 MB listed whole):
    /// the answer's subscriptions stay within their budget, every stream
    /// listed, the first ones with their metadata.
    #[test]
    fn streams_with_escaped_metadata_stay_within_the_answer_budget() {
        let owner = Arc::new(0_u8);
        let streams = StreamingSubscriptions::of(&owner);
        let metadata: BTreeMap<String, String> = (0..4)
            .map(|i| (format!("k{i}"), "\u{1}".repeat(4096)))
            .collect();
        let _open: Vec<_> = (0..1024)
            .map(|i| {
                let topic = format!("topic-{i}");
                let dead_letter = Some("\u{1}".repeat(64));
                streams.open("pubsub", &topic, metadata.clone(), dead_letter)
            })
            .collect();
        let budget = 2 << 20;

        let listed = streams.listed_within(budget);
        let answer: Vec<Subscription> = listed.iter().cloned().map(Into::into).collect();
        let bytes = serde_json::to_vec(&answer).map_or(usize::MAX, |json| json.len());

        assert!(bytes <= budget, "{bytes} bytes listed, budget {budget}");
        assert_eq!(listed.len(), 1024, "every stream listed");
        assert_eq!(listed[0].metadata, metadata, "the oldest whole");
        assert!(listed[1023].metadata.is_empty(), "the newest bare");
    }
}
