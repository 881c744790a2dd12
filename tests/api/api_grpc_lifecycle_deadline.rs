//! A push is never `CANCELLED` for something applied later: behind a reload
//! whose `init` hangs (init timeout 2 s here), a push whose caller allows
//! 1 s is answered within that second — `queued`, behind how many, not
//! applied yet — and is then applied; the hung push itself gets its
//! rolled-back NACK with the reason before its caller's 10 s deadline.

use crate::support::{grpc, sidecar, valid};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use grpc::lifecycle::{ComponentConfig, DynamicConfiguration};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{ComponentKey, Registry, Runtime, RuntimeOptions, StartTimeouts};
use serde::Deserialize;
use sidecar::Sidecar;
use tonic::Request;

/// Set once a hanging `init` has started.
static HUNG: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct HangMeta {
    hang_init: bool,
}

/// A component whose `init` never answers when `hangInit` is set.
#[derive(rewire::Component)]
#[component(kind = "worker", type = "test.push_deadline.hang")]
struct Hang {
    #[metadata]
    meta: HangMeta,
}

#[async_trait]
impl Component for Hang {
    async fn init(&mut self, _cx: &InitContext) -> Result<(), ComponentError> {
        if self.meta.hang_init {
            HUNG.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

fn push(
    kind: &str,
    name: &str,
    type_name: &str,
    metadata: &[(&str, &str)],
    within: Duration,
) -> Request<DynamicConfiguration> {
    let config = ComponentConfig {
        kind: kind.into(),
        name: name.into(),
        r#type: type_name.into(),
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ComponentConfig::default()
    };
    let mut request = Request::new(DynamicConfiguration {
        component_config: Some(config),
        based_on_generation: None,
    });
    request.set_timeout(within);
    request
}

#[tokio::test]
async fn a_push_behind_a_hung_init_is_answered_queued_in_time_then_applied() {
    let options = RuntimeOptions {
        timeouts: StartTimeouts {
            init: Duration::from_secs(2),
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    };
    let config = valid(r#"{"components": {"state": {"orders": {"type": "memory"}}}}"#);
    let runtime = Runtime::start(config, Registry::collected(), options)
        .await
        .expect("start failed");
    let sidecar = Sidecar::serve(runtime, ApiOptions::default()).await;
    let mut first = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let mut second = grpc::lifecycle_client(sidecar.grpc_url()).await;

    let hung = tokio::spawn(async move {
        let request = push(
            "worker",
            "w",
            "test.push_deadline.hang",
            &[("hangInit", "true")],
            Duration::from_secs(10),
        );
        first.apply_configuration(request).await
    });
    // The hung push holds the reload before the second one is sent.
    let started = Instant::now();
    while !HUNG.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < grpc::PATIENCE,
            "the hanging init never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let request = push("state", "audit", "memory", &[], Duration::from_secs(1));
    let queued = second
        .apply_configuration(request)
        .await
        .expect("the push behind was not answered (CANCELLED or DEADLINE_EXCEEDED)")
        .into_inner();
    assert!(!queued.accepted);
    assert_eq!(queued.outcome, "queued", "{:?}", queued.errors);
    assert!(
        queued
            .errors
            .iter()
            .any(|e| e.contains("queued behind 1") && e.contains("not applied yet")),
        "{:?}",
        queued.errors
    );

    // Answered before its caller's 10 s deadline (past it, the server
    // itself ends the call CANCELLED), and by the init timeout: a push
    // still waiting at 9 s would have been answered `queued`.
    let hung = hung
        .await
        .expect("task")
        .expect("the hung push was not answered before its deadline")
        .into_inner();
    assert!(!hung.accepted);
    assert_eq!(hung.outcome, "rolled_back", "{:?}", hung.errors);
    assert!(
        hung.errors
            .iter()
            .any(|e| e.contains("worker/w") && e.contains("init timed out")),
        "{:?}",
        hung.errors
    );

    // The queued push is then applied, as its answer said it would be.
    let audit = ComponentKey::new("state", "audit");
    let applied = tokio::time::timeout(grpc::PATIENCE, async {
        while !sidecar
            .runtime
            .generation()
            .iter()
            .any(|(key, _)| *key == audit)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(applied.is_ok(), "the queued push was never applied");
    sidecar.stop().await;
}
