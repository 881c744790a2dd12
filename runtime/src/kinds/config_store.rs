//! Configuration stores (`config_store`): keyed values with optional group
//! and label (as in Layotto's and Dapr's configuration APIs), and change
//! subscriptions.

use std::collections::HashMap;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::component::{Component, ComponentError};

/// One configuration value.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ConfigItem {
    /// The key, without group or label.
    pub key: String,
    /// The value.
    pub value: String,
    /// Opaque version (changes with every change of the value).
    pub version: String,
    /// The group the key belongs to, if the store has groups.
    pub group: Option<String>,
    /// The label (environment, tenant...) the value is for, if any.
    pub label: Option<String>,
    /// Store-specific extra data.
    pub metadata: HashMap<String, String>,
}

/// Which keys a get or subscription is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigQuery {
    /// The keys; empty means every key (of the group and label).
    pub keys: Vec<String>,
    /// Restrict to this group.
    pub group: Option<String>,
    /// Restrict to this label.
    pub label: Option<String>,
    /// Store-specific options.
    pub metadata: HashMap<String, String>,
}

impl ConfigQuery {
    /// A query for the given keys, no group or label.
    pub fn keys<I, S>(keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            keys: keys.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Whether `item` is covered by this query.
    pub fn matches(&self, item: &ConfigItem) -> bool {
        (self.keys.is_empty() || self.keys.contains(&item.key))
            && (self.group.is_none() || self.group == item.group)
            && (self.label.is_none() || self.label == item.label)
    }
}

/// A batch of changed items; a deleted key arrives with an empty value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChange {
    /// The changed items.
    pub items: Vec<ConfigItem>,
}

/// A live subscription: changes arrive on `changes` until it is dropped.
#[derive(Debug)]
pub struct ConfigSubscription {
    /// Unique id of the subscription within its store.
    pub id: String,
    /// The stream of changes.
    pub changes: mpsc::Receiver<ConfigChange>,
}

/// Why a configuration operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The store does not support the operation (read-only store...).
    #[error("operation not supported: {0}")]
    Unsupported(String),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
    /// The store did not answer within the runtime's bound on a store call
    /// (the call was abandoned; the store may still act on it). Says which
    /// call and the bound; its caller names the store.
    #[error("{0}")]
    Timeout(String),
}

/// A configuration store.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"config_store\"` but does not implement `ConfigStore`",
    note = "add `#[async_trait] impl ConfigStore for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait ConfigStore: Component {
    /// The items matching `query` (keys not found are simply absent).
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError>;

    /// Stores `items`.
    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        let _ = items;
        Err(ConfigError::Unsupported("set".into()))
    }

    /// Deletes the keys of `query`.
    async fn delete(&self, query: &ConfigQuery) -> Result<(), ConfigError> {
        let _ = query;
        Err(ConfigError::Unsupported("delete".into()))
    }

    /// Subscribes to changes of the keys of `query`.
    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError>;
}

impl From<ConfigError> for ComponentError {
    fn from(err: ConfigError) -> Self {
        ComponentError::new(err.to_string())
    }
}
