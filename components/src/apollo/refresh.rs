//! [`Refresher`]: fetches a namespace from the config service, takes the
//! answer into [`LiveNamespaces`] and the backup cache.
//!
//! Fetches of a namespace are serialised, so an older answer can never
//! replace a newer one (the long poll and a write's read-back may fetch the
//! same namespace); fetches of different namespaces run side by side (the
//! first load asks them all at once).
//!
//! Every fetch carries the release messages the long poll last brought
//! for its namespace (see [`super::notified`]), as the Java client's do, so
//! that a config service whose release cache lags reloads it rather than
//! answer an older release. A fetch refused while carrying them (HTTP 4xx
//! other than 401/403/404: a request line too long for a proxy or Tomcat,
//! messages it cannot read) is made again at once without them, and they
//! are dropped (warned about): they cannot stop the namespace from
//! following its releases. An answer naming the release key already held
//! is not taken again.
//!
//! A 404 for a namespace whose release is held (deleted in the portal, or
//! an instance that lost it) keeps that release and its backup, as the
//! Java client does: warned about once, reported in the readiness, and
//! taken as an answer (the caller advances the notification id, so the
//! long poll of the other namespaces goes on). A later release is taken as
//! usual. A store that holds no release yet (just started, or rebuilt
//! by a metadata change) takes the backup file's release for the one
//! held: served, kept and not written over, as the Java client falls back
//! to its local file. A namespace that never had a release is served
//! empty.
//!
//! A fetched release is served first, then handed to the store's backup
//! writer (still in the namespace's turn, so backups keep the fetches'
//! order), which writes it off the fetch: a hung backup folder holds
//! neither the long poll, nor a namespace's turn, nor the store's write
//! turn (see [`BackupWriter`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use rewire_runtime::ComponentKey;
use tracing::{debug, info, warn};

use super::backup_writer::BackupWriter;
use super::cache::BackupCache;
use super::client::{ApolloConfig, Fetched};
use super::error::ApolloError;
use super::namespaces::{LiveNamespaces, Source};
use super::release_messages::ReleaseMessages;
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
    /// (merged into the namespace's, which every fetch sends, so that a
    /// stale release cache is not believed).
    pub(crate) async fn refresh_notified(
        &self,
        namespace: &str,
        messages: Option<&ReleaseMessages>,
    ) -> Result<usize, ApolloError> {
        self.take_in(namespace, false, messages).await
    }

    /// The periodic refresh of `namespace` (as the Java client's
    /// `schedulePeriodicRefresh`): fetches it with the release key and
    /// messages held, usually a 304. A release found this way is one the
    /// long poll has not announced: either not yet (it is on its way), or
    /// never — the config service's notification ids are below the one
    /// held (its database restored, or another Apollo behind the instance
    /// now in use), and it answers a poll only past ours. So the
    /// namespace's id is forgotten (-1), in the namespace's turn: the next
    /// poll learns the service's current id, and the poller tells the two
    /// cases apart by comparing it with the id forgotten. Returns how many
    /// keys changed.
    pub(crate) async fn revisit(&self, namespace: &str) -> Result<usize, ApolloError> {
        self.take_in(namespace, true, None).await
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

    /// Fetches `namespace` (with its release key and messages) and serves
    /// the answer, then hands it to the backup writer (in the namespace's
    /// turn, so backups keep the fetches' order; never waiting for the
    /// disk). `unannounced`: a new release found is one the long poll has
    /// not announced (see [`revisit`](Self::revisit)). `notified`: the
    /// messages of the notification that asked for this fetch, merged in
    /// the namespace's turn, just before they are read: merged before it,
    /// a fetch in progress could drop them (see [`Notified::forget`]) and
    /// this one would go without them, to be answered an older release by
    /// a lagging instance. Returns how many keys changed.
    ///
    /// [`Notified::forget`]: super::notified::Notified::forget
    async fn take_in(
        &self,
        namespace: &str,
        unannounced: bool,
        notified: Option<&ReleaseMessages>,
    ) -> Result<usize, ApolloError> {
        let _serialised = self.lock_of(namespace).lock().await;
        if let Some(notified) = notified {
            self.live.note_messages(namespace, notified);
        }
        let held = self.live.release_key(namespace);
        let messages = self.live.messages(namespace);
        let fetched = match self
            .client
            .fetch(namespace, held.as_deref(), messages.as_ref())
            .await
        {
            Err(err) if messages.is_some() && err.is_refused_request() => {
                self.live.drop_messages(namespace);
                warn!(
                    component = %self.key,
                    server = %self.client.server(),
                    namespace,
                    error = %err,
                    "Apollo config service refused a fetch carrying the release messages; they are dropped and the fetch made again without them."
                );
                self.client.fetch(namespace, held.as_deref(), None).await?
            }
            other => other?,
        };
        let (config, source) = match fetched {
            Fetched::Released(config) if held.as_deref() == Some(config.release_key.as_str()) => {
                // The release served (a service or proxy that answers 200
                // where Apollo answers 304): nothing to take again.
                self.confirmed(namespace);
                return Ok(0);
            }
            Fetched::Unchanged => {
                self.confirmed(namespace);
                return Ok(0);
            }
            Fetched::Released(mut config) => {
                config.namespace_name = namespace.to_string();
                (config, Source::Server)
            }
            Fetched::NotReleased if held.is_some() => {
                self.keep_missing(namespace);
                return Ok(0);
            }
            Fetched::NotReleased => match self.backed_up_release(namespace).await {
                Some(backup) => return Ok(self.serve_missing_backup(namespace, backup)),
                None => (self.empty(namespace), Source::NotReleased),
            },
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
        if unannounced && source == Source::Server {
            // Warned about by the poller once the service's id is known:
            // a poll just late announces an id at or above the one held.
            self.live.forget_notification_id(namespace);
            debug!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                held = held.as_deref().unwrap_or(""),
                release_key = %release_key,
                "Apollo release found by the periodic refresh before the long poll announced it; polling again from the service's current id."
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

    /// The release held is the service's: confirmed, and said so when it
    /// was served from the backup or missing there.
    fn confirmed(&self, namespace: &str) {
        let previous = self.live.confirm(namespace);
        self.log_confirmed(namespace, previous);
    }

    /// The release backed up for `namespace`, for a 404 met before any
    /// release of it is held (the store just started or was rebuilt,
    /// every namespace Pending): the backup holds the last release this
    /// app served, kept as a release held in memory is (as the Java
    /// client's `LocalFileConfigRepository` falls back to its file when
    /// the sync fails). `None` without cache, file or release in it; a
    /// file that cannot be read is warned about (the namespace is then
    /// served empty, as without file).
    async fn backed_up_release(&self, namespace: &str) -> Option<ApolloConfig> {
        if !matches!(
            self.live.source(namespace),
            Source::Pending | Source::Backup
        ) {
            return None;
        }
        match self.cache.as_ref()?.read(namespace).await {
            Ok(found) => found.filter(|config| !config.release_key.is_empty()),
            Err(err) => {
                warn!(component = %self.key, namespace, error = %err, "Apollo backup cache unusable.");
                None
            }
        }
    }

    /// Serves `backup` as [`Source::Missing`] (warned about once; later
    /// 404s meet it held), without handing it to the backup writer: the
    /// file stays as it is. Returns how many keys changed.
    fn serve_missing_backup(&self, namespace: &str, backup: ApolloConfig) -> usize {
        let applied = self.live.apply(
            namespace,
            backup.configurations,
            &backup.release_key,
            Source::Missing,
        );
        warn!(
            component = %self.key,
            server = %self.client.server(),
            namespace,
            release_key = %backup.release_key,
            "Apollo namespace answered HTTP 404 before any release of it was held (deleted in the portal, or an instance that lost it); serving its last release from the backup cache (kept as it is) until it is released again."
        );
        applied.changed
    }

    /// A 404 while a release is held: the release is kept (not written
    /// over in the backup either), warned about once per streak (the
    /// name, never values).
    fn keep_missing(&self, namespace: &str) {
        if self.live.missing(namespace) != Source::Missing {
            warn!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                "Apollo namespace answered HTTP 404 though it had a release (deleted in the portal, or an instance that lost it); keeping its last release (and its backup) until it is released again."
            );
        }
    }

    fn log_confirmed(&self, namespace: &str, previous: Source) {
        match previous {
            Source::Backup => info!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                "Config service answered; no longer serving the backup cache."
            ),
            Source::Missing => info!(
                component = %self.key,
                server = %self.client.server(),
                namespace,
                "Apollo namespace's release found again at the config service."
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
