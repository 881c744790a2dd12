//! `GetMetadata`: the shared [`metadata()`](crate::dapr::metadata()) of the
//! call's generation, as protobuf, with the sidecar's extended metadata;
//! `SetMetadata` sets one entry of it.

use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{metadata, Call, ExtendedMetadata};

/// `SetMetadata`: sets one extended metadata entry (an empty key changes
/// nothing, as Dapr); over a bound is `INVALID_ARGUMENT`.
pub(super) fn set(extended: &ExtendedMetadata, req: pb::SetMetadataRequest) -> Result<(), Status> {
    extended
        .set(req.key, req.value)
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The sidecar's metadata.
pub(super) fn get(call: &Call, extended: &ExtendedMetadata) -> pb::GetMetadataResponse {
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
    let extended_metadata = extended.entries(metadata.generation).into_iter().collect();
    pb::GetMetadataResponse {
        id: metadata.app_id,
        registered_components,
        extended_metadata,
        runtime_version: metadata.runtime_version.into(),
        enabled_features: Vec::new(),
    }
}
