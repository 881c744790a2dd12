//! Dapr's state operations: get, bulk get, save (one write or a bulk
//! write), delete. Component errors come back with secret values scrubbed.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::stream::{self, StreamExt};
use rewire_runtime::{echoed, Kind};
use rewire_runtime::{
    BulkGetItem, DeleteRequest, GetRequest, Instance, SetRequest, StateEntry, StateError,
    StateStore,
};

use super::budget::{OverBudget, ResponseBudget};
use super::call::Call;
use super::request_limits::{check_item_count, check_item_metadata, RequestLimitError};
use super::retry_rule;

/// Keys read from the store in one call of a bulk get (one chunk): the
/// answer is counted as each chunk comes back, so a bulk of large values
/// stops near the limit instead of being read whole first.
const BULK_CHUNK: usize = 16;

/// Chunks of a bulk get read at once when the client gives no
/// `parallelism` (or zero or less, which Dapr's limiter also reads as its
/// default): 8 chunks, 128 keys in flight, about daprd's default of 100
/// gets at once. A bulk of 1,000 keys on a backend answering each call in
/// 1 s then takes about 8 s, not 63.
const DEFAULT_BULK_CHUNKS_IN_FLIGHT: usize = 8;

/// Most chunks of a bulk get read at once, whatever `parallelism` the
/// client asks: what a bulk refused for its size may have read past the
/// limit before the refusal is at most this many chunks (256 keys).
const MAX_BULK_CHUNKS_IN_FLIGHT: usize = 16;

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
    /// The distinct keys are read in chunks of 16 (`BULK_CHUNK`: one store
    /// bulk read each, or as many gets with `metadata`), `parallelism`
    /// chunks at once (Dapr's field, counted here in chunks: zero or less
    /// is the default of 8, `DEFAULT_BULK_CHUNKS_IN_FLIGHT`, and at most
    /// 16 are read at once, `MAX_BULK_CHUNKS_IN_FLIGHT`); what comes back is counted as each
    /// chunk arrives, and the first chunk over the budget (or failing as a
    /// whole) ends the read, the chunks still in flight dropped. So a bulk
    /// of more than one chunk is not one snapshot: each chunk is read as
    /// the store reads a bulk (one snapshot on the built-in stores), but
    /// a transaction may land between two chunks.
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
        let mut read: Vec<Option<BulkGetItem>> = vec![None; distinct.len()];
        {
            // What is held while reading, each key once.
            let mut held = ResponseBudget::new(budget.limit());
            // Each chunk's read, not started until the stream polls it
            // (collected first: a lazy map over the borrowed chunks would
            // not be `Send` across the awaits below).
            let reads: Vec<_> = distinct
                .chunks(BULK_CHUNK)
                .map(|chunk| {
                    self.read_chunk(chunk.iter().map(|k| (*k).to_owned()).collect(), metadata)
                })
                .collect();
            let mut answers = stream::iter(reads).buffer_unordered(chunks_in_flight(parallelism));
            while let Some(items) = answers.next().await {
                for item in items? {
                    let Some(&slot) = slot_of.get(item.key.as_str()) else {
                        continue; // A key not asked for.
                    };
                    self.within(&mut held, item_bytes(&item))?;
                    read[slot] = Some(item);
                }
            }
        }
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

    /// One chunk of a bulk get: the store's bulk read of `keys`, or with
    /// request `metadata` a get of each carrying it.
    async fn read_chunk(
        &self,
        keys: Vec<String>,
        metadata: &HashMap<String, String>,
    ) -> Result<Vec<BulkGetItem>, StateOpError> {
        if !metadata.is_empty() {
            return Ok(self.get_each(keys, metadata).await);
        }
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                keys,
                |keys| store.bulk_get(keys),
                StateError::Backend,
            )
            .await
            .map_err(|e| StateOpError::BulkGet {
                store: self.name.to_owned(),
                source: self.scrubbed(e),
            })
    }

    /// Each of `keys` read by its own get carrying `metadata`, at once;
    /// a failed get is that key's error (as in a bulk answer).
    async fn get_each(
        &self,
        keys: Vec<String>,
        metadata: &HashMap<String, String>,
    ) -> Vec<BulkGetItem> {
        let store = &self.store;
        let reads = keys.into_iter().map(|key| async move {
            let request = GetRequest {
                key: key.clone(),
                metadata: metadata.clone(),
            };
            let read = self
                .call
                .guarded(
                    self.target(),
                    retry_rule::IDEMPOTENT,
                    request,
                    |r| store.get(r),
                    StateError::Backend,
                )
                .await;
            match read {
                Ok(entry) => BulkGetItem {
                    key,
                    entry,
                    error: None,
                },
                Err(error) => BulkGetItem {
                    key,
                    entry: None,
                    error: Some(error.to_string()),
                },
            }
        });
        futures_util::future::join_all(reads).await
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

/// Chunks of a bulk get read at once for Dapr's `parallelism` (zero or
/// less: the default), within [`MAX_BULK_CHUNKS_IN_FLIGHT`].
fn chunks_in_flight(parallelism: i64) -> usize {
    match usize::try_from(parallelism) {
        Ok(0) | Err(_) => DEFAULT_BULK_CHUNKS_IN_FLIGHT,
        Ok(asked) => asked.min(MAX_BULK_CHUNKS_IN_FLIGHT),
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use rewire_runtime::config::{parse, validate};
    use rewire_runtime::prelude::async_trait;
    use rewire_runtime::{Component, Registry, Runtime, RuntimeOptions};

    use super::*;
    use crate::dapr::StoreLabel;

    /// Bulk reads a [`SlowBulk`] is running now, and the most at once.
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    static MOST_RUNNING: AtomicUsize = AtomicUsize::new(0);
    /// Bulk reads a [`SlowBulk`] was asked for.
    static ASKED: AtomicUsize = AtomicUsize::new(0);

    /// A state store whose bulk read takes a second (less for later
    /// keys, so chunks come back out of order), answering each key with
    /// 1 KiB: its own name, then padding. It counts its bulk reads, and
    /// the most running at once. It reports transactions (never applying
    /// one): the request checks of `http::state` and `grpc::dapr_state`
    /// use it as their store.
    #[derive(rewire_runtime::Component, Default)]
    #[component(kind = "state", type = "test.dapr.slow_bulk")]
    struct SlowBulk {}

    #[async_trait]
    impl Component for SlowBulk {}

    #[async_trait]
    impl StateStore for SlowBulk {
        async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
            Ok(Some(value_of(&req.key)))
        }

        async fn set(&self, _: SetRequest) -> Result<(), StateError> {
            Ok(())
        }

        async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
            Ok(())
        }

        fn features(&self) -> Vec<rewire_runtime::StateFeature> {
            vec![rewire_runtime::StateFeature::Transactional]
        }

        async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
            ASKED.fetch_add(1, Ordering::SeqCst);
            let running = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
            MOST_RUNNING.fetch_max(running, Ordering::SeqCst);
            let first: u64 = keys.first().and_then(|k| k[1..].parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(1_000 - first)).await;
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            Ok(keys
                .into_iter()
                .map(|key| BulkGetItem {
                    entry: Some(value_of(&key)),
                    key,
                    error: None,
                })
                .collect())
        }
    }

    /// The 1 KiB value of `key`: its name, padded.
    fn value_of(key: &str) -> StateEntry {
        let mut data = key.as_bytes().to_vec();
        data.resize(1024, b' ');
        StateEntry {
            data,
            etag: "1".into(),
            metadata: HashMap::new(),
        }
    }

    async fn runtime() -> Runtime {
        let config = r#"{"components": {"state": {"slow": {"type": "test.dapr.slow_bulk"}}}}"#;
        let file = parse(config.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Keys `k000`… `k{n-1}`.
    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("k{i:03}")).collect()
    }

    /// A bulk get of `keys` from the slow store with `parallelism`
    /// within `limit` bytes; the most bulk reads that ran at once, and
    /// how many were asked for.
    async fn bulk(
        runtime: &Runtime,
        keys: Vec<String>,
        parallelism: i64,
        limit: usize,
    ) -> (Result<Vec<BulkGetItem>, StateOpError>, usize, usize) {
        MOST_RUNNING.store(0, Ordering::SeqCst);
        ASKED.store(0, Ordering::SeqCst);
        let call = Call::new(runtime, StoreLabel::default());
        let store = call.state_store("slow").unwrap_or_else(|e| panic!("{e}"));
        let budget = ResponseBudget::new(limit);
        let answer = store
            .bulk_get(keys, &HashMap::new(), parallelism, budget)
            .await;
        let most = MOST_RUNNING.load(Ordering::SeqCst);
        (answer, most, ASKED.load(Ordering::SeqCst))
    }

    /// A bulk get's chunks are read at once, up to the client's
    /// `parallelism` (zero or less: the default of 8; at most 16), not one
    /// after another (failed before: one chunk at a time, so 1,000 keys on
    /// a backend taking 1 s a call took 63 s, past the request timeout);
    /// chunks coming back out of order still answer in the order asked,
    /// a repeated key read once and answered at each place. (One test:
    /// the store's counters are shared.)
    #[tokio::test(start_paused = true)]
    async fn bulk_get_reads_its_chunks_at_once_up_to_the_parallelism() {
        let runtime = runtime().await;
        let mut asked = keys(320);
        asked.reverse();
        asked.insert(5, "k300".into());
        asked.push("k000".into());
        for (parallelism, expected) in [(0, 8), (-1, 8), (3, 3), (1, 1), (1_000, 16)] {
            let (answer, most, calls) = bulk(&runtime, asked.clone(), parallelism, 1 << 20).await;
            assert_eq!((most, calls), (expected, 20), "parallelism {parallelism}");
            let answer = answer.unwrap_or_else(|e| panic!("{e}"));
            let answered: Vec<&str> = answer.iter().map(|item| item.key.as_str()).collect();
            assert_eq!(answered, asked, "parallelism {parallelism}");
            for item in &answer {
                let data = item.entry.as_ref().map(|e| e.data.clone());
                assert_eq!(data, Some(value_of(&item.key).data), "{}", item.key);
            }
        }

        // Over the response budget (40 KiB: the third chunk of 16 KiB is
        // past it), the read stops at the first chunk past it: the chunks
        // in flight are dropped and no more are asked for.
        let (answer, most, calls) = bulk(&runtime, keys(320), 0, 40 * 1024).await;
        assert!(
            matches!(answer, Err(StateOpError::BulkTooLarge { .. })),
            "{answer:?}"
        );
        assert_eq!(most, 8);
        assert!(calls < 20, "{calls} chunks asked for");
        runtime.shutdown().await;
    }
}
