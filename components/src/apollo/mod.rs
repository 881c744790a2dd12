//! The `apollo` config store: serves namespaces of an
//! [Apollo](https://www.apolloconfig.com) app through Apollo's client
//! protocol, follows their releases by long polling, and writes through the
//! Open API.
//!
//! * **Reads.** At init every namespace of `namespace_name`
//!   (comma-separated) is fetched from `GET /configs/{appId}/{cluster}/{ns}`.
//!   A namespace without release (404) is served empty, with a warning.
//!   A 404 for a namespace that has served a release (deleted in the
//!   portal, or an instance that lost it) keeps its last release and its
//!   backup, as the Java client does: warned about once, the store
//!   `Degraded` naming the namespace, its notification id advanced so the
//!   long poll of the others goes on; a later release is taken as usual.
//!   The same after a restart or rebuild, from the backup file's release
//!   (the file is not written over).
//!   `get`/`subscribe` with a `group` read that namespace; without a group
//!   they read all namespaces merged, the first namespace in
//!   `namespace_name` that has a key winning. Keys narrow the query (none =
//!   every key). An item's `version` is the release key of its namespace;
//!   `metadata["namespace"]` names the namespace. Apollo has no labels: a
//!   label is rejected.
//! * **Changes.** A background task long-polls `GET /notifications/v2`
//!   (held by the service up to 60 s, read timeout `longPollTimeoutMs`),
//!   re-fetches the namespaces it names and publishes changed keys to
//!   subscribers, removed keys with an empty value. Failures back off
//!   exponentially from `retryIntervalMs` to `maxRetryIntervalMs`, keeping
//!   the last good configuration. The task stops on the runtime's shutdown
//!   token and in `close`. Every `refreshIntervalMs` (default 5 min) each
//!   namespace is also fetched with its release key (usually a 304), as
//!   the Java client does: a release the poll never announces (the
//!   service's notification ids below ours, after a database restore or a
//!   move to another Apollo) is still served, and polling starts over
//!   from the service's ids (see `periodic.rs`). Every fetch, the
//!   periodic one included, sends the release messages the poll last
//!   brought for its namespace, so that a config service whose release
//!   cache lags answers the latest release, not the one before; an answer
//!   naming the release key held is not taken again. The messages kept
//!   are bounded (see `release_messages.rs`), and a fetch refused with
//!   them (HTTP 4xx) is made again without them, which are dropped.
//! * **Several config services.** `config_server` may list instances
//!   (comma-separated, or a JSON array), or `meta_server` names Apollo's
//!   meta server, whose `/services/config` lists them (asked at start,
//!   every `metaRefreshIntervalMs`, and when every instance failed; its
//!   first 64 distinct instances are taken). Fetches and long polls go to
//!   one instance and move on at once to the next when it is down (no
//!   connection, timeout, HTTP 5xx), at most three per request; when those
//!   are down, the usual backoff applies and the last good configuration
//!   (or the backup cache, at start) is served. See `services.rs`.
//! * **Access key.** With `secret`, every config service request is signed
//!   (`Authorization: Apollo {appId}:{signature}`, `Timestamp`). A rejected
//!   signature fails init at once, naming the server and the status.
//! * **Backup cache.** With `is_backup_config` (default), each release is
//!   written to `{backup_config_path}/{appId}+{cluster}+{namespace}.json`
//!   (write + rename) by a writer task of the store, off the long poll:
//!   each write has a deadline, a failed or hung one is retried until the
//!   latest release is on disk, meanwhile the store reports `Degraded`
//!   ("backup cache behind"); `close` waits for it, bounded (see
//!   `backup_writer.rs`). If the config service cannot be reached at init,
//!   the store starts from those files and reports
//!   `Degraded("serving from backup cache: config service unreachable")`
//!   until the service answers. The first load is bounded by the readiness
//!   timeout: namespaces are fetched at once (up to 8 in flight), none more
//!   after one no instance answered, and when the timeout runs out (a
//!   service that accepts connections but never answers) the backup is
//!   served. Without a backup, init retries until the
//!   readiness timeout, then fails naming `config_server`.
//! * **Writes.** With `open_api_address` and `open_api_token`, `set` and
//!   `delete` edit items through the Open API (in the item's group, or the
//!   first namespace) and release each touched namespace as
//!   `open_api_user`; the store then reads the namespace back, so a `get`
//!   right after a write sees it. Every key set is checked first
//!   (non-empty; a value past the portal's length limit is the portal's to
//!   refuse); a key to delete that is empty names no item, so nothing is
//!   deleted for it (as a get or subscription finds nothing for it).
//!   A request the portal refuses undoes the edits not released yet, so a
//!   later release does not publish half a write; a request without
//!   answer (timeout) or answered with a 5xx is not undone, and the error
//!   says its outcome is unknown. Writes of the component run one at a
//!   time (its instances share the turn across rebuilds), to their end
//!   even when the caller stops waiting; `close` waits for the one in
//!   flight (up to 4.5 s). Nothing orders them with another process's
//!   writes to the namespace (see `writes.rs`, also for what is left when
//!   undoing fails too). Without them, writes are unsupported.
//! * **Metadata changes** rebuild the store (`update_in_place` answers
//!   `NeedsRebuild`); the new instance starts from the service or the cache.

mod backup_writer;
mod cache;
mod client;
mod error;
mod metadata;
mod namespaces;
mod notified;
mod open_api;
mod periodic;
mod poller;
mod private_folder;
mod refresh;
mod release_messages;
mod services;
mod signing;
mod start;
mod trace;
mod value_texts;
mod writes;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, ConfigError, ConfigItem, ConfigQuery, ConfigStore,
    ConfigSubscription, InPlace, InPlaceUpdate, InitContext, Metadata, Readiness,
};
use tracing::{info, warn};

use crate::backoff::Backoff;
pub use client::MAX_ANSWER_BYTES;
pub use metadata::ApolloMetadata;

/// The least `refreshIntervalMs`: each interval fetches every namespace,
/// so 0 (perhaps meant as "off") would ask the config service non-stop.
const MIN_REFRESH_INTERVAL_MS: u64 = 1_000;
use open_api::OpenApiClient;
use poller::PollerTask;
use refresh::Refresher;
use writes::{Edit, ReadBack};

/// Config store reading an Apollo config service: several namespaces,
/// long-polled releases, access-key signing, backup cache, Open API writes.
///
/// See the [module docs](self) for the behaviour.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "config_store",
    type = "apollo",
    example = r#"{"config_server": "http://127.0.0.1:8080", "app_id": "checkout", "cluster": "default", "namespace_name": "application"}"#
)]
pub struct ApolloConfigStore {
    #[metadata]
    settings: ApolloMetadata,
    running: Option<Running>,
    poller: Mutex<Option<PollerTask>>,
}

/// What `init` set up.
#[derive(Debug)]
struct Running {
    refresher: Arc<Refresher>,
    open_api: Option<Arc<OpenApiClient>>,
    /// Taken by each write for its whole run (see [`write_turn_of`]).
    writing: Arc<tokio::sync::Mutex<WriteTurn>>,
    /// Held (shared) by each write this instance runs, for its whole run:
    /// its close waits for its own writes, not for a successor's.
    own_writes: Arc<tokio::sync::RwLock<()>>,
    /// Stops following the TLS files when the store goes.
    _follow: Option<tokio_util::sync::DropGuard>,
}

/// What the write turn guards: nothing but the right to write (a type of
/// its own, to be found in the handover area).
#[derive(Debug, Default)]
struct WriteTurn;

/// The turn every write of the component `cx` initialises takes for its
/// whole run (see [`writes`]). The component's, not one instance's: the
/// turn a live predecessor (or its write still running) holds, else a new
/// one left for the successors in the runtime's handover area — so that
/// an instance a metadata change builds (a rotated `open_api_token`)
/// waits for a write its predecessor still runs, else each could split
/// the other's. Left for any later instance, not only of the same type: a
/// write still running must be waited for whatever was declared since.
fn write_turn_of(cx: &InitContext) -> Arc<tokio::sync::Mutex<WriteTurn>> {
    if let Some(turn) = cx.left_by_predecessors().into_iter().next() {
        return turn;
    }
    let fresh = Arc::new(tokio::sync::Mutex::new(WriteTurn));
    cx.leave_for_successor(&fresh);
    fresh
}

/// How long `close` waits for a write in flight, and for the backups
/// (together): inside the runtime's 5 s bound on `close`, so that the
/// store can say what it left.
const CLOSE_WAITS_FOR_WRITE: Duration = Duration::from_millis(4_500);

impl ApolloConfigStore {
    /// A store for `settings`, not initialised yet.
    pub fn new(settings: ApolloMetadata) -> Self {
        Self {
            settings,
            running: None,
            poller: Mutex::default(),
        }
    }

    fn running(&self) -> Result<&Running, ConfigError> {
        self.running.as_ref().ok_or_else(|| {
            ConfigError::Backend("the apollo config store is not initialised".into())
        })
    }

    fn take_poller(&self) -> Option<PollerTask> {
        self.poller.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The namespace a write or read with `group` is about.
    fn namespace_of(
        &self,
        running: &Running,
        group: Option<&String>,
    ) -> Result<String, ConfigError> {
        let live = &running.refresher.live;
        match group {
            None => Ok(live.order().first().cloned().unwrap_or_default()),
            Some(group) if live.contains(group) => Ok(group.clone()),
            Some(group) => Err(ConfigError::Invalid(format!(
                "group `{group}` is not a namespace of this store (namespaces: {})",
                live.order().join(", ")
            ))),
        }
    }

    fn check_query(&self, running: &Running, query: &ConfigQuery) -> Result<(), ConfigError> {
        no_label(query.label.as_ref())?;
        self.namespace_of(running, query.group.as_ref()).map(|_| ())
    }

    fn open_api<'a>(
        &self,
        running: &'a Running,
        operation: &str,
    ) -> Result<&'a Arc<OpenApiClient>, ConfigError> {
        running.open_api.as_ref().ok_or_else(|| {
            ConfigError::Unsupported(format!(
                "{operation}: apollo writes go through the Open API; set `open_api_address` and `open_api_token`"
            ))
        })
    }

    /// Makes `edits` (checked), releases each namespace they touch and
    /// reads it back; a failure undoes what is known not to be released
    /// (see [`writes`]). One write at a time, each in a task of its own:
    /// a caller that stops waiting (its deadline) leaves the write to
    /// finish (each request bounded by `requestTimeoutMs`), so it is
    /// never split by the next.
    async fn write(
        &self,
        running: &Running,
        open_api: &Arc<OpenApiClient>,
        edits: Vec<Edit>,
    ) -> Result<(), ConfigError> {
        let open_api = Arc::clone(open_api);
        let refresher = Arc::clone(&running.refresher);
        // Waits as long as the caller does: the sidecar cuts a call after
        // its request timeout (or the caller's deadline), dropping this.
        let own = Arc::clone(&running.own_writes).read_owned().await;
        let turn = Arc::clone(&running.writing).lock_owned().await;
        let (answer, answered) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _own = own;
            let mut read_back = ReadBack::new(&refresher, open_api.request_timeout());
            let result = writes::write(&open_api, &mut read_back, &edits).await;
            drop(turn);
            let _ = answer.send(result);
        });
        answered.await.unwrap_or_else(|_| {
            Err(ConfigError::Backend(
                "the apollo write stopped before it finished".into(),
            ))
        })
    }

    /// Waits (bounded) for this instance's writes in flight, if any, so
    /// that closing (at shutdown, the last thing before the process ends)
    /// does not cut one between an edit and its release or undo. A
    /// successor's writes are not waited for (the old instance closes
    /// after a rebuild while the new one may be writing).
    async fn wait_for_writes(&self) {
        let Some(running) = &self.running else {
            return;
        };
        let turn = tokio::time::timeout(CLOSE_WAITS_FOR_WRITE, running.own_writes.write()).await;
        if turn.is_err() {
            warn!(
                component = %running.refresher.key,
                waited_ms = CLOSE_WAITS_FOR_WRITE.as_millis() as u64,
                "Apollo write still running at close; if it is cut short, its edits may be left in the namespace's draft."
            );
        }
    }

    /// Waits (up to `deadline`) until every release served is in the
    /// backup cache, so that a restart without config service serves the
    /// last one.
    async fn flush_backups(&self, deadline: tokio::time::Instant) {
        let Some(running) = &self.running else {
            return;
        };
        if !running.refresher.flush_backups(deadline).await {
            warn!(
                component = %running.refresher.key,
                "Apollo backup cache not written by close (failing or hung); the files may hold older releases."
            );
        }
    }
}

fn no_label(label: Option<&String>) -> Result<(), ConfigError> {
    match label {
        Some(label) => Err(ConfigError::Invalid(format!(
            "apollo has no labels, but label `{label}` was asked for"
        ))),
        None => Ok(()),
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for ApolloConfigStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let started = tokio::time::Instant::now();
        let app_id = match self.settings.app_id.as_deref().map(str::trim) {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => cx.app_id.clone(),
        };
        if app_id.is_empty() {
            return Err(ComponentError::new(
                "metadata field `app_id` is required (the runtime has no appId either)",
            ));
        }
        if self.settings.refresh_interval_ms < MIN_REFRESH_INTERVAL_MS {
            return Err(ComponentError::new(format!(
                "metadata field `refreshIntervalMs`: {} is below the least allowed, {MIN_REFRESH_INTERVAL_MS} (1 s): every namespace is fetched at each interval",
                self.settings.refresh_interval_ms
            )));
        }
        let (mut running, followed) = self.connect(cx, &app_id).await?;
        let refresher = Arc::clone(&running.refresher);
        self.first_load(&refresher, cx, started).await?;
        let backoff = Backoff::new(
            self.settings.retry_interval(),
            self.settings.max_retry_interval(),
        );
        let task = PollerTask::start(
            Arc::clone(&refresher),
            backoff,
            self.settings.retry_interval(),
            self.settings.refresh_interval(),
            cx.shutdown.child_token(),
        );
        let follow = task.stop_token().child_token();
        Self::follow_tls_files(cx, followed, &running, follow.clone());
        running._follow = Some(follow.drop_guard());
        if let Some(previous) = self
            .poller
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .replace(task)
        {
            previous.stop().await;
        }
        info!(
            component = %cx.key,
            servers = %refresher.client.servers(),
            app_id = %app_id,
            cluster = %self.settings.cluster,
            namespaces = %refresher.live.order().join(","),
            signed = self.settings.secret.is_some(),
            writable = running.open_api.is_some(),
            "Apollo config store started."
        );
        self.running = Some(running);
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        match &self.running {
            Some(running) => running.refresher.live.readiness(),
            None => Readiness::NotReady("not initialised".into()),
        }
    }

    async fn close(&self) -> Result<(), ComponentError> {
        let deadline = tokio::time::Instant::now() + CLOSE_WAITS_FOR_WRITE;
        if let Some(task) = self.take_poller() {
            task.stop().await;
        }
        self.wait_for_writes().await;
        self.flush_backups(deadline).await;
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Applied at once: nothing changes in place (the same metadata is kept,
/// any other is a rebuild), so nothing to stage.
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for ApolloConfigStore {
    /// Any change rebuilds the store: the new instance starts from the
    /// config service (or the backup cache).
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new: ApolloMetadata = metadata
            .decode()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        Ok(if new == self.settings {
            InPlace::Applied
        } else {
            InPlace::NeedsRebuild
        })
    }
}

#[rewire_runtime::prelude::async_trait]
impl ConfigStore for ApolloConfigStore {
    async fn get(&self, query: &ConfigQuery) -> Result<Vec<ConfigItem>, ConfigError> {
        let running = self.running()?;
        self.check_query(running, query)?;
        Ok(running.refresher.live.get(query))
    }

    async fn set(&self, items: Vec<ConfigItem>) -> Result<(), ConfigError> {
        let running = self.running()?;
        let open_api = self.open_api(running, "set")?;
        let mut edits = Vec::with_capacity(items.len());
        for item in items {
            writes::check_item(&item.key)?;
            no_label(item.label.as_ref())?;
            let namespace = self.namespace_of(running, item.group.as_ref())?;
            edits.push(Edit {
                namespace,
                key: item.key,
                value: Some(item.value),
            });
        }
        self.write(running, open_api, edits).await
    }

    async fn delete(&self, query: &ConfigQuery) -> Result<(), ConfigError> {
        let running = self.running()?;
        let open_api = self.open_api(running, "delete")?;
        no_label(query.label.as_ref())?;
        if query.keys.is_empty() {
            return Err(ConfigError::Invalid("delete needs at least one key".into()));
        }
        let namespace = self.namespace_of(running, query.group.as_ref())?;
        // An empty key names no item (a get finds none): nothing to
        // delete, as for any key not held.
        let edits: Vec<Edit> = query
            .keys
            .iter()
            .filter(|key| !key.is_empty())
            .map(|key| Edit {
                namespace: namespace.clone(),
                key: key.clone(),
                value: None,
            })
            .collect();
        if edits.is_empty() {
            return Ok(());
        }
        self.write(running, open_api, edits).await
    }

    async fn subscribe(&self, query: ConfigQuery) -> Result<ConfigSubscription, ConfigError> {
        let running = self.running()?;
        self.check_query(running, &query)?;
        Ok(running.refresher.live.subscribe(query))
    }
}
