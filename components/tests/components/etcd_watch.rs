//! Subscriptions of the `etcd` config store: puts and deletes arrive in
//! order and once each, several changes of one transaction together,
//! filtered by key, group and label; the watch stops on close and on the
//! runtime's shutdown token.

use crate::common;
use crate::support::etcd_server;

use std::sync::Arc;
use std::time::Duration;

use etcd_server::{items_until, items_within, show, values_of, EtcdServer};
use rewire_components::etcd::{EtcdConfigStore, EtcdMetadata};
use rewire_runtime::{Component, ConfigQuery, ConfigStore, ConfigSubscription, Instance};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// How long a change may take to arrive.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long to listen to show that nothing more arrives.
const QUIET: Duration = Duration::from_millis(500);

async fn store(server: &EtcdServer) -> Arc<dyn ConfigStore> {
    let metadata =
        json!({"endpoints": server.endpoint(), "keyPrefix": "/cfg/", "dialTimeout": "1s"});
    match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(err) => panic!("start: {err}"),
    }
}

async fn subscribe(store: &dyn ConfigStore, query: ConfigQuery) -> ConfigSubscription {
    store.subscribe(query).await.expect("subscribe")
}

#[tokio::test]
async fn puts_and_deletes_arrive_in_order_once_each() {
    let server = EtcdServer::start().await;
    server.put("/cfg/k", "0").await;
    let store = store(&server).await;
    let mut all = subscribe(&*store, ConfigQuery::default()).await;
    let mut only_k = subscribe(&*store, ConfigQuery::keys(["k"])).await;

    let r1 = server.put("/cfg/k", "1").await;
    // Longer than `dialTimeout`: the request timeout must not end the watch.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r2 = server.put("/cfg/k", "2").await;
    server.put("/cfg/other", "x").await;
    server.put("/outside/k", "no").await;
    let r3 = server.delete("/cfg/k").await;

    let items = items_until(&mut all, "the delete of k", PATIENCE, |items| {
        items.iter().any(|i| i.key == "k" && i.value.is_empty())
    })
    .await;
    assert_eq!(
        values_of(&items, "k"),
        vec!["1", "2", ""],
        "{}",
        show(&items)
    );
    let versions: Vec<String> = items
        .iter()
        .filter(|i| i.key == "k")
        .map(|i| i.version.clone())
        .collect();
    assert_eq!(
        versions,
        vec![r1.to_string(), r2.to_string(), r3.to_string()]
    );
    assert_eq!(values_of(&items, "other"), vec!["x"]);
    assert_eq!(items.len(), 4, "{}", show(&items));
    let more = items_within(&mut all, QUIET).await;
    assert!(more.is_empty(), "duplicates: {}", show(&more));

    let items = items_until(&mut only_k, "the delete of k", PATIENCE, |items| {
        items.iter().any(|i| i.value.is_empty())
    })
    .await;
    assert_eq!(
        values_of(&items, "k"),
        vec!["1", "2", ""],
        "{}",
        show(&items)
    );
    assert_eq!(items.len(), 3, "{}", show(&items));
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_transaction_arrives_whole_and_filters_apply() {
    let server = EtcdServer::start().await;
    let store = store(&server).await;
    let mut all = subscribe(&*store, ConfigQuery::default()).await;
    let mut db_prod = subscribe(
        &*store,
        ConfigQuery {
            group: Some("db".into()),
            label: Some("prod".into()),
            ..ConfigQuery::default()
        },
    )
    .await;

    server
        .put_all(&[
            ("/cfg/db/host", "h"),
            ("/cfg/db/host@prod", "hp"),
            ("/cfg/db/port@prod", "5432"),
            ("/cfg/plain", "p"),
        ])
        .await;

    let change = tokio::time::timeout(PATIENCE, all.changes.recv())
        .await
        .unwrap_or_else(|_| panic!("no change within {PATIENCE:?}"))
        .expect("subscription closed");
    assert_eq!(change.items.len(), 4, "one batch: {}", show(&change.items));
    let versions: Vec<&str> = change.items.iter().map(|i| i.version.as_str()).collect();
    assert!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");

    let items = items_until(&mut db_prod, "db prod items", PATIENCE, |items| {
        items.len() >= 2
    })
    .await;
    let mut names: Vec<(&str, &str)> = items
        .iter()
        .map(|i| (i.key.as_str(), i.value.as_str()))
        .collect();
    names.sort();
    assert_eq!(names, vec![("host", "hp"), ("port", "5432")]);
    assert!(items
        .iter()
        .all(|i| i.group.as_deref() == Some("db") && i.label.as_deref() == Some("prod")));
    let more = items_within(&mut db_prod, QUIET).await;
    assert!(more.is_empty(), "{}", show(&more));
    store.close().await.expect("close");
}

#[tokio::test]
async fn close_stops_the_watch() {
    let server = EtcdServer::start().await;
    let store = store(&server).await;
    let mut sub = subscribe(&*store, ConfigQuery::default()).await;
    server.put("/cfg/a", "1").await;
    items_until(&mut sub, "a=1", PATIENCE, |items| !items.is_empty()).await;
    store.close().await.expect("close");
    server.put("/cfg/a", "2").await;
    let after = items_within(&mut sub, QUIET).await;
    assert!(after.is_empty(), "published after close: {}", show(&after));
}

#[tokio::test]
async fn the_shutdown_token_stops_the_watch() {
    let server = EtcdServer::start().await;
    let metadata = EtcdMetadata::new(server.endpoint());
    let mut store = EtcdConfigStore::new(metadata);
    let shutdown = CancellationToken::new();
    let mut cx = common::context("config_store", &common::metadata(json!({})));
    cx.shutdown = shutdown.clone();
    store.init(&cx).await.expect("init");
    let mut sub = subscribe(&store, ConfigQuery::default()).await;
    server.put("a", "1").await;
    items_until(&mut sub, "a=1", PATIENCE, |items| !items.is_empty()).await;
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.put("a", "2").await;
    let after = items_within(&mut sub, QUIET).await;
    assert!(
        after.is_empty(),
        "published after shutdown: {}",
        show(&after)
    );
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_subscription_gets_only_the_items_get_of_its_query_returns() {
    let server = EtcdServer::start().await;
    let store = store(&server).await;
    let plain = ConfigQuery::keys(["timeout"]);
    let canary = ConfigQuery {
        label: Some("canary".into()),
        ..ConfigQuery::keys(["timeout"])
    };
    let mut plain_sub = subscribe(&*store, plain.clone()).await;
    let mut canary_sub = subscribe(&*store, canary.clone()).await;

    // Items of other labels and groups that share the key's name: `get`
    // of `timeout` (no group, no label) returns none of them.
    server.put("/cfg/timeout@canary", "c").await;
    server.put("/cfg/ops/timeout", "g").await;
    server.put("/cfg/ops/timeout@canary", "gc").await;
    server.put("/cfg/timeout", "t").await;

    let items = items_until(&mut plain_sub, "timeout=t", PATIENCE, |items| {
        items.iter().any(|i| i.value == "t")
    })
    .await;
    let more = items_within(&mut plain_sub, QUIET).await;
    let all: Vec<_> = items.iter().chain(&more).cloned().collect();
    let got = store.get(&plain).await.expect("get");
    assert_eq!(
        all,
        got,
        "delivered {} but get returns {}",
        show(&all),
        show(&got)
    );

    let items = items_until(&mut canary_sub, "timeout@canary=c", PATIENCE, |items| {
        !items.is_empty()
    })
    .await;
    let more = items_within(&mut canary_sub, QUIET).await;
    let all: Vec<_> = items.iter().chain(&more).cloned().collect();
    let got = store.get(&canary).await.expect("get");
    assert_eq!(
        all,
        got,
        "delivered {} but get returns {}",
        show(&all),
        show(&got)
    );
    store.close().await.expect("close");
}
