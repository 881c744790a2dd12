//! The `memory` lock: try-lock with expiry and unlock by owner, in process.
//!
//! An expired lock is free: the next operation drops it (an expiry index
//! keeps that proportional to what expired, so nothing leaks). It takes no
//! metadata; a metadata change is applied in place, keeping held locks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use rewire_runtime::NoMetadata;
use rewire_runtime::{
    Component, ComponentError, InPlace, InPlaceUpdate, Lock, LockError, Metadata, TryLockRequest,
    UnlockRequest, UnlockStatus,
};
use tokio::time::Instant;
use tracing::debug;

use crate::time_limits::{check_ttl, deadline};

/// An in-process lock store with Dapr's lock semantics: locks expire, and
/// only their owner can release them.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(kind = "lock", type = "memory", example = "{}")]
pub struct MemoryLock {
    locks: Mutex<LockTable>,
}

impl MemoryLock {
    /// A lock store holding no lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of locks held (expired ones included until the next operation).
    pub fn held(&self) -> usize {
        self.table().held.len()
    }

    fn table(&self) -> MutexGuard<'_, LockTable> {
        self.locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Held locks and their expiry index.
#[derive(Debug, Default)]
struct LockTable {
    held: HashMap<String, Held>,
    /// `(expires_at, grant)` → resource; grants are unique.
    expiries: BTreeMap<(Instant, u64), String>,
    last_grant: u64,
}

#[derive(Debug)]
struct Held {
    owner: String,
    grant: u64,
    expires_at: Instant,
}

impl LockTable {
    fn purge_expired(&mut self, now: Instant) {
        while let Some(entry) = self.expiries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, grant), resource) = entry.remove_entry();
            if self.held.get(&resource).is_some_and(|h| h.grant == grant) {
                self.held.remove(&resource);
            }
        }
    }

    /// Takes the lock if free, until `expires_at`.
    fn try_lock(&mut self, req: &TryLockRequest, now: Instant, expires_at: Instant) -> bool {
        self.purge_expired(now);
        if self.held.contains_key(&req.resource_id) {
            return false;
        }
        self.last_grant += 1;
        self.held.insert(
            req.resource_id.clone(),
            Held {
                owner: req.lock_owner.clone(),
                grant: self.last_grant,
                expires_at,
            },
        );
        self.expiries
            .insert((expires_at, self.last_grant), req.resource_id.clone());
        true
    }

    fn keep_alive(
        &mut self,
        req: &TryLockRequest,
        now: Instant,
        expires_at: Instant,
    ) -> UnlockStatus {
        self.purge_expired(now);
        match self.held.get_mut(&req.resource_id) {
            None => UnlockStatus::LockDoesNotExist,
            Some(held) if held.owner != req.lock_owner => UnlockStatus::LockBelongsToOthers,
            Some(held) => {
                self.expiries.remove(&(held.expires_at, held.grant));
                held.expires_at = expires_at;
                self.expiries
                    .insert((expires_at, held.grant), req.resource_id.clone());
                UnlockStatus::Success
            }
        }
    }

    fn unlock(&mut self, req: &UnlockRequest, now: Instant) -> UnlockStatus {
        self.purge_expired(now);
        match self.held.get(&req.resource_id) {
            None => UnlockStatus::LockDoesNotExist,
            Some(held) if held.owner != req.lock_owner => UnlockStatus::LockBelongsToOthers,
            Some(held) => {
                self.expiries.remove(&(held.expires_at, held.grant));
                self.held.remove(&req.resource_id);
                UnlockStatus::Success
            }
        }
    }
}

fn require(what: &str, value: &str) -> Result<(), LockError> {
    if value.is_empty() {
        Err(LockError::Invalid(format!("{what} is empty")))
    } else {
        Ok(())
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryLock {
    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Applied at once: there is no metadata, so nothing to stage.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryLock {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        metadata
            .decode::<NoMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        Ok(InPlace::Applied)
    }
}

#[rewire_runtime::prelude::async_trait]
impl Lock for MemoryLock {
    async fn try_lock(&self, req: TryLockRequest) -> Result<bool, LockError> {
        let now = Instant::now();
        let expires_at = checked_expiry(&req, now)?;
        let taken = self.table().try_lock(&req, now, expires_at);
        debug!(resource = %req.resource_id, owner = %req.lock_owner, taken, "Lock requested.");
        Ok(taken)
    }

    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError> {
        require("resource id", &req.resource_id)?;
        require("lock owner", &req.lock_owner)?;
        let status = self.table().unlock(&req, Instant::now());
        debug!(resource = %req.resource_id, owner = %req.lock_owner, ?status, "Unlock requested.");
        Ok(status)
    }

    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        let now = Instant::now();
        let expires_at = checked_expiry(&req, now)?;
        let status = self.table().keep_alive(&req, now, expires_at);
        debug!(resource = %req.resource_id, owner = %req.lock_owner, ?status, "Lock renewal requested.");
        Ok(status)
    }
}

/// When a lock taken or renewed `now` by `req` expires; an empty resource
/// or owner, a zero expiry and an over-long one refused.
fn checked_expiry(req: &TryLockRequest, now: Instant) -> Result<Instant, LockError> {
    require("resource id", &req.resource_id)?;
    require("lock owner", &req.lock_owner)?;
    if req.expiry.is_zero() {
        return Err(LockError::Invalid(format!(
            "expiry of the lock on `{}` must be positive",
            req.resource_id
        )));
    }
    check_ttl("expiry", req.expiry)
        .and_then(|expiry| deadline(now, "expiry", expiry))
        .map_err(|message| LockError::Invalid(format!("lock on `{}`: {message}", req.resource_id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    #[tokio::test(start_paused = true)]
    async fn contention_expiry_and_owner_only_unlock() {
        let store = MemoryLock::new();
        let minute = Duration::from_secs(60);
        assert_eq!(store.try_lock(lock("r", "a", minute)).await, Ok(true));
        assert_eq!(store.try_lock(lock("r", "b", minute)).await, Ok(false));
        assert_eq!(store.try_lock(lock("r", "a", minute)).await, Ok(false));
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
            store
                .try_lock(lock("r", "b", Duration::from_millis(50)))
                .await,
            Ok(true)
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            store.unlock(unlock("r", "b")).await,
            Ok(UnlockStatus::LockDoesNotExist)
        );
        assert_eq!(store.try_lock(lock("r", "a", minute)).await, Ok(true));
        assert_eq!(store.held(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_locks_do_not_pile_up() {
        let store = MemoryLock::new();
        for i in 0..50 {
            let taken = store
                .try_lock(lock(&format!("r{i}"), "a", Duration::from_millis(10)))
                .await;
            assert_eq!(taken, Ok(true));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            store
                .try_lock(lock("other", "a", Duration::from_secs(1)))
                .await,
            Ok(true)
        );
        assert_eq!(store.held(), 1);
        assert!(store.table().expiries.len() == 1);
    }

    #[tokio::test]
    async fn malformed_requests_are_invalid() {
        let store = MemoryLock::new();
        assert!(matches!(
            store.try_lock(lock("", "a", Duration::from_secs(1))).await,
            Err(LockError::Invalid(_))
        ));
        assert!(matches!(
            store.try_lock(lock("r", "a", Duration::ZERO)).await,
            Err(LockError::Invalid(_))
        ));
        assert!(matches!(
            store.unlock(unlock("r", "")).await,
            Err(LockError::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn apply_config_keeps_locks_and_rejects_fields() {
        let store = MemoryLock::new();
        assert_eq!(
            store
                .try_lock(lock("r", "a", Duration::from_secs(60)))
                .await,
            Ok(true)
        );
        assert_eq!(
            store.update_in_place(&Metadata::default()).await.ok(),
            Some(InPlace::Applied)
        );
        assert_eq!(store.held(), 1);
        let mut metadata = Metadata::default();
        metadata.insert("ttl", serde_json::json!(1));
        assert!(store.update_in_place(&metadata).await.is_err());
    }
}
