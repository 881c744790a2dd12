//! The `redis` lock against a real `redis-server`, built through the
//! registry: contention, expiry, and unlock by owner only; Dapr's keys;
//! staged changes of server or key prefix that keep held locks reachable.

use crate::common;
use crate::support::logs;
use testkit::redis as redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire_runtime::{
    Handover, InPlace, Increment, Instance, Lock, LockError, NextIdRequest, SetRequest,
    StagedInPlace, TryLockRequest, UnlockRequest, UnlockStatus,
};
use serde_json::{json, Value};

async fn lock_store(metadata: Value) -> Arc<dyn Lock> {
    match common::start("lock", "redis", metadata).await {
        Ok(Instance::Lock(lock)) => lock,
        Ok(other) => panic!("expected a lock, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn lock(resource: &str, owner: &str, expiry: Duration) -> TryLockRequest {
    TryLockRequest {
        resource_id: resource.into(),
        lock_owner: owner.into(),
        expiry,
    }
}

fn unlock(resource: &str, owner: &str) -> UnlockRequest {
    UnlockRequest {
        resource_id: resource.into(),
        lock_owner: owner.into(),
    }
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn contention_and_owner_only_unlock() {
    let server = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": server.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(false));
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(false));
    assert_eq!(
        store.unlock(unlock("r", "b")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::LockDoesNotExist)
    );
    assert_eq!(
        store.unlock(unlock("never", "a")).await,
        Ok(UnlockStatus::LockDoesNotExist)
    );
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(true));
}

#[tokio::test]
async fn a_lock_expires_after_its_expiry() {
    let server = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": server.addr()})).await;
    assert_eq!(
        store
            .try_lock(lock("r", "a", Duration::from_millis(200)))
            .await,
        Ok(true)
    );
    let mut raw = server.connection().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock||test||r")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!((1..=200).contains(&pttl), "PTTL {pttl}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.try_lock(lock("r", "b", MINUTE)).await != Ok(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );
}

#[tokio::test]
async fn malformed_requests_are_invalid() {
    let server = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": server.addr()})).await;
    for req in [
        lock("", "a", MINUTE),
        lock("r", "", MINUTE),
        lock("r", "a", Duration::ZERO),
    ] {
        assert!(
            matches!(
                store.try_lock(req.clone()).await,
                Err(LockError::Invalid(_))
            ),
            "{req:?}"
        );
    }
    assert!(matches!(
        store.unlock(unlock("r", "")).await,
        Err(LockError::Invalid(_))
    ));
}

/// The owner written at `key`, read straight from the server.
async fn owner_at(server: &RedisServer, key: &str) -> Option<String> {
    let mut raw = server.connection().await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_follow_dapr_key_prefix_strategies_and_ttl_in_seconds_is_refused() {
    let server = RedisServer::start().await;
    // The test context's app id is `test` and the store is `lock/x`.
    for (key_prefix, key) in [
        (None, "lock||test||r"),
        (Some("appid"), "lock||test||r"),
        (Some("name"), "lock||x||r"),
        (Some("none"), "lock||r"),
        (Some("Locks:"), "lock||locks:||r"),
    ] {
        let mut metadata = json!({"redisHost": server.addr()});
        if let Some(prefix) = key_prefix {
            metadata["keyPrefix"] = json!(prefix);
        }
        let store = match common::start_named("lock", "x", "redis", metadata).await {
            Ok(Instance::Lock(lock)) => lock,
            other => panic!("expected a lock, got {other:?}"),
        };
        assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
        assert_eq!(owner_at(&server, key).await.as_deref(), Some("a"), "{key}");
        assert_eq!(
            store.unlock(unlock("r", "a")).await,
            Ok(UnlockStatus::Success)
        );
    }

    for bad in [
        json!({"redisHost": server.addr(), "ttlInSeconds": 5}),
        json!({"redisHost": server.addr(), "keyPrefix": "a||b"}),
    ] {
        let err = common::start("lock", "redis", bad.clone())
            .await
            .map(|_| ())
            .expect_err("should be refused");
        let field = if bad.get("ttlInSeconds").is_some() {
            "ttlInSeconds"
        } else {
            "keyPrefix"
        };
        assert!(err.contains(field), "{err}");
    }
}

/// One redis-server for the state store, the lock and the sequencer, as
/// Dapr's quickstart lays them out: a state write of a key that is also a
/// held lock's resource leaves the lock alone, and no lock request can
/// reach a sequencer's counter.
#[tokio::test]
async fn locks_share_no_key_with_state_or_sequencer() {
    let server = RedisServer::start().await;
    let addr = json!({"redisHost": server.addr()});
    let locks = lock_store(addr.clone()).await;
    let state = match common::start("state", "redis", addr.clone()).await {
        Ok(Instance::State(store)) => store,
        other => panic!("expected a state store, got {other:?}"),
    };
    let sequencer = match common::start("sequencer", "redis", addr).await {
        Ok(Instance::Sequencer(sequencer)) => sequencer,
        other => panic!("expected a sequencer, got {other:?}"),
    };

    assert_eq!(
        locks.try_lock(lock("order-42", "alice", MINUTE)).await,
        Ok(true)
    );
    state
        .set(SetRequest {
            key: "order-42".into(),
            value: b"{}".to_vec(),
            ..SetRequest::default()
        })
        .await
        .expect("state save");
    assert_eq!(
        locks.try_lock(lock("order-42", "bob", MINUTE)).await,
        Ok(false),
        "the state save must not free the lock"
    );
    assert_eq!(
        locks.unlock(unlock("order-42", "alice")).await,
        Ok(UnlockStatus::Success)
    );

    let next = |key: &str| NextIdRequest {
        key: key.into(),
        increment: Increment::Strong,
        ..NextIdRequest::default()
    };
    assert_eq!(sequencer.get_next_id(next("x")).await, Ok(1));
    // The counter `sequencer|||x` holds "1": an owner of "1" would match it.
    assert!(matches!(
        locks.unlock(unlock("sequencer|||x", "1")).await,
        Err(LockError::Invalid(message)) if message.contains("||")
    ));
    assert!(matches!(
        locks
            .keep_alive(lock("sequencer|||x", "1", Duration::from_millis(1)))
            .await,
        Err(LockError::Invalid(_))
    ));
    assert!(matches!(
        locks.try_lock(lock("sequencer|||x", "1", MINUTE)).await,
        Err(LockError::Invalid(_))
    ));
    assert_eq!(sequencer.get_next_id(next("x")).await, Ok(2));
}

/// A change of server is staged: made and verified while the reload
/// prepares, in force only when applied (dropped, it changes nothing).
/// After it, for the grace, the locks held on the old server still count:
/// a try-lock of one is refused, its owner's unlock or keep-alive reaches
/// it (a keep-alive moves it to the new server), another's does not.
#[tokio::test]
async fn a_server_change_is_staged_and_locks_held_before_still_count() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    assert_eq!(store.try_lock(lock("s", "a", MINUTE)).await, Ok(true));
    let in_place = store.as_in_place().expect("in place");
    let to_second = common::metadata(json!({"redisHost": second.addr()}));

    let staged = in_place.stage_in_place(&to_second).await;
    let Ok(StagedInPlace::Deferred(pending)) = staged else {
        panic!("expected a deferred change, got {staged:?}");
    };
    // Not in force yet: the first server still serves.
    assert_eq!(store.try_lock(lock("t", "a", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&first, "lock||test||t").await.as_deref(),
        Some("a")
    );
    drop(pending);
    assert_eq!(store.try_lock(lock("u", "a", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&first, "lock||test||u").await.as_deref(),
        Some("a")
    );

    let Ok(StagedInPlace::Deferred(pending)) = in_place.stage_in_place(&to_second).await else {
        panic!("expected a deferred change");
    };
    pending.apply();
    // Held on the first server: nobody else takes it on the second.
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(false));
    assert_eq!(
        store.unlock(unlock("r", "b")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("b")
    );
    // A keep-alive moves the lock to the second server.
    assert_eq!(
        store.keep_alive(lock("s", "a", MINUTE)).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||s").await, None);
    assert_eq!(
        owner_at(&second, "lock||test||s").await.as_deref(),
        Some("a")
    );
    assert_eq!(
        store.keep_alive(lock("never", "a", MINUTE)).await,
        Ok(UnlockStatus::LockDoesNotExist)
    );
}

/// A `keyPrefix` change on the same server is a change of namespace too:
/// the owner still releases the lock taken under the old keys.
#[tokio::test]
async fn a_key_prefix_change_keeps_held_locks_reachable() {
    let server = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": server.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    let applied = store
        .as_in_place()
        .expect("in place")
        .update_in_place(&common::metadata(
            json!({"redisHost": server.addr(), "keyPrefix": "none"}),
        ))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(applied, Ok(InPlace::Applied));
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(false));
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(true));
    assert_eq!(owner_at(&server, "lock||r").await.as_deref(), Some("b"));
}

/// After a change of server the old one dies: the first look-up in the
/// previous namespace that finds the old server gone ends its grace (once),
/// so try-lock, unlock and keep-alive go on answering from the new server
/// instead of each waiting out (and failing on) the dead one.
#[tokio::test]
async fn a_dead_previous_server_does_not_slow_requests_down() {
    logs::capture();
    let mut first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    let applied = store
        .as_in_place()
        .expect("in place")
        .update_in_place(&common::metadata(json!({"redisHost": second.addr()})))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(applied, Ok(InPlace::Applied));
    first.stop();
    let requests = async {
        for round in 0..5 {
            let resource = format!("other-{round}");
            assert_eq!(store.try_lock(lock(&resource, "b", MINUTE)).await, Ok(true));
            assert_eq!(
                store.unlock(unlock("never-taken", "b")).await,
                Ok(UnlockStatus::LockDoesNotExist)
            );
            assert_eq!(
                store.keep_alive(lock("never-taken", "b", MINUTE)).await,
                Ok(UnlockStatus::LockDoesNotExist)
            );
        }
    };
    // A guard against a hang only: what is proven is below.
    tokio::time::timeout(Duration::from_secs(60), requests)
        .await
        .expect("the requests returned");
    assert_eq!(
        owner_at(&second, "lock||test||other-0").await.as_deref(),
        Some("b")
    );
    // The grace ended at the first look-up that found the server gone, and
    // once: no later request consulted it (nor waited on it and failed).
    let about_first = |text: &str| {
        logs::lines()
            .iter()
            .filter(|line| line.contains(text) && line.contains(&first.addr()))
            .count()
    };
    assert_eq!(
        about_first("its locks are no longer consulted"),
        1,
        "{:#?}",
        logs::lines()
    );
    assert_eq!(about_first("could not be read"), 0, "{:#?}", logs::lines());
}

/// After a change of server the old one stalls (stopped, as by a long
/// save) past the look-up limit while still up: its locks still count.
/// A try-lock of one by another owner is refused or fails (to retry),
/// never granted, and once the old server answers again the lock is still
/// honoured there.
#[tokio::test]
async fn a_stalled_previous_server_still_holds_its_locks() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    let applied = store
        .as_in_place()
        .expect("in place")
        .update_in_place(&common::metadata(json!({"redisHost": second.addr()})))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(applied, Ok(InPlace::Applied));
    let info = first.query(&["INFO", "server"]).await.expect("info");
    let pid = info
        .iter()
        .flat_map(|text| text.lines())
        .find_map(|line| line.strip_prefix("process_id:"))
        .expect("process_id")
        .trim()
        .to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {name} {pid}");
    };
    signal("-STOP");
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(store.try_lock(lock("r", "b", MINUTE)).await);
    }
    signal("-CONT");
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(false) | Err(LockError::Backend(_)))),
        "{outcomes:?}"
    );
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(false));
    assert_eq!(
        store.unlock(unlock("r", "a")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(store.try_lock(lock("r", "b", MINUTE)).await, Ok(true));
}

/// Stages and commits `metadata` on `store`.
async fn change(store: &Arc<dyn Lock>, metadata: Value) {
    let in_place = store.as_in_place().expect("in place");
    let staged = in_place.stage_in_place(&common::metadata(metadata)).await;
    let Ok(StagedInPlace::Deferred(pending)) = staged else {
        panic!("expected a deferred change, got {staged:?}");
    };
    pending.apply();
}

/// Two sidecars serve one app on one server: A holds `r` through the
/// first, the second (which never granted anything) is refused it, then
/// moves to another server. The lock A still holds on the old server is
/// not granted on the new one, whatever the second store granted itself;
/// once A's lock expires there, it is.
#[tokio::test]
async fn a_lock_held_through_another_sidecar_is_not_taken_after_a_server_change() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let a = lock_store(json!({"redisHost": first.addr()})).await;
    let b = lock_store(json!({"redisHost": first.addr()})).await;
    let held_for = Duration::from_millis(1500);
    assert_eq!(a.try_lock(lock("r", "A", held_for)).await, Ok(true));
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(false));

    change(&b, json!({"redisHost": second.addr()})).await;
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&second, "lock||test||r").await, None);
    assert_eq!(
        b.unlock(unlock("r", "B")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );

    tokio::time::sleep(held_for + Duration::from_millis(200)).await;
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("B")
    );
}

/// The same with a `keyPrefix` change, on a store that granted only short
/// locks itself (whose expiry is long past when the resource is asked
/// for): A's lock, held through another sidecar for longer, still counts
/// until A releases it.
#[tokio::test]
async fn a_key_prefix_change_honours_locks_longer_than_any_this_store_granted() {
    let server = RedisServer::start().await;
    let a = lock_store(json!({"redisHost": server.addr()})).await;
    let b = lock_store(json!({"redisHost": server.addr()})).await;
    assert_eq!(a.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    assert_eq!(
        b.try_lock(lock("s", "B", Duration::from_millis(100))).await,
        Ok(true)
    );
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(false));

    change(&b, json!({"redisHost": server.addr(), "keyPrefix": "none"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&server, "lock||r").await, None);

    assert_eq!(a.unlock(unlock("r", "A")).await, Ok(UnlockStatus::Success));
    assert_eq!(b.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
    assert_eq!(owner_at(&server, "lock||r").await.as_deref(), Some("B"));
}

/// The lock store `lock/<name>` of the runtime whose handover area is
/// `runtime`, on `server`.
async fn lock_in(runtime: &Handover, name: &str, server: &RedisServer) -> Arc<dyn Lock> {
    let metadata = json!({"redisHost": server.addr()});
    match common::start_in(runtime, "lock", name, "redis", metadata).await {
        Ok(Instance::Lock(lock)) => lock,
        other => panic!("expected a lock, got {other:?}"),
    }
}

/// A change that rebuilds the store (here: a new instance of the same
/// component in the same runtime on another server, built while the old
/// one still serves, as a reload does) honours the locks held on the old
/// server as an in-place change does, also once the old instance is
/// closed; its owner still releases them through the new instance.
#[tokio::test]
async fn a_rebuilt_store_honours_locks_held_on_the_old_namespace() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let runtime = Handover::new();
    let old = lock_in(&runtime, "rebuilt", &first).await;
    assert_eq!(old.try_lock(lock("r", "A", MINUTE)).await, Ok(true));

    let new = lock_in(&runtime, "rebuilt", &second).await;
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    old.close().await.expect("close");
    drop(old);
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&second, "lock||test||r").await, None);

    assert_eq!(
        new.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("B")
    );
}

/// Two runtimes of the same app in one process (tests do this), each with
/// a lock store of the same name on a Redis of its own: neither consults
/// the other's server, at start or when rebuilt (a rebuild consults its
/// own predecessor only). A process-wide registry keyed by app id, folder
/// and component name made the second runtime refuse the first's locks
/// (and fail its requests when the first's server misbehaved).
#[tokio::test]
async fn another_runtime_of_the_same_app_and_lock_name_is_never_consulted() {
    let a_server = RedisServer::start().await;
    let b_server = RedisServer::start().await;
    let b_recovery = RedisServer::start().await;
    let (a, b) = (Handover::new(), Handover::new());
    assert_ne!(a.runtime(), b.runtime());

    let a_lock = lock_in(&a, "shared", &a_server).await;
    assert_eq!(a_lock.try_lock(lock("a-held", "A", MINUTE)).await, Ok(true));

    let b_lock = lock_in(&b, "shared", &b_server).await;
    assert_eq!(
        b_lock.try_lock(lock("a-held", "B", MINUTE)).await,
        Ok(true),
        "runtime B consulted runtime A's lock server"
    );
    assert_eq!(
        b_lock.unlock(unlock("a-held", "B")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(b_lock.try_lock(lock("b-held", "B", MINUTE)).await, Ok(true));

    // B rebuilt onto its recovery server: its own old server still counts,
    // A's never does.
    let b_rebuilt = lock_in(&b, "shared", &b_recovery).await;
    assert_eq!(
        b_rebuilt.try_lock(lock("b-held", "X", MINUTE)).await,
        Ok(false),
        "the rebuilt store did not consult its predecessor's server"
    );
    assert_eq!(
        b_rebuilt.try_lock(lock("a-held", "X", MINUTE)).await,
        Ok(true),
        "the rebuilt store of runtime B consulted runtime A's lock server"
    );
    assert_eq!(
        owner_at(&b_recovery, "lock||test||a-held").await.as_deref(),
        Some("X")
    );
    assert_eq!(
        owner_at(&a_server, "lock||test||a-held").await.as_deref(),
        Some("A")
    );
}

/// A log sink that takes `PAUSE` over the "Lock namespace changed" line
/// (a slow sink: a file on a stalled disk, a full pipe), counting them.
struct SlowNamespaceLog(Arc<std::sync::atomic::AtomicUsize>);

impl SlowNamespaceLog {
    const PAUSE: Duration = Duration::from_millis(300);
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for SlowNamespaceLog {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains("Lock namespace changed") {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Self::PAUSE);
        }
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

/// While a `keyPrefix` change commits (its log line held up by a slow
/// sink), try-locks of a resource another sidecar holds on the old
/// namespace never succeed, and the owner of a lock on the old namespace
/// keeps it alive throughout. Before: the new session was put in force
/// before the old namespace's grace was stored (after the log line), and a
/// request in between saw the new namespace and no grace: `SET NX` there
/// took the held resource, and the keep-alive answered that the lock did
/// not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_held_on_the_old_namespace_is_taken_while_a_change_commits() {
    let server = RedisServer::start().await;
    let a = lock_store(json!({"redisHost": server.addr()})).await;
    let b = lock_store(json!({"redisHost": server.addr()})).await;
    assert_eq!(a.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    assert_eq!(b.try_lock(lock("s", "S", MINUTE)).await, Ok(true));

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let contenders: Vec<_> = (0..4)
        .map(|i| {
            let (b, stop) = (b.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match b.try_lock(lock("r", &format!("B{i}"), MINUTE)).await {
                        Ok(false) => {}
                        other => answers.push(format!("try-lock: {other:?}")),
                    }
                    // One renewer: the owner's keep-alives come one at a time.
                    if i == 0 {
                        match b.keep_alive(lock("s", "S", MINUTE)).await {
                            Ok(UnlockStatus::Success) => {}
                            other => answers.push(format!("keep-alive: {other:?}")),
                        }
                    }
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let logged = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        // The commit runs on this thread, which alone logs to the slow sink.
        let _slow = tracing::subscriber::set_default(SlowNamespaceLog(logged.clone()));
        change(&b, json!({"redisHost": server.addr(), "keyPrefix": "none"})).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut wrong = std::collections::BTreeMap::<String, usize>::new();
    for contender in contenders {
        for answer in contender.await.expect("a contender's task") {
            *wrong.entry(answer).or_default() += 1;
        }
    }
    assert_eq!(logged.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        wrong.is_empty(),
        "answers (and how many) while the change committed: {wrong:?}"
    );
    assert_eq!(owner_at(&server, "lock||r").await, None);
    assert_eq!(owner_at(&server, "lock||s").await.as_deref(), Some("S"));
}

/// Holds up every command `server` gets for `pause` (`CLIENT PAUSE …
/// ALL`): a look-up there answers late, yet within the 500 ms a look-up in
/// a previous namespace may take (the slack left absorbs a loaded machine).
async fn hold_up(server: &RedisServer, pause: Duration) {
    let millis = pause.as_millis().to_string();
    server
        .query(&["CLIENT", "PAUSE", &millis, "ALL"])
        .await
        .expect("CLIENT PAUSE");
}

/// Two changes in a row (first → second → third server). Try-locks that
/// read the second server before the last change committed wait on their
/// look-up in the first (held up); meanwhile the change commits and
/// another try-lock, on the third server, finds `r` free on the second and
/// takes it on the third. When the late ones go on, taking `r` and `q` on
/// the second server, they see the change: `r` held on the third is not
/// granted (their copy on the second released), `q` free there is taken
/// on the third. Before: `r` was granted to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_that_read_the_namespace_before_a_change_committed_is_not_granted_twice() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    change(&store, json!({"redisHost": second.addr()})).await;
    let staged = store
        .as_in_place()
        .expect("in place")
        .stage_in_place(&common::metadata(json!({"redisHost": third.addr()})))
        .await;
    let Ok(StagedInPlace::Deferred(to_third)) = staged else {
        panic!("expected a deferred change, got {staged:?}");
    };

    hold_up(&first, Duration::from_millis(350)).await;
    let late = |resource: &'static str| {
        let store = store.clone();
        tokio::spawn(async move { store.try_lock(lock(resource, "late", MINUTE)).await })
    };
    let (late_r, late_q) = (late("r"), late("q"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    to_third.apply();
    assert_eq!(store.try_lock(lock("r", "new", MINUTE)).await, Ok(true));

    assert_eq!(late_r.await.expect("the late try-lock of r"), Ok(false));
    assert_eq!(late_q.await.expect("the late try-lock of q"), Ok(true));
    assert_eq!(owner_at(&second, "lock||test||r").await, None);
    assert_eq!(
        owner_at(&third, "lock||test||r").await.as_deref(),
        Some("new")
    );
    assert_eq!(owner_at(&second, "lock||test||q").await, None);
    assert_eq!(
        owner_at(&third, "lock||test||q").await.as_deref(),
        Some("late")
    );
    assert_eq!(
        store.unlock(unlock("q", "late")).await,
        Ok(UnlockStatus::Success)
    );
}

/// After a change of server, two keep-alives at once by the owner of a
/// lock held on the old server both find it there (held up together) and
/// both move it over: both succeed, and the lock ends on the new server
/// alone. Before: the second found the first's copy on the new server and
/// answered `LockBelongsToOthers` (a little later, it found the lock in
/// neither: `LockDoesNotExist`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keep_alives_at_once_both_find_a_lock_being_moved() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(store.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    change(&store, json!({"redisHost": second.addr()})).await;

    hold_up(&first, Duration::from_millis(250)).await;
    let renew = || {
        let store = store.clone();
        tokio::spawn(async move { store.keep_alive(lock("r", "A", MINUTE)).await })
    };
    let (one, two) = (renew(), renew());
    assert_eq!(one.await.expect("a keep-alive"), Ok(UnlockStatus::Success));
    assert_eq!(two.await.expect("a keep-alive"), Ok(UnlockStatus::Success));
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("A")
    );
    assert_eq!(store.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
}

/// Holds up the retired instance's try-lock of `r` (its look-up in the
/// namespace it was changed from waits on a server held up) while its
/// rebuilt successor, on another server, takes `r`: the late try-lock,
/// granted on the old server, follows to the successor's namespace, finds
/// `r` held there and is not granted. Before: it compared only against its
/// own store's namespace, unchanged, and both were granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_store_still_serving_does_not_grant_what_its_successor_did() {
    let before = RedisServer::start().await;
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let runtime = Handover::new();
    let old = lock_in(&runtime, "retired", &before).await;
    change(&old, json!({"redisHost": first.addr()})).await;
    let new = lock_in(&runtime, "retired", &second).await;

    hold_up(&before, Duration::from_millis(400)).await;
    let late = {
        let old = old.clone();
        tokio::spawn(async move { old.try_lock(lock("r", "A", MINUTE)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
    assert_eq!(late.await.expect("the late try-lock"), Ok(false));
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("B")
    );
}

/// The lock store `lock/<name>` of app `app` in the runtime whose
/// handover area is `runtime`, on `server`.
async fn lock_of_app(
    runtime: &Handover,
    app: &str,
    name: &str,
    server: &RedisServer,
) -> Arc<dyn Lock> {
    let value = json!({"redisHost": server.addr()});
    let mut cx = common::named_context("lock", name, &common::metadata(value.clone()));
    cx.app_id = app.into();
    cx.handover = runtime.clone();
    let mut built = common::build("lock", "redis", value).expect("built");
    built.init(&cx).await.expect("init");
    match built.into_instance() {
        Instance::Lock(lock) => lock,
        other => panic!("expected a lock, got {other:?}"),
    }
}

/// A rebuild for a new app id, with the default `keyPrefix` (the app id):
/// same server, yet the keys move from `lock||a||` to `lock||b||`. A lock
/// held under the old app id is not granted to another owner, and its
/// owner still releases it through the new instance. Before: the rebuilt
/// store built both key bases from its own app id, saw one namespace, and
/// granted it.
#[tokio::test]
async fn a_rebuild_for_a_new_app_id_honours_locks_held_under_the_old_one() {
    let server = RedisServer::start().await;
    let runtime = Handover::new();
    let old = lock_of_app(&runtime, "a", "by-app", &server).await;
    assert_eq!(old.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    assert_eq!(owner_at(&server, "lock||a||r").await.as_deref(), Some("A"));

    let new = lock_of_app(&runtime, "b", "by-app", &server).await;
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&server, "lock||b||r").await, None);
    assert_eq!(
        new.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&server, "lock||a||r").await, None);
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
    assert_eq!(owner_at(&server, "lock||b||r").await.as_deref(), Some("B"));
}

/// A rebuild (to a third server) within the grace of an in-place change
/// (first → second): a lock another sidecar holds on the first server is
/// still not granted by the rebuilt store, and its owner still releases
/// it through it. Before: the rebuilt store consulted only the second
/// server, where its predecessor was, and granted the lock.
#[tokio::test]
async fn a_rebuild_within_the_grace_of_an_in_place_change_honours_both_namespaces() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let other_sidecar = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(
        other_sidecar.try_lock(lock("r", "A", MINUTE)).await,
        Ok(true)
    );

    let runtime = Handover::new();
    let old = lock_in(&runtime, "moved-twice", &first).await;
    change(&old, json!({"redisHost": second.addr()})).await;
    let new = lock_in(&runtime, "moved-twice", &third).await;
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&third, "lock||test||r").await, None);
    assert_eq!(
        new.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
}

/// Two changes (first → second → third server) while a try-lock that
/// read the first waits on its look-up in the one before (held up):
/// between them another try-lock takes `r` on the second. The late one,
/// granted on the first, follows to the third, where `r` is free, but
/// looks in the second first: held there, it is not granted. Before: it
/// took `r` on the third with a bare `SET NX`, and both were granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_following_two_changes_honours_the_namespace_between() {
    let before = RedisServer::start().await;
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": before.addr()})).await;
    change(&store, json!({"redisHost": first.addr()})).await;
    let in_place = store.as_in_place().expect("in place");
    let mut staged = Vec::new();
    for server in [&second, &third] {
        let metadata = common::metadata(json!({"redisHost": server.addr()}));
        match in_place.stage_in_place(&metadata).await {
            Ok(StagedInPlace::Deferred(pending)) => staged.push(pending),
            other => panic!("expected a deferred change, got {other:?}"),
        }
    }
    let (to_second, to_third) = (staged.remove(0), staged.remove(0));

    hold_up(&before, Duration::from_millis(400)).await;
    let late = {
        let store = store.clone();
        tokio::spawn(async move { store.try_lock(lock("r", "late", MINUTE)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    to_second.apply();
    assert_eq!(store.try_lock(lock("r", "between", MINUTE)).await, Ok(true));
    to_third.apply();

    assert_eq!(late.await.expect("the late try-lock"), Ok(false));
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(owner_at(&third, "lock||test||r").await, None);
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("between")
    );
    assert_eq!(
        store.unlock(unlock("r", "between")).await,
        Ok(UnlockStatus::Success)
    );
}

/// A reload builds a successor on another server and rolls back before
/// it served anything (it waited for readiness, then closed): meanwhile
/// the old instance's try-locks stay on the old server, where another
/// sidecar on it sees them, and nothing is left on the successor's.
/// Before: registered as successor at init, it drew every try-lock the
/// old instance granted to its server (the copy on the old one released),
/// unseen by the other sidecar, and honoured there for 60 s only after
/// the rollback.
#[tokio::test]
async fn a_successor_that_never_served_leaves_the_locks_on_the_old_server() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let runtime = Handover::new();
    let old = lock_in(&runtime, "unserved", &first).await;
    let new = lock_in(&runtime, "unserved", &second).await;
    assert_eq!(old.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&first, "lock||test||r").await.as_deref(),
        Some("A")
    );
    assert_eq!(owner_at(&second, "lock||test||r").await, None);
    let other_sidecar = lock_in(&Handover::new(), "unserved", &first).await;
    assert_eq!(
        other_sidecar.try_lock(lock("r", "B", MINUTE)).await,
        Ok(false)
    );

    new.close().await.expect("close");
    drop(new);
    assert_eq!(old.try_lock(lock("r", "C", MINUTE)).await, Ok(false));
    assert_eq!(
        old.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
}

/// A successor on another server serves, then is closed while the old
/// instance still serves requests: a lock the old instance's try-lock
/// followed to the successor's server is still honoured there, and its
/// owner still releases it. Without the hand-back it was taken again on
/// the old server.
#[tokio::test]
async fn a_closed_successor_leaves_the_locks_moved_to_it_honoured() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let runtime = Handover::new();
    let old = lock_in(&runtime, "closed-first", &first).await;
    let new = lock_in(&runtime, "closed-first", &second).await;
    assert_eq!(new.try_lock(lock("n", "N", MINUTE)).await, Ok(true));
    assert_eq!(old.try_lock(lock("r", "A", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&second, "lock||test||r").await.as_deref(),
        Some("A")
    );

    new.close().await.expect("close");
    drop(new);
    assert_eq!(old.try_lock(lock("r", "C", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(
        old.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(old.try_lock(lock("r", "C", MINUTE)).await, Ok(true));
    assert_eq!(
        owner_at(&first, "lock||test||r").await.as_deref(),
        Some("C")
    );
}

/// The old instance moved in place from `before` to `first` (still in
/// that change's grace) when a successor on `second` serves and is closed:
/// the handed-back namespace is consulted along with `before`, where
/// another sidecar holds `p`. Before: the hand-back replaced the grace of
/// `before`, and `p` was granted on `first`.
#[tokio::test]
async fn a_closed_successor_keeps_the_grace_its_predecessor_was_in() {
    let before = RedisServer::start().await;
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let runtime = Handover::new();
    let other_sidecar = lock_in(&Handover::new(), "kept", &before).await;
    assert_eq!(
        other_sidecar.try_lock(lock("p", "P", MINUTE)).await,
        Ok(true)
    );
    let old = lock_in(&runtime, "kept", &before).await;
    change(&old, json!({"redisHost": first.addr()})).await;
    let new = lock_in(&runtime, "kept", &second).await;
    assert_eq!(new.try_lock(lock("n", "N", MINUTE)).await, Ok(true));
    assert_eq!(old.try_lock(lock("r", "A", MINUTE)).await, Ok(true));

    new.close().await.expect("close");
    drop(new);
    assert_eq!(old.try_lock(lock("p", "X", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&first, "lock||test||p").await, None);
    assert_eq!(old.try_lock(lock("r", "X", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(
        old.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(
        owner_at(&before, "lock||test||p").await.as_deref(),
        Some("P")
    );
}

/// Two in-place changes within the grace (first → second → third server)
/// while another sidecar holds `r` on the first: the first is still
/// consulted after the second change, so `r` is not granted on the third,
/// and its owner still releases it through this store. Before: the second
/// change kept only the second server, `r` was granted on the third, and
/// the owner's unlock answered `LockDoesNotExist`.
#[tokio::test]
async fn two_quick_changes_still_honour_a_lock_held_two_namespaces_back() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let other_sidecar = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(
        other_sidecar.try_lock(lock("r", "A", MINUTE)).await,
        Ok(true)
    );
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    change(&store, json!({"redisHost": second.addr()})).await;
    change(&store, json!({"redisHost": third.addr()})).await;

    assert_eq!(store.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&third, "lock||test||r").await, None);
    assert_eq!(
        store.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
    assert_eq!(owner_at(&first, "lock||test||r").await, None);
    assert_eq!(store.try_lock(lock("r", "B", MINUTE)).await, Ok(true));
}

/// Three quick changes that come back to the namespace one step earlier
/// (first → second → third → second): a lock another sidecar holds on the
/// first is still honoured. Before: going back dropped every older grace,
/// and the lock was granted on the second to a second owner.
#[tokio::test]
async fn going_back_one_namespace_still_honours_a_lock_two_back() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let other_sidecar = lock_store(json!({"redisHost": first.addr()})).await;
    assert_eq!(
        other_sidecar.try_lock(lock("r", "A", MINUTE)).await,
        Ok(true)
    );
    let store = lock_store(json!({"redisHost": first.addr()})).await;
    change(&store, json!({"redisHost": second.addr()})).await;
    change(&store, json!({"redisHost": third.addr()})).await;
    change(&store, json!({"redisHost": second.addr()})).await;

    assert_eq!(store.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&second, "lock||test||r").await, None);
    assert_eq!(
        store.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
}

/// A rebuilt store (second server) in the grace it adopted of its
/// predecessor's namespace (first server), then changed in place to a
/// third: a lock another sidecar holds on the first is still not granted.
/// Before: the in-place change replaced the adopted grace with the second
/// server alone.
#[tokio::test]
async fn an_in_place_change_of_a_rebuilt_store_keeps_the_grace_it_adopted() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let third = RedisServer::start().await;
    let other_sidecar = lock_in(&Handover::new(), "adopted", &first).await;
    assert_eq!(
        other_sidecar.try_lock(lock("r", "A", MINUTE)).await,
        Ok(true)
    );
    let runtime = Handover::new();
    let _old = lock_in(&runtime, "adopted", &first).await;
    let new = lock_in(&runtime, "adopted", &second).await;
    change(&new, json!({"redisHost": third.addr()})).await;

    assert_eq!(new.try_lock(lock("r", "B", MINUTE)).await, Ok(false));
    assert_eq!(owner_at(&third, "lock||test||r").await, None);
    assert_eq!(
        new.unlock(unlock("r", "A")).await,
        Ok(UnlockStatus::Success)
    );
}
