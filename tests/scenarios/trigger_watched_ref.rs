//! `watch: true` refs: a watched configurationRef change (subscribed) and a
//! watched secretRef change (polled) re-apply the component — in place for
//! the memory state store.

use crate::support;
use crate::support::triggers;

use std::time::Duration;

use rewire::config::parse;
use rewire::{
    Action, ComponentKey, ConfigChange, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, Registry, Runtime, RuntimeOptions, Trigger,
};
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

/// The metadata field `field` of the component `name` as status shows it.
async fn shown_field(runtime: &Runtime, name: &str, field: &str) -> Option<serde_json::Value> {
    let status = runtime.status().await;
    let component = status.components.into_iter().find(|c| c.name == name)?;
    component.metadata.get(field).cloned()
}

/// Sets `key` to `value` in the memory config store `cfg`, in `group`.
async fn set_config(runtime: &Runtime, key: &str, value: &str, group: Option<&str>) {
    let store = runtime.config_store("cfg").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        group: group.map(Into::into),
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.unwrap();
}

/// What [`Fed`] serves: the items of every group.
static FED_ITEMS: std::sync::Mutex<Vec<ConfigItem>> = std::sync::Mutex::new(Vec::new());
/// Where changes reach [`Fed`]'s subscriber: a channel of one, so the test
/// knows when the subscriber took a change from it.
static FED_FEED: std::sync::Mutex<Option<tokio::sync::mpsc::Sender<ConfigChange>>> =
    std::sync::Mutex::new(None);

#[derive(Debug, Default, serde::Deserialize)]
struct FedMeta {}

/// A config store that serves [`FED_ITEMS`] as the memory store does (a
/// get without a group reads the default group) and whose subscriber sees
/// the changes the test feeds it, every group's.
#[derive(rewire::Component)]
#[component(kind = "config_store", type = "test.watched_ref.fed")]
struct Fed {
    #[metadata]
    _meta: FedMeta,
}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for Fed {}

#[rewire::prelude::async_trait]
impl ConfigStore for Fed {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let items = FED_ITEMS.lock().unwrap_or_else(|p| p.into_inner());
        let covered = |item: &&ConfigItem| {
            query.keys.contains(&item.key) && item.group == query.group && item.label == query.label
        };
        Ok(items.iter().filter(covered).cloned().collect())
    }

    async fn subscribe(&self, _query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let (sender, changes) = tokio::sync::mpsc::channel(1);
        *FED_FEED.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender);
        Ok(ConfigSubscription {
            id: "fed".into(),
            changes,
        })
    }
}

/// Stores `timeout` = `value` in `group` and feeds the change to the
/// subscriber; returns once the subscriber took it (fails after 10 s).
async fn feed(value: &str, group: Option<&str>) {
    let item = ConfigItem {
        key: "timeout".into(),
        value: value.into(),
        group: group.map(Into::into),
        ..ConfigItem::default()
    };
    {
        let mut items = FED_ITEMS.lock().unwrap_or_else(|p| p.into_inner());
        items.retain(|i| i.group != item.group);
        items.push(item.clone());
    }
    let sender = triggers::eventually(Duration::from_secs(10), || {
        FED_FEED.lock().unwrap_or_else(|p| p.into_inner()).clone()
    })
    .await
    .expect("nothing subscribed to the fed store");
    let taken = async {
        sender
            .send(ConfigChange { items: vec![item] })
            .await
            .expect("the subscriber went away");
        // The channel holds one change: room again once it was taken.
        drop(sender.reserve().await.expect("the subscriber went away"));
    };
    tokio::time::timeout(Duration::from_secs(10), taken)
        .await
        .expect("the subscriber did not take the change in 10 s");
}

/// Another group's write of the watched key (fed to the watch, as the
/// memory store's subscriptions carry every group's) neither reloads the
/// component nor keeps the default group's later change to the same text
/// from applying. One thread, so the test knows when the watch handled a
/// change and can let any reload it asked for finish before looking.
#[tokio::test]
async fn another_groups_write_of_a_watched_key_does_not_hide_the_defaults_change() {
    *FED_ITEMS.lock().unwrap_or_else(|p| p.into_inner()) = vec![ConfigItem {
        key: "timeout".into(),
        value: "10".into(),
        ..ConfigItem::default()
    }];
    let config = r#"{"components": {
        "config_store": {"cfg": {"type": "test.watched_ref.fed"}},
        "state": {"orders": {"type": "memory",
            "configurationRef": [{"store": "cfg", "key": "timeout", "injectAs": "defaultTtlInSeconds", "watch": true}]}}
    }}"#;
    let runtime = support::start(config).await.unwrap();
    feed("20", None).await;
    applied_after(&runtime, Trigger::WatchedRef, 0).await;
    let shown = shown_field(&runtime, "orders", "defaultTtlInSeconds").await;
    assert_eq!(shown, Some(json!("20")));

    // Another group's value: not what `orders` reads.
    feed("30", Some("canary")).await;
    // The watch handled it (one thread: it ran to its next wait first), so
    // any reload it asked for is queued. The reload worker starts it when
    // this task yields, and a reload asked for after that waits for it.
    tokio::task::yield_now().await;
    let flush = runtime.apply(parse(config.as_bytes()).unwrap()).await;
    assert!(flush.is_ok(), "{flush:?}");
    let shown = shown_field(&runtime, "orders", "defaultTtlInSeconds").await;
    assert_eq!(shown, Some(json!("20")), "the canary group's value applied");
    let watched = triggers::records_of(&runtime, Trigger::WatchedRef);
    assert_eq!(
        watched.len(),
        1,
        "the canary group's write asked for a reload: {watched:#?}"
    );

    // The default group's value moves to the same text: a real change.
    feed("30", None).await;
    let applied = applied_after(&runtime, Trigger::WatchedRef, 1).await;
    assert_eq!(
        applied.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace)
    );
    let shown = shown_field(&runtime, "orders", "defaultTtlInSeconds").await;
    assert_eq!(shown, Some(json!("30")));
    let watched = triggers::records_of(&runtime, Trigger::WatchedRef);
    assert_eq!(
        watched.len(),
        2,
        "one reload for \"20\", one for \"30\", none for the canary group: {watched:#?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_flips_back_while_its_reload_runs_is_applied_after_it() {
    let tag = "watched-flip-back";
    let config = format!(
        r#"{{"components": {{
            "config_store": {{"cfg": {{"type": "memory", "metadata": {{"items": {{"flip": "A"}}}}}}}},
            "probe": {{"p": {{"type": "test.reload.probe", "metadata": {{"tag": "{tag}", "initDelayMs": 500}},
                "configurationRef": [{{"store": "cfg", "key": "flip", "injectAs": "value", "watch": true}}]}}}}
        }}}}"#
    );
    let runtime = support::reload::start(&config).await;
    assert_eq!(
        support::reload::probe(&runtime, "p")
            .meta()
            .value
            .as_deref(),
        Some("A")
    );
    set_config(&runtime, "flip", "B", None).await;
    // The forced reload resolved B and is building the probe with it ...
    support::reload::wait_until("the reload builds the probe with B", || {
        support::reload::inits(tag) == 2
    })
    .await;
    // ... when the store goes back to A.
    set_config(&runtime, "flip", "A", None).await;
    let back = triggers::eventually(Duration::from_secs(10), || {
        let value = support::reload::probe(&runtime, "p").meta().value;
        (support::reload::inits(tag) >= 3 && value.as_deref() == Some("A")).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the probe runs with B while the store holds A: {:#?}",
        runtime.history()
    );
    runtime.shutdown().await;
}
