//! Health: `/v1.0/healthz` asks every component of the generation serving
//! whether it is ready (concurrently, each within a short timeout);
//! `/v1.0/healthz/outbound` answers as soon as the runtime is serving,
//! which it is once this server exists (the Dapr SDKs poll it before their
//! first call).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::task::JoinSet;

use rewire_runtime::Readiness;

use super::auth::authenticated;
use super::error::HttpError;
use crate::dapr::Call;
use crate::ApiState;

/// How long one component may take to answer its readiness.
const READINESS_TIMEOUT: Duration = Duration::from_millis(500);

/// `GET /v1.0/healthz`: 204 when every component is ready, else 500
/// listing the others (`kind/name: reason`) to a caller presenting the app
/// or the admin token (when one is set), without the list to anyone else:
/// backend addresses and errors are not for unauthenticated callers.
pub async fn healthz(
    State(state): State<ApiState>,
    headers: HeaderMap,
    call: Call,
) -> Result<StatusCode, HttpError> {
    let mut checks = JoinSet::new();
    for (key, instance) in call.generation().iter() {
        let (key, component) = (key.clone(), instance.component());
        checks.spawn(async move {
            match tokio::time::timeout(READINESS_TIMEOUT, component.readiness()).await {
                Ok(Readiness::Ready | Readiness::Degraded(_)) => None,
                Ok(Readiness::NotReady(reason)) => Some(format!("{key}: {reason}")),
                Err(_) => Some(format!(
                    "{key}: no readiness answer within {READINESS_TIMEOUT:?}"
                )),
            }
        });
    }
    let mut not_ready = Vec::new();
    while let Some(check) = checks.join_next().await {
        match check {
            Ok(None) => {}
            Ok(Some(line)) => not_ready.push(call.scrub(&line)),
            Err(error) => not_ready.push(format!("a readiness check failed: {error}")),
        }
    }
    if not_ready.is_empty() {
        return Ok(StatusCode::NO_CONTENT);
    }
    if !authenticated(&state.options, &headers) {
        return Err(HttpError::NotReadyWithheld);
    }
    not_ready.sort();
    Err(HttpError::NotReady(not_ready))
}

/// `GET /v1.0/healthz/outbound`: 204.
pub async fn outbound() -> StatusCode {
    StatusCode::NO_CONTENT
}
