//! The `etcd` config store on a real three-member cluster: a member that
//! hangs (frozen with `SIGSTOP`: connections open, no answers) is left for
//! another one by requests (their deadline) and by the watch (the
//! connection's keep-alive).

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, items_within, show, values_of};
use rewire_runtime::{ConfigQuery, ConfigStore, Instance};
use serde_json::json;
use std::sync::Arc;
use testkit::etcd_cluster::EtcdCluster;

/// How long a change may take to arrive: the keep-alive finds a hung
/// member within 10 s + `dialTimeout`, then the watch opens on another.
const PATIENCE: Duration = Duration::from_secs(30);
/// How long to listen to show that nothing more arrives.
const QUIET: Duration = Duration::from_millis(1500);

async fn store(endpoints: String, watch_retry_ms: u64) -> Arc<dyn ConfigStore> {
    let metadata = json!({
        "endpoints": endpoints, "keyPrefix": "/svc/",
        "dialTimeout": "1s", "watchRetryMs": watch_retry_ms
    });
    match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_is_left_for_another_by_requests_and_the_watch() {
    let cluster = EtcdCluster::start(3).await;
    let leader = cluster.leader().await;
    // Connected first to a follower, so that the cluster keeps its leader
    // while that member hangs.
    let follower = (leader + 1) % 3;
    let store = store(cluster.endpoints_from(follower), 100).await;
    let mut sub = store
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .expect("subscribe");
    cluster.put("/svc/k", "1").await;
    let first = items_until(&mut sub, "k=1", PATIENCE, |items| !items.is_empty()).await;
    assert_eq!(values_of(&first, "k"), vec!["1"]);

    cluster.pause(follower);
    cluster.put("/svc/k", "2").await;
    // The read times out on the hung member and is made on the next one:
    // it sees the write made after the member hung.
    let read = store
        .get(&ConfigQuery::keys(["k"]))
        .await
        .expect("a read with one member hung");
    assert_eq!(values_of(&read, "k"), vec!["2"], "{}", show(&read));
    // The watch, stuck on the hung member, moves on and delivers the
    // change once.
    let change = items_until(&mut sub, "k=2", PATIENCE, |items| !items.is_empty()).await;
    let more = items_within(&mut sub, QUIET).await;
    let all: Vec<_> = change.iter().chain(&more).cloned().collect();
    assert_eq!(values_of(&all, "k"), vec!["2"], "{}", show(&all));
    cluster.resume(follower);
    store.close().await.expect("close");
}

/// The first listed member hangs before the store starts: the login (none
/// here) and the first read time out on it (`dialTimeout`) and are made on
/// the next member, so init succeeds instead of running out of its time
/// on the first member alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_succeeds_when_the_first_listed_member_hangs_from_the_start() {
    let cluster = EtcdCluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    cluster.put("/svc/k", "1").await;
    cluster.pause(follower);
    let metadata = json!({
        "endpoints": cluster.endpoints_from(follower), "keyPrefix": "/svc/",
        "dialTimeout": "1s", "watchRetryMs": 100
    });
    let started = tokio::time::timeout(PATIENCE, common::start("config_store", "etcd", metadata))
        .await
        .expect("init hung");
    cluster.resume(follower);
    let store = match started {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start with the first member hung: {other:?}"),
    };
    let read = store.get(&ConfigQuery::keys(["k"])).await.expect("read");
    assert_eq!(values_of(&read, "k"), vec!["1"], "{}", show(&read));
    store.close().await.expect("close");
}
