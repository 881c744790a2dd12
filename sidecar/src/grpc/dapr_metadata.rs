//! `GetMetadata`: the shared [`metadata()`](crate::dapr::metadata()) of the
//! call's generation, as protobuf.

use std::collections::HashMap;

use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{metadata, Call};

/// The sidecar's metadata.
pub(super) fn get(call: &Call) -> pb::GetMetadataResponse {
    let metadata = metadata(call);
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
    let extended_metadata = HashMap::from([(
        "rewire.generation".to_string(),
        metadata.generation.to_string(),
    )]);
    pb::GetMetadataResponse {
        id: metadata.app_id,
        registered_components,
        extended_metadata,
        runtime_version: metadata.runtime_version.into(),
        enabled_features: Vec::new(),
    }
}
