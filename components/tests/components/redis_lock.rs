//! The `redis` lock against a real `redis-server`, built through the
//! registry: contention, expiry, and unlock by owner only.

use crate::common;
use testkit::redis as redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire_runtime::{Instance, Lock, LockError, TryLockRequest, UnlockRequest, UnlockStatus};
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
        .arg("r")
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

#[tokio::test]
async fn key_prefix_applies_and_ttl_in_seconds_is_refused() {
    let server = RedisServer::start().await;
    let store = lock_store(json!({"redisHost": server.addr(), "keyPrefix": "locks:"})).await;
    assert_eq!(store.try_lock(lock("r", "a", MINUTE)).await, Ok(true));
    let mut raw = server.connection().await;
    let owner: Option<String> = redis::cmd("GET")
        .arg("locks:r")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(owner.as_deref(), Some("a"));

    let err = common::start(
        "lock",
        "redis",
        json!({"redisHost": server.addr(), "ttlInSeconds": 5}),
    )
    .await
    .map(|_| ())
    .expect_err("ttlInSeconds should be refused");
    assert!(err.contains("ttlInSeconds"), "{err}");
}
