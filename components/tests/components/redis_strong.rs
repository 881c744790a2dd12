//! Dapr's `consistency: strong` on the `redis` state store, against a real
//! master and replica: a strong write (or delete) waits for the replicas
//! the master has had (`WAIT`), and fails, naming how many acknowledged,
//! when one is paused or gone. It waits on a connection of its own, so
//! the other requests of the store never queue behind its `WAIT`.

use crate::common;
use testkit::redis as redis_server;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire_runtime::{
    Consistency, DeleteRequest, GetRequest, Instance, SetRequest, StateError, StateStore,
};
use serde_json::json;

async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write(key: &str, consistency: Consistency) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: b"\"v\"".to_vec(),
        consistency,
        ..SetRequest::default()
    }
}

/// The pid of `server` (`INFO server`), to pause and resume it.
async fn pid(server: &RedisServer) -> String {
    let info = server
        .query(&["INFO", "server"])
        .await
        .expect("INFO server");
    info.concat()
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:").map(str::to_string))
        .expect("process_id")
}

fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

async fn master_and_replica() -> (RedisServer, RedisServer, Arc<dyn StateStore>) {
    let master = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(master.port()).await;
    eventually("the replica in sync", Duration::from_secs(10), || async {
        master
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("connected_slaves:1"))
            && replica
                .query(&["INFO", "replication"])
                .await
                .is_ok_and(|info| info.concat().contains("master_link_status:up"))
    })
    .await;
    let store = match common::start("state", "redis", json!({"redisHost": master.addr()})).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    (master, replica, store)
}

fn not_replicated(result: Result<(), StateError>) -> String {
    match result {
        Err(StateError::Backend(message)) => {
            assert!(
                message.contains("strong consistency not reached")
                    && message.contains("0 of 1 replica(s) acknowledged"),
                "{message}"
            );
            message
        }
        other => panic!("expected the strong write to fail, got {other:?}"),
    }
}

#[tokio::test]
async fn a_strong_write_waits_for_the_replica_and_fails_while_it_is_paused() {
    let (_master, replica, store) = master_and_replica().await;
    store
        .set(write("k", Consistency::Strong))
        .await
        .expect("strong write with the replica up");
    let pid = pid(&replica).await;
    signal(&pid, "-STOP");
    let started = tokio::time::Instant::now();
    let failed = store.set(write("k", Consistency::Strong)).await;
    let waited = started.elapsed();
    signal(&pid, "-CONT");
    not_replicated(failed);
    assert!(waited >= Duration::from_millis(900), "waited {waited:?}");
    // A delete asks the same.
    signal(&pid, "-STOP");
    let delete = DeleteRequest {
        key: "k".into(),
        consistency: Consistency::Strong,
        ..DeleteRequest::default()
    };
    let failed = store.delete(delete.clone()).await;
    signal(&pid, "-CONT");
    not_replicated(failed);
    // Eventual writes never wait.
    signal(&pid, "-STOP");
    let started = tokio::time::Instant::now();
    let eventual = store.set(write("k", Consistency::Eventual)).await;
    let waited = started.elapsed();
    signal(&pid, "-CONT");
    assert_eq!(eventual, Ok(()));
    assert!(waited < Duration::from_millis(500), "waited {waited:?}");
    // Resumed, the replica acknowledges again.
    eventually(
        "strong writes replicated again",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            async move { store.set(write("k", Consistency::Strong)).await.is_ok() }
        },
    )
    .await;
    store.delete(delete).await.expect("strong delete");
}

/// Redis holds the connection that sent a `WAIT` until the replicas
/// answer or it times out: on the connection every request shares, one
/// strong write waiting for a paused replica held up every read and
/// write of the store for its whole second.
#[tokio::test]
async fn a_strong_write_waiting_for_a_paused_replica_holds_up_no_other_request() {
    let (_master, replica, store) = master_and_replica().await;
    store
        .set(write("k", Consistency::Strong))
        .await
        .expect("strong write with the replica up");
    store
        .set(write("other", Consistency::Eventual))
        .await
        .expect("eventual write");
    let pid = pid(&replica).await;
    signal(&pid, "-STOP");
    let strong = tokio::spawn({
        let store = store.clone();
        async move {
            let started = tokio::time::Instant::now();
            let result = store.set(write("k", Consistency::Strong)).await;
            (result, started.elapsed())
        }
    });
    // The strong write is in its `WAIT` by now (its connection is open).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = tokio::time::Instant::now();
    let read = store
        .get(GetRequest {
            key: "other".into(),
            ..GetRequest::default()
        })
        .await;
    let read_took = started.elapsed();
    let started = tokio::time::Instant::now();
    let eventual = store.set(write("other", Consistency::Eventual)).await;
    let eventual_took = started.elapsed();
    let (strong, strong_took) = strong.await.expect("the strong write's task");
    signal(&pid, "-CONT");
    // The strong write was still waiting while the others were answered.
    not_replicated(strong);
    assert!(
        strong_took >= Duration::from_millis(900),
        "strong write took {strong_took:?}"
    );
    assert_eq!(
        read.expect("read during the strong write").map(|e| e.data),
        Some(b"\"v\"".to_vec())
    );
    assert!(
        read_took < Duration::from_millis(300),
        "the read waited {read_took:?} behind the strong write's WAIT"
    );
    assert_eq!(eventual, Ok(()));
    assert!(
        eventual_took < Duration::from_millis(300),
        "the eventual write waited {eventual_took:?} behind the strong write's WAIT"
    );
}

#[tokio::test]
async fn a_strong_write_fails_once_the_replica_is_gone() {
    let (master, mut replica, store) = master_and_replica().await;
    store
        .set(write("k", Consistency::Strong))
        .await
        .expect("strong write with the replica up");
    replica.stop();
    eventually(
        "the master sees the replica gone",
        Duration::from_secs(10),
        || async {
            master
                .query(&["INFO", "replication"])
                .await
                .is_ok_and(|info| info.concat().contains("connected_slaves:0"))
        },
    )
    .await;
    // The replica the master had still counts: not replicated is an error,
    // not a success.
    not_replicated(store.set(write("k", Consistency::Strong)).await);
    assert_eq!(store.set(write("k", Consistency::Eventual)).await, Ok(()));
}

#[tokio::test]
async fn a_strong_write_without_replicas_succeeds_at_once() {
    let master = RedisServer::start().await;
    let store = match common::start("state", "redis", json!({"redisHost": master.addr()})).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(store.set(write("k", Consistency::Strong)).await, Ok(()));
    let delete = DeleteRequest {
        key: "k".into(),
        consistency: Consistency::Strong,
        ..DeleteRequest::default()
    };
    assert_eq!(store.delete(delete).await, Ok(()));
}

/// How many times `server` ran `command` since its stats were reset
/// (`INFO commandstats`).
async fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server
        .query(&["INFO", "commandstats"])
        .await
        .expect("INFO commandstats")
        .concat();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count of calls"))
}

/// Strong writes on a master that never had a replica check the count
/// (`INFO replication`) about once a second, not once per write: the Dapr
/// Go SDK and Layotto's SDKs ask for strong on every write by default.
/// Before: every strong save and delete sent its own `INFO`, one at a time
/// on the connection for strong writes.
#[tokio::test]
async fn strong_writes_without_replicas_check_the_count_once_not_per_write() {
    let master = RedisServer::start().await;
    let store = match common::start("state", "redis", json!({"redisHost": master.addr()})).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    master
        .query(&["CONFIG", "RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    let writes: Vec<_> = (0..20)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("k{n}");
                store.set(write(&key, Consistency::Strong)).await?;
                let delete = DeleteRequest {
                    key,
                    consistency: Consistency::Strong,
                    ..DeleteRequest::default()
                };
                store.delete(delete).await
            })
        })
        .collect();
    for write in writes {
        assert_eq!(write.await.expect("a write's task"), Ok(()));
    }
    assert_eq!(calls(&master, "del").await, 20, "the deletes ran");
    let info = calls(&master, "info").await;
    assert!((1..=2).contains(&info), "{info} INFO for 40 strong writes");
    assert_eq!(calls(&master, "wait").await, 0);
}

/// A replica attached after strong writes went without one is counted
/// within about a second: strong writes then wait for it (and fail while
/// it is paused), as they would had it been there from the start.
#[tokio::test]
async fn a_replica_attached_later_is_waited_for_within_about_a_second() {
    let master = RedisServer::start().await;
    let store = match common::start("state", "redis", json!({"redisHost": master.addr()})).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(store.set(write("k", Consistency::Strong)).await, Ok(()));
    let replica = RedisServer::start_replica_of(master.port()).await;
    eventually("the replica in sync", Duration::from_secs(10), || async {
        replica
            .query(&["INFO", "replication"])
            .await
            .is_ok_and(|info| info.concat().contains("master_link_status:up"))
    })
    .await;
    let pid = pid(&replica).await;
    signal(&pid, "-STOP");
    // Within the count's second (plus a `WAIT` of one), a strong write
    // waits for the paused replica and fails.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let failed = loop {
        let result = store.set(write("k", Consistency::Strong)).await;
        if result.is_err() || tokio::time::Instant::now() >= deadline {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let next = store.set(write("k", Consistency::Strong)).await;
    signal(&pid, "-CONT");
    not_replicated(failed);
    not_replicated(next);
    eventually(
        "strong writes replicated again",
        Duration::from_secs(10),
        || {
            let store = store.clone();
            async move { store.set(write("k", Consistency::Strong)).await.is_ok() }
        },
    )
    .await;
}
