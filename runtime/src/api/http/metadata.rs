//! `GET /v1.0/metadata`, in Dapr's shape: the app id, the runtime version
//! and the components of the generation serving, each with a Dapr-style
//! type (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`).

use std::collections::BTreeMap;

use axum::Json;
use serde::Serialize;

use super::call::Call;
use crate::api::dapr_names::dapr_component_type;

/// The answer, as Dapr's `GetMetadata`.
#[derive(Debug, Serialize)]
pub struct Metadata {
    id: String,
    #[serde(rename = "runtimeVersion")]
    runtime_version: &'static str,
    components: Vec<RegisteredComponent>,
    extended: BTreeMap<String, String>,
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

/// `GET /v1.0/metadata`.
pub async fn get(call: Call) -> Json<Metadata> {
    let config = call.runtime().config().config;
    let components = call
        .generation
        .iter()
        .map(|(key, _)| {
            let type_name = config
                .components
                .get(key)
                .map_or("unknown", |spec| spec.type_name.as_str());
            RegisteredComponent {
                name: key.name.clone(),
                type_name: dapr_component_type(&key.kind, type_name),
                version: "v1",
                capabilities: Vec::new(),
            }
        })
        .collect();
    let extended = BTreeMap::from([(
        "rewire.generation".to_string(),
        call.generation.number.to_string(),
    )]);
    Json(Metadata {
        id: config.app_id,
        runtime_version: env!("CARGO_PKG_VERSION"),
        components,
        extended,
    })
}
