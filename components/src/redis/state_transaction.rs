//! Transactions of the `redis` state store: one Lua script
//! ([`scripts::TRANSACTION`]) over every key of the transaction checks
//! every etag, then writes, so Redis runs it atomically: no reader sees
//! part of it, and a failed etag changes no key.
//!
//! On a Redis Cluster (`redisType: cluster`) a script runs on one node, so
//! every key of a transaction must be in one hash slot: keys that share a
//! hash tag (`{order-1}:items`, `{order-1}:total`: only the part in braces
//! is hashed), as Dapr documents for `state.redis`. A transaction whose
//! keys span slots is refused before anything is sent, naming the
//! component and two keys that differ.

use rewire_runtime::{Concurrency, StateError, TransactionOperation, TransactionRequest};
use tracing::debug;

use super::any_connection::slot_of;
use super::connection::RedisConnection;
use super::scripts;
use super::state_args::{etag_arg, ttl_arg};
use super::state_keys::Naming;

/// Runs `req` on the state store's `connection` as one script, each key
/// stored behind the base `naming` gives (Dapr's `{appId}||` by default).
pub(super) async fn execute(
    connection: &RedisConnection,
    naming: &Naming,
    req: TransactionRequest,
) -> Result<(), StateError> {
    if req.operations.is_empty() {
        return Ok(());
    }
    let session = connection.session();
    let mut conn = session
        .connection()
        .map_err(|err| StateError::Backend(err.to_string()))?;
    let base = naming.key_base(&session.metadata().key_prefix);
    if conn.is_cluster() {
        refuse_cross_slot(connection.label(), &req, |key| format!("{base}{key}"))?;
    }
    let default_ttl = session.metadata().ttl_in_seconds;
    let mut invocation = scripts::TRANSACTION.prepare_invoke();
    for operation in &req.operations {
        let key = operation.key();
        if key.is_empty() {
            return Err(StateError::Invalid("the key is empty".into()));
        }
        invocation.key(format!("{base}{key}"));
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
        .map_err(|err| StateError::Backend(connection.describe(&session, &err)))?;
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

/// On a cluster: an error unless every key of `req` (as stored, through
/// `stored`) hashes to one slot.
fn refuse_cross_slot(
    component: &str,
    req: &TransactionRequest,
    stored: impl Fn(&str) -> String,
) -> Result<(), StateError> {
    let mut keys = req.operations.iter().map(TransactionOperation::key);
    let Some(first) = keys.next() else {
        return Ok(());
    };
    let slot = slot_of(&stored(first));
    match keys.find(|key| slot_of(&stored(key)) != slot) {
        None => Ok(()),
        Some(other) => Err(StateError::Invalid(format!(
            "{component} (`redisType: cluster`): the keys of a transaction must share one hash \
             slot, and `{first}` and `{other}` do not; give every key of the transaction the \
             same hash tag, as `{{order-1}}:items` and `{{order-1}}:total`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::{DeleteRequest, SetRequest};

    fn transaction(keys: &[&str]) -> TransactionRequest {
        TransactionRequest {
            operations: keys
                .iter()
                .enumerate()
                .map(|(i, key)| match i % 2 {
                    0 => TransactionOperation::Upsert(SetRequest {
                        key: key.to_string(),
                        ..SetRequest::default()
                    }),
                    _ => TransactionOperation::Delete(DeleteRequest {
                        key: key.to_string(),
                        ..DeleteRequest::default()
                    }),
                })
                .collect(),
            ..TransactionRequest::default()
        }
    }

    #[test]
    fn keys_of_one_hash_tag_pass_others_are_refused() {
        let stored = |key: &str| format!("shop||{key}");
        let same = transaction(&["{order-1}:items", "{order-1}:total", "{order-1}"]);
        assert_eq!(refuse_cross_slot("state/orders", &same, stored), Ok(()));
        let spread = transaction(&["order-1", "order-2", "order-3", "order-4"]);
        let err = refuse_cross_slot("state/orders", &spread, stored);
        assert!(
            matches!(&err, Err(StateError::Invalid(m)) if m.contains("state/orders") && m.contains("hash tag")),
            "{err:?}"
        );
    }
}
