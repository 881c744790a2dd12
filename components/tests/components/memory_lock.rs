//! The `memory` lock, built through the registry: one winner under
//! contention, expiry frees a lock, only the owner unlocks.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{InPlace, Instance, Lock, TryLockRequest, UnlockRequest, UnlockStatus};
use serde_json::json;

async fn lock_store() -> Arc<dyn Lock> {
    match common::start("lock", "memory", json!({})).await {
        Ok(Instance::Lock(store)) => store,
        Ok(other) => panic!("expected a lock, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn try_lock(owner: &str, expiry: Duration) -> TryLockRequest {
    TryLockRequest {
        resource_id: "invoice-42".into(),
        lock_owner: owner.into(),
        expiry,
    }
}

fn unlock(owner: &str) -> UnlockRequest {
    UnlockRequest {
        resource_id: "invoice-42".into(),
        lock_owner: owner.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_contender_wins() {
    let store = lock_store().await;
    let contenders = (0..16).map(|i| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .try_lock(try_lock(&format!("worker-{i}"), Duration::from_secs(60)))
                .await
        })
    });
    let mut winners = 0;
    for contender in contenders {
        if contender.await.unwrap() == Ok(true) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

#[tokio::test]
async fn an_expired_lock_is_free_and_only_the_owner_unlocks() {
    let store = lock_store().await;
    assert_eq!(
        store
            .try_lock(try_lock("a", Duration::from_millis(50)))
            .await,
        Ok(true)
    );
    assert_eq!(
        store.unlock(unlock("b")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.try_lock(try_lock("b", Duration::from_secs(60))).await != Ok(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        store.unlock(unlock("a")).await,
        Ok(UnlockStatus::LockBelongsToOthers)
    );
    assert_eq!(store.unlock(unlock("b")).await, Ok(UnlockStatus::Success));
    assert_eq!(
        store.unlock(unlock("b")).await,
        Ok(UnlockStatus::LockDoesNotExist)
    );
}

#[tokio::test]
async fn metadata_changes_keep_held_locks() {
    let store = lock_store().await;
    assert_eq!(
        store.try_lock(try_lock("a", Duration::from_secs(60))).await,
        Ok(true)
    );
    let dynamic = store.as_in_place().expect("memory lock is not dynamic");
    assert_eq!(
        dynamic
            .update_in_place(&common::metadata(json!({})))
            .await
            .ok(),
        Some(InPlace::Applied)
    );
    assert_eq!(
        store.try_lock(try_lock("b", Duration::from_secs(60))).await,
        Ok(false)
    );
}
