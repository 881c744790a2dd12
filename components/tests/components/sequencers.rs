//! The sequencers (`memory`, `redis` against real `redis-server`s): 8
//! concurrent clients × 10,000 STRONG ids never repeat and grow for each
//! client, also across a switch of redis server, in place or by a rebuild.

use crate::common;
use testkit::redis::RedisServer;

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use rewire_runtime::{Increment, Instance, NextIdRequest, Sequencer, SequencerError};
use serde_json::{json, Value};

const CLIENTS: usize = 8;
const IDS_PER_CLIENT: usize = 10_000;

pub(crate) async fn sequencer(type_name: &str, metadata: Value) -> Arc<dyn Sequencer> {
    match common::start("sequencer", type_name, metadata).await {
        Ok(Instance::Sequencer(sequencer)) => sequencer,
        Ok(other) => panic!("expected a sequencer, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn strong(key: &str) -> NextIdRequest {
    NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    }
}

/// The sequencer the clients use now; a test swaps it as a reload would.
pub(crate) type Current = Arc<RwLock<Arc<dyn Sequencer>>>;

/// `CLIENTS` clients taking `IDS_PER_CLIENT` ids each from whatever
/// sequencer `current` holds; `halfway` runs once half the ids are taken.
/// Asserts each client's ids strictly increase and no id repeats.
async fn eight_clients<F, Fut>(current: Current, halfway: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    clients_taking(current, IDS_PER_CLIENT, halfway).await;
}

/// [`eight_clients`], `per_client` ids each.
pub(crate) async fn clients_taking<F, Fut>(current: Current, per_client: usize, halfway: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (half_tx, half_rx) = tokio::sync::mpsc::channel::<()>(CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let current = current.clone();
            let half_tx = half_tx.clone();
            tokio::spawn(async move {
                let mut ids = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    if i == per_client / 2 {
                        let _ = half_tx.send(()).await;
                    }
                    let sequencer = current.read().unwrap().clone();
                    let id = sequencer.get_next_id(strong("orders")).await.unwrap();
                    assert!(id > 0);
                    if let Some(last) = ids.last() {
                        assert!(id > *last, "id {id} after {last}");
                    }
                    ids.push(id);
                }
                ids
            })
        })
        .collect();
    drop(half_tx);
    let mut half_rx = half_rx;
    // Once the first client is halfway: the others are still running.
    half_rx.recv().await;
    halfway().await;
    let mut all = HashSet::new();
    for client in clients {
        for id in client.await.unwrap() {
            assert!(all.insert(id), "id {id} handed out twice");
        }
    }
    assert_eq!(all.len(), CLIENTS * per_client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_strong_ids_never_repeat_across_an_in_place_server_switch() {
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    let sequencer = sequencer("redis", json!({"redisHost": a.addr()})).await;
    let current: Current = Arc::new(RwLock::new(sequencer.clone()));
    let switch = sequencer.clone();
    let b_addr = b.addr();
    eight_clients(current, || async move {
        let metadata = common::metadata(json!({"redisHost": b_addr}));
        let update = switch.as_in_place().unwrap().update_in_place(&metadata);
        assert!(update.await.is_ok());
    })
    .await;
    // Layotto's key: the counter on the new server went on above the old.
    let on_b: i64 = b.query(&["GET", "sequencer|||orders"]).await.unwrap()[0]
        .parse()
        .unwrap();
    assert!(on_b as usize >= CLIENTS * IDS_PER_CLIENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_strong_ids_never_repeat_across_a_rebuild_on_another_server() {
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let old = sequencer(
        "redis",
        json!({"redisHost": a.addr(), "highWaterFile": marks}),
    )
    .await;
    let current: Current = Arc::new(RwLock::new(old));
    let swap = current.clone();
    let b_addr = b.addr();
    eight_clients(current, || async move {
        // Built while the old one serves, then swapped in, as a reload does.
        let new = sequencer(
            "redis",
            json!({"redisHost": b_addr, "highWaterFile": marks}),
        )
        .await;
        *swap.write().unwrap() = new;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_strong_ids_never_repeat_across_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let old = sequencer("memory", json!({"highWaterFile": marks})).await;
    let current: Current = Arc::new(RwLock::new(old));
    let swap = current.clone();
    eight_clients(current, || async move {
        let new = sequencer("memory", json!({"highWaterFile": marks})).await;
        *swap.write().unwrap() = new;
    })
    .await;
}

#[tokio::test]
async fn bigger_than_and_bad_keys() {
    let server = RedisServer::start().await;
    let redis = sequencer(
        "redis",
        json!({"redisHost": server.addr(), "keyPrefix": "app:", "biggerThan": {"orders": "1000"}}),
    )
    .await;
    let memory = sequencer("memory", json!({"biggerThan": {"orders": 1000}})).await;
    for sequencer in [redis, memory] {
        assert_eq!(sequencer.get_next_id(strong("orders")).await, Ok(1001));
        assert_eq!(sequencer.get_next_id(strong("other")).await, Ok(1));
        for bad in ["", "a|||b"] {
            let refused = sequencer.get_next_id(strong(bad)).await;
            assert!(
                matches!(refused, Err(SequencerError::Invalid(_))),
                "{bad:?}"
            );
        }
    }
    let prefixed = server
        .query(&["GET", "app:sequencer|||orders"])
        .await
        .unwrap();
    assert_eq!(prefixed, ["1001"]);
}

#[tokio::test]
async fn sequencer_fields_are_refused_elsewhere_and_a_bad_file_is_named() {
    let server = RedisServer::start().await;
    let state = common::start(
        "state",
        "redis",
        json!({"redisHost": server.addr(), "highWaterFile": "x.json"}),
    )
    .await;
    assert!(state.unwrap_err().contains("highWaterFile"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.json");
    std::fs::write(&path, "[1, 2]").unwrap();
    let metadata = json!({"highWaterFile": path.display().to_string()});
    let err = common::start("sequencer", "memory", metadata)
        .await
        .unwrap_err();
    assert!(err.contains("metadata field `highWaterFile`"), "{err}");
}
