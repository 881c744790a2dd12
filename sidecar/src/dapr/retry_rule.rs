//! Which operations a resiliency retry policy may repeat, one rule per
//! operation. A failed attempt may still have been applied by the backend,
//! so an operation is retried only when repeating it cannot change the
//! outcome (it is idempotent), or when the caller's etag makes a repeat
//! fail visibly instead of overwriting. Timeouts and circuit breakers apply
//! to every operation, retried or not.
//!
//! | operation | retried |
//! |---|---|
//! | state get, bulk get, secrets, configuration get, file get/list/stat | yes: reads |
//! | state save, last-write | yes: writing the same value twice is one write |
//! | state save, first-write with an etag | yes: the etag guards it |
//! | state save, first-write without an etag | **never**: a repeat would fail on its own create |
//! | state delete, file delete, configuration save/delete | yes: idempotent |
//! | state transaction | when every operation is retryable by the rules above |
//! | lock keep-alive | yes: renewing twice is one renewal, for the same owner |
//! | lock try-lock, unlock | **never**: a repeat could misreport who holds the lock |
//! | sequencer next id, segment | **never**: a repeat would burn ids |
//! | pub/sub publish | **never**: a repeat is a duplicate event |
//! | file put, configuration subscribe | **never**: streamed or long-lived |

use rewire_runtime::resilience::Retries;
use rewire_runtime::{Concurrency, SetRequest, TransactionOperation, TransactionRequest};

/// Reads and idempotent operations.
pub(super) const IDEMPOTENT: Retries = Retries::Allowed;

/// Operations a repeat could change the outcome of.
pub(super) const NEVER: Retries = Retries::Never;

/// One write: last-write, or guarded by an etag.
fn write_is_safe(write: &SetRequest) -> bool {
    write.concurrency == Concurrency::LastWrite || write.etag.is_some()
}

/// A save of `writes` (one or a bulk): retried when every write is safe.
pub(super) fn save(writes: &[SetRequest]) -> Retries {
    Retries::when(writes.iter().all(write_is_safe))
}

/// A transaction: retried when every operation is safe.
pub(super) fn transaction(request: &TransactionRequest) -> Retries {
    Retries::when(request.operations.iter().all(|operation| match operation {
        TransactionOperation::Upsert(write) => write_is_safe(write),
        TransactionOperation::Delete(_) => true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_write_without_an_etag_is_never_retried() {
        let last = SetRequest::default();
        let first = SetRequest {
            concurrency: Concurrency::FirstWrite,
            ..SetRequest::default()
        };
        let guarded = SetRequest {
            etag: Some("1".into()),
            ..first.clone()
        };
        assert_eq!(save(std::slice::from_ref(&last)), Retries::Allowed);
        assert_eq!(save(std::slice::from_ref(&guarded)), Retries::Allowed);
        assert_eq!(save(std::slice::from_ref(&first)), Retries::Never);
        assert_eq!(save(&[last.clone(), first.clone()]), Retries::Never);
        let transaction = |write: SetRequest| TransactionRequest {
            operations: vec![TransactionOperation::Upsert(write)],
            ..TransactionRequest::default()
        };
        assert_eq!(super::transaction(&transaction(guarded)), Retries::Allowed);
        assert_eq!(super::transaction(&transaction(first)), Retries::Never);
    }
}
