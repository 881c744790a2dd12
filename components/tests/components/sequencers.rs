//! The sequencers (`memory`, `redis` against real `redis-server`s): 8
//! concurrent clients × 10,000 STRONG ids never repeat and grow for each
//! client, also across a switch of redis server, in place or by a rebuild.

use crate::common;
use testkit::redis::RedisServer;

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use rewire_runtime::{Handover, Increment, Instance, NextIdRequest, Sequencer, SequencerError};
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
    // Layotto's key (app `test`): the counter on the new server went on
    // above the old.
    let on_b: i64 = b.query(&["GET", "sequencer|||test||orders"]).await.unwrap()[0]
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
        for bad in ["", "a|||b", "a||b"] {
            let refused = sequencer.get_next_id(strong(bad)).await;
            assert!(
                matches!(refused, Err(SequencerError::Invalid(_))),
                "{bad:?}"
            );
        }
    }
    // `keyPrefix` is Layotto's strategy: a literal goes before `||`.
    let prefixed = server
        .query(&["GET", "sequencer|||app:||orders"])
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

/// A started instance of the sequencer component `sequencer/{name}` in
/// the runtime whose handover area is `runtime` (the same area again: a
/// rebuild in that runtime).
async fn named(
    runtime: &Handover,
    name: &str,
    type_name: &str,
    metadata: Value,
) -> Arc<dyn Sequencer> {
    match common::start_in(runtime, "sequencer", name, type_name, metadata).await {
        Ok(Instance::Sequencer(sequencer)) => sequencer,
        Ok(other) => panic!("expected a sequencer, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

/// `count` STRONG ids of `orders`, each added to `seen` (no repeat).
async fn take(sequencer: &Arc<dyn Sequencer>, count: usize, seen: &mut HashSet<i64>) -> i64 {
    let mut last = 0;
    for _ in 0..count {
        last = sequencer.get_next_id(strong("orders")).await.unwrap();
        assert!(seen.insert(last), "id {last} handed out twice");
    }
    last
}

#[tokio::test]
async fn redis_rebuild_onto_a_lagging_server_without_a_file_never_repeats_an_id() {
    let runtime = Handover::new();
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    let mut seen = HashSet::new();
    let old = named(&runtime, "lagging", "redis", json!({"redisHost": a.addr()})).await;
    let last = take(&old, 100, &mut seen).await;
    // The second server's counter lags far behind the first one's.
    b.query(&["SET", "sequencer|||test||orders", "10"])
        .await
        .unwrap();
    // The rebuild: built while the old instance is alive, as a reload
    // does when the in-place switch failed.
    let new = named(&runtime, "lagging", "redis", json!({"redisHost": b.addr()})).await;
    let first = new.get_next_id(strong("orders")).await.unwrap();
    assert!(first > last, "{first} after {last}");
    assert!(seen.insert(first));
    take(&new, 100, &mut seen).await;
    // The old instance, still serving a moment longer, never repeats either.
    take(&old, 10, &mut seen).await;
    take(&new, 10, &mut seen).await;
}

#[tokio::test]
async fn a_memory_sequencer_rebuilt_as_redis_goes_on_above_its_ids() {
    let runtime = Handover::new();
    let server = RedisServer::start().await;
    let mut seen = HashSet::new();
    let memory = named(&runtime, "retyped", "memory", json!({})).await;
    let last = take(&memory, 50, &mut seen).await;
    let redis = named(
        &runtime,
        "retyped",
        "redis",
        json!({"redisHost": server.addr()}),
    )
    .await;
    let first = take(&redis, 1, &mut seen).await;
    assert!(first > last, "{first} after {last}");
    take(&memory, 5, &mut seen).await;
    take(&redis, 5, &mut seen).await;
}

#[tokio::test]
async fn memory_ids_go_on_when_the_high_water_file_is_added_changed_or_removed() {
    let runtime = Handover::new();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let mut seen = HashSet::new();
    let mut instances = vec![named(&runtime, "files", "memory", json!({})).await];
    take(&instances[0], 20, &mut seen).await;
    for metadata in [
        json!({"highWaterFile": file("one.json")}),
        json!({"highWaterFile": file("two.json")}),
        json!({}),
        json!({"highWaterFile": file("three.json")}),
    ] {
        let last = *seen.iter().max().unwrap();
        // Rebuilt while the previous instance still serves, then swapped.
        let next = named(&runtime, "files", "memory", metadata).await;
        let first = take(&next, 1, &mut seen).await;
        assert!(first > last, "{first} after {last}");
        take(instances.last().unwrap(), 3, &mut seen).await;
        take(&next, 20, &mut seen).await;
        instances.push(next);
    }
    // Each file added covers every id handed out before it, at once: a
    // process restarted on it (another component here) starts above them.
    let before_three = seen.len();
    drop(instances);
    let restarted = named(
        &Handover::new(),
        "files-restarted",
        "memory",
        json!({"highWaterFile": file("three.json")}),
    )
    .await;
    take(&restarted, 1, &mut seen).await;
    assert_eq!(seen.len(), before_three + 1);
}

#[tokio::test]
async fn a_file_added_covers_the_ids_handed_out_before_any_next_request() {
    let runtime = Handover::new();
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json").display().to_string();
    let mut seen = HashSet::new();
    let old = named(&runtime, "covered", "memory", json!({})).await;
    let last = take(&old, 30, &mut seen).await;
    let new = named(
        &runtime,
        "covered",
        "memory",
        json!({"highWaterFile": marks}),
    )
    .await;
    drop((old, new));
    // Nothing was asked of the new instance: the file holds the ids anyway.
    let restarted = named(
        &Handover::new(),
        "covered-restart",
        "memory",
        json!({"highWaterFile": marks}),
    )
    .await;
    let first = take(&restarted, 1, &mut seen).await;
    assert!(first > last, "{first} after {last}");
}

#[tokio::test]
async fn redis_ids_above_2_pow_53_are_exact() {
    let server = RedisServer::start().await;
    for start in [9_007_199_254_740_993_i64, 100_000_000_000_000_000] {
        let key = format!("k{start}");
        let sequencer = sequencer(
            "redis",
            json!({"redisHost": server.addr(), "biggerThan": {key.clone(): start.to_string()}}),
        )
        .await;
        for n in 1..=3 {
            let id = sequencer.get_next_id(strong(&key)).await;
            assert_eq!(id, Ok(start + n), "{key}");
        }
        let counter = server
            .query(&["GET", &format!("sequencer|||test||{key}")])
            .await
            .unwrap();
        assert_eq!(counter, [(start + 3).to_string()]);
    }
    // A counter written as a double by an older script is lifted, not
    // fatal: past every counter `1e+17` may stand for (14 significant
    // digits), even above `biggerThan`.
    server
        .query(&["SET", "sequencer|||test||orders", "1e+17"])
        .await
        .unwrap();
    let sequencer = sequencer(
        "redis",
        json!({"redisHost": server.addr(), "biggerThan": {"orders": "100000000000000000"}}),
    )
    .await;
    assert_eq!(
        sequencer.get_next_id(strong("orders")).await,
        Ok(100_000_000_000_010_001)
    );
}

/// A counter holding a double (`1e+17`, which an early script wrote for
/// lifts past about 1e14), with nothing else to lift it (`keyPrefix:
/// none`, no `biggerThan`): `INCRBY` alone refuses it for ever, so it is
/// set to an integer past every counter it may stand for, once. A
/// counter that is no number is refused, saying what to do.
#[tokio::test]
async fn redis_a_double_counter_is_lifted_once_and_garbage_is_named() {
    let server = RedisServer::start().await;
    server
        .query(&["SET", "sequencer|||orders", "1e+17"])
        .await
        .unwrap();
    server
        .query(&["SET", "sequencer|||broken", "twelve"])
        .await
        .unwrap();
    let metadata = json!({"redisHost": server.addr(), "keyPrefix": "none"});
    let ids = sequencer("redis", metadata).await;
    // 1e+17 may stand for up to 1e17 + 5,000: one unit (10,000) of the
    // 14th digit past it.
    let first = 100_000_000_000_010_001;
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(first));
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(first + 1));
    let counter = server.query(&["GET", "sequencer|||orders"]).await.unwrap();
    assert_eq!(counter, [(first + 1).to_string()]);
    match ids.get_next_id(strong("broken")).await {
        Err(SequencerError::Backend(message)) => {
            assert!(message.contains("sequencer|||broken"), "{message}");
            assert!(message.contains("SET it to an integer"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn keys_longer_than_1_kib_are_refused() {
    let server = RedisServer::start().await;
    let redis = sequencer("redis", json!({"redisHost": server.addr()})).await;
    let memory = sequencer("memory", json!({})).await;
    for sequencer in [redis, memory] {
        let longest = "k".repeat(1024);
        assert_eq!(sequencer.get_next_id(strong(&longest)).await, Ok(1));
        let refused = sequencer.get_next_id(strong(&"k".repeat(1025))).await;
        match refused {
            Err(SequencerError::Invalid(message)) => {
                assert!(message.contains("at most 1024 bytes"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_full_high_water_file_takes_no_new_key_and_an_oversized_one_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marks.json");
    // 8,400 keys of 1,000 bytes: past the 8 MiB where new keys stop.
    let full: serde_json::Map<String, Value> = (0..8_400)
        .map(|n| (format!("{n:01000}"), json!(5)))
        .collect();
    std::fs::write(&path, serde_json::to_vec(&full).unwrap()).unwrap();
    let marks = path.display().to_string();
    let sequencer = sequencer("memory", json!({"highWaterFile": marks})).await;
    match sequencer.get_next_id(strong("new")).await {
        // The request is valid: the sequencer is out of room.
        Err(SequencerError::Capacity(message)) => assert!(message.contains("full"), "{message}"),
        other => panic!("{other:?}"),
    }
    // The keys it holds go on.
    let known = format!("{:01000}", 7);
    assert_eq!(sequencer.get_next_id(strong(&known)).await, Ok(6));
    // A file past 16 MiB (written by hand): the sequencer does not start,
    // and the error says why and what to do.
    let huge = dir.path().join("huge.json");
    std::fs::write(&huge, vec![b' '; 17 * 1024 * 1024]).unwrap();
    let metadata = json!({"highWaterFile": huge.display().to_string()});
    let err = common::start("sequencer", "memory", metadata)
        .await
        .unwrap_err();
    assert!(err.contains("metadata field `highWaterFile`"), "{err}");
    assert!(err.contains("biggerThan"), "{err}");
}

/// A sequencer holding its 100,000 keys refuses a new one before asking
/// Redis: no counter is made for it (one per refused request would let a
/// client fill the server with keys that never expire); known keys go on.
#[tokio::test]
async fn redis_a_full_sequencer_refuses_a_new_key_without_making_its_counter() {
    let runtime = Handover::new();
    let server = RedisServer::start().await;
    // The marks filled in memory, then adopted by a rebuild as redis.
    let memory = named(&runtime, "full", "memory", json!({})).await;
    for n in 0..rewire_components::high_water::MAX_KEYS {
        memory.get_next_id(strong(&format!("k{n}"))).await.unwrap();
    }
    let redis = named(
        &runtime,
        "full",
        "redis",
        json!({"redisHost": server.addr()}),
    )
    .await;
    match redis.get_next_id(strong("one-more")).await {
        Err(SequencerError::Capacity(message)) => {
            assert!(message.contains("one-more"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let exists = server
        .query(&["EXISTS", "sequencer|||test||one-more"])
        .await
        .unwrap();
    assert_eq!(exists, ["0"]);
    assert_eq!(redis.get_next_id(strong("k7")).await, Ok(2));
}

/// A started sequencer of app `app_id`, of `type_name`, named
/// `sequencer/{name}`.
pub(crate) async fn sequencer_of(
    app_id: &str,
    name: &str,
    type_name: &str,
    metadata: Value,
) -> Arc<dyn Sequencer> {
    let mut cx = common::named_context("sequencer", name, &common::metadata(metadata.clone()));
    cx.app_id = app_id.into();
    let mut built =
        common::build("sequencer", type_name, metadata).unwrap_or_else(|e| panic!("{e}"));
    built
        .init(&cx)
        .await
        .unwrap_or_else(|e| panic!("init: {e}"));
    match built.into_instance() {
        Instance::Sequencer(sequencer) => sequencer,
        other => panic!("expected a sequencer, got {other:?}"),
    }
}

/// A counter Layotto's sidecar left in Redis (its exact key,
/// `sequencer|||{appId}||{key}` by default) goes on: a user moving from
/// Layotto onto the same server never gets an id Layotto handed out. The
/// other strategies of `keyPrefix` put their part where Layotto does.
#[tokio::test]
async fn redis_counters_sit_at_layotto_s_keys() {
    let server = RedisServer::start().await;
    let addr = server.addr();
    server
        .query(&["SET", "sequencer|||app1||orders", "5000"])
        .await
        .unwrap();
    let ids = sequencer_of("app1", "ids-a", "redis", json!({"redisHost": addr})).await;
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(5001));
    assert_eq!(
        server
            .query(&["GET", "sequencer|||app1||orders"])
            .await
            .unwrap(),
        ["5001"]
    );
    for (key_prefix, counter) in [
        ("appid", "sequencer|||app1||k"),
        ("name", "sequencer|||ids-b||k"),
        ("none", "sequencer|||k"),
        ("Shop", "sequencer|||shop||k"),
    ] {
        server.query(&["SET", counter, "41"]).await.unwrap();
        let metadata = json!({"redisHost": addr, "keyPrefix": key_prefix});
        let ids = sequencer_of("app1", "ids-b", "redis", metadata).await;
        assert_eq!(ids.get_next_id(strong("k")).await, Ok(42), "{key_prefix}");
        server.query(&["DEL", counter]).await.unwrap();
    }
    // As Layotto: `||` is refused in keys (INVALID_ARGUMENT) and in a
    // literal `keyPrefix`.
    let refused = ids.get_next_id(strong("a||b")).await;
    assert!(matches!(refused, Err(SequencerError::Invalid(m)) if m.contains("||")));
    let err = common::start(
        "sequencer",
        "redis",
        json!({"redisHost": addr, "keyPrefix": "a||b"}),
    )
    .await
    .unwrap_err();
    assert!(err.contains("keyPrefix"), "{err}");
}

/// A counter in rewire's earlier layout (`{keyPrefix}sequencer|||{key}`,
/// `keyPrefix` literal) goes on at the new key: no id is handed out twice
/// across the upgrade.
#[tokio::test]
async fn redis_counters_in_the_earlier_layout_go_on() {
    let server = RedisServer::start().await;
    let addr = server.addr();
    server
        .query(&["SET", "sequencer|||orders", "700"])
        .await
        .unwrap();
    server
        .query(&["SET", "app:sequencer|||orders", "900"])
        .await
        .unwrap();
    let plain = sequencer("redis", json!({"redisHost": addr})).await;
    assert_eq!(plain.get_next_id(strong("orders")).await, Ok(701));
    assert_eq!(plain.get_next_id(strong("orders")).await, Ok(702));
    let prefixed = sequencer("redis", json!({"redisHost": addr, "keyPrefix": "app:"})).await;
    assert_eq!(prefixed.get_next_id(strong("orders")).await, Ok(901));
    assert_eq!(
        server
            .query(&["GET", "sequencer|||app:||orders"])
            .await
            .unwrap(),
        ["901"]
    );
    // Read once per key: the old counter is left as it was.
    assert_eq!(
        server.query(&["GET", "sequencer|||orders"]).await.unwrap(),
        ["700"]
    );
    // A new server (in place): its old-layout counter is read too.
    let other = RedisServer::start().await;
    other
        .query(&["SET", "sequencer|||orders", "5000"])
        .await
        .unwrap();
    let switch = common::metadata(json!({"redisHost": other.addr()}));
    let update = plain.as_in_place().unwrap().update_in_place(&switch).await;
    assert!(update.is_ok(), "{update:?}");
    assert_eq!(plain.get_next_id(strong("orders")).await, Ok(5001));
}

/// On a Redis Cluster the counter and its key in the earlier layout may
/// sit in different slots: the old key is read on its own (one script on
/// both would fail with CROSSSLOT), and ids go on above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_counters_in_the_earlier_layout_go_on_across_slots() {
    let cluster = testkit::redis_cluster::RedisCluster::start().await;
    let mut written = None;
    for port in cluster.master_ports().await {
        // Only the master of the key's slot takes it (the others: MOVED).
        if cluster
            .query(port, &["SET", "sequencer|||orders", "700"])
            .await
            .is_ok()
        {
            written = Some(port);
            break;
        }
    }
    let old_master = written.expect("no master took the old key");
    // A pub/sub topic `sequencer|||events` on the same cluster: a stream
    // at the old key of `events`, no counter (before: WRONGTYPE, every
    // first request after a restart failed).
    let mut streamed = false;
    for port in cluster.master_ports().await {
        let add = ["XADD", "sequencer|||events", "*", "f", "v"];
        if cluster.query(port, &add).await.is_ok() {
            streamed = true;
            break;
        }
    }
    assert!(streamed, "no master took the stream");
    let metadata = json!({"redisHost": cluster.seeds(), "redisType": "cluster"});
    let ids = sequencer("redis", metadata.clone()).await;
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(701));
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(702));
    assert_eq!(ids.get_next_id(strong("events")).await, Ok(1));
    // Once the counter exists, the old key is not read again: a value
    // planted there does not make a restarted sequencer jump.
    let plant = ["SET", "sequencer|||orders", "9223372036854775800"];
    cluster.query(old_master, &plant).await.unwrap();
    let restarted = sequencer("redis", metadata).await;
    assert_eq!(restarted.get_next_id(strong("orders")).await, Ok(703));
}

/// Keys of the earlier layout (`sequencer|||{key}`) are other clients'
/// too: a pub/sub topic `sequencer|||orders` on the same server is a
/// stream there, anything may be text. What is no counter is taken as
/// absent, never failing a request (before: WRONGTYPE or "not an
/// integer", after every restart); and once the counter exists the old
/// key is not read again, so a value planted there does not make a
/// restarted sequencer jump.
#[tokio::test]
async fn redis_an_earlier_layout_key_another_client_wrote_neither_fails_nor_lifts() {
    let server = RedisServer::start().await;
    server
        .query(&["XADD", "sequencer|||orders", "*", "f", "v"])
        .await
        .unwrap();
    server
        .query(&["SET", "sequencer|||invoices", "twelve"])
        .await
        .unwrap();
    // Cut at 64 bytes for the warning: in the middle of an `é`.
    let accented = format!("a{}", "é".repeat(40));
    server
        .query(&["SET", "sequencer|||names", &accented])
        .await
        .unwrap();
    let metadata = json!({"redisHost": server.addr()});
    let ids = sequencer("redis", metadata.clone()).await;
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(1));
    assert_eq!(ids.get_next_id(strong("names")).await, Ok(1));
    assert_eq!(ids.get_next_id(strong("invoices")).await, Ok(1));
    assert_eq!(ids.get_next_id(strong("invoices")).await, Ok(2));
    server
        .query(&["SET", "sequencer|||invoices", "9223372036854775800"])
        .await
        .unwrap();
    let restarted = sequencer("redis", metadata).await;
    assert_eq!(restarted.get_next_id(strong("invoices")).await, Ok(3));
    assert_eq!(restarted.get_next_id(strong("orders")).await, Ok(2));
}

/// Ids past `i64::MAX` are RESOURCE_EXHAUSTED (`Exhausted`), as the
/// memory sequencer's, not a backend failure (INTERNAL, counted by a
/// circuit breaker): after `biggerThan` just below the end, and on a
/// counter already at the end (`INCRBY` would overflow).
#[tokio::test]
async fn redis_ids_past_the_end_are_exhausted() {
    let server = RedisServer::start().await;
    let metadata = json!({"redisHost": server.addr(), "biggerThan": {"k": i64::MAX - 1}});
    let ids = sequencer("redis", metadata).await;
    assert_eq!(ids.get_next_id(strong("k")).await, Ok(i64::MAX));
    assert_eq!(
        ids.get_next_id(strong("k")).await,
        Err(SequencerError::Exhausted("k".into()))
    );
    server
        .query(&["SET", "sequencer|||test||full", &i64::MAX.to_string()])
        .await
        .unwrap();
    assert_eq!(
        ids.get_next_id(strong("full")).await,
        Err(SequencerError::Exhausted("full".into()))
    );
}

/// An earlier-layout key holding digits past `i64` (`99999999999999999999`)
/// is no counter: taken as absent (with a warning), so the counter is not
/// set to it and ids are served, for rewire as for Layotto's `INCRBY`
/// (before: it became the floor, the counter was SET to it and every
/// later request failed "value is not an integer or out of range"). A
/// counter holding such digits is refused, saying what to do.
#[tokio::test]
async fn redis_an_earlier_layout_key_past_i64_is_no_counter() {
    let server = RedisServer::start().await;
    let past = "99999999999999999999";
    server
        .query(&["SET", "sequencer|||orders", past])
        .await
        .unwrap();
    // 19 digits, just past `i64::MAX`.
    server
        .query(&["SET", "sequencer|||invoices", "9223372036854775808"])
        .await
        .unwrap();
    let metadata = json!({"redisHost": server.addr()});
    let ids = sequencer("redis", metadata).await;
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(1));
    assert_eq!(ids.get_next_id(strong("orders")).await, Ok(2));
    assert_eq!(ids.get_next_id(strong("invoices")).await, Ok(1));
    let counter = server.query(&["GET", "sequencer|||test||orders"]).await;
    assert_eq!(counter.unwrap(), ["2"]);
    server
        .query(&["SET", "sequencer|||test||huge", past])
        .await
        .unwrap();
    let refused = ids.get_next_id(strong("huge")).await;
    assert!(
        matches!(&refused, Err(SequencerError::Backend(m)) if m.contains("not an integer below 2^63")),
        "{refused:?}"
    );
}

/// A counter holding an integer with leading zeros (`007`, a hand edit)
/// goes on from its value: the script sets it to its plain digits before
/// `INCRBY`, which refuses leading zeros (before: the script took it as an
/// integer and every request failed "value is not an integer or out of
/// range"). `-0` is 0.
#[tokio::test]
async fn redis_a_counter_with_leading_zeros_goes_on() {
    let server = RedisServer::start().await;
    for (key, value) in [("z", "007"), ("minus-zero", "-0"), ("zero", "000")] {
        server
            .query(&["SET", &format!("sequencer|||test||{key}"), value])
            .await
            .unwrap();
    }
    let ids = sequencer("redis", json!({"redisHost": server.addr()})).await;
    assert_eq!(ids.get_next_id(strong("z")).await, Ok(8));
    assert_eq!(ids.get_next_id(strong("z")).await, Ok(9));
    assert_eq!(ids.get_next_id(strong("minus-zero")).await, Ok(1));
    assert_eq!(ids.get_next_id(strong("zero")).await, Ok(1));
    let counter = server.query(&["GET", "sequencer|||test||z"]).await;
    assert_eq!(counter.unwrap(), ["9"]);
}
