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

/// etcd re-created with an empty data dir (or restored from an old
/// snapshot) while the watch waits to reconnect, and written to under
/// other prefixes past the revision the watch last saw: the watch must not
/// resume there as if the history were the same. `k=b` and the delete of
/// `gone` happened at revisions the watch counts as seen; the check of the
/// history at that revision finds it differs and the prefix is re-read.
#[tokio::test]
async fn a_re_created_etcd_past_the_last_seen_revision_is_re_read() {
    let mut server = EtcdServer::start().await;
    // The first retry comes 2 s after the stream drops: the new history
    // is written by then.
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/svc/",
        "dialTimeout": "1s", "watchRetryMs": 2000
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::keys(["k", "gone"]))
        .await
        .expect("subscribe");
    let client = server.client().await;
    for i in 0..30 {
        client.put(format!("/other/{i}"), "x").await.expect("put");
    }
    server.put("/svc/gone", "x").await;
    let last_seen = server.put("/svc/k", "a").await;
    let before = items_until(&mut sub, "k=a", PATIENCE, |items| {
        values_of(items, "k").contains(&"a".to_string())
    })
    .await;
    assert_eq!(values_of(&before, "gone"), vec!["x"], "{}", show(&before));

    server.restart_empty().await;
    let client = server.client().await;
    client.put("/svc/k", "b").await.expect("put k=b");
    for i in 0..40 {
        client.put(format!("/other/{i}"), "y").await.expect("put");
    }
    assert!(
        server.revision().await > last_seen,
        "the new history is not past {last_seen}"
    );
    let after = items_until(&mut sub, "k=b and gone deleted", PATIENCE, |items| {
        values_of(items, "k").contains(&"b".to_string())
            && values_of(items, "gone").contains(&String::new())
    })
    .await;
    assert_eq!(values_of(&after, "k"), vec!["b"], "{}", show(&after));
    let read = store.get(&ConfigQuery::keys(["k"])).await.expect("get");
    assert_eq!(values_of(&read, "k"), vec!["b"]);
    store.close().await.expect("close");
}
