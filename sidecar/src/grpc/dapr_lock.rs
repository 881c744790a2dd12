//! Locks: `TryLockAlpha1` and `UnlockAlpha1` on the shared
//! [`LockOps`](crate::dapr::LockOps) (which checks a request in Dapr's
//! order, as over HTTP), with Dapr's unlock statuses; and Layotto's
//! `TryLock` on the same messages, checked in Layotto's order with its
//! words ([`layotto_try_lock`], [`layotto_status`]).

use rewire_runtime::UnlockStatus;
use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::unlock_response::Status as UnlockCode;
use crate::dapr::{Call, LockOpError};

/// `TryLockAlpha1`: takes the lock if it is free.
pub(super) async fn try_lock(
    call: Call,
    req: pb::TryLockRequest,
) -> Result<pb::TryLockResponse, Status> {
    let store = call.lock_store(&req.store_name);
    let success = store
        .try_lock(
            req.resource_id,
            req.lock_owner,
            i64::from(req.expiry_in_seconds),
        )
        .await?;
    Ok(pb::TryLockResponse { success })
}

/// Layotto's `TryLock` (its request in Dapr's message): as [`try_lock`],
/// but checked in Layotto's order (some lock store, resource, owner, then
/// the expiry, then the store named) and answered in its words
/// ([`layotto_status`]).
pub(super) async fn layotto_try_lock(
    call: Call,
    req: pb::TryLockRequest,
) -> Result<pb::TryLockResponse, Status> {
    let store = call.lock_store(&req.store_name).in_layotto_order();
    let success = store
        .try_lock(
            req.resource_id,
            req.lock_owner,
            i64::from(req.expiry_in_seconds),
        )
        .await
        .map_err(layotto_status)?;
    Ok(pb::TryLockResponse { success })
}

/// A lock operation's error as Layotto answers it: Dapr's codes and
/// messages (Layotto's `pkg/messages` has the same), but a non-positive
/// expiry is `Expire is not positive in lock store {store}`, after
/// Layotto's `expire` field (Dapr's says `ExpiryInSeconds`).
pub(super) fn layotto_status(err: LockOpError) -> Status {
    match err {
        LockOpError::ExpiryNotPositive(store) => {
            Status::invalid_argument(format!("Expire is not positive in lock store {store}"))
        }
        other => Status::from(other),
    }
}

/// `UnlockAlpha1`: releases the lock if its owner asks.
pub(super) async fn unlock(
    call: Call,
    req: pb::UnlockRequest,
) -> Result<pb::UnlockResponse, Status> {
    let store = call.lock_store(&req.store_name);
    let status = store.unlock(req.resource_id, req.lock_owner).await?;
    Ok(pb::UnlockResponse {
        status: unlock_code(status) as i32,
    })
}

/// Dapr's enum value of an unlock outcome.
fn unlock_code(status: UnlockStatus) -> UnlockCode {
    match status {
        UnlockStatus::Success => UnlockCode::Success,
        UnlockStatus::LockDoesNotExist => UnlockCode::LockDoesNotExist,
        UnlockStatus::LockBelongsToOthers => UnlockCode::LockBelongsToOthers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layotto_says_expire_where_dapr_says_expiry_in_seconds() {
        let status = layotto_status(LockOpError::ExpiryNotPositive("locks".into()));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "Expire is not positive in lock store locks"
        );
        let status = layotto_status(LockOpError::NotConfigured("locks".into()));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), "lock store is not configured");
        let status = layotto_status(LockOpError::ResourceIdEmpty("locks".into()));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "ResourceId is empty in lock store locks");
    }

    #[test]
    fn unlock_outcomes_have_dapr_values() {
        assert_eq!(unlock_code(UnlockStatus::Success) as i32, 0);
        assert_eq!(unlock_code(UnlockStatus::LockDoesNotExist) as i32, 1);
        assert_eq!(unlock_code(UnlockStatus::LockBelongsToOthers) as i32, 2);
    }
}
