//! Locks: `TryLockAlpha1` and `UnlockAlpha1`, with Dapr's validation
//! messages and unlock statuses.

use std::time::Duration;

use tonic::Status;

use super::call::Call;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::unlock_response::Status as UnlockCode;
use super::status::lock_error;
use crate::kinds::{TryLockRequest, UnlockRequest, UnlockStatus};

/// `TryLockAlpha1`: takes the lock if it is free.
pub(super) async fn try_lock(
    call: Call,
    req: pb::TryLockRequest,
) -> Result<pb::TryLockResponse, Status> {
    let store = call.lock_store(&req.store_name)?;
    require(&req.store_name, &req.resource_id, &req.lock_owner)?;
    let seconds = u64::try_from(req.expiry_in_seconds)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "ExpiryInSeconds is not positive in lock store `{}`",
                req.store_name
            ))
        })?;
    let doing = format!(
        "failed to try acquiring lock `{}` in lock store `{}`",
        req.resource_id, req.store_name
    );
    let success = store
        .try_lock(TryLockRequest {
            resource_id: req.resource_id,
            lock_owner: req.lock_owner,
            expiry: Duration::from_secs(seconds),
        })
        .await
        .map_err(|e| lock_error(&doing, &e))?;
    Ok(pb::TryLockResponse { success })
}

/// `UnlockAlpha1`: releases the lock if its owner asks.
pub(super) async fn unlock(
    call: Call,
    req: pb::UnlockRequest,
) -> Result<pb::UnlockResponse, Status> {
    let store = call.lock_store(&req.store_name)?;
    require(&req.store_name, &req.resource_id, &req.lock_owner)?;
    let doing = format!(
        "failed to release lock `{}` in lock store `{}`",
        req.resource_id, req.store_name
    );
    let status = store
        .unlock(UnlockRequest {
            resource_id: req.resource_id,
            lock_owner: req.lock_owner,
        })
        .await
        .map_err(|e| lock_error(&doing, &e))?;
    Ok(pb::UnlockResponse {
        status: unlock_code(status) as i32,
    })
}

/// Dapr's checks: a resource and an owner are required.
fn require(store: &str, resource_id: &str, lock_owner: &str) -> Result<(), Status> {
    if resource_id.is_empty() {
        return Err(Status::invalid_argument(format!(
            "ResourceId is empty in lock store `{store}`"
        )));
    }
    if lock_owner.is_empty() {
        return Err(Status::invalid_argument(format!(
            "LockOwner is empty in lock store `{store}`"
        )));
    }
    Ok(())
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

    #[test]
    fn resource_and_owner_are_required() {
        assert!(require("l", "r", "o").is_ok());
        let status = require("l", "", "o").expect_err("empty resource");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("ResourceId"),
            "{}",
            status.message()
        );
        assert!(require("l", "r", "").is_err());
    }
}
