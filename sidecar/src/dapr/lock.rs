//! Dapr's lock operations: try-lock with an expiry, unlock by owner, with
//! Dapr's validation messages.

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{echoed, Kind};
use rewire_runtime::{Instance, Lock, LockError, TryLockRequest, UnlockRequest, UnlockStatus};

use super::call::Call;
use super::retry_rule;

/// Why a lock operation failed (messages in Dapr's gRPC wording).
#[derive(Debug, thiserror::Error)]
pub enum LockOpError {
    /// The call's generation has no lock store at all (Dapr's message,
    /// which names the store asked for, as [`echoed`]; gRPC
    /// `FAILED_PRECONDITION`).
    #[error("lock store {0} is not configured")]
    NotConfigured(String),
    /// No lock store with that name in the call's generation (Dapr's
    /// message; the name as [`echoed`]).
    #[error("lock store {0} is not found")]
    NotFound(String),
    /// The request names no resource.
    #[error("ResourceId is empty in lock store `{0}`")]
    ResourceIdEmpty(String),
    /// The resource id holds `||`, which separates a lock key's parts
    /// (Dapr refuses it too).
    #[error("ResourceId cannot contain `||` in lock store `{0}`")]
    ResourceIdSeparator(String),
    /// The request names no owner.
    #[error("LockOwner is empty in lock store `{0}`")]
    LockOwnerEmpty(String),
    /// The expiry is zero or negative.
    #[error("ExpiryInSeconds is not positive in lock store `{0}`")]
    ExpiryNotPositive(String),
    /// The store failed to take the lock (the resource as [`echoed`]).
    #[error("failed to try acquiring lock `{resource_id}` in lock store `{store}`: {source}")]
    TryLock {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
    /// The store failed to renew the lock.
    #[error("failed to renew lock `{resource_id}` in lock store `{store}`: {source}")]
    KeepAlive {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
    /// The store failed to release the lock.
    #[error("failed to release lock `{resource_id}` in lock store `{store}`: {source}")]
    Unlock {
        /// The store.
        store: String,
        /// The resource.
        resource_id: String,
        /// Why (scrubbed).
        source: LockError,
    },
}

impl LockOpError {
    /// The store's own error, when the store was asked.
    pub fn store_error(&self) -> Option<&LockError> {
        match self {
            Self::TryLock { source, .. }
            | Self::Unlock { source, .. }
            | Self::KeepAlive { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Call {
    /// The lock store `name` of the call's generation.
    pub fn lock_store(&self, name: &str) -> Result<LockOps, LockOpError> {
        match self.instance(Kind::Lock, name) {
            Some(Instance::Lock(store)) => Ok(LockOps {
                name: name.to_string(),
                store: store.clone(),
                call: self.clone(),
            }),
            _ if !self
                .generation()
                .iter()
                .any(|(key, _)| key.kind == Kind::Lock) =>
            {
                Err(LockOpError::NotConfigured(echoed(name).into_owned()))
            }
            _ => Err(LockOpError::NotFound(echoed(name).into_owned())),
        }
    }
}

/// Dapr's lock operations on one store of a call's generation.
pub struct LockOps {
    name: String,
    store: Arc<dyn Lock>,
    call: Call,
}

impl LockOps {
    /// Takes the lock on `resource_id` for `lock_owner` if it is free;
    /// whether it was taken.
    pub async fn try_lock(
        &self,
        resource_id: String,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<bool, LockOpError> {
        let request = self.lease(&resource_id, lock_owner, expiry_in_seconds)?;
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::NEVER,
                request,
                |r| store.try_lock(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::TryLock {
                store: self.name.clone(),
                resource_id: echoed(&resource_id).into_owned(),
                source: self.scrubbed(e),
            })
    }

    /// Renews the lock on `resource_id` for `expiry_in_seconds` if
    /// `lock_owner` holds it.
    pub async fn keep_alive(
        &self,
        resource_id: String,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<UnlockStatus, LockOpError> {
        let request = self.lease(&resource_id, lock_owner, expiry_in_seconds)?;
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.keep_alive(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::KeepAlive {
                store: self.name.clone(),
                resource_id: echoed(&resource_id).into_owned(),
                source: self.scrubbed(e),
            })
    }

    /// Releases the lock on `resource_id` if `lock_owner` holds it.
    pub async fn unlock(
        &self,
        resource_id: String,
        lock_owner: String,
    ) -> Result<UnlockStatus, LockOpError> {
        self.require(&resource_id, &lock_owner)?;
        let request = UnlockRequest {
            resource_id: resource_id.clone(),
            lock_owner,
        };
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::NEVER,
                request,
                |r| store.unlock(r),
                LockError::Backend,
            )
            .await
            .map_err(|e| LockOpError::Unlock {
                store: self.name.clone(),
                resource_id: echoed(&resource_id).into_owned(),
                source: self.scrubbed(e),
            })
    }

    /// A lease of `expiry_in_seconds` on `resource_id` for `lock_owner`,
    /// after Dapr's checks (a resource, an owner, a positive expiry).
    fn lease(
        &self,
        resource_id: &str,
        lock_owner: String,
        expiry_in_seconds: i64,
    ) -> Result<TryLockRequest, LockOpError> {
        self.require(resource_id, &lock_owner)?;
        let seconds = u64::try_from(expiry_in_seconds)
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| LockOpError::ExpiryNotPositive(self.name.clone()))?;
        Ok(TryLockRequest {
            resource_id: resource_id.to_string(),
            lock_owner,
            expiry: Duration::from_secs(seconds),
        })
    }

    /// Dapr's checks: a resource and an owner are required, and the
    /// resource id cannot hold `||` (Dapr's lock keys are
    /// `lock||{appId}||{resourceId}`, so that no resource id makes another
    /// one's key).
    fn require(&self, resource_id: &str, lock_owner: &str) -> Result<(), LockOpError> {
        if resource_id.is_empty() {
            return Err(LockOpError::ResourceIdEmpty(self.name.clone()));
        }
        if resource_id.contains("||") {
            return Err(LockOpError::ResourceIdSeparator(self.name.clone()));
        }
        if lock_owner.is_empty() {
            return Err(LockOpError::LockOwnerEmpty(self.name.clone()));
        }
        Ok(())
    }

    fn target(&self) -> (Kind, &str) {
        (Kind::Lock, &self.name)
    }

    fn scrubbed(&self, error: LockError) -> LockError {
        match error {
            LockError::Invalid(m) => LockError::Invalid(self.call.scrub(&m)),
            LockError::Backend(m) => LockError::Backend(self.call.scrub(&m)),
            LockError::Unsupported(m) => LockError::Unsupported(self.call.scrub(&m)),
        }
    }
}
