//! The `file` config store: serves the keys of a JSON file and publishes
//! their changes as the file changes.
//!
//! The file is a JSON object of key → value (values that are not strings
//! are served as their JSON text). It is read at init — a missing or invalid
//! file fails init with the path and, for bad JSON, the line and column.
//! Afterwards the file's directory is watched, and the file is also re-read
//! every `pollIntervalMs`; changed keys are published to subscribers,
//! removed keys with an empty value. A half-written or invalid file keeps
//! the last good content, as does a read that hangs (a hung mount: one read
//! thread stays stuck, the polls meanwhile start none). The store is
//! read-only and has no groups or labels.

mod live_file;
mod snapshot;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, InitContext,
};
use serde::Deserialize;
use tracing::info;

use crate::component_file::ComponentFile;
use live_file::LiveFile;
use rewire_runtime::{FileWatch, OnChange};
pub use snapshot::FileConfigError;

/// Metadata of the `file` config store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileConfigMetadata {
    /// The JSON file to serve.
    pub path: PathBuf,
    /// How often the file is re-read even without a change event, in
    /// milliseconds; 0 turns the periodic re-read off.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
}

fn default_poll_interval_ms() -> u64 {
    1000
}

impl FileConfigMetadata {
    /// Metadata serving `path` with the default poll interval.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            poll_interval_ms: default_poll_interval_ms(),
        }
    }
}

/// A read-only config store serving a JSON file, reloaded when it changes
/// (rename-writes and Kubernetes ConfigMap symlink swaps included).
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "config_store",
    type = "file",
    example = r#"{"path": "config.json", "pollIntervalMs": 1000}"#
)]
pub struct FileConfigStore {
    #[metadata]
    settings: FileConfigMetadata,
    live: Option<Arc<LiveFile>>,
    watch: Mutex<Option<FileWatch>>,
}

impl FileConfigStore {
    /// A store for `settings`, not initialised yet.
    pub fn new(settings: FileConfigMetadata) -> Self {
        Self {
            settings,
            live: None,
            watch: Mutex::default(),
        }
    }

    fn live(&self) -> Result<&LiveFile, ConfigError> {
        self.live
            .as_deref()
            .ok_or_else(|| ConfigError::Backend("the file config store is not initialised".into()))
    }

    fn take_watch(&self) -> Option<FileWatch> {
        self.watch
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// Rejects a group or label: the file has neither.
fn plain_keys_only(query: &ConfigQuery) -> Result<(), ConfigError> {
    if let Some(group) = &query.group {
        return Err(ConfigError::Invalid(format!(
            "the file config store has no groups, but group `{group}` was asked for"
        )));
    }
    if let Some(label) = &query.label {
        return Err(ConfigError::Invalid(format!(
            "the file config store has no labels, but label `{label}` was asked for"
        )));
    }
    Ok(())
}

#[rewire_runtime::prelude::async_trait]
impl Component for FileConfigStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        // A relative `path` is the configuration file's neighbour.
        self.settings.path = cx.resolve_path(&self.settings.path);
        let file = ComponentFile::new("path", &self.settings.path);
        let live = Arc::new(LiveFile::open(file).await?);
        let resync =
            Some(Duration::from_millis(self.settings.poll_interval_ms)).filter(|d| !d.is_zero());
        let reloaded = Arc::clone(&live);
        let on_change: OnChange = Arc::new(move || {
            let live = Arc::clone(&reloaded);
            Box::pin(async move {
                live.reload().await;
            })
        });
        let path = live.path().to_path_buf();
        let watch = FileWatch::start(path, on_change, resync, cx.shutdown.child_token());
        if let Some(previous) = self
            .watch
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .replace(watch)
        {
            previous.stop().await;
        }
        self.live = Some(live);
        info!(component = %cx.key, path = %self.settings.path.display(), "Config file loaded.");
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        if let Some(watch) = self.take_watch() {
            watch.stop().await;
        }
        Ok(())
    }
}

#[rewire_runtime::prelude::async_trait]
impl ConfigStore for FileConfigStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        plain_keys_only(query)?;
        Ok(self.live()?.get(query))
    }

    async fn set(&self, _items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        Err(ConfigError::Unsupported(
            "set: the file config store is read-only".into(),
        ))
    }

    async fn delete(&self, _query: &ConfigQuery) -> Result<(), ConfigError> {
        Err(ConfigError::Unsupported(
            "delete: the file config store is read-only".into(),
        ))
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        plain_keys_only(&query)?;
        Ok(self.live()?.subscribe(query))
    }
}
