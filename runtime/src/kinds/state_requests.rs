//! What a state store is asked: reads, writes and deletes of one key (a
//! transaction carries writes and deletes too).

use std::collections::HashMap;
use std::time::Duration;

/// Concurrency mode of a write, as in Dapr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// The last write wins; an etag, if given, is still checked.
    #[default]
    LastWrite,
    /// The first write wins: a write without an etag only creates a new key.
    FirstWrite,
}

/// Consistency of a write, as in Dapr: whether it must reach the store's
/// replicas before it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// The write succeeds once the store took it (Dapr's default).
    #[default]
    Eventual,
    /// The write succeeds only once the store's replicas took it too (a
    /// store without replicas satisfies it at once).
    Strong,
}

/// Read one key.
#[derive(Debug, Clone, Default)]
pub struct GetRequest {
    /// The key.
    pub key: String,
    /// Store-specific options.
    pub metadata: HashMap<String, String>,
}

/// Write one key.
#[derive(Debug, Clone, Default)]
pub struct SetRequest {
    /// The key.
    pub key: String,
    /// The value bytes.
    pub value: Vec<u8>,
    /// Only write if the stored etag is this one.
    pub etag: Option<String>,
    /// Concurrency mode.
    pub concurrency: Concurrency,
    /// Consistency mode.
    pub consistency: Consistency,
    /// Expire the key after this long (Dapr's `ttlInSeconds`).
    pub ttl: Option<Duration>,
    /// Store-specific options.
    pub metadata: HashMap<String, String>,
}

/// Delete one key.
#[derive(Debug, Clone, Default)]
pub struct DeleteRequest {
    /// The key.
    pub key: String,
    /// Only delete if the stored etag is this one.
    pub etag: Option<String>,
    /// Concurrency mode.
    pub concurrency: Concurrency,
    /// Consistency mode.
    pub consistency: Consistency,
    /// Store-specific options.
    pub metadata: HashMap<String, String>,
}
