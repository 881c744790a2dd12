//! The `redis` components on a real six-node Redis Cluster (three masters,
//! a replica each): a command whose reply comes late is never sent again
//! (the server already ran it: a second run would answer for the first —
//! a lock refused to the owner that took it, an etag mismatch for a write
//! that applied, an unlock that found nothing because the first deleted
//! it), while the redirections of a slot moving to another master (`ASK`
//! during the migration, `MOVED` after) are still followed.
//!
//! A late reply, deterministically: `CLIENT PAUSE` holds every command the
//! master of the key's slot receives for longer than the components'
//! `readTimeout` + `writeTimeout`, then runs them in the order they came
//! (the cluster bus goes on, so no failover starts). The master's
//! `INFO commandstats` counts how often the command ran.
//!
//! A resharding usually moves slots to a master that has none yet: joined
//! to the cluster empty, it is not in the slot map (`CLUSTER SLOTS`), so
//! the cluster client has no connection to it when `ASK` names it.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::support::state_requests::write;
use rewire_runtime::{
    GetRequest, Instance, Lock, StateError, StateStore, TryLockRequest, UnlockRequest, UnlockStatus,
};
use serde_json::{json, Value};
use testkit::redis_cluster::{RedisCluster, NODE_TIMEOUT};
use testkit::ChildProcess;
use tokio::time::{sleep, Instant};

/// How long the master holds the commands: well past a try's
/// `readTimeout` + `writeTimeout` (500 ms), within the command's own
/// deadline (`dialTimeout` + those: 2.5 s) — where a command sent again
/// after its first try timed out would get its answer.
const PAUSE: Duration = Duration::from_millis(1500);

const MINUTE: Duration = Duration::from_secs(60);

/// The lock of the late replies, and its key (`keyPrefix: none`).
const LOCK: &str = "{late-lock}";
const LOCK_KEY: &str = "lock||{late-lock}";

/// The cluster metadata of the tests' components: unprefixed keys, so the
/// test knows each key's slot.
pub(crate) fn metadata(cluster: &RedisCluster) -> Value {
    json!({
        "redisHost": cluster.seeds(), "redisType": "cluster", "keyPrefix": "none",
        "dialTimeout": "2s", "readTimeout": "300ms", "writeTimeout": "200ms"
    })
}

pub(crate) async fn lock_store(cluster: &RedisCluster) -> Arc<dyn Lock> {
    match common::start("lock", "redis", metadata(cluster)).await {
        Ok(Instance::Lock(lock)) => lock,
        Ok(other) => panic!("expected a lock, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

pub(crate) async fn state_store(cluster: &RedisCluster) -> Arc<dyn StateStore> {
    match common::start("state", "redis", metadata(cluster)).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

pub(crate) fn lock(resource: &str, owner: &str) -> TryLockRequest {
    TryLockRequest {
        resource_id: resource.into(),
        lock_owner: owner.into(),
        expiry: MINUTE,
    }
}

pub(crate) fn unlock(resource: &str, owner: &str) -> UnlockRequest {
    UnlockRequest {
        resource_id: resource.into(),
        lock_owner: owner.into(),
    }
}

pub(crate) async fn read(store: &dyn StateStore, key: &str) -> Option<(String, String)> {
    let req = GetRequest {
        key: key.into(),
        ..GetRequest::default()
    };
    let entry = store
        .get(req)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))?;
    Some((
        String::from_utf8_lossy(&entry.data).into_owned(),
        entry.etag,
    ))
}

/// The port of the master serving `key` now.
pub(crate) async fn master_of(cluster: &RedisCluster, key: &str) -> u16 {
    let slot = cluster.keyslot(key).await;
    cluster
        .master_of_slot(slot)
        .await
        .unwrap_or_else(|| panic!("no master serves slot {slot}"))
}

/// How many times the node at `port` ran `command` (lower case, as in
/// `INFO commandstats`) without an error (an `EVALSHA` refused with
/// `NOSCRIPT` does not count) since its statistics were reset.
async fn calls(cluster: &RedisCluster, port: u16, command: &str) -> u64 {
    let lines = cluster
        .query(port, &["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(stats) = lines
        .iter()
        .flat_map(|text| text.lines())
        .find_map(|line| line.strip_prefix(&prefix))
    else {
        return 0;
    };
    let field = |name: &str| {
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |n| n.parse::<u64>().expect("a count"))
    };
    field("calls") - field("failed_calls")
}

/// How many scripts the node at `port` ran (see [`calls`]).
async fn scripts(cluster: &RedisCluster, port: u16) -> u64 {
    calls(cluster, port, "evalsha").await + calls(cluster, port, "eval").await
}

/// `CLUSTER SETSLOT slot state id` on the node at `port`.
pub(crate) async fn setslot(cluster: &RedisCluster, port: u16, slot: u16, state: &str, id: &str) {
    let slot = slot.to_string();
    cluster
        .query(port, &["CLUSTER", "SETSLOT", &slot, state, id])
        .await
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {state} on {port}: {e}"));
}

/// Moves `key` from the node at `source` to the one at `target`.
pub(crate) async fn migrate(cluster: &RedisCluster, source: u16, target: u16, key: &str) {
    let target = target.to_string();
    cluster
        .query(
            source,
            &[
                "MIGRATE",
                "127.0.0.1",
                &target,
                "",
                "0",
                "5000",
                "KEYS",
                key,
            ],
        )
        .await
        .expect("MIGRATE");
}

/// A key (`{bg-N}`) that a master other than the one at `port` serves.
async fn key_elsewhere(cluster: &RedisCluster, port: u16) -> String {
    for n in 0.. {
        let key = format!("{{bg-{n}}}");
        if master_of(cluster, &key).await != port {
            return key;
        }
    }
    unreachable!()
}

/// Runs `command` every 50 ms until aborted: other traffic on the same
/// cluster connection, as a busy sidecar has (the client sends a command
/// again only when something else wakes it).
fn traffic<F, Fut>(command: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        loop {
            command().await;
            sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Resets the statistics of the node at `port`, then makes it hold every
/// command for [`PAUSE`]; returns when the pause ends.
async fn pause(cluster: &RedisCluster, port: u16) -> Instant {
    cluster
        .query(port, &["CONFIG", "RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    let millis = PAUSE.as_millis().to_string();
    cluster
        .query(port, &["CLIENT", "PAUSE", &millis, "ALL"])
        .await
        .expect("CLIENT PAUSE");
    Instant::now() + PAUSE
}

/// A `SET NX` whose reply came after `readTimeout` + `writeTimeout`: the
/// caller hears an error ("may or may not have been taken") or `true`,
/// never `false` for the lock it took; the master ran it once, and the
/// lock is the caller's. Then an unlock whose reply came late: an error or
/// `Success`, never `LockDoesNotExist` because a second run found the
/// first one's delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_late_lock_reply_is_never_answered_by_a_second_run() {
    let cluster = RedisCluster::start().await;
    let store = lock_store(&cluster).await;
    let master = master_of(&cluster, "{late-lock}").await;
    let elsewhere = key_elsewhere(&cluster, master).await;
    let busy = {
        let store = store.clone();
        traffic(move || {
            let (store, key) = (store.clone(), elsewhere.clone());
            async move {
                let _ = store.try_lock(lock(&key, "other")).await;
            }
        })
    };
    // The unlock script loaded on the master (a late `NOSCRIPT` would hide
    // a second run).
    assert_eq!(
        store.unlock(unlock(LOCK, "a")).await,
        Ok(UnlockStatus::LockDoesNotExist)
    );

    let resumed = pause(&cluster, master).await;
    let taken = store.try_lock(lock(LOCK, "a")).await;
    sleep(resumed.saturating_duration_since(Instant::now()) + Duration::from_millis(100)).await;
    eprintln!("try_lock with a late reply: {taken:?}");
    assert_ne!(taken, Ok(false), "the lock it took was answered refused");
    assert_eq!(calls(&cluster, master, "set").await, 1, "SET NX ran again");
    let holder = cluster.query(master, &["GET", LOCK_KEY]).await;
    assert_eq!(holder, Ok(vec!["a".to_string()]), "{taken:?}");
    // The owner's lock is held: refused to anyone, the owner included, and
    // released by the owner.
    assert_eq!(store.try_lock(lock(LOCK, "b")).await, Ok(false));

    let resumed = pause(&cluster, master).await;
    let released = store.unlock(unlock(LOCK, "a")).await;
    sleep(resumed.saturating_duration_since(Instant::now()) + Duration::from_millis(100)).await;
    eprintln!("unlock with a late reply: {released:?}");
    assert_ne!(
        released,
        Ok(UnlockStatus::LockDoesNotExist),
        "the unlock that deleted the lock was answered `does not exist`"
    );
    assert_eq!(
        scripts(&cluster, master).await,
        1,
        "the unlock script ran again"
    );
    assert_eq!(store.try_lock(lock(LOCK, "b")).await, Ok(true));
    busy.abort();
}

/// A write with an etag whose reply came late: an error or success, never
/// `EtagMismatch` for the write that applied (a second run would have found
/// the version the first one made); it applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_late_etag_write_reply_is_never_a_mismatch() {
    let cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    store
        .set(write("late-write", "v1", None))
        .await
        .expect("first write");
    let (_, etag) = read(store.as_ref(), "late-write").await.expect("written");
    let master = master_of(&cluster, "late-write").await;
    let elsewhere = key_elsewhere(&cluster, master).await;
    let busy = {
        let store = store.clone();
        traffic(move || {
            let (store, key) = (store.clone(), elsewhere.clone());
            async move {
                let _ = read(store.as_ref(), &key).await;
            }
        })
    };

    let resumed = pause(&cluster, master).await;
    let written = store.set(write("late-write", "v2", Some(&etag))).await;
    sleep(resumed.saturating_duration_since(Instant::now()) + Duration::from_millis(100)).await;
    eprintln!("etag write with a late reply: {written:?}");
    assert!(
        !matches!(written, Err(StateError::EtagMismatch(_))),
        "the write that applied was answered an etag mismatch: {written:?}"
    );
    assert_eq!(
        scripts(&cluster, master).await,
        1,
        "the etag write ran again"
    );
    let (value, now) = read(store.as_ref(), "late-write").await.expect("written");
    assert_eq!(value, "v2");
    assert_ne!(now, etag);
    // The new etag works, once.
    store
        .set(write("late-write", "v3", Some(&now)))
        .await
        .expect("write with the new etag");
    busy.abort();
}

/// A slot moved from one master to another under the components: while it
/// migrates, a key already moved (or new) is served by the importing master
/// (`ASK`, followed with `ASKING`), one not yet moved by the old one; once
/// the slot is the new master's, the stale slot map meets `MOVED`, is read
/// again, and every command goes on. Each write ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_redirections_of_a_migrating_slot_are_followed() {
    let cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    let locks = lock_store(&cluster).await;
    let (stay, moved, new) = ("{mig}stay", "{mig}moved", "{mig}new");
    for key in [stay, moved] {
        store
            .set(write(key, "before", None))
            .await
            .expect("write before");
    }

    // The migration starts; `moved` goes over, `stay` not yet.
    let Migration {
        slot,
        source,
        target,
        target_id,
    } = start_migration(&cluster, "{mig}").await;
    migrate(&cluster, source, target, moved).await;
    for port in [source, target] {
        cluster
            .query(port, &["CONFIG", "RESETSTAT"])
            .await
            .expect("CONFIG RESETSTAT");
    }

    // ASK for the moved key and the new one; the old master for the other.
    let (_, etag) = read(store.as_ref(), moved).await.expect("moved key read");
    store
        .set(write(moved, "during", Some(&etag)))
        .await
        .expect("etag write to the moved key");
    store
        .set(write(new, "during", None))
        .await
        .expect("write of a new key");
    let (_, etag) = read(store.as_ref(), stay).await.expect("staying key read");
    store
        .set(write(stay, "during", Some(&etag)))
        .await
        .expect("etag write to the staying key");
    assert_eq!(locks.try_lock(lock("{mig}lock", "a")).await, Ok(true));
    assert_eq!(locks.try_lock(lock("{mig}lock", "b")).await, Ok(false));
    assert_eq!(
        read(store.as_ref(), moved).await.map(|e| e.0).as_deref(),
        Some("during")
    );
    assert_eq!(
        read(store.as_ref(), new).await.map(|e| e.0).as_deref(),
        Some("during")
    );
    assert_eq!(
        read(store.as_ref(), stay).await.map(|e| e.0).as_deref(),
        Some("during")
    );
    // Writes to keys on the importing master ran there, once each.
    assert_eq!(scripts(&cluster, target).await, 2, "the moved and new keys");
    assert_eq!(calls(&cluster, target, "set").await, 2, "the two SET NX");
    assert_eq!(scripts(&cluster, source).await, 1, "the staying key");

    // The migration ends: the rest moves and the slot is the target's.
    migrate(&cluster, source, target, stay).await;
    for port in cluster.master_ports().await {
        setslot(&cluster, port, slot, "NODE", &target_id).await;
    }
    let (_, etag) = read(store.as_ref(), stay)
        .await
        .expect("read after the move");
    store
        .set(write(stay, "after", Some(&etag)))
        .await
        .expect("etag write after the move");
    assert_eq!(
        read(store.as_ref(), stay).await.map(|e| e.0).as_deref(),
        Some("after")
    );
    assert_eq!(
        locks.unlock(unlock("{mig}lock", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(master_of(&cluster, "{mig}").await, target);
}

/// The slot of a key, moving from the master at `source` to the one at
/// `target` (another master, with a replica): both told, nothing moved
/// yet.
pub(crate) struct Migration {
    pub(crate) slot: u16,
    pub(crate) source: u16,
    pub(crate) target: u16,
    /// The node id of `target`, to hand it the slot at the end.
    pub(crate) target_id: String,
}

/// Starts migrating the slot of `key` to another master.
pub(crate) async fn start_migration(cluster: &RedisCluster, key: &str) -> Migration {
    let slot = cluster.keyslot(key).await;
    let source = master_of(cluster, key).await;
    let roles = cluster.roles().await;
    let id_of = |port: u16| {
        roles
            .iter()
            .find(|role| role.port == port)
            .map(|role| role.id.clone())
            .expect("a node id")
    };
    let target = roles
        .iter()
        .find(|role| role.master_id.is_none() && role.port != source)
        .map(|role| role.port)
        .expect("another master");
    let target_id = id_of(target);
    setslot(cluster, target, slot, "IMPORTING", &id_of(source)).await;
    setslot(cluster, source, slot, "MIGRATING", &target_id).await;
    Migration {
        slot,
        source,
        target,
        target_id,
    }
}

/// An empty master joined to `cluster` (`CLUSTER MEET`), not serving any
/// slot: returns once every node (those of `cluster` and the nodes at
/// `joined`, joined before) knows it, it knows them all and every node
/// says `cluster_state:ok`; its id.
pub(crate) async fn join_empty_master(
    cluster: &RedisCluster,
    joined: &[u16],
) -> (ChildProcess, tempfile::TempDir, u16, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (process, port) = start_cluster_node(&dir, cluster).await;
    let id = cluster
        .query(port, &["CLUSTER", "MYID"])
        .await
        .expect("CLUSTER MYID")
        .concat();
    let mut known = cluster.running_ports();
    known.extend_from_slice(joined);
    let seed = known[0].to_string();
    cluster
        .query(port, &["CLUSTER", "MEET", "127.0.0.1", &seed])
        .await
        .expect("CLUSTER MEET");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut joined = true;
        for node in known.iter().copied().chain([port]) {
            let nodes = cluster
                .query(node, &["CLUSTER", "NODES"])
                .await
                .unwrap_or_default()
                .concat();
            let lines = nodes.lines().filter(|line| !line.contains("handshake"));
            let seen = lines.filter(|line| !line.contains("fail")).count();
            let info = cluster
                .query(node, &["CLUSTER", "INFO"])
                .await
                .unwrap_or_default()
                .concat();
            joined &=
                nodes.contains(&id) && seen == known.len() + 1 && info.contains("cluster_state:ok");
        }
        if joined {
            break;
        }
        assert!(Instant::now() < deadline, "node {port} did not join");
        if !process.is_running() {
            panic!("node {port} stopped: {}", process.log_tail());
        }
        sleep(Duration::from_millis(50)).await;
    }
    (process, dir, port, id)
}

/// A `redis-server --cluster-enabled yes` on a free port (whose bus port,
/// `+10000`, is free too), in `dir`.
async fn start_cluster_node(
    dir: &tempfile::TempDir,
    cluster: &RedisCluster,
) -> (ChildProcess, u16) {
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = loop {
            let port = testkit::free_port();
            let free_bus = port
                .checked_add(10000)
                .is_some_and(|bus| std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok());
            if free_bus {
                break port;
            }
        };
        let path = dir.path().to_path_buf();
        let mut process = ChildProcess::new("redis-server", path.join("redis.log"), move || {
            let mut command = Command::new("redis-server");
            command
                .args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args([
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT.as_millis().to_string(),
                ])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .arg("--dir")
                .arg(&path);
            command
        });
        let started = process
            .start(Duration::from_secs(10), || async move {
                cluster.query(port, &["PING"]).await.is_ok()
            })
            .await;
        match started {
            Ok(()) => return (process, port),
            Err(err) => last_error = err,
        }
    }
    panic!("the new cluster node did not start: {last_error}")
}

/// A slot migrating to a master that joined empty (not in the slot map the
/// components read): keys already moved, and new ones, are read and
/// written there through `ASK` — the components connect to the node named
/// themselves — while the others stay on the old master; each write ran
/// once. Once the slot is the new master's, `MOVED` brings the slot map up
/// to date and everything goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_slot_migrating_to_a_new_empty_master_is_followed_through_ask() {
    let cluster = RedisCluster::start().await;
    let store = state_store(&cluster).await;
    let locks = lock_store(&cluster).await;
    let (stay, moved, new) = ("{grow}stay", "{grow}moved", "{grow}new");
    let slot = cluster.keyslot("{grow}").await;
    let source = master_of(&cluster, "{grow}").await;
    let source_id = cluster
        .roles()
        .await
        .into_iter()
        .find(|role| role.port == source)
        .map(|role| role.id)
        .expect("the source's id");
    for key in [stay, moved] {
        store
            .set(write(key, "before", None))
            .await
            .expect("write before");
    }

    let (_process, _dir, target, target_id) = join_empty_master(&cluster, &[]).await;
    assert_eq!(master_of(&cluster, "{grow}").await, source);
    setslot(&cluster, target, slot, "IMPORTING", &source_id).await;
    setslot(&cluster, source, slot, "MIGRATING", &target_id).await;
    migrate(&cluster, source, target, moved).await;
    for port in [source, target] {
        cluster
            .query(port, &["CONFIG", "RESETSTAT"])
            .await
            .expect("CONFIG RESETSTAT");
    }

    let (_, etag) = read(store.as_ref(), moved).await.expect("moved key read");
    store
        .set(write(moved, "during", Some(&etag)))
        .await
        .expect("etag write to the moved key");
    store
        .set(write(new, "during", None))
        .await
        .expect("write of a new key");
    let (_, etag) = read(store.as_ref(), stay).await.expect("staying key read");
    store
        .set(write(stay, "during", Some(&etag)))
        .await
        .expect("etag write to the staying key");
    assert_eq!(locks.try_lock(lock("{grow}lock", "a")).await, Ok(true));
    assert_eq!(locks.try_lock(lock("{grow}lock", "b")).await, Ok(false));
    for key in [moved, new, stay] {
        assert_eq!(
            read(store.as_ref(), key).await.map(|e| e.0).as_deref(),
            Some("during"),
            "{key}"
        );
    }
    // The writes of keys on the new master ran there, once each (followed
    // by ASK, not retried against the source until the deadline).
    assert_eq!(scripts(&cluster, target).await, 2, "the moved and new keys");
    assert_eq!(calls(&cluster, target, "set").await, 2, "the two SET NX");
    assert_eq!(scripts(&cluster, source).await, 1, "the staying key");
    // The moved key, the new one and the lock are on the new master; the
    // staying key alone on the old.
    let slot_text = slot.to_string();
    for (port, count) in [(target, "3"), (source, "1")] {
        let keys = cluster
            .query(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot_text])
            .await;
        assert_eq!(keys, Ok(vec![count.to_string()]), "keys on {port}");
    }

    // The migration ends: the slot is the new master's.
    migrate(&cluster, source, target, stay).await;
    for port in cluster.master_ports().await {
        setslot(&cluster, port, slot, "NODE", &target_id).await;
    }
    let (_, etag) = read(store.as_ref(), stay)
        .await
        .expect("read after the move");
    store
        .set(write(stay, "after", Some(&etag)))
        .await
        .expect("etag write after the move");
    assert_eq!(
        read(store.as_ref(), stay).await.map(|e| e.0).as_deref(),
        Some("after")
    );
    assert_eq!(
        locks.unlock(unlock("{grow}lock", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(master_of(&cluster, "{grow}").await, target);
}

/// A bulk get over keys of two masters while one holds every command
/// past the timeouts (`CLIENT PAUSE`, as an unreachable master): the keys
/// of the other master are answered, each key of the held one carries its
/// error, and once the master answers again both are read. Before: the
/// whole bulk get failed with the held master's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_bulk_get_answers_the_keys_of_the_masters_that_answer() {
    let cluster = RedisCluster::start().await;
    let mut short = metadata(&cluster);
    // Every command is cut within 1 s: well inside the pause below.
    short["dialTimeout"] = json!("500ms");
    let store = match common::start("state", "redis", short).await {
        Ok(Instance::State(store)) => store,
        other => panic!("expected a state store, got {other:?}"),
    };
    let held_key = "{bulk-held}";
    let held = master_of(&cluster, held_key).await;
    let answering_key = key_elsewhere(&cluster, held).await;
    for (key, value) in [(held_key, "held"), (answering_key.as_str(), "there")] {
        store
            .set(write(key, value, None))
            .await
            .unwrap_or_else(|e| panic!("set {key}: {e}"));
    }
    let keys = vec![held_key.to_string(), answering_key.clone()];
    let data = |item: &rewire_runtime::BulkGetItem| {
        item.entry
            .as_ref()
            .map(|entry| String::from_utf8_lossy(&entry.data).into_owned())
    };

    let millis = Duration::from_millis(2500).as_millis().to_string();
    cluster
        .query(held, &["CLIENT", "PAUSE", &millis, "ALL"])
        .await
        .expect("CLIENT PAUSE");
    let resumed = Instant::now() + Duration::from_millis(2500);
    let items = store.bulk_get(keys.clone()).await.expect("a bulk get");
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].key, held_key);
    assert!(
        items[0].error.is_some() && items[0].entry.is_none(),
        "{items:?}"
    );
    assert_eq!(items[1].key, answering_key);
    assert_eq!(items[1].error, None, "{items:?}");
    assert_eq!(data(&items[1]).as_deref(), Some("there"));

    sleep(resumed.saturating_duration_since(Instant::now()) + Duration::from_millis(100)).await;
    let items = store.bulk_get(keys).await.expect("a bulk get");
    assert!(items.iter().all(|item| item.error.is_none()), "{items:?}");
    assert_eq!(data(&items[0]).as_deref(), Some("held"));
    assert_eq!(data(&items[1]).as_deref(), Some("there"));
}
