//! Dapr's state operations: get, bulk get, save (one write or a bulk
//! write), delete. Component errors come back with secret values scrubbed.

use std::sync::Arc;

use rewire_runtime::Kind;
use rewire_runtime::{
    BulkGetItem, DeleteRequest, GetRequest, Instance, SetRequest, StateEntry, StateError,
    StateStore,
};

use super::call::Call;

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
    /// A save failed (or one of its items is invalid).
    #[error("failed saving state in state store `{store}`: {source}")]
    Save {
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
            Self::NotFound(_) => None,
            Self::Get { source, .. }
            | Self::BulkGet { source, .. }
            | Self::Save { source, .. }
            | Self::Delete { source, .. } => Some(source),
        }
    }
}

impl Call {
    /// The state store `name` of the call's generation.
    pub fn state_store(&self, name: &str) -> Result<StateOps, StateOpError> {
        match self.instance(Kind::State, name) {
            Some(Instance::State(store)) => Ok(StateOps {
                name: name.to_string(),
                store: store.clone(),
                call: self.clone(),
            }),
            _ => Err(StateOpError::NotFound(name.to_string())),
        }
    }
}

/// Dapr's state operations on one store of a call's generation.
pub struct StateOps {
    name: String,
    store: Arc<dyn StateStore>,
    call: Call,
}

impl StateOps {
    /// The value and etag of one key (`None` when absent).
    pub async fn get(&self, request: GetRequest) -> Result<Option<StateEntry>, StateOpError> {
        let key = request.key.clone();
        self.store
            .get(request)
            .await
            .map_err(|e| StateOpError::Get {
                store: self.name.clone(),
                key,
                source: self.scrubbed(e),
            })
    }

    /// Every key asked for, each with its entry or its own (scrubbed) error.
    pub async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateOpError> {
        let items = self
            .store
            .bulk_get(keys)
            .await
            .map_err(|e| StateOpError::BulkGet {
                store: self.name.clone(),
                source: self.scrubbed(e),
            })?;
        Ok(items
            .into_iter()
            .map(|item| BulkGetItem {
                error: item.error.map(|e| self.call.scrub(&e)),
                ..item
            })
            .collect())
    }

    /// Writes every item: none, one, or a bulk write.
    pub async fn save(&self, mut writes: Vec<SetRequest>) -> Result<(), StateOpError> {
        let result = match writes.len() {
            0 => Ok(()),
            1 => match writes.pop() {
                Some(write) => self.store.set(write).await,
                None => Ok(()),
            },
            _ => self.store.bulk_set(writes).await,
        };
        result.map_err(|e| self.save_error(e))
    }

    /// A save of this store that failed with `source` (also for items the
    /// adapter found invalid before writing).
    pub fn save_error(&self, source: StateError) -> StateOpError {
        StateOpError::Save {
            store: self.name.clone(),
            source: self.scrubbed(source),
        }
    }

    /// Deletes one key (at its etag, when given).
    pub async fn delete(&self, request: DeleteRequest) -> Result<(), StateOpError> {
        let key = request.key.clone();
        self.store
            .delete(request)
            .await
            .map_err(|e| StateOpError::Delete {
                store: self.name.clone(),
                key,
                source: self.scrubbed(e),
            })
    }

    /// `error` with every secret value the runtime knows scrubbed.
    fn scrubbed(&self, error: StateError) -> StateError {
        match error {
            StateError::Invalid(m) => StateError::Invalid(self.call.scrub(&m)),
            StateError::Backend(m) => StateError::Backend(self.call.scrub(&m)),
            other => other,
        }
    }
}
