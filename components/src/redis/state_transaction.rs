//! Transactions of the `redis` state store: one Lua script
//! ([`scripts::TRANSACTION`]) over every key of the transaction checks
//! every etag, then writes, so Redis runs it atomically: no reader sees
//! part of it, and a failed etag changes no key.
//!
//! All keys are sent to one server; a Redis Cluster would need them in one
//! hash slot (a `{tag}` in every key), as Dapr's `state.redis` requires.

use rewire_runtime::{Concurrency, StateError, TransactionOperation, TransactionRequest};
use tracing::debug;

use super::scripts;
use super::state::{etag_arg, ttl_arg, RedisStateStore};

/// Runs `req` on `store` as one script.
pub(super) async fn execute(
    store: &RedisStateStore,
    req: TransactionRequest,
) -> Result<(), StateError> {
    if req.operations.is_empty() {
        return Ok(());
    }
    let (session, mut conn) = store.session()?;
    let default_ttl = session.metadata().ttl_in_seconds;
    let mut invocation = scripts::TRANSACTION.prepare_invoke();
    for operation in &req.operations {
        let key = operation.key();
        if key.is_empty() {
            return Err(StateError::Invalid("the key is empty".into()));
        }
        invocation.key(session.key(key));
        match operation {
            TransactionOperation::Upsert(set) => {
                let etag = etag_arg(key, set.etag.as_deref())?;
                let first_write = match (set.concurrency, etag.is_empty()) {
                    (Concurrency::FirstWrite, true) => "1",
                    _ => "0",
                };
                let ttl_ms = ttl_arg(key, set.ttl, &set.metadata, default_ttl)?;
                invocation
                    .arg("s")
                    .arg(etag)
                    .arg(first_write)
                    .arg(&set.value)
                    .arg(ttl_ms);
            }
            TransactionOperation::Delete(delete) => {
                let etag = etag_arg(key, delete.etag.as_deref())?;
                invocation.arg("d").arg(etag).arg("0").arg("").arg(0);
            }
        }
    }
    let failed: i64 = invocation
        .invoke_async(&mut conn)
        .await
        .map_err(|err| store.backend_error(&session, &err))?;
    let failed_key = usize::try_from(failed)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|index| req.operations.get(index))
        .map(TransactionOperation::key);
    match (failed, failed_key) {
        (0, _) => {
            debug!(
                operations = req.operations.len(),
                "State transaction applied."
            );
            Ok(())
        }
        (_, Some(key)) => Err(StateError::EtagMismatch(key.to_string())),
        (other, None) => Err(StateError::Backend(format!(
            "the transaction script answered {other} for {} operations",
            req.operations.len()
        ))),
    }
}
