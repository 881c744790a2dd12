//! The sidecar's metadata, as Dapr's `GetMetadata` has it: the app id, the
//! runtime version and the components of the call's generation, each with a
//! Dapr-style type (`state.memory`, `secretstores.local.file`,
//! `configuration.apollo`, `lock.redis`; custom kinds as `kind.type`).
//!
//! Everything comes from the one generation snapshot the call loaded (it
//! carries the app id and each component's type), so the answer never pairs
//! one generation's components with another's configuration.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rewire_runtime::{Instance, Kind};

use super::call::Call;

/// Most entries a client may set in the extended metadata.
pub const MAX_EXTENDED_METADATA_ENTRIES: usize = 64;

/// Longest key of an extended metadata entry, in bytes.
pub const MAX_EXTENDED_METADATA_KEY_BYTES: usize = 1024;

/// Longest value of an extended metadata entry, in bytes.
pub const MAX_EXTENDED_METADATA_VALUE_BYTES: usize = 4096;

/// Why an extended metadata entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtendedMetadataError {
    /// The key is too long.
    #[error("the metadata key takes {0} bytes, more than the sidecar's limit of {MAX_EXTENDED_METADATA_KEY_BYTES}")]
    KeyTooLong(usize),
    /// The value is too long.
    #[error("the value of metadata key `{key}` takes {bytes} bytes, more than the sidecar's limit of {MAX_EXTENDED_METADATA_VALUE_BYTES}")]
    ValueTooLong {
        /// The key (short enough to be named).
        key: String,
        /// The value's size.
        bytes: usize,
    },
    /// A new key, with the metadata full.
    #[error("the extended metadata already holds {MAX_EXTENDED_METADATA_ENTRIES} entries, the sidecar's limit; metadata key `{0}` was not added (an existing key can still be changed)")]
    Full(String),
}

/// The sidecar's extended metadata, as Dapr's `SetMetadata` (gRPC) and
/// `PUT /v1.0/metadata/{key}` (HTTP) set it and `GetMetadata` shows it:
/// one table per sidecar, shared by both APIs, bounded in entries and in
/// the length of each key and value.
#[derive(Debug, Default)]
pub struct ExtendedMetadata {
    entries: Mutex<BTreeMap<String, String>>,
}

impl ExtendedMetadata {
    /// The table of the sidecar that `owner` (one `Arc` per sidecar,
    /// shared by its HTTP and gRPC APIs) belongs to; made on first use and
    /// dropped soon after `owner` is.
    pub fn of<T: Any + Send + Sync>(owner: &Arc<T>) -> Arc<Self> {
        /// The tables, each with a weak handle on its owner.
        type Tables = Vec<(Weak<dyn Any + Send + Sync>, Arc<ExtendedMetadata>)>;
        static TABLES: Mutex<Tables> = Mutex::new(Vec::new());
        let mut tables = TABLES.lock().unwrap_or_else(PoisonError::into_inner);
        tables.retain(|(owner, _)| owner.strong_count() > 0);
        let address = Arc::as_ptr(owner).cast::<()>();
        if let Some((_, table)) = tables
            .iter()
            .find(|(owner, _)| owner.as_ptr().cast::<()>() == address)
        {
            return table.clone();
        }
        let any: Arc<dyn Any + Send + Sync> = owner.clone();
        let table = Arc::new(Self::default());
        tables.push((Arc::downgrade(&any), table.clone()));
        table
    }

    /// Sets `key` to `value`, as Dapr: an empty key changes nothing.
    pub fn set(&self, key: String, value: String) -> Result<(), ExtendedMetadataError> {
        if key.is_empty() {
            return Ok(());
        }
        if key.len() > MAX_EXTENDED_METADATA_KEY_BYTES {
            return Err(ExtendedMetadataError::KeyTooLong(key.len()));
        }
        if value.len() > MAX_EXTENDED_METADATA_VALUE_BYTES {
            return Err(ExtendedMetadataError::ValueTooLong {
                key,
                bytes: value.len(),
            });
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_EXTENDED_METADATA_ENTRIES && !entries.contains_key(&key) {
            return Err(ExtendedMetadataError::Full(key));
        }
        entries.insert(key, value);
        Ok(())
    }

    /// Every entry set, with `generation` as `rewire.generation` (the
    /// sidecar's own entry wins over one a client set).
    pub fn entries(&self, generation: u64) -> BTreeMap<String, String> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        entries.insert("rewire.generation".to_string(), generation.to_string());
        entries
    }
}

/// The sidecar's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarMetadata {
    /// The app id served.
    pub app_id: String,
    /// rewire's version.
    pub runtime_version: &'static str,
    /// The number of the generation described.
    pub generation: u64,
    /// Its components, in key order.
    pub components: Vec<RegisteredComponent>,
}

/// One component, as Dapr's `RegisteredComponents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredComponent {
    /// The component's name.
    pub name: String,
    /// Its Dapr-style type (see [`dapr_component_type`]).
    pub type_name: String,
    /// What it can do, in Dapr's names (a state store's features:
    /// `ETAG`, `TRANSACTIONAL`, `TTL`).
    pub capabilities: Vec<String>,
}

/// The metadata of the call's generation.
pub fn metadata(call: &Call) -> SidecarMetadata {
    let generation = call.generation();
    let components = generation
        .iter()
        .map(|(key, instance)| RegisteredComponent {
            name: key.name.to_string(),
            type_name: dapr_component_type(
                &key.kind,
                generation.type_name(key).unwrap_or("unknown"),
            ),
            capabilities: capabilities(instance),
        })
        .collect();
    SidecarMetadata {
        app_id: generation.app_id().to_string(),
        runtime_version: env!("CARGO_PKG_VERSION"),
        generation: generation.number,
        components,
    }
}

/// A component's capabilities, in Dapr's names.
fn capabilities(instance: &Instance) -> Vec<String> {
    match instance {
        Instance::State(store) => store
            .features()
            .into_iter()
            .map(|feature| feature.dapr_name().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

/// A component's type as Dapr spells it: `{category}.{type}`, e.g.
/// `state.redis`, `secretstores.local.file`, `configuration.apollo`; a
/// custom kind is its own category.
pub fn dapr_component_type(kind: &Kind, type_name: &str) -> String {
    let category = match kind {
        Kind::State => "state",
        Kind::SecretStore => "secretstores",
        Kind::ConfigStore => "configuration",
        Kind::Lock => "lock",
        Kind::Sequencer => "sequencer",
        Kind::File => "file",
        Kind::PubSub => "pubsub",
        Kind::Custom(custom) => custom.as_ref(),
    };
    format!("{category}.{type_name}")
}

#[cfg(test)]
mod tests {
    use rewire_runtime::config::{validate, Config};
    use rewire_runtime::{Registry, Runtime, RuntimeOptions};

    use super::*;
    use crate::dapr::StoreLabel;

    #[tokio::test]
    async fn metadata_comes_from_the_generation_snapshot() {
        let file = Config {
            app_id: "checkout".into(),
            ..Config::default()
        };
        let config = validate(file, &Registry::default()).unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, Registry::default(), RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let answer = metadata(&Call::new(&runtime, StoreLabel::default()));
        assert_eq!(answer.app_id, "checkout");
        assert_eq!(answer.generation, 1);
        assert!(answer.components.is_empty());
        runtime.shutdown().await;
    }

    #[test]
    fn extended_metadata_is_bounded_and_kept_per_owner() {
        let (one, other) = (Arc::new(1_u8), Arc::new(2_u8));
        let table = ExtendedMetadata::of(&one);
        assert!(Arc::ptr_eq(&table, &ExtendedMetadata::of(&one)));
        assert!(!Arc::ptr_eq(&table, &ExtendedMetadata::of(&other)));
        assert_eq!(table.set(String::new(), "ignored".into()), Ok(()));
        for i in 0..MAX_EXTENDED_METADATA_ENTRIES {
            assert_eq!(table.set(format!("k{i}"), "v".into()), Ok(()));
        }
        assert!(matches!(
            table.set("one-more".into(), "v".into()),
            Err(ExtendedMetadataError::Full(_))
        ));
        assert_eq!(table.set("k0".into(), "changed".into()), Ok(()));
        let long = "x".repeat(MAX_EXTENDED_METADATA_VALUE_BYTES + 1);
        assert!(table.set("k1".into(), long.clone()).is_err());
        assert!(table.set(long, "v".into()).is_err());
        let entries = table.entries(7);
        assert_eq!(entries.len(), MAX_EXTENDED_METADATA_ENTRIES + 1);
        assert_eq!(entries.get("k0").map(String::as_str), Some("changed"));
        assert_eq!(
            entries.get("rewire.generation").map(String::as_str),
            Some("7")
        );
    }

    #[test]
    fn built_in_kinds_use_dapr_categories() {
        assert_eq!(dapr_component_type(&Kind::State, "redis"), "state.redis");
        assert_eq!(
            dapr_component_type(&Kind::SecretStore, "local.file"),
            "secretstores.local.file"
        );
        assert_eq!(
            dapr_component_type(&Kind::ConfigStore, "apollo"),
            "configuration.apollo"
        );
        assert_eq!(dapr_component_type(&Kind::Lock, "memory"), "lock.memory");
        assert_eq!(
            dapr_component_type(&Kind::parse("greeter"), "english"),
            "greeter.english"
        );
    }
}
