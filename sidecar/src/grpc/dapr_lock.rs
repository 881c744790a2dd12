//! Locks: `TryLockAlpha1` and `UnlockAlpha1` on the shared
//! [`LockOps`](crate::dapr::LockOps) (which checks a request in Dapr's
//! order, as over HTTP and Layotto's API), with Dapr's unlock statuses.

use rewire_runtime::UnlockStatus;
use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::unlock_response::Status as UnlockCode;
use crate::dapr::Call;

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
    fn unlock_outcomes_have_dapr_values() {
        assert_eq!(unlock_code(UnlockStatus::Success) as i32, 0);
        assert_eq!(unlock_code(UnlockStatus::LockDoesNotExist) as i32, 1);
        assert_eq!(unlock_code(UnlockStatus::LockBelongsToOthers) as i32, 2);
    }
}
