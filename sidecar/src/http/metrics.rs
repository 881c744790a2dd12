//! `GET /metrics`: the Prometheus text exposition.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::ApiState;

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub async fn get(State(state): State<ApiState>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, PROMETHEUS_TEXT)],
        state.metrics.render(&state.runtime),
    )
}
