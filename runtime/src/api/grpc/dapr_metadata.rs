//! `GetMetadata`: the app id and the components of the call's generation,
//! with Dapr-style types (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`).

use std::collections::HashMap;

use super::call::Call;
use super::proto::dapr::proto::runtime::v1 as pb;
use crate::key::{CONFIG_STORE, LOCK, SECRET_STORE, STATE};

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
                r#type: format!("{}.{type_name}", dapr_category(&key.kind)),
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

/// Dapr's name for the category of a kind.
fn dapr_category(kind: &str) -> &str {
    match kind {
        STATE => "state",
        SECRET_STORE => "secretstores",
        CONFIG_STORE => "configuration",
        LOCK => "lock",
        custom => custom,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_kinds_use_dapr_categories() {
        assert_eq!(dapr_category(STATE), "state");
        assert_eq!(dapr_category(SECRET_STORE), "secretstores");
        assert_eq!(dapr_category(CONFIG_STORE), "configuration");
        assert_eq!(dapr_category(LOCK), "lock");
        assert_eq!(dapr_category("greeter"), "greeter");
    }
}
