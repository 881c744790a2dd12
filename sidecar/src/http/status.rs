//! `GET /v1.0/rewire/status`: the runtime's status (generation, components
//! with their type and state, reloads oldest first), secret values
//! redacted.

use axum::extract::State;
use axum::Json;

use rewire_runtime::Status;

use crate::ApiState;

/// `GET /v1.0/rewire/status`; with TLS on a listener, a `tls` list too
/// (certificate fingerprint, loads, the last refused rotation).
pub async fn get(State(state): State<ApiState>) -> Json<serde_json::Value> {
    let status: Status = state.runtime.status().await;
    let mut value = serde_json::to_value(status).unwrap_or_default();
    let tls = state.tls.status();
    if let (false, Some(object)) = (tls.is_empty(), value.as_object_mut()) {
        object.insert("tls".into(), serde_json::to_value(tls).unwrap_or_default());
    }
    Json(value)
}
