//! Which operations a resiliency retry policy may repeat, one rule per
//! operation. A failed attempt may still have been applied by the backend,
//! so an operation is retried only when repeating it cannot change the
//! outcome (it is idempotent). A write or a delete at an etag is not
//! retried: its repeat, after an attempt applied but answered late (a
//! timeout, a lost answer), finds the etag changed (or the key gone) and
//! reports a stale etag (a 409) for a write or delete that happened; the
//! first attempt's error is answered instead. Timeouts and circuit
//! breakers apply to every operation, retried or not.
//!
//! | operation | retried |
//! |---|---|
//! | state get, bulk get, secrets, configuration get, file get/list/stat | yes: reads |
//! | state save, last-write without an etag | yes: writing the same value twice is one write |
//! | state save with an etag (one, a bulk, an upsert in a transaction) | **never**: a repeat would report a false conflict |
//! | state save, first-write without an etag | **never**: a repeat would fail on its own create |
//! | state delete without an etag, file delete, configuration save/delete | yes: idempotent |
//! | state delete with an etag (one, a bulk, in a transaction) | **never**: a repeat would report a false conflict |
//! | state transaction | when every operation is retryable by the rules above |
//! | lock keep-alive | yes: renewing twice is one renewal, for the same owner |
//! | lock try-lock, unlock | **never**: a repeat could misreport who holds the lock |
//! | sequencer next id, segment | **never**: a repeat would burn ids |
//! | pub/sub publish | **never**: a repeat is a duplicate event |
//! | file put, configuration subscribe | **never**: streamed or long-lived |

use rewire_runtime::resilience::Retries;
use rewire_runtime::{
    Concurrency, DeleteRequest, SetRequest, TransactionOperation, TransactionRequest,
};

/// Reads and idempotent operations.
pub(super) const IDEMPOTENT: Retries = Retries::Allowed;

/// Operations a repeat could change the outcome of.
pub(super) const NEVER: Retries = Retries::Never;

/// One write: last-write without an etag (writing the same value twice
/// is one write). At an etag, a repeat after an attempt applied but
/// answered late would find the etag changed and report a false conflict.
fn write_is_safe(write: &SetRequest) -> bool {
    write.concurrency == Concurrency::LastWrite && write.etag.is_none()
}

/// A save of `writes` (one or a bulk): retried when every write is safe.
pub(super) fn save(writes: &[SetRequest]) -> Retries {
    Retries::when(writes.iter().all(write_is_safe))
}

/// One delete: without an etag (deleting a key twice is one delete).
fn delete_is_safe(delete: &DeleteRequest) -> bool {
    delete.etag.is_none()
}

/// A delete of `deletes` (one or a bulk): retried when none carries an
/// etag.
pub(super) fn delete(deletes: &[DeleteRequest]) -> Retries {
    Retries::when(deletes.iter().all(delete_is_safe))
}

/// A transaction: retried when every operation is safe.
pub(super) fn transaction(request: &TransactionRequest) -> Retries {
    Retries::when(request.operations.iter().all(|operation| match operation {
        TransactionOperation::Upsert(write) => write_is_safe(write),
        TransactionOperation::Delete(delete) => delete_is_safe(delete),
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;

    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{
        Component, GetRequest, Registry, Runtime, RuntimeOptions, StateEntry, StateError,
        StateFeature, StateStore,
    };

    use super::*;
    use crate::dapr::{Call, StateOpError, StoreLabel};

    /// A state store whose first attempt at deleting a key, at saving a
    /// key at an etag, or at a transaction, is applied, then answered with
    /// a backend failure: the answer lost, as when a timeout cuts an
    /// attempt the backend applied. A new key gets etag `1`, each write
    /// of it the next number. (A save without an etag is answered at once:
    /// it is retried, and would be applied twice.)
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "state", type = "test.state.answered_late")]
    struct AnsweredLate {
        /// Each key stored, with its etag.
        etags: Mutex<HashMap<String, String>>,
        /// The keys (and transactions) already answered late once.
        late: Mutex<HashSet<String>>,
    }

    impl AnsweredLate {
        fn etags(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
            self.etags.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Whether the attempt on `what` is the first one (answered late).
        fn first_attempt(&self, what: &str) -> bool {
            let mut late = self.late.lock().unwrap_or_else(|p| p.into_inner());
            late.insert(what.to_string())
        }

        /// A stale etag, if the operation on `key` carries an `etag` that
        /// is not the key's.
        fn check(
            etags: &HashMap<String, String>,
            key: &str,
            etag: Option<&String>,
        ) -> Result<(), StateError> {
            match etag {
                Some(etag) if etags.get(key) != Some(etag) => {
                    Err(StateError::EtagMismatch(key.to_string()))
                }
                _ => Ok(()),
            }
        }

        /// Writes `key`: etag `1` when new, else the next number.
        fn write(etags: &mut HashMap<String, String>, key: String) {
            let next = etags
                .get(&key)
                .and_then(|etag| etag.parse::<u64>().ok())
                .map_or(1, |version| version + 1);
            etags.insert(key, next.to_string());
        }

        fn lost_answer() -> StateError {
            StateError::Backend("the answer was lost".into())
        }
    }

    #[async_trait]
    impl Component for AnsweredLate {}

    #[async_trait]
    impl StateStore for AnsweredLate {
        async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
            Ok(self.etags().get(&req.key).map(|etag| StateEntry {
                data: b"v".to_vec(),
                etag: etag.clone(),
                metadata: HashMap::new(),
            }))
        }

        async fn set(&self, req: SetRequest) -> Result<(), StateError> {
            let late = req.etag.is_some() && self.first_attempt(&format!("save {}", req.key));
            {
                let mut etags = self.etags();
                Self::check(&etags, &req.key, req.etag.as_ref())?;
                Self::write(&mut etags, req.key);
            }
            if late {
                return Err(Self::lost_answer());
            }
            Ok(())
        }

        async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
            {
                let mut etags = self.etags();
                Self::check(&etags, &req.key, req.etag.as_ref())?;
                etags.remove(&req.key);
            }
            if self.first_attempt(&req.key) {
                return Err(Self::lost_answer());
            }
            Ok(())
        }

        fn features(&self) -> Vec<StateFeature> {
            vec![StateFeature::Etag, StateFeature::Transactional]
        }

        async fn transact(&self, req: TransactionRequest) -> Result<(), StateError> {
            {
                let mut etags = self.etags();
                for operation in &req.operations {
                    let etag = match operation {
                        TransactionOperation::Delete(delete) => delete.etag.as_ref(),
                        TransactionOperation::Upsert(write) => write.etag.as_ref(),
                    };
                    Self::check(&etags, operation.key(), etag)?;
                }
                for operation in req.operations {
                    match operation {
                        TransactionOperation::Delete(delete) => {
                            etags.remove(&delete.key);
                        }
                        TransactionOperation::Upsert(write) => Self::write(&mut etags, write.key),
                    }
                }
            }
            if self.first_attempt("a transaction") {
                return Err(Self::lost_answer());
            }
            Ok(())
        }
    }

    /// A runtime whose state store `s` answers late, under a policy
    /// retrying a failed attempt twice.
    async fn retried_store() -> Runtime {
        let config = serde_json::json!({
            "appId": "app",
            "components": {"state": {"s": {"type": "test.state.answered_late"}}},
            "resiliency": {
                "policies": {"retries": {"twice": {
                    "policy": "constant", "duration": "1ms", "maxRetries": 2
                }}},
                "targets": {"components": {"s": {"outbound": {"retry": "twice"}}}}
            }
        });
        let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A delete of `key`, at `etag` when given.
    fn delete_of(key: &str, etag: Option<&str>) -> DeleteRequest {
        DeleteRequest {
            key: key.into(),
            etag: etag.map(str::to_string),
            ..DeleteRequest::default()
        }
    }

    /// Writes `keys` (each at etag `1`) to the store `s` of `call`.
    async fn stored(call: &Call, keys: &[&str]) {
        let writes = keys
            .iter()
            .map(|key| SetRequest {
                key: (*key).into(),
                value: b"v".to_vec(),
                ..SetRequest::default()
            })
            .collect();
        let store = call.state_store("s").unwrap_or_else(|e| panic!("{e}"));
        store.save(writes).await.unwrap_or_else(|e| panic!("{e}"));
    }

    /// The store's own error of `result`, if it failed.
    fn store_error(result: Result<(), StateOpError>) -> Option<StateError> {
        result.err().and_then(|e| e.store_error().cloned())
    }

    /// A delete at an etag (one, a bulk, in a transaction) whose attempt
    /// was applied but answered late is not retried: the caller gets the
    /// first attempt's error, never a stale etag (a 409) for a delete that
    /// happened (failed before the fix: retried, the repeat found the key
    /// gone and answered `EtagMismatch`).
    #[tokio::test]
    async fn a_delete_at_an_etag_answered_late_is_not_retried_into_a_false_conflict() {
        let runtime = retried_store().await;
        let call = Call::new(&runtime, StoreLabel::default());
        stored(&call, &["one", "a", "b", "t"]).await;
        let store = call.state_store("s").unwrap_or_else(|e| panic!("{e}"));
        let lost = Some(AnsweredLate::lost_answer());

        let one = store.delete(delete_of("one", Some("1"))).await;
        assert_eq!(store_error(one), lost, "one delete");
        let bulk = vec![delete_of("a", Some("1")), delete_of("b", Some("1"))];
        assert_eq!(store_error(store.bulk_delete(bulk).await), lost, "bulk");
        let transaction = TransactionRequest {
            operations: vec![TransactionOperation::Delete(delete_of("t", Some("1")))],
            ..TransactionRequest::default()
        };
        assert_eq!(
            store_error(store.transact(transaction).await),
            lost,
            "transaction"
        );
        runtime.shutdown().await;
    }

    /// A delete without an etag is still retried: its repeat finds the
    /// key gone and succeeds, as the delete did.
    #[tokio::test]
    async fn a_delete_without_an_etag_answered_late_is_retried_and_succeeds() {
        let runtime = retried_store().await;
        let call = Call::new(&runtime, StoreLabel::default());
        stored(&call, &["one", "a", "b"]).await;
        let store = call.state_store("s").unwrap_or_else(|e| panic!("{e}"));
        store
            .delete(delete_of("one", None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store
            .bulk_delete(vec![delete_of("a", None), delete_of("b", None)])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        runtime.shutdown().await;
    }

    /// A write of `key` (last-write), at `etag` when given.
    fn write_of(key: &str, etag: Option<&str>) -> SetRequest {
        SetRequest {
            key: key.into(),
            value: b"w".to_vec(),
            etag: etag.map(str::to_string),
            ..SetRequest::default()
        }
    }

    /// A save at an etag (one, a bulk, an upsert in a transaction) whose
    /// attempt was applied but answered late is not retried: the caller
    /// gets the first attempt's error, never a stale etag (a 409) for a
    /// write that happened (failed before the fix: retried, the repeat
    /// found the etag changed and answered `EtagMismatch`).
    #[tokio::test]
    async fn a_save_at_an_etag_answered_late_is_not_retried_into_a_false_conflict() {
        let runtime = retried_store().await;
        let call = Call::new(&runtime, StoreLabel::default());
        stored(&call, &["one", "a", "b", "t"]).await;
        let store = call.state_store("s").unwrap_or_else(|e| panic!("{e}"));
        let lost = Some(AnsweredLate::lost_answer());

        let one = store.save(vec![write_of("one", Some("1"))]).await;
        assert_eq!(store_error(one), lost, "one save");
        let bulk = vec![write_of("a", Some("1")), write_of("b", Some("1"))];
        assert_eq!(store_error(store.save(bulk).await), lost, "bulk");
        let transaction = TransactionRequest {
            operations: vec![TransactionOperation::Upsert(write_of("t", Some("1")))],
            ..TransactionRequest::default()
        };
        assert_eq!(
            store_error(store.transact(transaction).await),
            lost,
            "transaction"
        );
        runtime.shutdown().await;
    }

    #[test]
    fn a_delete_at_an_etag_is_never_retried() {
        let plain = delete_of("k", None);
        let guarded = delete_of("k", Some("1"));
        assert_eq!(delete(std::slice::from_ref(&plain)), Retries::Allowed);
        assert_eq!(delete(std::slice::from_ref(&guarded)), Retries::Never);
        assert_eq!(delete(&[plain.clone(), guarded.clone()]), Retries::Never);
        let transaction = |delete: DeleteRequest| TransactionRequest {
            operations: vec![TransactionOperation::Delete(delete)],
            ..TransactionRequest::default()
        };
        assert_eq!(super::transaction(&transaction(plain)), Retries::Allowed);
        assert_eq!(super::transaction(&transaction(guarded)), Retries::Never);
    }

    /// Only a last-write save without an etag is retried: a first-write
    /// without an etag would fail on its own create, a save at an etag
    /// (last- or first-write) would report a false conflict.
    #[test]
    fn only_a_last_write_save_without_an_etag_is_retried() {
        let last = SetRequest::default();
        let first = SetRequest {
            concurrency: Concurrency::FirstWrite,
            ..SetRequest::default()
        };
        let first_guarded = SetRequest {
            etag: Some("1".into()),
            ..first.clone()
        };
        let last_guarded = SetRequest {
            etag: Some("1".into()),
            ..last.clone()
        };
        assert_eq!(save(std::slice::from_ref(&last)), Retries::Allowed);
        assert_eq!(save(std::slice::from_ref(&first_guarded)), Retries::Never);
        assert_eq!(save(std::slice::from_ref(&last_guarded)), Retries::Never);
        assert_eq!(save(std::slice::from_ref(&first)), Retries::Never);
        assert_eq!(save(&[last.clone(), first.clone()]), Retries::Never);
        assert_eq!(save(&[last.clone(), last_guarded.clone()]), Retries::Never);
        let transaction = |write: SetRequest| TransactionRequest {
            operations: vec![TransactionOperation::Upsert(write)],
            ..TransactionRequest::default()
        };
        assert_eq!(super::transaction(&transaction(last)), Retries::Allowed);
        for unsafe_write in [first_guarded, last_guarded, first] {
            assert_eq!(
                super::transaction(&transaction(unsafe_write)),
                Retries::Never
            );
        }
    }
}
