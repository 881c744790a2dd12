//! State stores (`state`): key/value with etags and TTL, Dapr semantics.

use std::collections::HashMap;

use async_trait::async_trait;

use crate::component::{Component, ComponentError};

pub use super::state_requests::{Concurrency, DeleteRequest, GetRequest, SetRequest};
use super::state_transaction::{StateFeature, TransactionRequest};

/// A stored value with its etag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// The value bytes.
    pub data: Vec<u8>,
    /// The etag of this version.
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

    /// Writes several keys, stopping at the first failure.
    async fn bulk_set(&self, reqs: Vec<SetRequest>) -> Result<(), StateError> {
        for req in reqs {
            self.set(req).await?;
        }
        Ok(())
    }

    /// Deletes several keys, stopping at the first failure.
    async fn bulk_delete(&self, reqs: Vec<DeleteRequest>) -> Result<(), StateError> {
        for req in reqs {
            self.delete(req).await?;
        }
        Ok(())
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

impl From<StateError> for ComponentError {
    fn from(err: StateError) -> Self {
        ComponentError::new(err.to_string())
    }
}
