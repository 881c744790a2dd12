//! `GET /v1.0/metadata`, in Dapr's shape: the shared
//! [`metadata()`](crate::dapr::metadata()) of the generation serving (app id,
//! runtime version, components with Dapr-style types) as JSON.

use std::collections::BTreeMap;

use axum::Json;
use serde::Serialize;

use crate::dapr::{metadata, Call};

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
    let metadata = metadata(&call);
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
    let extended = BTreeMap::from([(
        "rewire.generation".to_string(),
        metadata.generation.to_string(),
    )]);
    Json(Metadata {
        id: metadata.app_id,
        runtime_version: metadata.runtime_version,
        components,
        extended,
    })
}
