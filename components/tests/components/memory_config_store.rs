//! The `memory` config store, built through the registry: initial items,
//! subscriptions receiving sets and deletes, in-place metadata changes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{
    ConfigChange, ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription, InPlace,
    Instance,
};
use serde_json::json;

async fn config_store(metadata: serde_json::Value) -> Arc<dyn ConfigStore> {
    match common::start("config_store", "memory", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

async fn next(sub: &mut ConfigSubscription) -> ConfigChange {
    tokio::time::timeout(Duration::from_secs(5), sub.changes.recv())
        .await
        .ok()
        .flatten()
        .expect("no change arrived")
}

fn item(key: &str, value: &str) -> ConfigItem {
    ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    }
}

#[tokio::test]
async fn subscribers_receive_sets_and_deletes() {
    let store = config_store(json!({"items": {"feature.x": "off", "limit": 10}})).await;
    let initial = store
        .get(&ConfigQuery::keys(["limit"]))
        .await
        .unwrap_or_default();
    assert_eq!(initial.first().map(|i| i.value.as_str()), Some("10"));

    let mut sub = store
        .subscribe(ConfigQuery::keys(["feature.x"]))
        .await
        .unwrap();
    store
        .set(vec![item("feature.x", "on"), item("unrelated", "1")])
        .await
        .unwrap();
    let change = next(&mut sub).await;
    assert_eq!(change.items.len(), 1);
    assert_eq!(change.items[0].value, "on");
    let set_version: u64 = change.items[0].version.parse().unwrap_or_default();

    store
        .delete(&ConfigQuery::keys(["feature.x"]))
        .await
        .unwrap();
    let change = next(&mut sub).await;
    assert_eq!(
        (change.items[0].key.as_str(), change.items[0].value.as_str()),
        ("feature.x", "")
    );
    assert!(change.items[0].version.parse::<u64>().unwrap_or_default() > set_version);
}

#[tokio::test]
async fn a_group_is_part_of_the_key() {
    let store = config_store(json!({})).await;
    let mut grouped = item("timeout", "5s");
    grouped.group = Some("payments".into());
    store
        .set(vec![grouped, item("timeout", "1s")])
        .await
        .unwrap();
    let query = ConfigQuery {
        keys: vec!["timeout".into()],
        group: Some("payments".into()),
        ..ConfigQuery::default()
    };
    let items = store.get(&query).await.unwrap_or_default();
    assert_eq!(
        items.iter().map(|i| i.value.as_str()).collect::<Vec<_>>(),
        vec!["5s"]
    );
}

#[tokio::test]
async fn metadata_changes_apply_in_place() {
    let store = config_store(json!({"items": {"a": "1"}})).await;
    store.set(vec![item("b", "runtime")]).await.unwrap();
    let mut sub = store.subscribe(ConfigQuery::default()).await.unwrap();
    let dynamic = store
        .as_in_place()
        .expect("memory config store is not dynamic");
    let applied = dynamic
        .update_in_place(&common::metadata(json!({"items": {"a": "2"}})))
        .await;
    assert_eq!(applied.ok(), Some(InPlace::Applied));
    assert_eq!(next(&mut sub).await.items[0].value, "2");
    let all = store.get(&ConfigQuery::default()).await.unwrap_or_default();
    let pairs: Vec<_> = all
        .iter()
        .map(|i| (i.key.as_str(), i.value.as_str()))
        .collect();
    assert_eq!(pairs, vec![("a", "2"), ("b", "runtime")]);
}

/// A client setting unique keys in a loop meets `maxKeys`: the set fails
/// with a backend error naming the store and the limit, the items held
/// stay, and subscribers hear of nothing that was not set.
#[tokio::test]
async fn sets_past_max_keys_fail_and_keep_the_items() {
    let store = match common::start_named(
        "config_store",
        "settings",
        "memory",
        json!({"maxKeys": "3", "maxTotalSize": "1000"}),
    )
    .await
    {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("expected a config store, got {other:?}"),
    };
    let mut sub = store.subscribe(ConfigQuery::default()).await.unwrap();
    let mut written = 0;
    let refused = loop {
        match store.set(vec![item(&format!("k{written}"), "v")]).await {
            Ok(()) => written += 1,
            Err(err) => break err,
        }
        assert!(written <= 3, "maxKeys not enforced");
    };
    assert_eq!(written, 3);
    let message = refused.to_string();
    assert!(
        matches!(refused, ConfigError::Backend(_))
            && message.contains("memory config store `config_store/settings`")
            && message.contains("`maxKeys` is 3"),
        "{message}"
    );
    for _ in 0..3 {
        next(&mut sub).await;
    }
    let big = "x".repeat(1000);
    let refused = store.set(vec![item("k0", &big)]).await;
    assert!(
        matches!(&refused, Err(ConfigError::Backend(m)) if m.contains("`maxTotalSize` of 1000")),
        "{refused:?}"
    );
    let held = store.get(&ConfigQuery::default()).await.unwrap();
    assert_eq!(held.len(), 3);
    assert!(held.iter().all(|i| i.value == "v"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), sub.changes.recv())
            .await
            .is_err(),
        "a refused set was published"
    );
}
