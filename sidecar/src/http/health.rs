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
//!
//! healthz needs no token, so its fan-out to every backend is shared:
//! calls arriving while a check of the same generation runs wait for that
//! check, and its outcome answers the calls of the next [`FRESH_FOR`]
//! too. A flood of probes (200 streams on each of 1,024 connections)
//! costs the backends one check at a time, not one per call.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures_util::FutureExt as _;
use tokio::sync::OnceCell;
use tokio::task::JoinSet;

use rewire_runtime::{Generation, Readiness};

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

/// How long a finished check's outcome answers later healthz calls: short
/// enough for a probe to see a backend's change at once, long enough that
/// a flood of probes cannot turn into a flood of backend checks.
pub const FRESH_FOR: Duration = Duration::from_millis(500);

/// Dapr's error for an `appid` that is not this app's.
const APPID_NOT_MATCH: &str = "ERR_HEALTH_APPID_NOT_MATCH";

/// `GET /v1.0/healthz`: 204 when every component is ready or degraded,
/// else 500 listing the others (`kind/name: reason`) to a caller presenting
/// the app or the admin token (when one is set), without the list to anyone
/// else: backend addresses and errors are not for unauthenticated callers.
/// Then, as Dapr: with `?appid=` other than this app's id, 500
/// `ERR_HEALTH_APPID_NOT_MATCH` (a name resolver checking that the address
/// still serves the app it registered). Concurrent calls share one check of
/// the components, and its outcome is reused for [`FRESH_FOR`] (500 ms).
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
    let not_ready = match shared_check(state, call) {
        Some(check) => {
            let (_, not_ready) = check.get_or_init(|| run_check(call)).await;
            Arc::clone(not_ready)
        }
        // A reload between the call's start and now: checked alone.
        None => run_check(call).await.1,
    };
    if not_ready.is_empty() {
        return Ok(());
    }
    if !authenticated(&state.options, headers) {
        return Err(HttpError::NotReadyWithheld);
    }
    Err(HttpError::NotReady(not_ready.to_vec()))
}

/// A check's outcome: when it finished, and the not-ready lines (sorted,
/// scrubbed).
type Outcome = (Instant, Arc<Vec<String>>);

/// One generation's check, running or finished. The `Weak` keeps the
/// generation's allocation (not the generation) alive, so its address
/// names no other generation while the entry exists.
struct SharedCheck {
    generation: Weak<Generation>,
    outcome: Arc<OnceCell<Outcome>>,
}

/// The checks of every served generation (few: one per sidecar in the
/// process, two during a reload).
static CHECKS: Mutex<Vec<SharedCheck>> = Mutex::new(Vec::new());

/// The check of the call's generation to wait for: the one running, or
/// finished less than [`FRESH_FOR`] ago, else a new one. `None` when the
/// call's generation is no longer the runtime's.
fn shared_check(state: &ApiState, call: &Call) -> Option<Arc<OnceCell<Outcome>>> {
    let generation = state.runtime.generation();
    if !std::ptr::eq(Arc::as_ptr(&generation), call.generation()) {
        return None;
    }
    let mut checks = CHECKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    checks.retain(|check| {
        check.generation.strong_count() > 0
            && check
                .outcome
                .get()
                .is_none_or(|(finished, _)| finished.elapsed() < FRESH_FOR)
    });
    let found = checks
        .iter()
        .find(|check| std::ptr::eq(check.generation.as_ptr(), Arc::as_ptr(&generation)));
    if let Some(check) = found {
        return Some(Arc::clone(&check.outcome));
    }
    let outcome = Arc::new(OnceCell::new());
    checks.push(SharedCheck {
        generation: Arc::downgrade(&generation),
        outcome: Arc::clone(&outcome),
    });
    Some(outcome)
}

/// Asks every component of the call's generation, all at once, each within
/// [`READINESS_WAIT`]; a check that panics is `{key}: readiness check
/// panicked`.
async fn run_check(call: &Call) -> Outcome {
    let mut checks = JoinSet::new();
    for (key, instance) in call.generation().iter() {
        let (key, component) = (key.clone(), instance.component());
        checks.spawn(async move {
            // A panic is caught here, where the component's key is known:
            // its line names the component, never the panic's message
            // (which may quote a connection string).
            let asked = AssertUnwindSafe(async move { component.readiness().await });
            match tokio::time::timeout(READINESS_WAIT, asked.catch_unwind()).await {
                Ok(Ok(Readiness::Ready | Readiness::Degraded(_))) => None,
                Ok(Ok(Readiness::NotReady(reason))) => Some(format!("{key}: {reason}")),
                Ok(Err(_panic)) => Some(format!("{key}: readiness check panicked")),
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
            // Only a cancelled task (the runtime shutting down): panics
            // are caught in the task.
            Err(_) => not_ready.push("a readiness check was cancelled".to_string()),
        }
    }
    not_ready.sort();
    (Instant::now(), Arc::new(not_ready))
}

/// `GET /v1.0/healthz/outbound`: 204.
pub async fn outbound() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::Readiness;

    use super::*;
    use crate::dapr::StoreLabel;

    /// The credentials the panicking check quotes.
    const PASSWORD: &str = "s3cret-pass";

    /// Whether [`PanickingProbe`]'s check panics (not while the runtime
    /// starts, which asks it too).
    static PANICS: AtomicBool = AtomicBool::new(false);

    /// A component whose readiness check panics quoting its connection
    /// string, once [`PANICS`] is set.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "probe", type = "test.health.panics")]
    struct PanickingProbe {}

    #[async_trait]
    impl rewire_runtime::Component for PanickingProbe {
        async fn readiness(&self) -> Readiness {
            if PANICS.load(Ordering::SeqCst) {
                panic!("cannot reach redis://user:{PASSWORD}@db:6379");
            }
            Readiness::Ready
        }
    }

    /// A readiness check that panics is reported by the component's key,
    /// without the panic's message (failed before the fix: `a readiness
    /// check failed: task N panicked with message "cannot reach
    /// redis://user:s3cret-pass@…"`, no component named).
    #[tokio::test]
    async fn a_panicking_check_names_the_component_and_not_its_secret() {
        use rewire_runtime::config::{parse, validate};
        let config = serde_json::json!({
            "appId": "app",
            "components": {"probe": {"p": {"type": "test.health.panics"}}}
        });
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = rewire_runtime::Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        let runtime = rewire_runtime::Runtime::start(config, registry, Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let call = Call::new(&runtime, StoreLabel::default());
        PANICS.store(true, Ordering::SeqCst);

        let (_, not_ready) = run_check(&call).await;

        assert_eq!(*not_ready, vec!["probe/p: readiness check panicked"]);
        let body = HttpError::NotReady(not_ready.to_vec()).body().to_string();
        assert!(body.contains("probe/p"), "{body}");
        assert!(!body.contains(PASSWORD), "{body}");
        runtime.shutdown().await;
    }
}
