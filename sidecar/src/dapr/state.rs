//! Dapr's state operations: get, bulk get, save (one write or a bulk
//! write), delete. Component errors come back with secret values scrubbed.

use std::collections::HashMap;
use std::sync::Arc;

use rewire_runtime::{echoed, Kind};
use rewire_runtime::{
    BulkGetItem, DeleteRequest, GetRequest, Instance, SetRequest, StateEntry, StateError,
    StateStore,
};

use super::budget::{OverBudget, ResponseBudget};
use super::call::Call;
use super::request_limits::{check_item_count, check_item_metadata, RequestLimitError};
use super::retry_rule;

mod bulk;

/// What each item of a bulk answer takes beyond its text: its framing
/// (JSON braces, quotes and field names, protobuf tags and lengths), so a
/// bulk of empty or missing keys is counted too.
const BULK_ITEM_OVERHEAD: usize = 32;

/// Why a state operation failed (messages in Dapr's gRPC wording).
#[derive(Debug, thiserror::Error)]
pub enum StateOpError {
    /// No state store with that name in the call's generation (which
    /// holds others): Dapr's exact message (the name as [`echoed`]).
    #[error("state store {store} is not found")]
    NotFound {
        /// The store asked for.
        store: String,
        /// The sidecar's app id (Dapr's details name it).
        app_id: String,
    },
    /// The call's generation holds no state store at all (Dapr's
    /// message, which names the store asked for, as [`echoed`]).
    #[error("state store {store} is not configured")]
    NotConfigured {
        /// The store asked for.
        store: String,
        /// The sidecar's app id (Dapr's details name it).
        app_id: String,
    },
    /// A read failed.
    #[error("fail to get `{key}` from state store `{store}`: {source}")]
    Get {
        /// The store.
        store: String,
        /// The key, as [`echoed`].
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
    /// A key Dapr refuses (empty, or with its `||` separator).
    #[error("{problem} ({})", key_place(*.index, .store))]
    InvalidKey {
        /// The store.
        store: String,
        /// The key refused, as [`echoed`] (the error's details repeat it).
        key: String,
        /// The item's index in the request (`None` for a one-key request).
        index: Option<usize>,
        /// What is wrong, in Dapr's wording.
        problem: String,
    },
    /// The request is over one of the sidecar's bounds.
    #[error(transparent)]
    Limit(#[from] RequestLimitError),
    /// A bulk delete failed.
    #[error("failed deleting state in state store `{store}`: {source}")]
    BulkDelete {
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
        /// The key, as [`echoed`].
        key: String,
        /// Why (scrubbed).
        source: StateError,
    },
}

impl StateOpError {
    /// The store's own error, when the store was found.
    pub fn store_error(&self) -> Option<&StateError> {
        match self {
            Self::NotFound { .. }
            | Self::NotConfigured { .. }
            | Self::BulkTooLarge { .. }
            | Self::TransactionsNotSupported(_)
            | Self::UnsupportedOperation(_)
            | Self::TooManyOperations { .. }
            | Self::InvalidKey { .. }
            | Self::Limit(_) => None,
            Self::Get { source, .. }
            | Self::Transaction { source, .. }
            | Self::BulkGet { source, .. }
            | Self::Save { source, .. }
            | Self::BulkDelete { source, .. }
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
            // Looked at only on the way out: a found store costs nothing.
            _ if !self
                .generation()
                .iter()
                .any(|(key, _)| key.kind == Kind::State) =>
            {
                Err(StateOpError::NotConfigured {
                    store: echoed(name).into_owned(),
                    app_id: self.generation().app_id().to_string(),
                })
            }
            _ => Err(StateOpError::NotFound {
                store: echoed(name).into_owned(),
                app_id: self.generation().app_id().to_string(),
            }),
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
        self.check_single_key(&request.key)?;
        let key = echoed(&request.key).into_owned();
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
    /// whole answer (repeats included, each item with its framing) must fit
    /// `budget`, else nothing is answered ([`StateOpError::BulkTooLarge`]).
    /// Too many keys, or one with Dapr's `||` separator, is refused before
    /// any is read; an empty key is asked of the store and answered as it
    /// answers (daprd's `GetBulkState` and HTTP bulk refuse only `||`).
    /// With request `metadata`, each key is read by a get carrying it (as
    /// Dapr passes it to every get; the store's bulk read takes none).
    ///
    /// The distinct keys are read in chunks (16 keys, one store bulk read
    /// each; with `metadata` one key, one get each), the first alone, then
    /// several at once: Dapr's `parallelism` counts gets (zero or less:
    /// daprd's default of 100; at most 256), so `parallelism` gets at once
    /// with `metadata`, else `ceil(parallelism / 16)` chunks (at least 1).
    /// A further chunk starts only while the answer held plus the keys in
    /// flight, each counted as the largest item answered so far but at
    /// least 64 KiB, fits the budget (at most `limit / 64 KiB` keys in
    /// flight; large values are read one chunk at a time). The first chunk
    /// failing as a whole answers its error at once, the chunks in flight
    /// dropped; past the budget, the answers held are freed and the chunks
    /// in flight let finish, their answers dropped. A chunk a half-open
    /// breaker refuses while others are in flight is started again once
    /// one of them finishes. So a bulk of more than one chunk is not one
    /// snapshot: each chunk is read as the store reads a bulk (one snapshot
    /// on the built-in stores), but a transaction may land between two
    /// chunks. (The `bulk` module.)
    pub async fn bulk_get(
        &self,
        keys: Vec<String>,
        metadata: &HashMap<String, String>,
        parallelism: i64,
        mut budget: ResponseBudget,
    ) -> Result<Vec<BulkGetItem>, StateOpError> {
        check_item_count(("state store", self.name), keys.len())?;
        for (index, key) in keys.iter().enumerate() {
            if !key.is_empty() {
                self.check_key(index, key)?;
            }
        }
        // Each distinct key's slot (first-asked order), and each asked
        // key's slot: the one dedup structure.
        let mut slot_of: HashMap<&str, usize> = HashMap::with_capacity(keys.len());
        let mut distinct: Vec<&str> = Vec::new();
        let slots: Vec<usize> = keys
            .iter()
            .map(|key| {
                *slot_of.entry(key.as_str()).or_insert_with(|| {
                    distinct.push(key.as_str());
                    distinct.len() - 1
                })
            })
            .collect();
        let read = self
            .read_distinct(&distinct, &slot_of, metadata, parallelism, budget.limit())
            .await?;
        drop((slot_of, distinct));
        for (key, &slot) in keys.iter().zip(&slots) {
            let size = read[slot].as_ref().map_or(key.len(), item_bytes);
            self.within(&mut budget, size + BULK_ITEM_OVERHEAD)?;
        }
        Ok(keys
            .into_iter()
            .zip(slots)
            .map(|(key, slot)| match &read[slot] {
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

    /// Checks `keys` by Dapr's key rules, naming the first one refused.
    pub fn check_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(), StateOpError> {
        keys.into_iter()
            .enumerate()
            .try_for_each(|(index, key)| self.check_key(index, key))
    }

    /// Checks the own metadata of item `index` of a save or a transaction
    /// (its operation's item) against the bounds of request metadata (64
    /// entries, 16 KiB), before the item is converted.
    pub fn check_item_metadata(
        &self,
        index: usize,
        metadata: &HashMap<String, String>,
    ) -> Result<(), StateOpError> {
        Ok(check_item_metadata(
            ("state store", self.name),
            index,
            metadata,
        )?)
    }

    /// Checks the key of item `index` by Dapr's key rules.
    pub fn check_key(&self, index: usize, key: &str) -> Result<(), StateOpError> {
        match key_problem(key) {
            None => Ok(()),
            Some(problem) => Err(StateOpError::InvalidKey {
                store: self.name.to_owned(),
                key: echoed(key).into_owned(),
                index: Some(index),
                problem,
            }),
        }
    }

    /// Checks the one key of a get or delete: Dapr refuses its `||`
    /// separator there too, so a key can never reach another app's keys,
    /// a lock (`lock||{appId}||…`) or a sequencer (`sequencer|||…`) sharing
    /// the store's server. (An empty key is left to the store, as Dapr
    /// leaves it.)
    fn check_single_key(&self, key: &str) -> Result<(), StateOpError> {
        match key_problem(key) {
            Some(problem) if !key.is_empty() => Err(StateOpError::InvalidKey {
                store: self.name.to_owned(),
                key: echoed(key).into_owned(),
                index: None,
                problem,
            }),
            _ => Ok(()),
        }
    }

    fn within(&self, budget: &mut ResponseBudget, bytes: usize) -> Result<(), StateOpError> {
        budget
            .take(bytes)
            .map_err(|source| StateOpError::BulkTooLarge {
                store: self.name.to_owned(),
                source,
            })
    }

    /// Writes every item: none, one, or a bulk write (every item is
    /// written whatever became of the others, as Dapr's; the error is a
    /// stale etag if any item had one, else the first failure).
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

    /// Deletes one key (at its etag, when given; at an etag it is not
    /// retried, see `retry_rule`).
    pub async fn delete(&self, request: DeleteRequest) -> Result<(), StateOpError> {
        self.check_single_key(&request.key)?;
        let key = echoed(&request.key).into_owned();
        let retries = retry_rule::delete(std::slice::from_ref(&request));
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retries,
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

    /// Deletes every item: none, one (as [`delete`](Self::delete)), or a
    /// bulk delete (Dapr's `DeleteBulkState`: every item is deleted
    /// whatever became of the others, the error as a bulk save's). Too
    /// many items, or a key with Dapr's `||` separator, is refused before
    /// anything is deleted.
    pub async fn bulk_delete(&self, mut deletes: Vec<DeleteRequest>) -> Result<(), StateOpError> {
        check_item_count(("state store", self.name), deletes.len())?;
        for (index, delete) in deletes.iter().enumerate() {
            if !delete.key.is_empty() {
                self.check_key(index, &delete.key)?;
            }
        }
        match deletes.len() {
            0 => Ok(()),
            1 => match deletes.pop() {
                Some(delete) => self.delete(delete).await,
                None => Ok(()),
            },
            _ => {
                let retries = retry_rule::delete(&deletes);
                let store = &self.store;
                self.call
                    .guarded(
                        self.target(),
                        retries,
                        deletes,
                        |d| store.bulk_delete(d),
                        StateError::Backend,
                    )
                    .await
                    .map_err(|e| StateOpError::BulkDelete {
                        store: self.name.to_owned(),
                        source: self.scrubbed(e),
                    })
            }
        }
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

    /// `error` with every secret value the runtime knows scrubbed, and
    /// the client's key an etag error names as [`echoed`].
    pub(super) fn scrubbed(&self, error: StateError) -> StateError {
        match error {
            StateError::Invalid(m) => StateError::Invalid(self.call.scrub(&m)),
            StateError::Backend(m) => StateError::Backend(self.call.scrub(&m)),
            StateError::Unsupported(m) => StateError::Unsupported(self.call.scrub(&m)),
            StateError::EtagMismatch(key) => StateError::EtagMismatch(echoed(&key).into_owned()),
            StateError::EtagInvalid(key) => StateError::EtagInvalid(echoed(&key).into_owned()),
        }
    }
}

/// Dapr's key rules: not empty, no `||` (its key separator); what is
/// wrong with `key`, in Dapr's wording (the key as [`echoed`]), if
/// anything.
fn key_problem(key: &str) -> Option<String> {
    if key.is_empty() {
        Some("\"key\" is a required field".to_string())
    } else if key.contains("||") {
        Some(format!("input key `{}` can't contain `||`", echoed(key)))
    } else {
        None
    }
}

/// Where a refused key is, for its error: the item of a request holding
/// several, or the request's one key.
fn key_place(index: Option<usize>, store: &str) -> String {
    match index {
        Some(index) => format!("item {index} of the request to state store `{store}`"),
        None => format!("state store `{store}`"),
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
