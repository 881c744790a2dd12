//! `GET /v1.0/rewire/status`: the runtime's status (generation, components
//! with their type and state, reloads oldest first), secret values
//! redacted.

use axum::extract::State;
use axum::Json;

use rewire_runtime::Status;

use crate::ApiState;

/// `GET /v1.0/rewire/status`.
pub async fn get(State(state): State<ApiState>) -> Json<Status> {
    Json(state.runtime.status().await)
}
