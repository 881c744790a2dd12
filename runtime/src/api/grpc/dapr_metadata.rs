//! `GetMetadata`: the app id and the components of the call's generation,
//! with Dapr-style types (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`).

use std::collections::HashMap;

use super::call::Call;
use super::proto::dapr::proto::runtime::v1 as pb;
use crate::api::dapr_names::dapr_component_type;

/// The sidecar's metadata.
pub(super) fn get(call: &Call) -> pb::GetMetadataResponse {
    let config = call.runtime().config().config;
    let registered_components = call
        .generation
        .iter()
        .map(|(key, _)| {
            let type_name = config
                .components
                .get(key)
                .map_or("unknown", |spec| spec.type_name.as_str());
            pb::RegisteredComponents {
                name: key.name.clone(),
                r#type: dapr_component_type(&key.kind, type_name),
                version: "v1".into(),
                capabilities: Vec::new(),
            }
        })
        .collect();
    let extended_metadata = HashMap::from([(
        "rewire.generation".to_string(),
        call.generation.number.to_string(),
    )]);
    pb::GetMetadataResponse {
        id: config.app_id,
        registered_components,
        extended_metadata,
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        enabled_features: Vec::new(),
    }
}
