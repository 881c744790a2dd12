//! In-place updates of the `redis` components: moving to another server
//! (the failover story) while requests run, refusing a bad server or
//! password while the old connection keeps serving, and passwords that
//! never show up in errors.

use crate::common;
use testkit::redis as redis_server;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_server::{free_port, RedisServer};
use rewire_runtime::{
    GetRequest, InPlace, Instance, Lock, SetRequest, StateStore, TryLockRequest, UnlockRequest,
    UnlockStatus,
};
use serde_json::{json, Value};

async fn store(metadata: Value) -> Arc<dyn StateStore> {
    match common::start("state", "redis", metadata).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

async fn apply(store: &dyn StateStore, metadata: Value) -> Result<InPlace, String> {
    let dynamic = store
        .as_in_place()
        .expect("the redis state store is not dynamic");
    dynamic
        .update_in_place(&common::metadata(metadata))
        .await
        .map_err(|e| e.to_string())
}

fn write(key: &str, value: &str) -> SetRequest {
    SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        ..SetRequest::default()
    }
}

async fn put(store: &dyn StateStore, key: &str, value: &str) {
    store
        .set(write(key, value))
        .await
        .unwrap_or_else(|e| panic!("set {key}: {e}"));
}

/// The `data` field of state key `key` on `server`, read with a plain
/// client: stored as Dapr's `{appId}||{key}` (the test app is `test`).
async fn raw_data(server: &RedisServer, key: &str) -> Option<String> {
    let mut conn = server.connection().await;
    redis::cmd("HGET")
        .arg(format!("test||{key}"))
        .arg("data")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("HGET {key} on {}: {e}", server.addr()))
}

async fn connected_clients(server: &RedisServer) -> usize {
    let mut conn = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info}"))
}

#[tokio::test]
async fn moving_to_another_server_loses_no_request() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let store = store(json!({"redisHost": first.addr()})).await;
    put(&*store, "before", "1").await;

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (store, stop, ops) = (store.clone(), stop.clone(), ops.clone());
        workers.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut i = 0_usize;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w{worker}-{i}");
                if let Err(e) = store.set(write(&key, "v")).await {
                    errors.push(format!("set {key}: {e}"));
                }
                let get = GetRequest {
                    key: key.clone(),
                    ..GetRequest::default()
                };
                if let Err(e) = store.get(get).await {
                    errors.push(format!("get {key}: {e}"));
                }
                ops.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            errors
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before_swap = ops.load(Ordering::Relaxed);
    assert_eq!(
        apply(&*store, json!({"redisHost": second.addr()})).await,
        Ok(InPlace::Applied)
    );
    let at_swap = ops.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for worker in workers {
        errors.extend(worker.await.unwrap());
    }
    assert!(errors.is_empty(), "requests failed: {errors:?}");
    let after_swap = ops.load(Ordering::Relaxed) - at_swap;
    assert!(
        before_swap > 0 && after_swap > 0,
        "{before_swap} / {after_swap}"
    );

    put(&*store, "after", "2").await;
    assert_eq!(raw_data(&second, "after").await.as_deref(), Some("2"));
    assert_eq!(raw_data(&first, "after").await, None);
    assert_eq!(raw_data(&first, "before").await.as_deref(), Some("1"));

    // The old connection closes once nothing uses it: only our probe is
    // left on the first server.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while connected_clients(&first).await > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old connection was never closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_bad_new_server_is_refused_and_the_old_one_keeps_serving() {
    let server = RedisServer::start().await;
    let store = store(json!({"redisHost": server.addr(), "dialTimeout": "2s"})).await;
    let unreachable = format!("127.0.0.1:{}", free_port());
    let err = apply(
        &*store,
        json!({"redisHost": unreachable, "dialTimeout": "2s"}),
    )
    .await
    .expect_err("an unreachable host must be refused");
    assert!(
        err.contains("redisHost") && err.contains(&unreachable),
        "{err}"
    );

    let err = apply(
        &*store,
        json!({"redisHost": server.addr(), "redisHots": "x"}),
    )
    .await
    .expect_err("an unknown field must be refused");
    assert!(err.contains("did you mean `redisHost`"), "{err}");

    put(&*store, "still", "here").await;
    assert_eq!(raw_data(&server, "still").await.as_deref(), Some("here"));
}

#[tokio::test]
async fn passwords_work_and_never_show_in_errors() {
    let secret = "s3cr3t-pw";
    let wrong = "wr0ng-pw";
    let guarded = RedisServer::start_with_password(secret).await;
    let other = RedisServer::start_with_password(secret).await;

    let err = common::start(
        "state",
        "redis",
        json!({"redisHost": guarded.addr(), "redisPassword": wrong}),
    )
    .await
    .map(|_| ())
    .expect_err("a wrong password must fail init");
    assert!(
        err.contains("redisPassword") && !err.contains(wrong),
        "{err}"
    );
    let err = common::start("state", "redis", json!({"redisHost": guarded.addr()}))
        .await
        .map(|_| ())
        .expect_err("a missing password must fail init");
    assert!(err.contains("redisPassword"), "{err}");

    let store = store(json!({"redisHost": guarded.addr(), "redisPassword": secret})).await;
    put(&*store, "k", "v").await;
    assert_eq!(raw_data(&guarded, "k").await.as_deref(), Some("v"));

    let err = apply(
        &*store,
        json!({"redisHost": other.addr(), "redisPassword": wrong}),
    )
    .await
    .expect_err("a wrong password must be refused");
    assert!(
        err.contains("redisPassword") && !err.contains(wrong) && !err.contains(secret),
        "{err}"
    );
    put(&*store, "k2", "old").await;
    assert_eq!(raw_data(&guarded, "k2").await.as_deref(), Some("old"));

    assert_eq!(
        apply(
            &*store,
            json!({"redisHost": other.addr(), "redisPassword": secret})
        )
        .await,
        Ok(InPlace::Applied)
    );
    put(&*store, "k3", "new").await;
    assert_eq!(raw_data(&other, "k3").await.as_deref(), Some("new"));
}

#[tokio::test]
async fn key_prefix_and_database_changes_apply_in_place() {
    let server = RedisServer::start().await;
    let store = store(json!({"redisHost": server.addr()})).await;
    assert_eq!(
        apply(
            &*store,
            json!({"redisHost": server.addr(), "keyPrefix": "p"})
        )
        .await,
        Ok(InPlace::Applied)
    );
    put(&*store, "k", "v").await;
    let mut conn = server.connection().await;
    let data: Option<String> = redis::cmd("HGET")
        .arg("p||k")
        .arg("data")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(data.as_deref(), Some("v"));

    assert_eq!(
        apply(&*store, json!({"redisHost": server.addr(), "redisDB": "3"})).await,
        Ok(InPlace::Applied)
    );
    put(&*store, "in3", "v").await;
    assert_eq!(raw_data(&server, "in3").await, None, "written to db 0");
    let mut conn = server.connection().await;
    let _: () = redis::cmd("SELECT")
        .arg(3)
        .query_async(&mut conn)
        .await
        .unwrap();
    let data: Option<String> = redis::cmd("HGET")
        .arg("test||in3")
        .arg("data")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(data.as_deref(), Some("v"));

    let err = apply(
        &*store,
        json!({"redisHost": server.addr(), "redisDB": "99"}),
    )
    .await
    .expect_err("a database the server lacks must be refused");
    assert!(err.contains("redisDB"), "{err}");
}

#[tokio::test]
async fn the_lock_moves_to_another_server_too() {
    let first = RedisServer::start().await;
    let second = RedisServer::start().await;
    let lock: Arc<dyn Lock> =
        match common::start("lock", "redis", json!({"redisHost": first.addr()})).await {
            Ok(Instance::Lock(lock)) => lock,
            Ok(other) => panic!("expected a lock, got {other:?}"),
            Err(e) => panic!("{e}"),
        };
    let req = TryLockRequest {
        resource_id: "r".into(),
        lock_owner: "a".into(),
        expiry: Duration::from_secs(60),
    };
    assert_eq!(lock.try_lock(req.clone()).await, Ok(true));
    let dynamic = lock.as_in_place().expect("the redis lock is not dynamic");
    let applied = dynamic
        .update_in_place(&common::metadata(json!({"redisHost": second.addr()})))
        .await
        .map_err(|e| e.to_string());
    assert_eq!(applied, Ok(InPlace::Applied));
    // The lock held on the first server still counts (for the grace that
    // follows the switch); once released there, the new server takes it.
    assert_eq!(lock.try_lock(req.clone()).await, Ok(false));
    let release = UnlockRequest {
        resource_id: "r".into(),
        lock_owner: "a".into(),
    };
    assert_eq!(lock.unlock(release).await, Ok(UnlockStatus::Success));
    assert_eq!(lock.try_lock(req).await, Ok(true));
    let mut conn = second.connection().await;
    let owner: Option<String> = redis::cmd("GET")
        .arg("lock||test||r")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner.as_deref(), Some("a"));
}
