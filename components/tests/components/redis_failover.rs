//! `failover`: the `redis` state store finds its master through Redis
//! Sentinel, and follows it when the sentinels promote a replica after the
//! master dies.

use crate::common;
use testkit::redis as redis_server;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire_runtime::{Instance, SetRequest, StateStore};
use serde_json::json;
use tokio::time::{sleep, Instant};

const MASTER: &str = "mymaster";

/// Polls `check` until it holds; panics with `what` after `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        sleep(Duration::from_millis(100)).await;
    }
}

fn write(key: &str, value: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        ..SetRequest::default()
    }
}

async fn data(server: &RedisServer, key: &str) -> Option<String> {
    server
        .query(&["HGET", &format!("test||{key}"), "data"])
        .await
        .ok()
        .and_then(|v| v.into_iter().next())
}

#[tokio::test]
async fn the_master_is_found_through_sentinel_and_followed_after_a_failover() {
    let mut master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(master.port()).await;
    eventually("the replica in sync", Duration::from_secs(10), || async {
        replica
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("master_link_status:up"))
    })
    .await;
    let sentinel = RedisServer::start_sentinel(MASTER, master.port()).await;
    let replica_port = replica.port().to_string();
    eventually(
        "the sentinel knows the replica",
        Duration::from_secs(15),
        || async {
            sentinel
                .query(&["SENTINEL", "REPLICAS", MASTER])
                .await
                .is_ok_and(|fields| fields.contains(&replica_port))
        },
    )
    .await;

    let store: Arc<dyn StateStore> = match common::start(
        "state",
        "redis",
        json!({"redisHost": sentinel.addr(), "failover": "true",
               "sentinelMasterName": MASTER, "dialTimeout": "2s"}),
    )
    .await
    {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    store.set(write("before", "1")).await.unwrap();
    assert_eq!(data(&master, "before").await.as_deref(), Some("1"));

    // The sentinels promote the replica; then the old master dies.
    eventually("the failover to start", Duration::from_secs(15), || async {
        sentinel
            .query(&["SENTINEL", "FAILOVER", MASTER])
            .await
            .is_ok()
    })
    .await;
    eventually(
        "the replica to be master",
        Duration::from_secs(15),
        || async {
            sentinel
                .query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                .await
                .is_ok_and(|addr| addr.get(1) == Some(&replica_port))
        },
    )
    .await;
    master.stop();

    // Requests may fail while the component notices; then they reach the
    // new master.
    eventually(
        "writes to reach the new master",
        Duration::from_secs(20),
        || {
            let store = store.clone();
            async move { store.set(write("after", "2")).await.is_ok() }
        },
    )
    .await;
    assert_eq!(data(&replica, "after").await.as_deref(), Some("2"));
    assert_eq!(data(&replica, "before").await.as_deref(), Some("1"));
}

#[tokio::test]
async fn an_unknown_master_name_is_reported() {
    let master = RedisServer::start().await;
    let sentinel = RedisServer::start_sentinel(MASTER, master.port()).await;
    let err = common::start(
        "lock",
        "redis",
        json!({"redisHost": sentinel.addr(), "failover": true,
               "sentinelMasterName": "other", "dialTimeout": "2s"}),
    )
    .await
    .map(|_| ())
    .expect_err("an unknown master must fail init");
    assert!(
        err.contains("sentinelMasterName") && err.contains("other"),
        "{err}"
    );
}
