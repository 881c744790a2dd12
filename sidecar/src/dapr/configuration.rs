//! Dapr's configuration operations: get items, and subscribe to changes.
//!
//! A subscription is made through the runtime's config store handle, so it
//! keeps delivering after the store is hot-reloaded: when a reload rebuilds
//! the store, the subscriber gets the values that differ in the new
//! instance, then every change made on it.

use std::sync::Arc;

use rewire_runtime::{echoed, Kind};
use rewire_runtime::{
    ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription, Instance,
};

use super::budget::{OverBudget, ResponseBudget};
use super::call::Call;
use super::request_limits::MAX_BULK_ITEMS;
use super::retry_rule;

/// Most keys one configuration request may name: as many as a bulk
/// request's items.
const MAX_CONFIG_KEYS: usize = MAX_BULK_ITEMS;

/// Most bytes the keys of one configuration request may take together,
/// counted as each key's length plus [`KEY_OVERHEAD`]: 512 KiB, so that
/// [`MAX_CONFIG_KEYS`] keys of up to 36 bytes fit. A subscription keeps
/// its keys for as long as it is open, and thousands may be open. (An HTTP
/// request's URI, at most 64 KiB, never reaches it.)
const MAX_CONFIG_KEY_BYTES: usize = 512 * 1024;

/// What one key costs beyond its text (a list slot), so that many empty
/// keys count too.
const KEY_OVERHEAD: usize = 16;

/// Why a configuration operation failed (messages in Dapr's gRPC wording).
#[derive(Debug, thiserror::Error)]
pub enum ConfigOpError {
    /// The call's generation has no configuration store at all (Dapr's
    /// `ERR_CONFIGURATION_STORE_NOT_CONFIGURED`: HTTP 500, gRPC
    /// `FAILED_PRECONDITION`).
    #[error("configuration stores not configured")]
    NotConfigured,
    /// No configuration store with that name in the call's generation:
    /// Dapr's message (`ErrConfigurationStoreNotFound`; the name as
    /// [`echoed`]; gRPC `INVALID_ARGUMENT`, HTTP 500).
    #[error("configuration store {0} not found")]
    NotFound(String),
    /// Items could not be read.
    #[error("failed to get {keys:?} from configuration store `{store}`: {source}")]
    Get {
        /// The store.
        store: String,
        /// The keys asked for, as [`shown_keys`] quotes them.
        keys: Vec<String>,
        /// Why (scrubbed).
        source: ConfigError,
    },
    /// The items asked for are larger than the response limit.
    #[error("configuration answer from configuration store `{store}` refused: {source}; ask for fewer keys")]
    TooLarge {
        /// The store.
        store: String,
        /// The limit exceeded.
        source: OverBudget,
    },
    /// The request names more keys than the sidecar's limit (10,000).
    #[error("the request for configuration store `{store}` names {count} keys, more than the sidecar's limit of {MAX_CONFIG_KEYS}; ask for fewer keys, or for every key (none)")]
    TooManyKeys {
        /// The store.
        store: String,
        /// Keys sent.
        count: usize,
    },
    /// The request's keys take more bytes than the sidecar's limit
    /// (64 KiB, a key's text plus 32 bytes each).
    #[error("the keys of the request for configuration store `{store}` take more than {MAX_CONFIG_KEY_BYTES} bytes (their text, plus {KEY_OVERHEAD} per key), the sidecar's limit; ask for fewer keys, or for every key (none)")]
    KeysTooLarge {
        /// The store.
        store: String,
    },
    /// Items could not be written (or the store is read-only).
    #[error("failed to save {keys:?} in configuration store `{store}`: {source}")]
    Save {
        /// The store.
        store: String,
        /// The keys written, as [`shown_keys`] quotes them.
        keys: Vec<String>,
        /// Why (scrubbed).
        source: ConfigError,
    },
    /// Items could not be deleted (or the store is read-only).
    #[error("failed to delete {keys:?} from configuration store `{store}`: {source}")]
    Delete {
        /// The store.
        store: String,
        /// The keys asked for, as [`shown_keys`] quotes them.
        keys: Vec<String>,
        /// Why (scrubbed).
        source: ConfigError,
    },
    /// A subscription could not be made.
    #[error("failed to subscribe to {keys:?} in configuration store `{store}`: {source}")]
    Subscribe {
        /// The store.
        store: String,
        /// The keys asked for, as [`shown_keys`] quotes them.
        keys: Vec<String>,
        /// Why (scrubbed).
        source: ConfigError,
    },
}

impl ConfigOpError {
    /// The store's own error, when the store was found.
    pub fn store_error(&self) -> Option<&ConfigError> {
        match self {
            Self::NotConfigured
            | Self::NotFound(_)
            | Self::TooLarge { .. }
            | Self::TooManyKeys { .. }
            | Self::KeysTooLarge { .. } => None,
            Self::Get { source, .. }
            | Self::Save { source, .. }
            | Self::Delete { source, .. }
            | Self::Subscribe { source, .. } => Some(source),
        }
    }
}

impl Call {
    /// The configuration store `name` of the call's generation.
    pub fn config_store(&self, name: &str) -> Result<ConfigOps, ConfigOpError> {
        match self.instance(Kind::ConfigStore, name) {
            Some(Instance::ConfigStore(store)) => Ok(ConfigOps {
                name: name.to_string(),
                store: store.clone(),
                call: self.clone(),
            }),
            _ if !self
                .generation()
                .iter()
                .any(|(key, _)| key.kind == Kind::ConfigStore) =>
            {
                Err(ConfigOpError::NotConfigured)
            }
            _ => Err(ConfigOpError::NotFound(echoed(name).into_owned())),
        }
    }
}

/// Dapr's configuration operations on one store of a call's generation.
pub struct ConfigOps {
    name: String,
    store: Arc<dyn ConfigStore>,
    call: Call,
}

impl ConfigOps {
    /// The items of the keys asked for (all when none), refused when they
    /// do not fit `budget` ([`ConfigOpError::TooLarge`]).
    pub async fn get(
        &self,
        query: &ConfigQuery,
        budget: ResponseBudget,
    ) -> Result<Vec<ConfigItem>, ConfigOpError> {
        let items = self.read(query).await?;
        self.within(items, budget)
    }

    async fn read(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigOpError> {
        self.check_keys(&query.keys)?;
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                query,
                |q| store.get(q),
                ConfigError::Backend,
            )
            .await
            .map_err(|e| ConfigOpError::Get {
                store: self.name.clone(),
                keys: shown_keys(query.keys.iter().map(String::as_str)),
                source: self.scrubbed(e),
            })
    }

    fn within(
        &self,
        items: Vec<ConfigItem>,
        mut budget: ResponseBudget,
    ) -> Result<Vec<ConfigItem>, ConfigOpError> {
        for item in &items {
            budget
                .take(config_item_bytes(item))
                .map_err(|source| ConfigOpError::TooLarge {
                    store: self.name.clone(),
                    source,
                })?;
        }
        Ok(items)
    }

    /// Dapr's get: as [`get`](Self::get), keeping only the items of the
    /// query's own group and label — none for a Dapr request, which never
    /// carries one. A store lists every group's and label's items when
    /// asked for all keys ([`ConfigQuery::matches`] takes "no label" as
    /// "any"), and Dapr's answer is keyed by the bare key: a labelled
    /// variant would stand in for the key itself.
    pub async fn get_dapr(
        &self,
        query: &ConfigQuery,
        budget: ResponseBudget,
    ) -> Result<Vec<ConfigItem>, ConfigOpError> {
        let mut items = self.read(query).await?;
        items.retain(|item| in_scope(query, item));
        self.within(items, budget)
    }

    /// Whether a Dapr subscription delivers `item`: only an item with no
    /// group and no label (Dapr's requests carry neither, and its answers
    /// are keyed by the bare key), though the store's subscription reports
    /// every group's and label's changes of the keys.
    pub fn dapr_visible(item: &ConfigItem) -> bool {
        in_scope(&ConfigQuery::default(), item)
    }

    /// Writes `items` (Layotto's `SaveConfiguration`); a read-only store
    /// answers [`ConfigError::Unsupported`].
    pub async fn save(&self, items: Vec<ConfigItem>) -> Result<(), ConfigOpError> {
        let keys = shown_keys(items.iter().map(|item| item.key.as_str()));
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                items,
                |i| store.set(i),
                ConfigError::Backend,
            )
            .await
            .map_err(|e| ConfigOpError::Save {
                store: self.name.clone(),
                keys,
                source: self.scrubbed(e),
            })
    }

    /// Deletes the items `query` covers (Layotto's `DeleteConfiguration`).
    pub async fn delete(&self, query: &ConfigQuery) -> Result<(), ConfigOpError> {
        let store = &self.store;
        self.call
            .guarded(
                self.target(),
                retry_rule::IDEMPOTENT,
                query,
                |q| store.delete(q),
                ConfigError::Backend,
            )
            .await
            .map_err(|e| ConfigOpError::Delete {
                store: self.name.clone(),
                keys: shown_keys(query.keys.iter().map(String::as_str)),
                source: self.scrubbed(e),
            })
    }

    /// Subscribes to `query` through the store's handle, which follows the
    /// store across reloads (the store was checked in the call's
    /// generation).
    pub async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigOpError> {
        self.check_keys(&query.keys)?;
        let keys = shown_keys(query.keys.iter().map(String::as_str));
        let handle = self.call.runtime().config_store(&self.name);
        self.call
            .guarded(
                self.target(),
                retry_rule::NEVER,
                query,
                |q| handle.subscribe(q),
                ConfigError::Backend,
            )
            .await
            .map_err(|e| ConfigOpError::Subscribe {
                store: self.name.clone(),
                keys,
                source: self.scrubbed(e),
            })
    }

    /// Refuses a request naming more keys, or larger ones, than the
    /// sidecar keeps for one request ([`MAX_CONFIG_KEYS`],
    /// [`MAX_CONFIG_KEY_BYTES`]); a subscribe checks it before booking its
    /// place, so a malformed request is told so even at the cap.
    pub fn check_keys(&self, keys: &[String]) -> Result<(), ConfigOpError> {
        if keys.len() > MAX_CONFIG_KEYS {
            return Err(ConfigOpError::TooManyKeys {
                store: self.name.clone(),
                count: keys.len(),
            });
        }
        if keys_bytes(keys) > MAX_CONFIG_KEY_BYTES {
            return Err(ConfigOpError::KeysTooLarge {
                store: self.name.clone(),
            });
        }
        Ok(())
    }

    fn target(&self) -> (Kind, &str) {
        (Kind::ConfigStore, &self.name)
    }

    fn scrubbed(&self, error: ConfigError) -> ConfigError {
        match error {
            ConfigError::Unsupported(m) => ConfigError::Unsupported(self.call.scrub(&m)),
            ConfigError::Invalid(m) => ConfigError::Invalid(self.call.scrub(&m)),
            ConfigError::Backend(m) => ConfigError::Backend(self.call.scrub(&m)),
            ConfigError::Timeout(m) => ConfigError::Timeout(self.call.scrub(&m)),
        }
    }
}

/// Whether `item` is of exactly the group and label of `query` (none
/// meaning none, not any): what Dapr's API shows of a store.
fn in_scope(query: &ConfigQuery, item: &ConfigItem) -> bool {
    fn given(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|v| !v.trim().is_empty())
    }
    given(&item.group) == given(&query.group) && given(&item.label) == given(&query.label)
}

/// Keys shown in an error at most.
const SHOWN_KEYS: usize = 8;

/// `keys` as an error quotes them: the first [`SHOWN_KEYS`], each as
/// [`echoed`], then how many more there are.
pub(crate) fn shown_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut shown = Vec::new();
    let mut more = 0usize;
    for key in keys {
        if shown.len() < SHOWN_KEYS {
            shown.push(echoed(key).into_owned());
        } else {
            more += 1;
        }
    }
    if more > 0 {
        shown.push(format!("… and {more} more"));
    }
    shown
}

/// The size of `keys` as [`MAX_CONFIG_KEY_BYTES`] counts it.
fn keys_bytes(keys: &[String]) -> usize {
    keys.iter().map(|key| key.len() + KEY_OVERHEAD).sum()
}

/// What one configuration item adds to an answer, in bytes.
pub(crate) fn config_item_bytes(item: &ConfigItem) -> usize {
    let metadata: usize = item.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    item.key.len() + item.value.len() + item.version.len() + metadata
}
