//! State stores (`state`): key/value with etags and TTL, Dapr semantics.

use std::collections::HashMap;

use async_trait::async_trait;

use crate::component::{Component, ComponentError};

pub use super::state_requests::{Concurrency, Consistency, DeleteRequest, GetRequest, SetRequest};
use super::state_transaction::{StateFeature, TransactionRequest};

/// A stored value with its etag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// The value bytes.
    pub data: Vec<u8>,
    /// The etag of this version; empty for a value that has none (a plain
    /// string on Redis, which Dapr reads without an etag): the APIs then
    /// answer no etag. A store's real versions are never empty.
    pub etag: String,
    /// Store-specific extra data.
    pub metadata: HashMap<String, String>,
}

/// One result of a bulk get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkGetItem {
    /// The key asked for.
    pub key: String,
    /// The entry, or `None` when the key does not exist.
    pub entry: Option<StateEntry>,
    /// A per-key error, if reading this key failed.
    pub error: Option<String>,
}

/// Why a state operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The etag given does not match the stored one (or the key is gone).
    #[error("possible etag mismatch for key `{0}`")]
    EtagMismatch(String),
    /// The etag given is malformed.
    #[error("invalid etag for key `{0}`")]
    EtagInvalid(String),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
    /// The store does not support the operation (e.g. transactions).
    #[error("{0} not supported by this state store")]
    Unsupported(String),
}

/// A state store.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"state\"` but does not implement `StateStore`",
    note = "add `#[async_trait] impl StateStore for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait StateStore: Component {
    /// The entry for the key, or `None` if it does not exist.
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError>;

    /// Writes a key.
    async fn set(&self, req: SetRequest) -> Result<(), StateError>;

    /// Deletes a key (deleting a missing key without an etag succeeds).
    async fn delete(&self, req: DeleteRequest) -> Result<(), StateError>;

    /// Reads several keys; per-key failures are reported per item.
    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        let mut items = Vec::with_capacity(keys.len());
        for key in keys {
            let req = GetRequest {
                key: key.clone(),
                metadata: HashMap::new(),
            };
            items.push(match self.get(req).await {
                Ok(entry) => BulkGetItem {
                    key,
                    entry,
                    error: None,
                },
                Err(err) => BulkGetItem {
                    key,
                    entry: None,
                    error: Some(err.to_string()),
                },
            });
        }
        Ok(items)
    }

    /// Writes several keys, in order, each whatever became of the others
    /// (as Dapr's bulk write): a failed item does not stop the rest. The
    /// error is [`BulkFailures`]': a stale etag if any item had one, else
    /// the first failure.
    async fn bulk_set(&self, reqs: Vec<SetRequest>) -> Result<(), StateError> {
        let mut failures = BulkFailures::default();
        for req in reqs {
            failures.record(self.set(req).await);
        }
        failures.into_result()
    }

    /// Deletes several keys, in order, each whatever became of the others
    /// (as Dapr's bulk delete); the error as [`bulk_set`](Self::bulk_set)'s.
    async fn bulk_delete(&self, reqs: Vec<DeleteRequest>) -> Result<(), StateError> {
        let mut failures = BulkFailures::default();
        for req in reqs {
            failures.record(self.delete(req).await);
        }
        failures.into_result()
    }

    /// What the store supports, reported in the sidecar's metadata. The
    /// sidecar offers transactions only on a store that lists
    /// [`StateFeature::Transactional`]. Default: nothing declared.
    fn features(&self) -> Vec<StateFeature> {
        Vec::new()
    }

    /// Applies every operation of `req` in order, all or none: a failed
    /// etag check ([`StateError::EtagMismatch`]) leaves every key as it was.
    /// Default: [`StateError::Unsupported`].
    async fn transact(&self, req: TransactionRequest) -> Result<(), StateError> {
        let _ = req;
        Err(StateError::Unsupported("transactions".into()))
    }
}

/// The failures of a bulk write or delete whose every item ran: none is
/// success; else the first stale etag ([`StateError::EtagMismatch`], so the
/// caller answers a conflict as Dapr does for its joined errors), else the
/// first failure.
#[derive(Debug, Default)]
pub struct BulkFailures {
    first: Option<StateError>,
}

impl BulkFailures {
    /// Counts one item's outcome.
    pub fn record(&mut self, outcome: Result<(), StateError>) {
        let Err(error) = outcome else { return };
        let replaces = match &self.first {
            None => true,
            Some(StateError::EtagMismatch(_)) => false,
            Some(_) => matches!(error, StateError::EtagMismatch(_)),
        };
        if replaces {
            self.first = Some(error);
        }
    }

    /// Success when no item failed, else the error chosen.
    pub fn into_result(self) -> Result<(), StateError> {
        self.first.map_or(Ok(()), Err)
    }
}

impl From<StateError> for ComponentError {
    fn from(err: StateError) -> Self {
        ComponentError::new(err.to_string())
    }
}
