//! Dapr's state transactions (`ExecuteStateTransaction`, `POST
//! /v1.0/state/{store}/transaction`), once for both transports: the
//! operation types, Dapr's key rules, the bound on operations, and the
//! store's all-or-nothing [`transact`](rewire_runtime::StateStore::transact)
//! on a store that reports [`StateFeature::Transactional`].

use rewire_runtime::{
    echoed, DeleteRequest, SetRequest, StateError, StateFeature, TransactionOperation,
    TransactionRequest,
};

use super::retry_rule;
use super::state::{StateOpError, StateOps};

/// Most operations one transaction may hold (its body is bounded by
/// `max_request_bytes` too).
pub const MAX_TRANSACTION_OPERATIONS: usize = 1_000;

/// One operation as Dapr's APIs carry it: `operation_type` (`upsert` or
/// `delete`) and a state item; a delete uses the item's key, etag,
/// concurrency and metadata. Another type is refused, quoted as
/// [`echoed`].
pub fn transaction_operation(
    operation_type: &str,
    item: SetRequest,
) -> Result<TransactionOperation, StateOpError> {
    match operation_type {
        "upsert" => Ok(TransactionOperation::Upsert(item)),
        "delete" => Ok(TransactionOperation::Delete(DeleteRequest {
            key: item.key,
            etag: item.etag,
            concurrency: item.concurrency,
            consistency: item.consistency,
            metadata: item.metadata,
        })),
        other => Err(StateOpError::UnsupportedOperation(
            echoed(other).into_owned(),
        )),
    }
}

impl StateOps<'_> {
    /// Whether the store takes transactions; else Dapr's "doesn't support
    /// transactions" (checked before the request is read, as Dapr does).
    pub fn require_transactions(&self) -> Result<(), StateOpError> {
        if self
            .store()
            .features()
            .contains(&StateFeature::Transactional)
        {
            Ok(())
        } else {
            Err(StateOpError::TransactionsNotSupported(
                self.name().to_string(),
            ))
        }
    }

    /// Whether a transaction of `count` operations is within
    /// [`MAX_TRANSACTION_OPERATIONS`]: checked on the count the request
    /// carries, before any operation is converted.
    pub fn check_operation_count(&self, count: usize) -> Result<(), StateOpError> {
        if count > MAX_TRANSACTION_OPERATIONS {
            return Err(StateOpError::TooManyOperations {
                store: self.name().to_string(),
                count,
                max: MAX_TRANSACTION_OPERATIONS,
            });
        }
        Ok(())
    }

    /// Applies `request` all or none; an empty transaction succeeds.
    pub async fn transact(&self, request: TransactionRequest) -> Result<(), StateOpError> {
        self.require_transactions()?;
        let count = request.operations.len();
        self.check_operation_count(count)?;
        if count == 0 {
            return Ok(());
        }
        // Dapr's separator first, in every key (its `GetModifiedStateKey`
        // on each operation before `Multi`): its illegal key, whatever
        // other key is empty.
        for (index, operation) in request.operations.iter().enumerate() {
            let key = operation.key();
            if !key.is_empty() {
                self.check_key(index, key)?;
            }
        }
        if request.operations.iter().any(|o| o.key().is_empty()) {
            // Dapr leaves it to the store, which fails the transaction.
            return Err(self.transaction_failed(StateError::Invalid("a key is empty".into())));
        }
        let retries = retry_rule::transaction(&request);
        let store = self.store();
        let done = self
            .call()
            .guarded(
                self.target(),
                retries,
                request,
                |r| store.transact(r),
                StateError::Backend,
            )
            .await;
        match done {
            Err(StateError::Unsupported(_)) => Err(StateOpError::TransactionsNotSupported(
                self.name().to_string(),
            )),
            result => result.map_err(|e| self.transaction_failed(e)),
        }
    }

    /// A transaction of this store that failed with `source` (also for
    /// operations the adapter found invalid before sending any).
    pub fn transaction_failed(&self, source: StateError) -> StateOpError {
        StateOpError::Transaction {
            store: self.name().to_string(),
            source: self.scrubbed(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_types_follow_dapr() {
        let item = SetRequest {
            key: "k".into(),
            etag: Some("3".into()),
            ..SetRequest::default()
        };
        assert!(matches!(
            transaction_operation("upsert", item.clone()),
            Ok(TransactionOperation::Upsert(set)) if set.key == "k"
        ));
        assert!(matches!(
            transaction_operation("delete", item.clone()),
            Ok(TransactionOperation::Delete(d)) if d.etag.as_deref() == Some("3")
        ));
        let err = transaction_operation("merge", item)
            .err()
            .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("operation type merge not supported"));
    }
}
