//! `GET /v1.0/metadata`, in Dapr's shape: the shared
//! [`metadata()`](crate::dapr::metadata()) of the generation serving (app id,
//! runtime version, components with Dapr-style types) as JSON, with the
//! sidecar's extended metadata, which `PUT /v1.0/metadata/{key}` sets.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::error::HttpError;
use super::input::{body_bytes, RawBody};
use crate::dapr::{metadata, Call, ExtendedMetadata};
use crate::ApiState;

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

/// `PUT /v1.0/metadata/{key}`: the body (its text) becomes the value of
/// extended metadata entry `key`, 204; over a bound is a 400
/// `ERR_MALFORMED_REQUEST`.
pub async fn put(
    State(state): State<ApiState>,
    Path(key): Path<String>,
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
    let extended = ExtendedMetadata::of(&state.metrics).entries(metadata.generation);
    Json(Metadata {
        id: metadata.app_id,
        runtime_version: metadata.runtime_version,
        components,
        extended,
    })
}
