//! Starting `apollo` config stores against the test server the way the
//! runtime does (registry → factory → init), waiting for changes, and
//! capturing log lines.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{
    ComponentKey, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription, InitContext, Instance,
    Metadata, Registry,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::APP_ID;

/// How long a change may take to arrive before a test fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Metadata for a store of [`APP_ID`] on `server` (a base URL), backing up
/// to `backup_dir`, with short timings.
pub fn metadata(server: &str, backup_dir: &Path) -> Value {
    json!({
        "config_server": server,
        "app_id": APP_ID,
        "backup_config_path": backup_dir.display().to_string(),
        "longPollTimeoutMs": 10_000,
        "requestTimeoutMs": 2_000,
        "retryIntervalMs": 50,
        "maxRetryIntervalMs": 400,
    })
}

/// `base` with the fields of `extra` set.
pub fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// A started store and the shutdown token the runtime would hold.
pub struct Started {
    pub store: Arc<dyn ConfigStore>,
    pub shutdown: CancellationToken,
}

/// Builds the `apollo` config store from `metadata` through the registry
/// and initialises it (readiness timeout 5 s).
pub async fn start(metadata: Value) -> Result<Started, String> {
    start_within(metadata, Duration::from_secs(5)).await
}

/// As [`start`], with the given readiness timeout.
pub async fn start_within(metadata: Value, ready_timeout: Duration) -> Result<Started, String> {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry
        .get("config_store", "apollo")
        .ok_or_else(|| "config_store/apollo is not registered".to_string())?;
    let metadata = Metadata::from(metadata.as_object().cloned().unwrap_or_default());
    let mut built = (descriptor.build)(&metadata).map_err(|e| e.to_string())?;
    let shutdown = CancellationToken::new();
    let mut cx = InitContext::new(
        ComponentKey::new("config_store", "apollo"),
        "runtime-app",
        metadata,
    );
    cx.shutdown = shutdown.clone();
    cx.ready_timeout = ready_timeout;
    built.init(&cx).await.map_err(|e| e.to_string())?;
    match built.into_instance() {
        Instance::ConfigStore(store) => Ok(Started { store, shutdown }),
        other => Err(format!("expected a config store, got {other:?}")),
    }
}

/// Subscribes to `query`.
pub async fn subscribe(store: &Arc<dyn ConfigStore>, query: ConfigQuery) -> ConfigSubscription {
    store.subscribe(query).await.expect("subscribe")
}

/// Waits (bounded) for a change that sets `key` to `value`.
pub async fn expect_change(
    sub: &mut ConfigSubscription,
    key: &str,
    value: &str,
) -> Vec<ConfigItem> {
    let wait = async {
        while let Some(change) = sub.changes.recv().await {
            if change
                .items
                .iter()
                .any(|i| i.key == key && i.value == value)
            {
                return change.items;
            }
        }
        panic!("subscription closed before `{key}` became `{value}`");
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no change setting `{key}` to `{value}` within {PATIENCE:?}"))
}

/// The value of `key` (no group), if any.
pub async fn value_of(store: &Arc<dyn ConfigStore>, key: &str) -> Option<String> {
    let items = store.get(&ConfigQuery::keys([key])).await.expect("get");
    items.into_iter().next().map(|i| i.value)
}

/// Waits (bounded) until `condition` holds.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut condition: F) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub use crate::support::logs;
