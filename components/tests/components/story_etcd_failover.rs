//! The DR switch story with etcd as the config store (feature `etcd`): the
//! Redis host is a watched configurationRef on an etcd key; changing the key
//! moves the traffic to the DR server, in place, with no failed request and
//! every acknowledged write on a server. (With Apollo:
//! `tests/scenarios/story_redis_failover.rs`.)

use crate::support::etcd_server;
use crate::support::story_load;
use testkit::redis as redis_server;

use std::time::Duration;

use etcd_server::EtcdServer;
use redis_server::RedisServer;
use rewire_runtime::config::{parse, validate};
use rewire_runtime::{Action, ComponentKey, Outcome, Registry, Runtime, RuntimeOptions, Trigger};
use story_load::{lost_writes, start_load};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dr_switch_in_etcd_without_a_failed_request() {
    rewire_components::link();
    let primary = RedisServer::start().await;
    let dr = RedisServer::start().await;
    let etcd = EtcdServer::start().await;
    etcd.put("/rewire/orders.redisHost", &primary.addr()).await;
    let config = serde_json::json!({
        "appId": "checkout",
        "components": {
            "config_store": {"etcd": {"type": "etcd", "metadata": {"endpoints": etcd.endpoint(), "keyPrefix": "/rewire/"}}},
            "state": {"orders": {"type": "redis",
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
    let orders = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();

    let load = start_load(runtime.state_store("orders"), 4, "t");
    tokio::time::sleep(Duration::from_millis(300)).await;
    etcd.put("/rewire/orders.redisHost", &dr.addr()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let switch = loop {
        let applied = runtime
            .history()
            .into_iter()
            .find(|r| r.trigger == Trigger::WatchedRef && r.outcome == Outcome::Applied);
        if let Some(record) = applied {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no switch: {:#?}",
            runtime.history()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        switch.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{switch:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = load.finish().await;

    assert!(
        seen.acked.len() > 100,
        "too little traffic to prove anything: {}",
        seen.acked.len()
    );
    assert!(
        seen.failed.is_empty(),
        "failed requests during the switch: {:?}",
        seen.failed
    );
    assert!(
        seen.missed <= 4,
        "{} read-backs missed: more than one per task at the switch",
        seen.missed
    );
    let last = seen.acked.last().cloned().unwrap_or_default();
    assert_eq!(
        story_load::stored_value(&dr.client(), &last.0).await,
        Some(last.1),
        "the last writes are not on the DR server"
    );
    let lost = lost_writes(&seen.acked, &[primary.client(), dr.client()]).await;
    assert!(
        lost.is_empty(),
        "acknowledged writes on neither server: {lost:?}"
    );
    let now = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();
    assert!(
        matches!((orders, now), (Some(a), Some(b)) if a.same_as(&b)),
        "the switch was not in place"
    );
    runtime.shutdown().await;
}
