//! The `etcd` config store's watch survives etcd being killed and started
//! again: the changes made after the restart arrive exactly once, and the
//! ones made before it are not repeated.

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, items_within, show, values_of, EtcdServer};
use rewire_runtime::{ConfigQuery, Instance};
use serde_json::json;

/// How long a change may take to arrive (the watch retries every
/// `watchRetryMs`, doubling).
const PATIENCE: Duration = Duration::from_secs(15);
/// How long to listen to show that nothing more arrives.
const QUIET: Duration = Duration::from_millis(1500);

#[tokio::test]
async fn changes_after_a_restart_arrive_exactly_once() {
    let mut server = EtcdServer::start().await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/svc/",
        "dialTimeout": "1s", "watchRetryMs": 200
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .expect("subscribe");

    server.put("/svc/k", "1").await;
    let before = items_until(&mut sub, "k=1", PATIENCE, |items| !items.is_empty()).await;
    assert_eq!(values_of(&before, "k"), vec!["1"]);

    server.restart().await;
    server.put("/svc/k", "2").await;
    server.put("/svc/k", "3").await;
    let after = items_until(&mut sub, "k=3", PATIENCE, |items| {
        values_of(items, "k").contains(&"3".to_string())
    })
    .await;
    let more = items_within(&mut sub, QUIET).await;
    let all: Vec<_> = after.iter().chain(&more).cloned().collect();
    assert_eq!(values_of(&all, "k"), vec!["2", "3"], "{}", show(&all));

    // A second round, with the server down for a while (several retries).
    server.stop();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.start_again().await;
    server.put("/svc/k", "4").await;
    let after = items_until(&mut sub, "k=4", PATIENCE, |items| !items.is_empty()).await;
    let more = items_within(&mut sub, QUIET).await;
    let all: Vec<_> = after.iter().chain(&more).cloned().collect();
    assert_eq!(values_of(&all, "k"), vec!["4"], "{}", show(&all));
    store.close().await.expect("close");
}
