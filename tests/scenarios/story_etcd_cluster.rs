//! A three-member etcd cluster as the config store of a running runtime:
//! the Redis host is a watched configurationRef on an etcd key.
//!
//! 1. The leader — also the member rewire is connected to (listed first) —
//!    is killed, and the key changes while the cluster elects a new
//!    leader: the watch resumes on another member from the revision after
//!    the last one it saw, and the change is applied exactly once, with no
//!    failed request.
//! 2. Every member is killed: the store serves the last values and shows
//!    `degraded`; requests go on. The cluster comes back, the key changes
//!    again: applied once more.

use crate::support::story_load;
use crate::support::triggers;
use testkit::etcd_cluster::EtcdCluster;
use testkit::redis::RedisServer;

use std::time::{Duration, Instant};

use rewire::config::{parse, validate};
use rewire::{Action, ConfigQuery, Outcome, Registry, Runtime, RuntimeOptions, Trigger};
use story_load::{lost_writes, start_load};
use triggers::{eventually, records_of};

/// The bound on applying a change made while a member dies: opening the
/// watch may try every member (3 × `dialTimeout` of 1 s), after at most a few
/// backoff waits, then the reload re-reads the key (3 × `dialTimeout`
/// again at worst); generous on a loaded machine.
const WATCH_BOUND: Duration = Duration::from_secs(20);

fn applied(runtime: &Runtime) -> Vec<rewire::ReloadRecord> {
    records_of(runtime, Trigger::WatchedRef)
        .into_iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .collect()
}

/// Waits for the `n`th applied watched-ref reload; returns it and how long
/// it took from `since`.
async fn nth_applied(
    runtime: &Runtime,
    n: usize,
    since: Instant,
) -> (rewire::ReloadRecord, Duration) {
    let record = eventually(WATCH_BOUND, || applied(runtime).into_iter().nth(n - 1))
        .await
        .unwrap_or_else(|| panic!("change {n} not applied: {:#?}", runtime.history()));
    (record, since.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_loses_its_leader_then_everything_without_a_failed_request() {
    let mut cluster = EtcdCluster::start(3).await;
    let (primary, dr) = (RedisServer::start().await, RedisServer::start().await);
    cluster
        .put("/rewire/orders.redisHost", &primary.addr())
        .await;
    let leader = cluster.leader().await;
    let config = serde_json::json!({
        "appId": "checkout",
        "components": {
            "config_store": {"etcd": {"type": "etcd", "metadata": {
                "endpoints": cluster.endpoints_from(leader), "keyPrefix": "/rewire/",
                "dialTimeout": "1s", "watchRetryMs": 100}}},
            "state": {"orders": {"type": "redis", "metadata": {"dialTimeout": "1s"},
                "configurationRef": [{"store": "etcd", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}]}}
        }
    });
    let valid = validate(
        parse(config.to_string().as_bytes()).unwrap(),
        &Registry::collected(),
    )
    .unwrap();
    let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap();
    let load = start_load(runtime.state_store("orders"), 4, "t");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // 1. The leader, which rewire is connected to, dies; the key changes
    // as soon as the others have elected a new leader.
    cluster.kill(leader);
    cluster.put("/rewire/orders.redisHost", &dr.addr()).await;
    let changed = Instant::now();
    let (switch, took) = nth_applied(&runtime, 1, changed).await;
    println!("etcd cluster, leader killed: change applied {took:?} after the write");
    assert_eq!(
        switch.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{switch:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        applied(&runtime).len(),
        1,
        "the change was applied more than once: {:#?}",
        runtime.history()
    );
    cluster.start_again(leader).await;

    // 2. The whole cluster goes down: degraded, last values served.
    for member in 0..3 {
        cluster.kill(member);
    }
    let mut state = String::new();
    let deadline = Instant::now() + WATCH_BOUND;
    while Instant::now() < deadline {
        let status = runtime.status().await;
        let store = status.components.iter().find(|c| c.name == "etcd");
        state = format!("{:?}", store.map(|c| (c.state, c.reason.clone())));
        if store.is_some_and(|c| c.state == "degraded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        state.contains("degraded") && state.contains("last values"),
        "{state}"
    );
    let store = runtime.config_store("etcd").load().unwrap();
    let last = store
        .get(&ConfigQuery::keys(["orders.redisHost".to_string()]))
        .await
        .expect("the last values, with every member down");
    assert_eq!(last.first().map(|i| i.value.clone()), Some(dr.addr()));

    cluster.start_all_again().await;
    cluster
        .put("/rewire/orders.redisHost", &primary.addr())
        .await;
    let back = Instant::now();
    let (switch_back, took) = nth_applied(&runtime, 2, back).await;
    println!("etcd cluster, after a full outage: change applied {took:?} after the write");
    assert_eq!(
        switch_back.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{switch_back:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(applied(&runtime).len(), 2, "{:#?}", runtime.history());

    let seen = load.finish().await;
    assert!(
        seen.acked.len() > 100,
        "too little traffic to prove anything: {}",
        seen.acked.len()
    );
    assert!(
        seen.failed.is_empty(),
        "failed requests during the failovers: {:?}",
        seen.failed
    );
    // Stored as Dapr's `{appId}||{key}`.
    let stored: Vec<(String, String)> = seen
        .acked
        .iter()
        .map(|(key, value)| (format!("checkout||{key}"), value.clone()))
        .collect();
    let lost = lost_writes(&stored, &[primary.client(), dr.client()]).await;
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    runtime.shutdown().await;
}
