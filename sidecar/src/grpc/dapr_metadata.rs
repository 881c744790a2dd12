//! `GetMetadata`: the shared [`metadata()`](crate::dapr::metadata()) of the
//! call's generation, as protobuf, with the sidecar's extended metadata and,
//! as Dapr always sends them, the app connection and the actor runtime;
//! `SetMetadata` sets one entry of it.

use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{
    metadata, AppConnection, Call, ExtendedMetadata, ListedSubscription, SubscriptionOrigin,
    APP_MAX_CONCURRENCY,
};
use crate::ApiState;

/// `SetMetadata`: sets one extended metadata entry (an empty key changes
/// nothing, as Dapr); over a bound is `INVALID_ARGUMENT`.
pub(super) fn set(extended: &ExtendedMetadata, req: pb::SetMetadataRequest) -> Result<(), Status> {
    extended
        .set(req.key, req.value)
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The sidecar's metadata.
pub(super) fn get(
    call: &Call,
    state: &ApiState,
    extended: &ExtendedMetadata,
) -> pb::GetMetadataResponse {
    let metadata = metadata(call, state);
    let actors = metadata.actor_runtime;
    let registered_components = metadata
        .components
        .into_iter()
        .map(|component| pb::RegisteredComponents {
            name: component.name,
            r#type: component.type_name,
            version: "v1".into(),
            capabilities: component.capabilities,
        })
        .collect();
    let extended_metadata = extended.entries(metadata.generation).into_iter().collect();
    pb::GetMetadataResponse {
        id: metadata.app_id,
        registered_components,
        extended_metadata,
        subscriptions: metadata
            .subscriptions
            .into_iter()
            .map(subscription)
            .collect(),
        app_connection_properties: Some(app_connection(
            metadata
                .app_connection
                .unwrap_or_else(AppConnection::without_app),
        )),
        runtime_version: metadata.runtime_version.into(),
        enabled_features: Vec::new(),
        actor_runtime: Some(actor_runtime(
            actors.status,
            actors.host_ready,
            actors.placement,
        )),
    }
}

/// The actor runtime, as Dapr's `ActorRuntime` (no active actors).
fn actor_runtime(status: &str, host_ready: bool, placement: &str) -> pb::ActorRuntime {
    let status = pb::actor_runtime::ActorRuntimeStatus::from_str_name(status)
        .unwrap_or(pb::actor_runtime::ActorRuntimeStatus::Disabled);
    pb::ActorRuntime {
        runtime_status: status.into(),
        active_actors: Vec::new(),
        host_ready,
        placement: placement.to_string(),
    }
}

/// One subscription, as Dapr's `PubsubSubscription`.
fn subscription(listed: ListedSubscription) -> pb::PubsubSubscription {
    let origin = match listed.origin {
        SubscriptionOrigin::Declarative => pb::PubsubSubscriptionType::Declarative,
        SubscriptionOrigin::Programmatic => pb::PubsubSubscriptionType::Programmatic,
        SubscriptionOrigin::Streaming => pb::PubsubSubscriptionType::Streaming,
    };
    let rules = listed
        .rules
        .into_iter()
        .map(|(r#match, path)| pb::PubsubSubscriptionRule { r#match, path })
        .collect();
    pb::PubsubSubscription {
        pubsub_name: listed.pubsub_name,
        topic: listed.topic,
        metadata: listed.metadata.into_iter().collect(),
        rules: Some(pb::PubsubSubscriptionRules { rules }),
        dead_letter_topic: listed.dead_letter_topic.unwrap_or_default(),
        r#type: origin.into(),
    }
}

/// How the app is reached, as Dapr's `AppConnectionProperties`.
fn app_connection(connection: AppConnection) -> pb::AppConnectionProperties {
    pb::AppConnectionProperties {
        port: connection.port.into(),
        protocol: connection.protocol.into(),
        channel_address: connection.channel_address,
        max_concurrency: APP_MAX_CONCURRENCY,
        health: None,
    }
}
