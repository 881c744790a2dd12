//! `ExecuteStateTransaction` on the shared
//! [`StateOps::transact`](crate::dapr::StateOps::transact): here only the
//! protobuf messages (each operation an `operationType` and a `StateItem`,
//! read as `SaveState` reads its items).

use tonic::Status;

use rewire_runtime::{echoed, StateError, TransactionRequest};

use super::dapr_state::{set_request, untimed_request};
use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{check_request_metadata, transaction_operation, Call};

/// `ExecuteStateTransaction`: every operation, all or none.
pub(super) async fn execute(
    call: Call,
    req: pb::ExecuteStateTransactionRequest,
) -> Result<(), Status> {
    let store = call.state_store(&req.store_name)?;
    store.require_transactions()?;
    store.check_operation_count(req.operations.len())?;
    check_request_metadata(("state store", &req.store_name), &req.metadata)?;
    let operations = req
        .operations
        .into_iter()
        .enumerate()
        .map(|(index, operation)| {
            let item = operation.request.ok_or_else(|| {
                store.transaction_failed(StateError::Invalid(format!(
                    "an operation of type `{}` has no `request`",
                    echoed(&operation.operation_type)
                )))
            })?;
            store.check_item_metadata(index, &item.metadata)?;
            // A delete's `ttlInSeconds` is not read, as daprd's.
            let write = if operation.operation_type == "delete" {
                untimed_request(item)
            } else {
                set_request(item).map_err(|e| store.transaction_failed(e))?
            };
            transaction_operation(&operation.operation_type, write)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let request = TransactionRequest {
        operations,
        metadata: req.metadata,
    };
    Ok(store.transact(request).await?)
}
