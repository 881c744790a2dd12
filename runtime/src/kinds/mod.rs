//! One trait per component kind, each on top of [`crate::Component`].

pub mod config_store;
pub mod file;
pub mod lock;
pub mod pubsub;
pub mod secret_store;
pub mod sequencer;
mod state_requests;
pub mod state_store;
pub mod state_transaction;
mod subscriptions;

pub use config_store::{
    ConfigChange, ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription,
};
pub use file::{
    FileBody, FileError, FileInfo, FileRead, FileStore, ListPage, ListRequest, PutFileRequest,
};
pub use lock::{Lock, LockError, TryLockRequest, UnlockRequest, UnlockStatus};
pub use pubsub::{
    Delivery, DeliveryOutcome, Message, PubSub, PubSubError, PubSubSubscription, PublishRequest,
    SubscribeRequest, SubscriptionFeed,
};
pub use secret_store::{SecretError, SecretMap, SecretStore, SecretString};
pub use sequencer::{IdRange, Increment, NextIdRequest, SegmentRequest, Sequencer, SequencerError};
pub use state_store::{
    BulkFailures, BulkGetItem, Concurrency, Consistency, DeleteRequest, GetRequest, SetRequest,
    StateEntry, StateError, StateStore,
};
pub use state_transaction::{StateFeature, TransactionOperation, TransactionRequest};
pub use subscriptions::SubscriptionHub;
