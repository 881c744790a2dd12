//! `watch: true` refs: a watched configurationRef change (subscribed) and a
//! watched secretRef change (polled) re-apply the component — in place for
//! the memory state store.

use crate::support;
use crate::support::triggers;

use std::time::Duration;

use rewire::config::parse;
use rewire::{Action, ComponentKey, ConfigItem, Registry, Runtime, RuntimeOptions, Trigger};
use serde_json::json;
use triggers::applied_after;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_configuration_ref_change_is_applied_in_place() {
    let runtime = support::start(
        r#"{"components": {
            "config_store": {"cfg": {"type": "memory", "metadata": {"items": {"orders.ttl": "5"}}}},
            "state": {
                "orders": {"type": "memory",
                    "configurationRef": [{"store": "cfg", "key": "orders.ttl", "injectAs": "defaultTtlInSeconds", "watch": true}]},
                "unwatched": {"type": "memory",
                    "configurationRef": [{"store": "cfg", "key": "orders.ttl", "injectAs": "defaultTtlInSeconds"}]}
            }
        }}"#,
    )
    .await
    .unwrap();
    let orders = ComponentKey::new("state", "orders");
    let before = runtime.generation().get(&orders).cloned();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let store = runtime.config_store("cfg").load().unwrap();
    store
        .set(vec![ConfigItem {
            key: "orders.ttl".into(),
            value: "7".into(),
            ..ConfigItem::default()
        }])
        .await
        .unwrap();
    let record = applied_after(&runtime, Trigger::WatchedRef, 0).await;
    assert_eq!(
        record.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace)
    );
    assert_eq!(
        record.actions.get("state/unwatched"),
        Some(&Action::Unchanged),
        "only the watching component is re-resolved"
    );
    let after = runtime.generation().get(&orders).cloned();
    assert!(matches!((before, after), (Some(a), Some(b)) if a.same_as(&b)));
    let status = runtime.status().await;
    let shown = status
        .components
        .iter()
        .find(|c| c.name == "orders")
        .map(|c| c.metadata.clone());
    assert_eq!(
        shown.and_then(|m| m.get("defaultTtlInSeconds").cloned()),
        Some(json!("7"))
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_secret_ref_change_is_picked_up_by_polling() {
    let variable = format!("REWIRE_TEST_TTL_{}", std::process::id());
    std::env::set_var(&variable, "5");
    let config = format!(
        r#"{{"components": {{
            "secret_store": {{"env": {{"type": "env"}}}},
            "state": {{"orders": {{"type": "memory",
                "secretRef": [{{"store": "env", "name": "{variable}", "key": "{variable}", "injectAs": "defaultTtlInSeconds", "watch": true}}]}}}}
        }}}}"#
    );
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_millis(50),
        ..RuntimeOptions::default()
    };
    let valid = rewire::config::validate(parse(config.as_bytes()).unwrap(), &Registry::collected())
        .unwrap();
    let runtime = Runtime::start(valid, Registry::collected(), options)
        .await
        .unwrap();
    std::env::set_var(&variable, "9");
    let record = applied_after(&runtime, Trigger::WatchedRef, 0).await;
    assert_eq!(
        record.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace)
    );
    let status = runtime.status().await;
    let shown = status
        .components
        .iter()
        .find(|c| c.name == "orders")
        .map(|c| c.metadata.clone());
    assert_eq!(
        shown.and_then(|m| m.get("defaultTtlInSeconds").cloned()),
        Some(json!(format!("[secret env/{variable}#{variable}]"))),
        "status names the secret's source, never its value"
    );
    runtime.shutdown().await;
}

/// The value [`HangOnce`] serves for every secret.
static HANG_ONCE_VALUE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
/// Set: the next `get_secret` of [`HangOnce`] never answers.
static HANG_NEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Debug, Default, serde::Deserialize)]
struct HangOnceMeta {}

/// A secret store whose next read never answers once told so.
#[derive(rewire::Component)]
#[component(kind = "secret_store", type = "test.hang_once")]
struct HangOnce {
    #[metadata]
    _meta: HangOnceMeta,
}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for HangOnce {}

#[rewire::prelude::async_trait]
impl rewire::prelude::SecretStore for HangOnce {
    async fn get_secret(
        &self,
        name: &str,
        _metadata: &std::collections::HashMap<String, String>,
    ) -> Result<rewire::SecretMap, rewire::SecretError> {
        if HANG_NEXT.swap(false, std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let value = HANG_ONCE_VALUE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(rewire::SecretMap::from([(
            name.to_string(),
            rewire::prelude::SecretString::new(value),
        )]))
    }

    async fn bulk_get_secret(
        &self,
        _metadata: &std::collections::HashMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, rewire::SecretMap>, rewire::SecretError> {
        Ok(std::collections::BTreeMap::new())
    }
}

#[tokio::test(start_paused = true)]
async fn a_watched_secret_ref_read_that_hangs_once_does_not_stop_the_watch() {
    *HANG_ONCE_VALUE.lock().unwrap_or_else(|p| p.into_inner()) = "5".into();
    let config = r#"{"components": {
        "secret_store": {"hang": {"type": "test.hang_once"}},
        "state": {"orders": {"type": "memory",
            "secretRef": [{"store": "hang", "name": "ttl", "key": "ttl", "injectAs": "defaultTtlInSeconds", "watch": true}]}}
    }}"#;
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_millis(50),
        ..RuntimeOptions::default()
    };
    let valid = rewire::config::validate(parse(config.as_bytes()).unwrap(), &Registry::collected())
        .unwrap();
    let runtime = Runtime::start(valid, Registry::collected(), options)
        .await
        .unwrap();
    // The watch's next read hangs (virtual time: the clock is paused).
    HANG_NEXT.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !HANG_NEXT.load(std::sync::atomic::Ordering::SeqCst),
        "the watch did not read"
    );
    *HANG_ONCE_VALUE.lock().unwrap_or_else(|p| p.into_inner()) = "9".into();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let applied = loop {
        let found = triggers::records_of(&runtime, Trigger::WatchedRef)
            .into_iter()
            .find(|r| r.outcome == rewire::Outcome::Applied);
        if found.is_some() || tokio::time::Instant::now() >= deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let record = applied.expect("the watch stopped at the read that hung: the change was missed");
    assert_eq!(
        record.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace)
    );
    runtime.shutdown().await;
}
