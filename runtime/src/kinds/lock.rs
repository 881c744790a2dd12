//! Distributed locks (`lock`): try-lock with expiry, unlock by owner, as in
//! Dapr's lock API.

use std::time::Duration;

use async_trait::async_trait;

use crate::component::{Component, ComponentError};

/// Take a lock.
#[derive(Debug, Clone)]
pub struct TryLockRequest {
    /// What is locked.
    pub resource_id: String,
    /// Who takes it (only the owner can unlock).
    pub lock_owner: String,
    /// The lock is released after this long if not unlocked.
    pub expiry: Duration,
}

/// Release a lock.
#[derive(Debug, Clone)]
pub struct UnlockRequest {
    /// What is unlocked.
    pub resource_id: String,
    /// Who releases it.
    pub lock_owner: String,
}

/// Outcome of an unlock, with Dapr's status values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnlockStatus {
    /// Released.
    Success,
    /// No such lock (never taken, or expired).
    LockDoesNotExist,
    /// Held by another owner; left as is.
    LockBelongsToOthers,
}

/// Why a lock operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
    /// The store does not offer the operation.
    #[error("operation not supported: {0}")]
    Unsupported(String),
}

/// A lock store.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"lock\"` but does not implement `Lock`",
    note = "add `#[async_trait] impl Lock for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait Lock: Component {
    /// Takes the lock if free; `Ok(false)` if someone holds it.
    async fn try_lock(&self, req: TryLockRequest) -> Result<bool, LockError>;

    /// Releases the lock if `lock_owner` holds it.
    async fn unlock(&self, req: UnlockRequest) -> Result<UnlockStatus, LockError>;

    /// Renews the lease: if `lock_owner` holds the lock, it now expires
    /// `expiry` from now (Layotto's `LockKeepAlive`). The outcome uses the
    /// unlock statuses. A store without leases keeps the default, which
    /// answers [`LockError::Unsupported`].
    async fn keep_alive(&self, req: TryLockRequest) -> Result<UnlockStatus, LockError> {
        Err(LockError::Unsupported(format!(
            "this lock store cannot renew the lock on `{}`",
            req.resource_id
        )))
    }
}

impl From<LockError> for ComponentError {
    fn from(err: LockError) -> Self {
        ComponentError::new(err.to_string())
    }
}
