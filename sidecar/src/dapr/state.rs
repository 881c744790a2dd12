//! Dapr's state operations: get, bulk get, save (one write or a bulk
//! write), delete. Component errors come back with secret values scrubbed.

use std::sync::Arc;

use rewire_runtime::Kind;
use rewire_runtime::{
    BulkGetItem, DeleteRequest, GetRequest, Instance, SetRequest, StateEntry, StateError,
    StateStore,
};

use super::budget::{OverBudget, ResponseBudget};
use super::call::Call;
use super::retry_rule;

/// Keys read from the store at once in a bulk get: the answer is counted
/// after each chunk, so a bulk of large values stops near the limit.
const BULK_CHUNK: usize = 16;

/// Why a state operation failed (messages in Dapr's gRPC wording).
#[derive(Debug, thiserror::Error)]
pub enum StateOpError {
    /// No state store with that name in the call's generation.
    #[error("state store `{0}` is not found")]
    NotFound(String),
    /// A read failed.
    #[error("fail to get `{key}` from state store `{store}`: {source}")]
    Get {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// Why (scrubbed).
        source: StateError,
    },
    /// A bulk read failed as a whole.
    #[error("failed getting bulk state from state store `{store}`: {source}")]
    BulkGet {
        /// The store.
        store: String,
        /// Why (scrubbed).
        source: StateError,
    },
    /// A bulk answer would be larger than the response limit.
    #[error("bulk state answer from state store `{store}` refused: {source}; ask for fewer keys")]
    BulkTooLarge {
        /// The store.
        store: String,
        /// The limit exceeded.
        source: OverBudget,
    },
    /// A save failed (or one of its items is invalid).
    #[error("failed saving state in state store `{store}`: {source}")]
    Save {
        /// The store.
        store: String,
        /// Why (scrubbed).
        source: StateError,
    },
    /// The store does not take transactions.
    #[error("state store `{0}` doesn't support transactions")]
    TransactionsNotSupported(String),
    /// A transaction names an operation type other than `upsert` and
    /// `delete`.
    #[error("operation type {0} not supported")]
    UnsupportedOperation(String),
    /// A transaction holds more operations than allowed.
    #[error("the transaction contains {count} operations, which is more than what the state store `{store}` supports: {max}")]
    TooManyOperations {
        /// The store.
        store: String,
        /// Operations sent.
        count: usize,
        /// Operations allowed.
        max: usize,
    },
    /// A transaction failed as a whole (nothing of it was applied).
    #[error("error while executing state transaction in state store `{store}`: {source}")]
    Transaction {
        /// The store.
        store: String,
        /// Why (scrubbed).
        source: StateError,
    },
    /// A delete failed.
    #[error("failed deleting state with key `{key}` from state store `{store}`: {source}")]
    Delete {
        /// The store.
        store: String,
        /// The key.
        key: String,
        /// Why (scrubbed).
        source: StateError,
    },
}

impl StateOpError {
    /// The store's own error, when the store was found.
    pub fn store_error(&self) -> Option<&StateError> {
        match self {
            Self::NotFound(_)
            | Self::BulkTooLarge { .. }
            | Self::TransactionsNotSupported(_)
            | Self::UnsupportedOperation(_)
            | Self::TooManyOperations { .. } => None,
            Self::Get { source, .. }
            | Self::Transaction { source, .. }
            | Self::BulkGet { source, .. }
            | Self::Save { source, .. }
            | Self::Delete { source, .. } => Some(source),
        }
    }
}

impl Call {
    /// The state store `name` of the call's generation.
    pub fn state_store<'n>(&self, name: &'n str) -> Result<StateOps<'n>, StateOpError> {
        match self.instance(Kind::State, name) {
            Some(Instance::State(store)) => Ok(StateOps {
                name,
                store: store.clone(),
                call: self.clone(),
            }),
            _ => Err(StateOpError::NotFound(name.to_string())),
        }
    }
}

/// Dapr's state operations on one store of a call's generation.
pub struct StateOps<'n> {
    /// The store's name, as the caller gave it (errors name it).
    name: &'n str,
    store: Arc<dyn StateStore>,
    call: Call,
}

impl StateOps<'_> {
    /// The value and etag of one key (`None` when absent).
    pub async fn get(&self, request: GetRequest) -> Result<Option<StateEntry>, StateOpError> {
        let key = request.key.clone();
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.get(r),
                StateError::Backend,
            )
            .await
            .map_err(|e| StateOpError::Get {
                store: self.name.to_owned(),
                key,
                source: self.scrubbed(e),
            })
    }

    /// Every key asked for, each with its entry or its own (scrubbed)
    /// error, in the order asked. A key asked for twice is read once; the
    /// whole answer (repeats included) must fit `budget`, else nothing is
    /// answered ([`StateOpError::BulkTooLarge`]).
    pub async fn bulk_get(
        &self,
        keys: Vec<String>,
        mut budget: ResponseBudget,
    ) -> Result<Vec<BulkGetItem>, StateOpError> {
        let mut unique: Vec<String> = keys.clone();
        let mut seen = std::collections::HashSet::new();
        unique.retain(|k| seen.insert(k.clone()));
        let mut read = std::collections::HashMap::with_capacity(unique.len());
        let mut sizes = std::collections::HashMap::with_capacity(unique.len());
        // What is held while reading, each key once.
        let mut held = ResponseBudget::new(budget.limit());
        for chunk in unique.chunks(BULK_CHUNK) {
            let store = &self.store;
            let items = self
                .call
                .guarded(
                    self.target(),
                    retry_rule::IDEMPOTENT,
                    chunk.to_vec(),
                    |keys| store.bulk_get(keys),
                    StateError::Backend,
                )
                .await
                .map_err(|e| StateOpError::BulkGet {
                    store: self.name.to_owned(),
                    source: self.scrubbed(e),
                })?;
            for item in items {
                let size = item_bytes(&item);
                self.within(&mut held, size)?;
                sizes.insert(item.key.clone(), size);
                read.insert(item.key.clone(), item);
            }
        }
        for key in &keys {
            let size = sizes.get(key).copied().unwrap_or(key.len());
            self.within(&mut budget, size)?;
        }
        Ok(keys
            .into_iter()
            .map(|key| match read.get(&key) {
                Some(item) => BulkGetItem {
                    key,
                    entry: item.entry.clone(),
                    error: item.error.as_ref().map(|e| self.call.scrub(e)),
                },
                None => BulkGetItem {
                    key,
                    entry: None,
                    error: None,
                },
            })
            .collect())
    }

    fn within(&self, budget: &mut ResponseBudget, bytes: usize) -> Result<(), StateOpError> {
        budget
            .take(bytes)
            .map_err(|source| StateOpError::BulkTooLarge {
                store: self.name.to_owned(),
                source,
            })
    }

    /// Writes every item: none, one, or a bulk write.
    pub async fn save(&self, mut writes: Vec<SetRequest>) -> Result<(), StateOpError> {
        let retries = retry_rule::save(&writes);
        let store = &self.store;
        let result = match writes.len() {
            0 => Ok(()),
            1 => match writes.pop() {
                Some(write) => {
                    self.call
                        .guarded(
                            self.target(),
                            retries,
                            write,
                            |w| store.set(w),
                            StateError::Backend,
                        )
                        .await
                }
                None => Ok(()),
            },
            _ => {
                self.call
                    .guarded(
                        self.target(),
                        retries,
                        writes,
                        |w| store.bulk_set(w),
                        StateError::Backend,
                    )
                    .await
            }
        };
        result.map_err(|e| self.save_error(e))
    }

    /// A save of this store that failed with `source` (also for items the
    /// adapter found invalid before writing).
    pub fn save_error(&self, source: StateError) -> StateOpError {
        StateOpError::Save {
            store: self.name.to_owned(),
            source: self.scrubbed(source),
        }
    }

    /// Deletes one key (at its etag, when given).
    pub async fn delete(&self, request: DeleteRequest) -> Result<(), StateOpError> {
        let key = request.key.clone();
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                request,
                |r| store.delete(r),
                StateError::Backend,
            )
            .await
            .map_err(|e| StateOpError::Delete {
                store: self.name.to_owned(),
                key,
                source: self.scrubbed(e),
            })
    }

    /// The store as a resiliency target.
    pub(super) fn target(&self) -> (Kind, &str) {
        (Kind::State, self.name)
    }

    /// The store's name in the call's generation.
    pub(super) fn name(&self) -> &str {
        self.name
    }

    /// The call the store was found by.
    pub(super) fn call(&self) -> &Call {
        &self.call
    }

    /// The store itself.
    pub(super) fn store(&self) -> &dyn StateStore {
        self.store.as_ref()
    }

    /// `error` with every secret value the runtime knows scrubbed.
    pub(super) fn scrubbed(&self, error: StateError) -> StateError {
        match error {
            StateError::Invalid(m) => StateError::Invalid(self.call.scrub(&m)),
            StateError::Backend(m) => StateError::Backend(self.call.scrub(&m)),
            StateError::Unsupported(m) => StateError::Unsupported(self.call.scrub(&m)),
            other => other,
        }
    }
}

/// What one bulk item adds to an answer, in bytes (its key, value, etag,
/// metadata and error).
fn item_bytes(item: &BulkGetItem) -> usize {
    let entry = item.entry.as_ref().map_or(0, |e| {
        e.data.len()
            + e.etag.len()
            + e.metadata
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    });
    item.key.len() + entry + item.error.as_ref().map_or(0, String::len)
}
