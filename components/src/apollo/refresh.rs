//! [`Refresher`]: fetches a namespace from the config service, takes the
//! answer into [`LiveNamespaces`] and the backup cache.
//!
//! Fetches of a namespace are serialised, so an older answer can never
//! replace a newer one (the long poll and a write's read-back may fetch the
//! same namespace); fetches of different namespaces run side by side (the
//! first load asks them all at once).
//!
//! A fetched release is served first, then handed to the store's backup
//! writer (still in the namespace's turn, so backups keep the fetches'
//! order), which writes it off the fetch: a hung backup folder holds
//! neither the long poll, nor a namespace's turn, nor the store's write
//! turn (see [`BackupWriter`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use rewire_runtime::ComponentKey;
use tracing::{info, warn};

use super::backup_writer::BackupWriter;
use super::cache::BackupCache;
use super::client::{ApolloConfig, Fetched};
use super::error::ApolloError;
use super::namespaces::{LiveNamespaces, Source};
use super::services::ConfigServices;

/// Keeps [`LiveNamespaces`] in line with the config service.
#[derive(Debug)]
pub(crate) struct Refresher {
    pub(crate) key: ComponentKey,
    pub(crate) client: ConfigServices,
    pub(crate) live: Arc<LiveNamespaces>,
    pub(crate) cache: Option<BackupCache>,
    /// Writes `cache` (when on), off the fetches.
    backups: Option<BackupWriter>,
    pub(crate) app_id: String,
    pub(crate) cluster: String,
    /// One per served namespace, in `live`'s order, then one for any
    /// other name.
    locks: Vec<tokio::sync::Mutex<()>>,
}

impl Refresher {
    /// A refresher of `live` through `client`, backing up to `cache`.
    pub(crate) fn new(
        key: ComponentKey,
        client: ConfigServices,
        live: Arc<LiveNamespaces>,
        cache: Option<BackupCache>,
        app_id: &str,
        cluster: &str,
    ) -> Self {
        let locks = (0..=live.order().len())
            .map(|_| tokio::sync::Mutex::new(()))
            .collect();
        let backups = cache
            .clone()
            .map(|cache| BackupWriter::start(key.clone(), cache, Arc::clone(&live)));
        Self {
            key,
            client,
            live,
            cache,
            backups,
            app_id: app_id.to_string(),
            cluster: cluster.to_string(),
            locks,
        }
    }

    /// Fetches `namespace` and takes the answer. Returns how many keys
    /// changed.
    pub(crate) async fn refresh(&self, namespace: &str) -> Result<usize, ApolloError> {
        self.refresh_notified(namespace, None).await
    }

    /// [`refresh`](Self::refresh) for a notification carrying `messages`
    /// (sent with the fetch, so that a stale release cache is not
    /// believed).
    pub(crate) async fn refresh_notified(
        &self,
        namespace: &str,
        messages: Option<&serde_json::Value>,
    ) -> Result<usize, ApolloError> {
        self.take_in(namespace, messages, false).await
    }

    /// The periodic refresh of `namespace` (as the Java client's
    /// `schedulePeriodicRefresh`): fetches it with the release key held,
    /// usually a 304. A release found this way is one the long poll never
    /// announced — the config service's notification ids are below the
    /// one held (its database restored, or another Apollo behind the
    /// instance now in use), and it answers a poll only past ours — so the
    /// namespace's id is forgotten (-1), in the namespace's turn: the next
    /// poll learns the service's current id. Returns how many keys changed.
    pub(crate) async fn revisit(&self, namespace: &str) -> Result<usize, ApolloError> {
        self.take_in(namespace, None, true).await
    }

    /// The same refresher writing its backups through `backups` (a seam).
    #[cfg(test)]
    pub(crate) fn with_backup_writer(mut self, backups: BackupWriter) -> Self {
        self.backups = Some(backups);
        self
    }

    /// Has a backup that failed tried again now (see [`BackupWriter::retry`]).
    pub(crate) fn retry_backups(&self) {
        if let Some(backups) = &self.backups {
            backups.retry();
        }
    }

    /// Waits, up to `deadline`, until every release served is backed up;
    /// whether it was (true without backup cache).
    pub(crate) async fn flush_backups(&self, deadline: tokio::time::Instant) -> bool {
        match &self.backups {
            Some(backups) => backups.flush(deadline).await,
            None => true,
        }
    }

    /// Fetches `namespace` and serves the answer, then hands it to the
    /// backup writer (in the namespace's turn, so backups keep the
    /// fetches' order; never waiting for the disk). `unannounced`: a new
    /// release found is one the long poll did not announce (see
    /// [`revisit`](Self::revisit)). Returns how many keys changed.
    async fn take_in(
        &self,
        namespace: &str,
        messages: Option<&serde_json::Value>,
        unannounced: bool,
    ) -> Result<usize, ApolloError> {
        let _serialised = self.lock_of(namespace).lock().await;
        let held = self.live.release_key(namespace);
        let fetched = self
            .client
            .fetch(namespace, held.as_deref(), messages)
            .await?;
        let (config, source) = match fetched {
            Fetched::Unchanged => {
                let previous = self.live.confirm(namespace);
                self.log_confirmed(namespace, previous);
                return Ok(0);
            }
            Fetched::Released(mut config) => {
                config.namespace_name = namespace.to_string();
                (config, Source::Server)
            }
            Fetched::NotReleased => (self.empty(namespace), Source::NotReleased),
        };
        let applied = self.live.apply(
            namespace,
            config.configurations.clone(),
            &config.release_key,
            source,
        );
        let release_key = config.release_key.clone();
        if let Some(backups) = &self.backups {
            backups.offer(config);
        }
        if unannounced && held.as_deref() != Some(release_key.as_str()) {
            self.live.forget_notification_id(namespace);
            warn!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                held = held.as_deref().unwrap_or(""),
                release_key = %release_key,
                "Apollo release found by the periodic refresh, never announced by the long poll (the config service's notification ids are below ours: a restored or another Apollo); polling again from its current id."
            );
        }
        if source == Source::NotReleased && applied.previous != Source::NotReleased {
            warn!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                "Apollo namespace has no release (HTTP 404); serving it empty."
            );
        } else {
            self.log_confirmed(namespace, applied.previous);
        }
        if applied.previous == Source::Pending {
            info!(
                component = %self.key,
                namespace,
                release_key = %release_key,
                keys = applied.changed,
                "Apollo namespace loaded."
            );
        } else if applied.changed > 0 {
            info!(
                component = %self.key,
                namespace,
                release_key = %release_key,
                changed = applied.changed,
                "Apollo namespace updated."
            );
        }
        Ok(applied.changed)
    }

    /// The lock serialising the fetches of `namespace`.
    fn lock_of(&self, namespace: &str) -> &tokio::sync::Mutex<()> {
        let order = self.live.order();
        let index = order
            .iter()
            .position(|n| n == namespace)
            .unwrap_or(order.len());
        &self.locks[index]
    }

    /// Serves `config` (read from the backup cache) until the config
    /// service answers for its namespace.
    pub(crate) fn serve_backup(&self, config: ApolloConfig) {
        self.live.apply(
            &config.namespace_name.clone(),
            config.configurations,
            &config.release_key,
            Source::Backup,
        );
    }

    fn empty(&self, namespace: &str) -> ApolloConfig {
        ApolloConfig {
            app_id: self.app_id.clone(),
            cluster: self.cluster.clone(),
            namespace_name: namespace.to_string(),
            configurations: BTreeMap::new(),
            release_key: String::new(),
        }
    }

    fn log_confirmed(&self, namespace: &str, previous: Source) {
        if previous == Source::Backup {
            info!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                "Config service answered; no longer serving the backup cache."
            );
        }
    }
}
