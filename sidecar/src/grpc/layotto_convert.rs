//! Layotto's state, lock and secret messages are Dapr's under another
//! package, field for field: each is turned into Dapr's and served by the
//! Dapr handlers, so both APIs share one implementation.

use super::proto::dapr::proto::common::v1 as dapr_common;
use super::proto::dapr::proto::runtime::v1 as dapr;
use super::proto::spec::proto::runtime::v1 as layotto;

pub(super) fn get_state(req: layotto::GetStateRequest) -> dapr::GetStateRequest {
    dapr::GetStateRequest {
        store_name: req.store_name,
        key: req.key,
        consistency: req.consistency,
        metadata: req.metadata,
    }
}

pub(super) fn get_state_response(resp: dapr::GetStateResponse) -> layotto::GetStateResponse {
    layotto::GetStateResponse {
        data: resp.data,
        etag: resp.etag,
        metadata: resp.metadata,
    }
}

pub(super) fn get_bulk_state(req: layotto::GetBulkStateRequest) -> dapr::GetBulkStateRequest {
    dapr::GetBulkStateRequest {
        store_name: req.store_name,
        keys: req.keys,
        parallelism: req.parallelism,
        metadata: req.metadata,
    }
}

pub(super) fn get_bulk_state_response(
    resp: dapr::GetBulkStateResponse,
) -> layotto::GetBulkStateResponse {
    let items = resp
        .items
        .into_iter()
        .map(|item| layotto::BulkStateItem {
            key: item.key,
            data: item.data,
            etag: item.etag,
            error: item.error,
            metadata: item.metadata,
        })
        .collect();
    layotto::GetBulkStateResponse { items }
}

pub(super) fn save_state(req: layotto::SaveStateRequest) -> dapr::SaveStateRequest {
    dapr::SaveStateRequest {
        store_name: req.store_name,
        states: req.states.into_iter().map(state_item).collect(),
    }
}

pub(super) fn delete_state(req: layotto::DeleteStateRequest) -> dapr::DeleteStateRequest {
    dapr::DeleteStateRequest {
        store_name: req.store_name,
        key: req.key,
        etag: req.etag.map(etag),
        options: req.options.map(options),
        metadata: req.metadata,
    }
}

/// `DeleteBulkState` as Dapr's: the same items (key, etag, options,
/// metadata; a value is ignored).
pub(super) fn delete_bulk_state(
    req: layotto::DeleteBulkStateRequest,
) -> dapr::DeleteBulkStateRequest {
    dapr::DeleteBulkStateRequest {
        store_name: req.store_name,
        states: req.states.into_iter().map(state_item).collect(),
    }
}

pub(super) fn state_item(item: layotto::StateItem) -> dapr_common::StateItem {
    dapr_common::StateItem {
        key: item.key,
        value: item.value,
        etag: item.etag.map(etag),
        metadata: item.metadata,
        options: item.options.map(options),
    }
}

fn etag(etag: layotto::Etag) -> dapr_common::Etag {
    dapr_common::Etag { value: etag.value }
}

fn options(options: layotto::StateOptions) -> dapr_common::StateOptions {
    dapr_common::StateOptions {
        concurrency: options.concurrency,
        consistency: options.consistency,
    }
}

pub(super) fn transaction(
    req: layotto::ExecuteStateTransactionRequest,
) -> dapr::ExecuteStateTransactionRequest {
    dapr::ExecuteStateTransactionRequest {
        store_name: req.store_name,
        operations: req
            .operations
            .into_iter()
            .map(|op| dapr::TransactionalStateOperation {
                operation_type: op.operation_type,
                request: op.request.map(state_item),
            })
            .collect(),
        metadata: req.metadata,
    }
}

pub(super) fn try_lock(req: layotto::TryLockRequest) -> dapr::TryLockRequest {
    dapr::TryLockRequest {
        store_name: req.store_name,
        resource_id: req.resource_id,
        lock_owner: req.lock_owner,
        expiry_in_seconds: req.expire,
    }
}

pub(super) fn unlock(req: layotto::UnlockRequest) -> dapr::UnlockRequest {
    dapr::UnlockRequest {
        store_name: req.store_name,
        resource_id: req.resource_id,
        lock_owner: req.lock_owner,
    }
}

/// Dapr's unlock status values are Layotto's (0 success, 1 no lock, 2 held
/// by another owner).
pub(super) fn unlock_response(resp: dapr::UnlockResponse) -> layotto::UnlockResponse {
    layotto::UnlockResponse {
        status: resp.status,
    }
}

pub(super) fn get_secret(req: layotto::GetSecretRequest) -> dapr::GetSecretRequest {
    dapr::GetSecretRequest {
        store_name: req.store_name,
        key: req.key,
        metadata: req.metadata,
    }
}

pub(super) fn get_bulk_secret(req: layotto::GetBulkSecretRequest) -> dapr::GetBulkSecretRequest {
    dapr::GetBulkSecretRequest {
        store_name: req.store_name,
        metadata: req.metadata,
    }
}

pub(super) fn get_bulk_secret_response(
    resp: dapr::GetBulkSecretResponse,
) -> layotto::GetBulkSecretResponse {
    let data = resp
        .data
        .into_iter()
        .map(|(name, secret)| {
            let secrets = secret.secrets;
            (name, layotto::SecretResponse { secrets })
        })
        .collect();
    layotto::GetBulkSecretResponse { data }
}
