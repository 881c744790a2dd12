//! State transactions and state store features: what Dapr's
//! `ExecuteStateTransaction` carries, and the capabilities a store reports
//! in the sidecar's metadata (`ETAG`, `TRANSACTIONAL`, `TTL`).

use std::collections::HashMap;

use super::state_requests::{DeleteRequest, SetRequest};

/// What a state store can do beyond reads and plain writes, as Dapr names
/// it in `GetMetadata` (`"capabilities": ["ETAG", "TRANSACTIONAL", "TTL"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateFeature {
    /// Writes and deletes check etags (optimistic concurrency).
    Etag,
    /// [`StateStore::transact`](super::StateStore::transact) applies
    /// operations all or nothing.
    Transactional,
    /// Writes may expire (`ttlInSeconds`).
    Ttl,
}

impl StateFeature {
    /// Dapr's name of the feature.
    pub fn dapr_name(self) -> &'static str {
        match self {
            Self::Etag => "ETAG",
            Self::Transactional => "TRANSACTIONAL",
            Self::Ttl => "TTL",
        }
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum TransactionOperation {
    /// Write a key (Dapr's `upsert`), with its etag, concurrency and TTL.
    Upsert(SetRequest),
    /// Delete a key (Dapr's `delete`), at its etag when given.
    Delete(DeleteRequest),
}

impl TransactionOperation {
    /// The key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            Self::Upsert(set) => &set.key,
            Self::Delete(delete) => &delete.key,
        }
    }
}

/// A transaction: its operations apply in order, all of them or none. An
/// etag that does not match fails the whole transaction and changes no key.
#[derive(Debug, Clone, Default)]
pub struct TransactionRequest {
    /// The operations, in order.
    pub operations: Vec<TransactionOperation>,
    /// Store-specific options of the whole transaction.
    pub metadata: HashMap<String, String>,
}
