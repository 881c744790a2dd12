//! Health: `/v1.0/healthz` asks every component of the generation serving
//! whether it is ready (concurrently, each within [`READINESS_WAIT`]) and,
//! as Dapr does, refuses an `appid` that is not this app's;
//! `/v1.0/healthz/outbound` answers as soon as the runtime is serving,
//! which it is once this server exists (the Dapr SDKs poll it before their
//! first call).
//!
//! The readiness budget is ordered: a component bounds its own readiness
//! check (the etcd and redis stores within 800 ms) and answers `Degraded`
//! or `NotReady` itself; the callers (healthz here, the status in
//! `rewire_runtime`) wait longer, 1 s, so that the component's own answer
//! is the one heard. A caller that gave up first would turn an etcd store
//! serving its last values (`Degraded`, healthy) into a 500, and a
//! Kubernetes liveness probe would restart the sidecar in exactly the
//! outage the degraded mode is there to survive; it would also cut the
//! redis readiness before its timed-out `PING` starts following a
//! failover. A component that has not answered within the wait broke that
//! contract (its check hangs, not its backend) and counts as not ready.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::task::JoinSet;

use rewire_runtime::Readiness;

use super::auth::authenticated;
use super::error::HttpError;
use super::input::{query_pairs, query_value, QueryPairs};
use crate::dapr::Call;
use crate::ApiState;

/// How long healthz waits for one component's readiness answer: longer
/// than any component's own readiness limit (800 ms at most), so that a
/// component that bounds its check answers `Degraded` or `NotReady` itself
/// instead of being cut off (see the module docs). The same wait as the
/// status's (`rewire_runtime`'s `READINESS_TIMEOUT`).
pub const READINESS_WAIT: Duration = Duration::from_secs(1);

/// Dapr's error for an `appid` that is not this app's.
const APPID_NOT_MATCH: &str = "ERR_HEALTH_APPID_NOT_MATCH";

/// `GET /v1.0/healthz`: 204 when every component is ready or degraded,
/// else 500 listing the others (`kind/name: reason`) to a caller presenting
/// the app or the admin token (when one is set), without the list to anyone
/// else: backend addresses and errors are not for unauthenticated callers.
/// Then, as Dapr: with `?appid=` other than this app's id, 500
/// `ERR_HEALTH_APPID_NOT_MATCH` (a name resolver checking that the address
/// still serves the app it registered).
pub async fn healthz(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: QueryPairs,
    call: Call,
) -> Result<StatusCode, HttpError> {
    let pairs = query_pairs(query)?;
    check_components(&state, &headers, &call).await?;
    let app_id = call.generation().app_id();
    match query_value(&pairs, "appid") {
        Some(asked) if asked != app_id => Err(HttpError::Api {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: APPID_NOT_MATCH,
            message: "dapr app-id does not match".into(),
        }),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// Every component of the generation serving ready or degraded, or the
/// not-ready error.
async fn check_components(
    state: &ApiState,
    headers: &HeaderMap,
    call: &Call,
) -> Result<(), HttpError> {
    let mut checks = JoinSet::new();
    for (key, instance) in call.generation().iter() {
        let (key, component) = (key.clone(), instance.component());
        checks.spawn(async move {
            match tokio::time::timeout(READINESS_WAIT, component.readiness()).await {
                Ok(Readiness::Ready | Readiness::Degraded(_)) => None,
                Ok(Readiness::NotReady(reason)) => Some(format!("{key}: {reason}")),
                Err(_) => Some(format!(
                    "{key}: no readiness answer within {READINESS_WAIT:?}"
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
        return Ok(());
    }
    if !authenticated(&state.options, headers) {
        return Err(HttpError::NotReadyWithheld);
    }
    not_ready.sort();
    Err(HttpError::NotReady(not_ready))
}

/// `GET /v1.0/healthz/outbound`: 204.
pub async fn outbound() -> StatusCode {
    StatusCode::NO_CONTENT
}
