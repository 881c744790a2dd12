//! The `memory` lock: try-lock with expiry and unlock by owner, in process.
//!
//! An expired lock is free: the next operation drops it (an expiry index
//! keeps that proportional to what expired, so nothing leaks). It takes no
//! metadata; a metadata change is applied in place, keeping held locks,
//! and a rebuild of the same type (a new `appId`) takes over its
//! predecessor's table (see [`crate::memory`]): held locks stay held by
//! their owners, with the same expiry.
//!
//! Its memory is bounded: at most [`MAX_LOCKS`] locks are held at once
//! (expired ones are dropped before the count is checked; a try-lock past
//! it fails, naming the limit), and a resource id and an owner are at most
//! [`MAX_RESOURCE_ID_BYTES`] and [`MAX_OWNER_BYTES`] (longer ones are
//! invalid requests). Each resource id is kept once, shared by the table
//! and the expiry index.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use rewire_runtime::NoMetadata;
use rewire_runtime::{
    echoed, Component, ComponentError, InPlace, InPlaceUpdate, InitContext, Lock, LockError,
    Metadata, TryLockRequest, UnlockRequest, UnlockStatus,
};
use tokio::time::Instant;
use tracing::debug;

use crate::time_limits::{check_ttl, deadline};

/// Most locks held at once by one memory lock store.
pub const MAX_LOCKS: usize = 10_000;
/// Longest resource id the memory lock store takes, in bytes.
pub const MAX_RESOURCE_ID_BYTES: usize = 1024;
/// Longest lock owner the memory lock store takes, in bytes.
pub const MAX_OWNER_BYTES: usize = 1024;

/// An in-process lock store with Dapr's lock semantics: locks expire, and
/// only their owner can release them.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(kind = "lock", type = "memory", example = "{}")]
pub struct MemoryLock {
    /// The component's locks: shared with the instances rebuilt from or
    /// into this one, so mutual exclusion holds across a rebuild.
    locks: Arc<Mutex<LockTable>>,
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

/// Held locks and their expiry index; each resource id is one shared
/// string.
#[derive(Debug, Default)]
struct LockTable {
    held: HashMap<Arc<str>, Held>,
    /// `(expires_at, grant)` → resource; grants are unique.
    expiries: BTreeMap<(Instant, u64), Arc<str>>,
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

    /// Takes the lock if free, until `expires_at`; an error when
    /// [`MAX_LOCKS`] unexpired locks are held.
    fn try_lock(
        &mut self,
        req: &TryLockRequest,
        now: Instant,
        expires_at: Instant,
    ) -> Result<bool, LockError> {
        self.purge_expired(now);
        if self.held.contains_key(req.resource_id.as_str()) {
            return Ok(false);
        }
        if self.held.len() >= MAX_LOCKS {
            return Err(LockError::Backend(format!(
                "the memory lock store holds {MAX_LOCKS} locks, its limit: \
                 the lock on `{}` was not taken (unlock some, or let them expire)",
                echoed(&req.resource_id)
            )));
        }
        self.last_grant += 1;
        let resource: Arc<str> = Arc::from(req.resource_id.as_str());
        self.held.insert(
            resource.clone(),
            Held {
                owner: req.lock_owner.clone(),
                grant: self.last_grant,
                expires_at,
            },
        );
        self.expiries
            .insert((expires_at, self.last_grant), resource);
        Ok(true)
    }

    fn keep_alive(
        &mut self,
        req: &TryLockRequest,
        now: Instant,
        expires_at: Instant,
    ) -> UnlockStatus {
        self.purge_expired(now);
        match self.held.get_mut(req.resource_id.as_str()) {
            None => UnlockStatus::LockDoesNotExist,
            Some(held) if held.owner != req.lock_owner => UnlockStatus::LockBelongsToOthers,
            Some(held) => {
                // The index's entry moves; its shared resource id with it.
                let resource = self
                    .expiries
                    .remove(&(held.expires_at, held.grant))
                    .unwrap_or_else(|| Arc::from(req.resource_id.as_str()));
                held.expires_at = expires_at;
                self.expiries.insert((expires_at, held.grant), resource);
                UnlockStatus::Success
            }
        }
    }

    fn unlock(&mut self, req: &UnlockRequest, now: Instant) -> UnlockStatus {
        self.purge_expired(now);
        match self.held.get(req.resource_id.as_str()) {
            None => UnlockStatus::LockDoesNotExist,
            Some(held) if held.owner != req.lock_owner => UnlockStatus::LockBelongsToOthers,
            Some(held) => {
                self.expiries.remove(&(held.expires_at, held.grant));
                self.held.remove(req.resource_id.as_str());
                UnlockStatus::Success
            }
        }
    }
}

/// `value` is given and at most `limit` bytes.
fn require(what: &str, value: &str, limit: usize) -> Result<(), LockError> {
    if value.is_empty() {
        Err(LockError::Invalid(format!("{what} is empty")))
    } else if value.len() > limit {
        Err(LockError::Invalid(format!(
            "{what} is {} bytes, over the memory lock store's limit of {limit} bytes",
            value.len()
        )))
    } else {
        Ok(())
    }
}

/// A resource id and an owner, within their limits.
fn check_request(resource_id: &str, lock_owner: &str) -> Result<(), LockError> {
    require("resource id", resource_id, MAX_RESOURCE_ID_BYTES)?;
    require("lock owner", lock_owner, MAX_OWNER_BYTES)
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryLock {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let (locks, adopted) = crate::memory::shared_with_predecessors(cx, self.locks.clone());
        self.locks = locks;
        if adopted {
            debug!(component = %cx.key, held = self.held(), "Memory lock store rebuilt: it keeps its predecessor's locks.");
        }
        Ok(())
    }

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
        let taken = self.table().try_lock(&req, now, expires_at)?;
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), taken, "Lock requested.");
        Ok(taken)
    }

    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError> {
        check_request(&req.resource_id, &req.lock_owner)?;
        let status = self.table().unlock(&req, Instant::now());
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), ?status, "Unlock requested.");
        Ok(status)
    }

    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        let now = Instant::now();
        let expires_at = checked_expiry(&req, now)?;
        let status = self.table().keep_alive(&req, now, expires_at);
        debug!(resource = %echoed(&req.resource_id), owner = %echoed(&req.lock_owner), ?status, "Lock renewal requested.");
        Ok(status)
    }
}

/// When a lock taken or renewed `now` by `req` expires; an empty or
/// over-long resource or owner, a zero expiry and an over-long one refused.
fn checked_expiry(req: &TryLockRequest, now: Instant) -> Result<Instant, LockError> {
    check_request(&req.resource_id, &req.lock_owner)?;
    if req.expiry.is_zero() {
        return Err(LockError::Invalid(format!(
            "expiry of the lock on `{}` must be positive",
            echoed(&req.resource_id)
        )));
    }
    check_ttl("expiry", req.expiry)
        .and_then(|expiry| deadline(now, "expiry", expiry))
        .map_err(|message| {
            LockError::Invalid(format!("lock on `{}`: {message}", echoed(&req.resource_id)))
        })
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

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_expired_locks_make_room() {
        let store = MemoryLock::new();
        let second = Duration::from_secs(1);
        for i in 0..MAX_LOCKS {
            assert_eq!(
                store.try_lock(lock(&format!("r{i}"), "a", second)).await,
                Ok(true)
            );
        }
        let full = store.try_lock(lock("one-more", "a", second)).await;
        assert!(
            matches!(&full, Err(LockError::Backend(m)) if m.contains(&MAX_LOCKS.to_string())),
            "{full:?}"
        );
        // A held resource still answers "held", not the limit.
        assert_eq!(store.try_lock(lock("r0", "b", second)).await, Ok(false));
        assert_eq!(
            store.unlock(unlock("r0", "a")).await,
            Ok(UnlockStatus::Success)
        );
        assert_eq!(
            store.try_lock(lock("one-more", "a", second)).await,
            Ok(true)
        );
        tokio::time::sleep(2 * second).await;
        assert_eq!(
            store.try_lock(lock("after", "a", second)).await,
            Ok(true),
            "expired locks are dropped before the limit is checked"
        );
        assert_eq!(store.held(), 1);
    }

    #[tokio::test]
    async fn long_resources_and_owners_are_invalid_and_not_echoed_whole() {
        let store = MemoryLock::new();
        let minute = Duration::from_secs(60);
        let long = "r".repeat(MAX_RESOURCE_ID_BYTES + 1);
        let limit = MAX_RESOURCE_ID_BYTES.to_string();
        for refused in [
            store.try_lock(lock(&long, "a", minute)).await.err(),
            store.keep_alive(lock(&long, "a", minute)).await.err(),
            store.unlock(unlock(&long, "a")).await.err(),
            store
                .try_lock(lock("r", &"o".repeat(MAX_OWNER_BYTES + 1), minute))
                .await
                .err(),
        ] {
            assert!(
                matches!(&refused, Some(LockError::Invalid(m)) if m.contains(&limit) && m.len() < 200),
                "{refused:?}"
            );
        }
        let longest = "r".repeat(MAX_RESOURCE_ID_BYTES);
        assert_eq!(store.try_lock(lock(&longest, "a", minute)).await, Ok(true));
        let too_long = store
            .try_lock(lock(&longest, "a", Duration::from_secs(u64::MAX / 4)))
            .await;
        assert!(
            matches!(&too_long, Err(LockError::Invalid(m)) if m.len() < 600),
            "{too_long:?}"
        );
        // One copy of the resource: the table and the index share it.
        let table = store.table();
        let (key, _) = table.held.get_key_value(longest.as_str()).unwrap();
        let indexed = table.expiries.values().next().unwrap();
        assert!(Arc::ptr_eq(key, indexed));
    }

    /// An instance of `lock/orders` initialised in the runtime whose
    /// handover area is `runtime`.
    async fn instance_in(runtime: &rewire_runtime::Handover) -> MemoryLock {
        let key = rewire_runtime::ComponentKey::new("lock", "orders");
        let mut cx = InitContext::new(key, "app", Metadata::default());
        cx.handover = runtime.clone();
        let mut store = MemoryLock::new();
        store.init(&cx).await.unwrap_or_else(|e| panic!("{e}"));
        store
    }

    /// Built while the old instance serves, as a reload does: a lock the
    /// old one grants after the handover binds the new one, and a rollback
    /// (the new one dropped) leaves the old one with every lock.
    #[tokio::test]
    async fn a_rebuild_shares_the_table_with_the_instance_it_replaces() {
        let runtime = rewire_runtime::Handover::new();
        let minute = Duration::from_secs(60);
        let old = instance_in(&runtime).await;
        assert_eq!(old.try_lock(lock("before", "a", minute)).await, Ok(true));
        let new = instance_in(&runtime).await;
        assert_eq!(old.try_lock(lock("after", "a", minute)).await, Ok(true));
        for resource in ["before", "after"] {
            assert_eq!(
                new.try_lock(lock(resource, "b", minute)).await,
                Ok(false),
                "{resource}"
            );
        }
        drop(new);
        assert_eq!(
            old.unlock(unlock("after", "a")).await,
            Ok(UnlockStatus::Success)
        );
        assert_eq!(old.held(), 1);
        let elsewhere = instance_in(&rewire_runtime::Handover::new()).await;
        assert_eq!(elsewhere.held(), 0, "another runtime has locks of its own");
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
