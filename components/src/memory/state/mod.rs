//! The `memory` state store: keys in process, with Dapr's etag, first-write
//! and TTL semantics.
//!
//! Etags are version numbers (as text) that increase with every write of
//! any key, so a deleted and re-created key never gets an old etag back.
//! Expired entries are invisible at once and dropped by the next operation
//! (an expiry index makes that proportional to what expired, so nothing
//! leaks). Every metadata change applies in place: the data lives in this
//! process and survives reloads, a rebuild of the same type included (the
//! new instance takes over its predecessor's table, see
//! [`crate::memory`]).
//!
//! What it holds is bounded: at most `maxKeys` keys (default
//! [`DEFAULT_MAX_KEYS`]) and `maxTotalSize` bytes of keys and values
//! (default [`DEFAULT_MAX_TOTAL_SIZE`]); a write (or transaction) that
//! would grow it past either fails with a backend error naming the store
//! and the limit, and changes nothing. Expired entries are dropped before
//! the bounds are checked. A lowered bound keeps what is held; deletes and
//! writes that do not grow the store still pass.

mod table;
mod transaction;
mod ttl;

use std::sync::{Arc, Mutex, MutexGuard};

use rewire_runtime::{
    BulkGetItem, Component, ComponentError, DeleteRequest, GetRequest, InPlace, InPlaceUpdate,
    InitContext, Metadata, PendingInPlace, SetRequest, StagedInPlace, StateEntry, StateError,
    StateFeature, StateStore, TransactionRequest,
};
use serde::{Deserialize, Deserializer};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::live::LiveMetadata;
use table::{Bounds, Condition, StateTable};
pub use table::{DEFAULT_MAX_KEYS, DEFAULT_MAX_TOTAL_SIZE};
use ttl::Expiry;

/// Metadata of the `memory` state store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryStateMetadata {
    /// TTL given to writes that ask for none; zero or negative: no default.
    /// At most [`MAX_TTL_SECONDS`](crate::time_limits::MAX_TTL_SECONDS).
    #[serde(deserialize_with = "crate::time_limits::deserialize_ttl_seconds")]
    pub default_ttl_in_seconds: i64,
    /// Most keys held (at least 1; default [`DEFAULT_MAX_KEYS`]).
    #[serde(deserialize_with = "deserialize_positive")]
    pub max_keys: u64,
    /// Most bytes of keys and values held together (at least 1; default
    /// [`DEFAULT_MAX_TOTAL_SIZE`], 256 MiB).
    #[serde(deserialize_with = "deserialize_positive")]
    pub max_total_size: u64,
}

impl Default for MemoryStateMetadata {
    fn default() -> Self {
        Self {
            default_ttl_in_seconds: 0,
            max_keys: DEFAULT_MAX_KEYS,
            max_total_size: DEFAULT_MAX_TOTAL_SIZE,
        }
    }
}

impl MemoryStateMetadata {
    fn bounds(&self) -> Bounds {
        Bounds {
            max_keys: self.max_keys,
            max_total_size: self.max_total_size,
        }
    }
}

/// A bound: a whole number, at least 1.
fn deserialize_positive<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    match u64::deserialize(deserializer)? {
        0 => Err(serde::de::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

/// An in-process state store with Dapr semantics (etags, first-write, TTL).
/// Its data survives every configuration change except a change of type.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "state",
    type = "memory",
    example = r#"{"defaultTtlInSeconds": 0}"#
)]
pub struct MemoryStateStore {
    #[metadata]
    settings: LiveMetadata<MemoryStateMetadata>,
    /// The component's data: shared with the instances rebuilt from or
    /// into this one (see [`crate::memory`]).
    table: Arc<Mutex<StateTable>>,
    /// The component (`state/orders`), for errors; empty outside a runtime.
    key: String,
}

impl MemoryStateStore {
    /// A store with the given metadata and no data.
    pub fn new(metadata: MemoryStateMetadata) -> Self {
        Self {
            settings: LiveMetadata::new(metadata),
            table: Arc::default(),
            key: String::new(),
        }
    }

    /// The metadata in force.
    pub fn metadata(&self) -> MemoryStateMetadata {
        (*self.settings.load()).clone()
    }

    /// Number of keys held (expired ones included until the next operation).
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn table(&self) -> MutexGuard<'_, StateTable> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The table, held to the bounds of `settings` (those in force).
    fn table_to_write(&self, settings: &MemoryStateMetadata) -> MutexGuard<'_, StateTable> {
        let mut table = self.table();
        table.set_bounds(settings.bounds());
        table
    }

    /// `error`, a backend one (a bound) naming this store.
    fn named(&self, error: StateError) -> StateError {
        match error {
            StateError::Backend(message) if self.key.is_empty() => {
                StateError::Backend(format!("the memory state store {message}"))
            }
            StateError::Backend(message) => {
                StateError::Backend(format!("the memory state store `{}` {message}", self.key))
            }
            other => other,
        }
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemoryStateStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        self.key = cx.key.to_string();
        let (table, adopted) = crate::memory::shared_with_predecessors(cx, self.table.clone());
        self.table = table;
        if adopted {
            info!(component = %cx.key, keys = self.len(), "Memory state store rebuilt: it keeps its predecessor's keys.");
        }
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

impl MemoryStateStore {
    /// Checks `metadata` and stages it (the data is untouched either way).
    fn stage(&self, metadata: &Metadata) -> Result<PendingInPlace, ComponentError> {
        let new = LiveMetadata::<MemoryStateMetadata>::decode(metadata)?;
        Ok(self.settings.stage_then(new, |_, new| {
            info!(
                default_ttl_in_seconds = new.default_ttl_in_seconds,
                max_keys = new.max_keys,
                max_total_size = new.max_total_size,
                "Memory state store metadata applied in place."
            );
        }))
    }
}

/// Deferred: a swap of settings, put in force at commit.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemoryStateStore {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.stage(metadata)?.apply();
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        self.stage(metadata).map(StagedInPlace::Deferred)
    }
}

#[rewire_runtime::prelude::async_trait]
impl StateStore for MemoryStateStore {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(self.table().get(&req.key, Instant::now()))
    }

    async fn set(&self, req: SetRequest) -> Result<(), StateError> {
        if req.key.is_empty() {
            return Err(StateError::Invalid("the key is empty".into()));
        }
        let settings = self.settings.load();
        let default_ttl = settings.default_ttl_in_seconds;
        let ttl = ttl::write_ttl(&req.key, req.ttl, &req.metadata, default_ttl)?;
        let now = Instant::now();
        let expires_at = ttl
            .map(|ttl| Expiry::after(now, ttl))
            .transpose()
            .map_err(|message| StateError::Invalid(format!("key `{}`: {message}", req.key)))?;
        let condition = Condition {
            etag: req.etag.as_deref(),
            concurrency: req.concurrency,
        };
        let etag = self
            .table_to_write(&settings)
            .set(&req.key, req.value, condition, expires_at, now)
            .map_err(|e| self.named(e))?;
        debug!(key = %req.key, etag = %etag, ttl_ms = ttl.map(|t| t.as_millis() as u64), "State written.");
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError> {
        let condition = Condition {
            etag: req.etag.as_deref(),
            concurrency: req.concurrency,
        };
        self.table().delete(&req.key, condition, Instant::now())
    }

    /// Every key read under one lock: one snapshot.
    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        let now = Instant::now();
        let mut table = self.table();
        Ok(keys
            .into_iter()
            .map(|key| BulkGetItem {
                entry: table.get(&key, now),
                key,
                error: None,
            })
            .collect())
    }

    fn features(&self) -> Vec<StateFeature> {
        vec![
            StateFeature::Etag,
            StateFeature::Transactional,
            StateFeature::Ttl,
        ]
    }

    /// All or none, under the table's lock.
    async fn transact(&self, req: TransactionRequest) -> Result<(), StateError> {
        let settings = self.settings.load();
        let now = Instant::now();
        let operations =
            transaction::prepare(req.operations, settings.default_ttl_in_seconds, now)?;
        let count = operations.len();
        transaction::apply(&mut self.table_to_write(&settings), operations, now)
            .map_err(|e| self.named(e))?;
        debug!(operations = count, "State transaction applied.");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rewire_runtime::Concurrency;
    use std::collections::HashMap;
    use std::time::Duration;

    fn set(key: &str, value: &str) -> SetRequest {
        SetRequest {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            ..SetRequest::default()
        }
    }

    async fn value(store: &MemoryStateStore, key: &str) -> Option<Vec<u8>> {
        let req = GetRequest {
            key: key.into(),
            metadata: HashMap::new(),
        };
        store
            .get(req)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|e| e.data)
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_from_request_metadata_and_default() {
        let store = MemoryStateStore::new(MemoryStateMetadata {
            default_ttl_in_seconds: 10,
            ..MemoryStateMetadata::default()
        });
        let mut short = set("short", "s");
        short.ttl = Some(Duration::from_millis(50));
        let mut forever = set("forever", "f");
        forever.metadata.insert("ttlInSeconds".into(), "-1".into());
        let mut by_meta = set("by_meta", "m");
        by_meta.metadata.insert("ttlInSeconds".into(), "2".into());
        for req in [short, forever, by_meta, set("default", "d")] {
            store.set(req).await.unwrap_or_else(|e| panic!("{e}"));
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(value(&store, "short").await, None);
        assert!(value(&store, "by_meta").await.is_some());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(value(&store, "by_meta").await, None);
        assert!(value(&store, "default").await.is_some());
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(value(&store, "default").await, None);
        assert_eq!(value(&store, "forever").await, Some(b"f".to_vec()));
        assert_eq!(store.len(), 1);
    }

    #[tokio::test]
    async fn apply_config_keeps_the_data() {
        let store = MemoryStateStore::default();
        store
            .set(set("k", "v"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut metadata = Metadata::default();
        metadata.insert("defaultTtlInSeconds", serde_json::json!("30"));
        assert_eq!(
            store.update_in_place(&metadata).await.ok(),
            Some(InPlace::Applied)
        );
        assert_eq!(store.metadata().default_ttl_in_seconds, 30);
        assert_eq!(value(&store, "k").await, Some(b"v".to_vec()));
        metadata.insert("defaultTtl", serde_json::json!(1));
        let err = store
            .update_in_place(&metadata)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("defaultTtlInSeconds"), "{err}");
        assert_eq!(store.metadata().default_ttl_in_seconds, 30);
    }

    #[tokio::test]
    async fn first_write_and_bulk() {
        let store = MemoryStateStore::default();
        let mut first = set("k", "a");
        first.concurrency = Concurrency::FirstWrite;
        store
            .set(first.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            store.set(first).await,
            Err(StateError::EtagMismatch("k".into()))
        );
        store
            .bulk_set(vec![set("a", "1"), set("b", "2")])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let items = store
            .bulk_get(vec!["a".into(), "b".into(), "zz".into()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let found: Vec<_> = items
            .iter()
            .map(|i| i.entry.as_ref().map(|e| e.data.clone()))
            .collect();
        assert_eq!(found, vec![Some(b"1".to_vec()), Some(b"2".to_vec()), None]);
        let deletes = ["a", "b"].map(|key| DeleteRequest {
            key: key.into(),
            ..DeleteRequest::default()
        });
        store
            .bulk_delete(deletes.to_vec())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(value(&store, "a").await, None);
    }
}
