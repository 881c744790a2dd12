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
