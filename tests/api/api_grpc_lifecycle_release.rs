//! Handing a component back to the file: `ReleaseComponent` lets go of a
//! push, so the file's version is in force again (and a later file change
//! applies); releasing a component nobody pushed is a NACK saying so. A
//! `RemoveComponent` of a component that does not exist is a NACK with the
//! reason, and leaves the file free to add it later.

use crate::support::grpc;
use crate::support::sidecar;

use std::path::Path;
use std::time::Duration;

use grpc::lifecycle::lifecycle_client::LifecycleClient;
use grpc::lifecycle::{
    ApplyConfigurationResponse, ComponentConfig, DynamicConfiguration, ReleaseComponentRequest,
    RemoveComponentRequest,
};
use rewire::sidecar::ApiOptions;
use rewire::{ComponentKey, Runtime};
use sidecar::Sidecar;
use tonic::transport::Channel;

const FILE: &str = r#"{"components": {"state": {"orders": {"type": "memory",
    "metadata": {"defaultTtlInSeconds": 10}}}}}"#;
const FILE_WITH_AUDIT: &str = r#"{"components": {"state": {"orders": {"type": "memory",
    "metadata": {"defaultTtlInSeconds": 10}}, "audit": {"type": "memory"}}}}"#;

fn write(path: &Path, json: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, json).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

/// The running `orders` store's `defaultTtlInSeconds`, as status shows it.
async fn orders_ttl(runtime: &Runtime) -> Option<serde_json::Value> {
    let status = serde_json::to_value(runtime.status().await).unwrap();
    let components = status["components"].as_array().cloned().unwrap_or_default();
    components
        .into_iter()
        .find(|c| c["kind"] == "state" && c["name"] == "orders")
        .map(|c| c["metadata"]["defaultTtlInSeconds"].clone())
}

/// Waits until `check` holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(grpc::PATIENCE, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never: {what}");
}

async fn release(
    lifecycle: &mut LifecycleClient<Channel>,
    kind: &str,
    name: &str,
) -> ApplyConfigurationResponse {
    let request = ReleaseComponentRequest {
        kind: kind.into(),
        name: name.into(),
        based_on_generation: None,
    };
    lifecycle
        .release_component(request)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_released_push_gives_the_component_back_to_the_file() {
    let sidecar = Sidecar::start(FILE, ApiOptions::default()).await;
    let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let never_pushed = release(&mut lifecycle, "state", "orders").await;
    assert!(!never_pushed.accepted, "a release of nothing was ACKed");
    assert_eq!(never_pushed.outcome, "rejected");
    assert!(
        never_pushed
            .errors
            .iter()
            .any(|e| e.contains("state/orders")),
        "{:?}",
        never_pushed.errors
    );

    let push = DynamicConfiguration {
        component_config: Some(ComponentConfig {
            kind: "state".into(),
            name: "orders".into(),
            metadata: [("defaultTtlInSeconds".to_string(), "30".to_string())].into(),
            ..ComponentConfig::default()
        }),
        based_on_generation: None,
    };
    let pushed = lifecycle
        .apply_configuration(push)
        .await
        .unwrap()
        .into_inner();
    assert!(pushed.accepted, "{:?}", pushed.errors);
    let ttl = orders_ttl(&sidecar.runtime).await;
    assert!(
        ttl.as_ref().is_some_and(|t| t.to_string().contains("30")),
        "the push is not in force: {ttl:?}"
    );
    let released = release(&mut lifecycle, "state", "orders").await;
    assert!(released.accepted, "{:?}", released.errors);
    assert_eq!(released.generation, pushed.generation + 1);
    let ttl = orders_ttl(&sidecar.runtime).await;
    assert!(
        ttl.as_ref().is_some_and(|t| t.to_string().contains("10")),
        "the file's ttl is not back: {ttl:?}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn removing_an_unknown_component_is_nacked_and_the_file_can_add_it_later() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewire.json");
    write(&path, FILE);
    let sidecar = Sidecar::start(FILE, ApiOptions::default()).await;
    let _watch = sidecar
        .runtime
        .watch_config_file(path.clone(), Duration::from_secs(1));
    let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
    let request = RemoveComponentRequest {
        kind: "state".into(),
        name: "audit".into(),
        based_on_generation: None,
    };
    let answer = lifecycle
        .remove_component(request)
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.accepted, "removing an unknown component was ACKed");
    assert_eq!(answer.outcome, "rejected");
    assert!(
        answer.errors.iter().any(|e| e.contains("state/audit")),
        "the NACK does not name the component: {:?}",
        answer.errors
    );

    write(&path, FILE_WITH_AUDIT);
    let audit = ComponentKey::new("state", "audit");
    let runtime = sidecar.runtime.clone();
    eventually("the file adds state/audit", || {
        let present = runtime.generation().iter().any(|(key, _)| *key == audit);
        async move { present }
    })
    .await;
    sidecar.stop().await;
}
