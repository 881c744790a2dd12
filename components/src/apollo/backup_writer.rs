//! [`BackupWriter`]: writes the backup cache off the long poll, one task
//! per store.
//!
//! A backup folder on a hung mount (NFS) blocks every file call. Were the
//! poll round or a write's read-back to wait for the backup, one hung
//! folder would stop the store following releases for good. So a served
//! release is only handed over ([`offer`](BackupWriter::offer), which
//! never waits); the writer keeps the latest release per namespace not
//! written yet and writes them one at a time, each write (every file
//! step) in one blocking call given [`WRITE_DEADLINE`]:
//!
//! * A write past its deadline is left to finish on its blocking thread;
//!   no other is started until it returns (threads do not pile up on a
//!   hung mount), and the releases served meanwhile wait in their place,
//!   the latest only.
//! * A failed or late write is retried (from 1 s, doubling to 60 s, and at
//!   each long poll round) until the latest release is on disk: a file
//!   left stale by one failure is written again.
//! * Meanwhile the store reports `Degraded` with the reason (a restart
//!   without config service would serve an older release, or none).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::ComponentKey;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

use super::cache::BackupCache;
use super::client::ApolloConfig;
use super::error::ApolloError;
use super::namespaces::LiveNamespaces;
use crate::backoff::Backoff;

/// How long one backup write (all its file steps) may take before it is
/// taken as failed: a healthy disk takes milliseconds.
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// The first wait before a failed write is tried again; doubles up to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Writes one release to disk, blocking (a seam for tests).
pub(crate) type WriteFn = Arc<dyn Fn(&ApolloConfig) -> Result<(), ApolloError> + Send + Sync>;

/// The releases waiting to be written, by namespace, each with the number
/// of its offer (to tell whether a newer one came while it was written).
#[derive(Default)]
struct Waiting {
    releases: BTreeMap<String, (u64, ApolloConfig)>,
    offers: u64,
    /// Whether a write is running (so a flush waits for it too).
    writing: bool,
}

struct Shared {
    waiting: Mutex<Waiting>,
    /// Wakes the writer: a release offered, or a retry asked for.
    wake: Notify,
    /// Wakes flushes: nothing waiting any more.
    drained: Notify,
}

impl Shared {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The store's backup writer; its task ends when this is dropped.
pub(crate) struct BackupWriter {
    shared: Arc<Shared>,
    _stop: DropGuard,
}

impl std::fmt::Debug for BackupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupWriter")
            .field("waiting", &self.shared.waiting().releases.len())
            .finish()
    }
}

impl BackupWriter {
    /// A writer to `cache`, reporting to `live`.
    pub(crate) fn start(key: ComponentKey, cache: BackupCache, live: Arc<LiveNamespaces>) -> Self {
        let write: WriteFn = Arc::new(move |config| cache.write_blocking(config));
        Self::start_with(key, write, WRITE_DEADLINE, live)
    }

    /// A writer through `write`, each given `deadline`.
    pub(crate) fn start_with(
        key: ComponentKey,
        write: WriteFn,
        deadline: Duration,
        live: Arc<LiveNamespaces>,
    ) -> Self {
        let shared = Arc::new(Shared {
            waiting: Mutex::default(),
            wake: Notify::new(),
            drained: Notify::new(),
        });
        let stop = CancellationToken::new();
        let task = Task {
            key,
            write,
            deadline,
            live,
            shared: Arc::clone(&shared),
            stuck: None,
            backoff: Backoff::new(FIRST_RETRY, MAX_RETRY),
            failing: None,
        };
        tokio::spawn(task.run(stop.clone()));
        Self {
            shared,
            _stop: stop.drop_guard(),
        }
    }

    /// Hands `config` over to be written, replacing an older release of
    /// its namespace still waiting. Never waits.
    pub(crate) fn offer(&self, config: ApolloConfig) {
        {
            let mut waiting = self.shared.waiting();
            waiting.offers += 1;
            let offer = waiting.offers;
            waiting
                .releases
                .insert(config.namespace_name.clone(), (offer, config));
        }
        self.shared.wake.notify_one();
    }

    /// Has a failed write tried again now, if one waits (each long poll
    /// round asks); a write in progress is not doubled.
    pub(crate) fn retry(&self) {
        if !self.shared.waiting().releases.is_empty() {
            self.shared.wake.notify_one();
        }
    }

    /// Waits until every release offered is written, up to `deadline`;
    /// whether it was.
    pub(crate) async fn flush(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let drained = self.shared.drained.notified();
            {
                let waiting = self.shared.waiting();
                if waiting.releases.is_empty() && !waiting.writing {
                    return true;
                }
            }
            self.shared.wake.notify_one();
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                return false;
            }
        }
    }
}

struct Task {
    key: ComponentKey,
    write: WriteFn,
    deadline: Duration,
    live: Arc<LiveNamespaces>,
    shared: Arc<Shared>,
    /// A write past its deadline, still blocked.
    stuck: Option<JoinHandle<Result<(), ApolloError>>>,
    backoff: Backoff,
    /// The error of the current failure streak, if one is going on.
    failing: Option<String>,
}

impl Task {
    async fn run(mut self, stop: CancellationToken) {
        let mut retry_in: Option<Duration> = None;
        loop {
            let woken = self.shared.wake.notified();
            let retry = async {
                match retry_in {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = woken => {}
                () = retry => {}
            }
            // A write still blocked: no other until it returns.
            if let Some(stuck) = self.stuck.as_mut() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = stuck => self.stuck = None,
                }
            }
            retry_in = match self.write_waiting().await {
                Ok(()) => {
                    self.succeeded();
                    None
                }
                Err(err) => Some(self.failed(&err)),
            };
        }
    }

    /// Writes every release waiting, the oldest namespace first; stops at
    /// the first failure.
    async fn write_waiting(&mut self) -> Result<(), ApolloError> {
        loop {
            let next = {
                let mut waiting = self.shared.waiting();
                let next = waiting
                    .releases
                    .iter()
                    .min_by_key(|(_, (offer, _))| *offer)
                    .map(|(name, (offer, config))| (name.clone(), *offer, config.clone()));
                waiting.writing = next.is_some();
                next
            };
            let Some((namespace, offer, config)) = next else {
                self.shared.drained.notify_waiters();
                return Ok(());
            };
            let written = self.write_one(config).await;
            let mut waiting = self.shared.waiting();
            waiting.writing = false;
            written?;
            if waiting.releases.get(&namespace).map(|(o, _)| *o) == Some(offer) {
                waiting.releases.remove(&namespace);
            }
        }
    }

    /// Writes `config` in a blocking task, within the deadline.
    async fn write_one(&mut self, config: ApolloConfig) -> Result<(), ApolloError> {
        let write = Arc::clone(&self.write);
        let namespace = config.namespace_name.clone();
        let mut task = tokio::task::spawn_blocking(move || write(&config));
        match tokio::time::timeout(self.deadline, &mut task).await {
            Ok(Ok(written)) => written,
            Ok(Err(join)) => Err(ApolloError::Config(format!(
                "backup of namespace `{namespace}` stopped: {join}"
            ))),
            Err(_) => {
                self.stuck = Some(task);
                Err(ApolloError::Config(format!(
                    "backup of namespace `{namespace}` not written within {:?} (a hung backup folder?); later backups wait for it",
                    self.deadline
                )))
            }
        }
    }

    fn succeeded(&mut self) {
        self.backoff.reset();
        self.live.backup_failed(None);
        if self.failing.take().is_some() {
            info!(component = %self.key, "Apollo backup cache written again.");
        }
    }

    /// Reports `err`; the wait before the next try.
    fn failed(&mut self, err: &ApolloError) -> Duration {
        let wait = self.backoff.next_wait();
        let message = err.to_string();
        self.live.backup_failed(Some(&message));
        if self.failing.as_deref() != Some(message.as_str()) {
            warn!(
                component = %self.key,
                error = %message,
                retry_in_ms = wait.as_millis() as u64,
                "Apollo backup cache not written; the releases are served, the backup is behind."
            );
        }
        self.failing = Some(message);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apollo::poller::PollerTask;
    use crate::apollo::refresh::Refresher;
    use crate::apollo::services::{ConfigServices, InstanceSettings};
    use rewire_runtime::Readiness;
    use testkit::apollo::{ApolloServer, APP_ID, CLUSTER};

    /// A backup folder on a hung mount: each write blocks until the gate
    /// opens (at the end of the test, so the runtime can shut down).
    #[derive(Clone, Default)]
    struct HungFolder {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        calls: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl HungFolder {
        fn write(&self) -> WriteFn {
            let folder = self.clone();
            Arc::new(move |_config| {
                folder
                    .calls
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (open, opened) = &*folder.open;
                let mut is_open = open.lock().unwrap_or_else(|p| p.into_inner());
                while !*is_open {
                    is_open = opened.wait(is_open).unwrap_or_else(|p| p.into_inner());
                }
                Ok(())
            })
        }

        fn open(&self) {
            let (open, opened) = &*self.open;
            *open.lock().unwrap_or_else(|p| p.into_inner()) = true;
            opened.notify_all();
        }
    }

    /// Opens the gate when the test ends, failed or not: the runtime's
    /// shutdown waits for the blocked write.
    struct OpenOnDrop(HungFolder);

    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.open();
        }
    }

    async fn services(server: &ApolloServer) -> ConfigServices {
        let settings = InstanceSettings {
            app_id: APP_ID.into(),
            cluster: CLUSTER.into(),
            secret: None,
            ip: None,
            request_timeout: Duration::from_secs(2),
            long_poll_timeout: Duration::from_secs(5),
            tls: crate::tls::http_config(None).unwrap_or_else(|e| panic!("{e}")),
            tls_configured: false,
        };
        ConfigServices::new(&server.url(), None, Duration::from_secs(60), settings)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not within 10 s: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_backup_folder_holds_no_release_back_and_is_reported() {
        let server = ApolloServer::start().await;
        server.set_hold(Duration::from_millis(300));
        server.release("application", &[("k", "v1")]);
        let live = Arc::new(LiveNamespaces::new(vec!["application".into()]));
        let key = ComponentKey::new("configuration", "apollo");
        let folder = HungFolder::default();
        let _open_at_end = OpenOnDrop(folder.clone());
        let writer = BackupWriter::start_with(
            key.clone(),
            folder.write(),
            Duration::from_millis(200),
            Arc::clone(&live),
        );
        let refresher = Refresher::new(
            key,
            services(&server).await,
            Arc::clone(&live),
            None,
            APP_ID,
            CLUSTER,
        )
        .with_backup_writer(writer);
        let refresher = Arc::new(refresher);
        let first_load =
            tokio::time::timeout(Duration::from_secs(10), refresher.refresh("application"));
        first_load
            .await
            .expect("the first load waits for no backup")
            .unwrap_or_else(|e| panic!("{e}"));
        let poller = PollerTask::start(
            Arc::clone(&refresher),
            crate::backoff::Backoff::new(Duration::from_millis(50), Duration::from_millis(400)),
            Duration::from_millis(50),
            Duration::from_secs(600),
            tokio_util::sync::CancellationToken::new(),
        );
        let value = |live: &LiveNamespaces| live.value("application", "k");

        for release in ["v2", "v3"] {
            server.release("application", &[("k", release)]);
            eventually(&format!("`k` is {release}"), || {
                value(&live).as_deref() == Some(release)
            })
            .await;
        }
        eventually("the hung backup reported", || {
            matches!(live.readiness(), Readiness::Degraded(_))
        })
        .await;
        match live.readiness() {
            Readiness::Degraded(reason) => {
                assert!(reason.starts_with("backup cache behind"), "{reason}");
                assert!(reason.contains("not written within 200ms"), "{reason}");
            }
            other => panic!("a backup that never returns is not silently Ready: {other:?}"),
        }
        assert_eq!(
            folder.calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "no write is started while one is blocked"
        );

        // The mount recovers: the latest release is written, Ready again.
        folder.open();
        eventually("Ready once the backup is written", || {
            live.readiness() == Readiness::Ready
        })
        .await;
        assert!(folder.calls.load(std::sync::atomic::Ordering::SeqCst) >= 2);
        poller.stop().await;
    }
}
