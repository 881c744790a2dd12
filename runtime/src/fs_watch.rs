//! Watching one file (or the YAML files of a folder) for changes of its
//! content: the directory is watched (so editors' rename-writes and
//! Kubernetes ConfigMap `..data` symlink swaps are seen), debounces bursts
//! of events, and re-reads the file periodically in case events are lost.
//! The content is compared, never the inode, so any way of replacing the
//! file works.
//!
//! The watch's own blocking calls on the directory (its `stat`, adding the
//! OS watch) run on a detached thread bounded by [`PROBE_DEADLINE`], never
//! on an async worker: on a hung hard NFS mount a `stat` blocks in the
//! kernel for good, and would pin the worker with it. One that does not
//! answer in time is a lost watch; the periodic re-read carries on.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};

use crate::fs_read::{Abandoned, DetachedReader};

/// What to do when the file may have changed: typically re-read it and
/// compare its content with the last one.
pub type OnChange = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Quiet time after the last event before the file is re-read.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A steady stream of events still gets a re-read this often.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// While the directory cannot be watched (it was replaced, or is gone),
/// the watch is tried again this often.
const REWATCH: Duration = Duration::from_secs(1);
/// The shortest period of the periodic re-read: a shorter `resync` (zero
/// included) is raised to it.
pub(crate) const MIN_RESYNC: Duration = Duration::from_millis(100);
/// How long one of the watch's blocking calls on the directory (its
/// `stat`, adding the OS watch) may take before the watch counts as lost.
const PROBE_DEADLINE: Duration = Duration::from_secs(5);

/// The running watcher task; stopped when cancelled or dropped.
#[derive(Debug)]
pub struct FileWatch {
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl FileWatch {
    /// Starts watching `path`, calling `on_change` after each settled
    /// burst of events and every `resync` (`None`: never; 100 ms at the
    /// least: a shorter period, zero included, is raised to it);
    /// stops when `token` is cancelled.
    ///
    /// No change made after this returns is missed: the task puts the OS
    /// watch in place (off the async thread, see the module's doc), then
    /// calls `on_change` once for changes made before it.
    pub fn start(
        path: PathBuf,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
    ) -> Self {
        Self::start_target(Target::File(path), on_change, resync, token)
    }

    /// Like [`start`](Self::start), for the `*.yaml` / `*.yml` files of the
    /// folder `dir`: one added, changed, renamed or removed is a change.
    pub fn start_folder(
        dir: PathBuf,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
    ) -> Self {
        Self::start_target(Target::Folder(dir), on_change, resync, token)
    }

    fn start_target(
        target: Target,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
    ) -> Self {
        let probe = Probe::new(Arc::new(identity), PROBE_DEADLINE);
        Self::start_probed(target, on_change, resync, token, probe)
    }

    fn start_probed(
        target: Target,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
        probe: Probe,
    ) -> Self {
        let task =
            tokio::spawn(run(target, on_change, probe, resync, token.clone()).in_current_span());
        Self {
            token,
            task: Some(task),
        }
    }

    /// Stops the task and waits for it to end.
    pub async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            if let Err(err) = task.await {
                warn!(error = %err, "File watcher task failed.");
            }
        }
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// What is watched: one file, or the YAML files of a folder.
#[derive(Debug, Clone)]
enum Target {
    File(PathBuf),
    Folder(PathBuf),
}

impl Target {
    fn shown(&self) -> std::path::Display<'_> {
        match self {
            Self::File(path) | Self::Folder(path) => path.display(),
        }
    }
}

/// How the OS watcher reaches the task: pokes on relevant events, and
/// marks the watch stale when the directory itself was removed or renamed
/// (replaced) or the watcher failed.
#[derive(Clone, Default)]
struct Signal {
    poke: Arc<Notify>,
    stale: Arc<AtomicBool>,
}

/// The OS watcher, and which directory it watches (device and inode), to
/// tell when the directory was replaced under it.
struct Watching {
    _watcher: RecommendedWatcher,
    identity: Option<(u64, u64)>,
}

/// The device and inode of a directory (`None` where unknown); blocks.
type IdentityOf = Arc<dyn Fn(&Path) -> Option<(u64, u64)> + Send + Sync>;

/// The watch's blocking calls on its directory, each on a detached thread
/// and given up after `deadline`, with at most one stuck at a time (see
/// [`DetachedReader`]).
struct Probe {
    reader: DetachedReader,
    identity: IdentityOf,
    deadline: Duration,
}

impl Probe {
    fn new(identity: IdentityOf, deadline: Duration) -> Self {
        Self {
            reader: DetachedReader::default(),
            identity,
            deadline,
        }
    }

    /// The identity of the directory watched for `target` now.
    async fn identity(&self, target: &Target) -> Result<Option<(u64, u64)>, Abandoned> {
        let (identity, dir) = (Arc::clone(&self.identity), watched_directory(target));
        self.reader
            .read_within(self.deadline, move || identity(&dir))
            .await
    }

    /// [`watch_directory`], off the async thread; `None` (a lost watch) if
    /// it does not answer within the deadline.
    async fn watch(&self, target: &Target, signal: &Signal, loud: bool) -> Option<Watching> {
        let (identity, owned, signal) =
            (Arc::clone(&self.identity), target.clone(), signal.clone());
        let started = self
            .reader
            .read_within(self.deadline, move || {
                watch_directory(&owned, &signal, identity.as_ref())
            })
            .await;
        let dir = watched_directory(target);
        match started {
            Ok(Ok(watching)) => {
                debug!(directory = %dir.display(), "Watching directory.");
                Some(watching)
            }
            Ok(Err(err)) if loud => {
                warn!(directory = %dir.display(), error = %err, "Cannot watch directory; relying on periodic re-reads.");
                None
            }
            Ok(Err(err)) => {
                debug!(directory = %dir.display(), error = %err, "Cannot watch directory yet.");
                None
            }
            Err(abandoned) => {
                given_up(&dir, &abandoned);
                None
            }
        }
    }
}

/// Logs a probe of `dir` given up: a warning for one that timed out (one
/// per stuck thread), quietly while it stays stuck.
fn given_up(dir: &Path, abandoned: &Abandoned) {
    match abandoned {
        Abandoned::StillReading => {
            debug!(directory = %dir.display(), error = %abandoned, "Directory check not started; relying on periodic re-reads.");
        }
        _ => {
            warn!(directory = %dir.display(), error = %abandoned, "Directory check (stat, watch) given up; relying on periodic re-reads until it answers.");
        }
    }
}

/// Follows `target` until `token` is cancelled, which ends it at once,
/// also in the middle of a directory check or an `on_change` (a hung
/// mount): a stop is not held up by the calls the watch is waiting for.
async fn run(
    target: Target,
    on_change: OnChange,
    probe: Probe,
    resync: Option<Duration>,
    token: CancellationToken,
) {
    let shown = target.shown().to_string();
    tokio::select! {
        () = token.cancelled() => {}
        () = follow(target, on_change, probe, resync, token.clone()) => {}
    }
    debug!(path = %shown, "File watcher stopped.");
}

async fn follow(
    target: Target,
    on_change: OnChange,
    probe: Probe,
    resync: Option<Duration>,
    token: CancellationToken,
) {
    let signal = Signal::default();
    let mut watching = probe.watch(&target, &signal, true).await;
    on_change().await;
    let mut ticks = resync.map(|period| {
        let period = period.max(MIN_RESYNC);
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks
    });
    loop {
        let lost = watching.is_none();
        tokio::select! {
            _ = token.cancelled() => break,
            _ = signal.poke.notified() => {
                if !settle(&signal.poke, &token).await {
                    break;
                }
                if signal.stale.swap(false, Ordering::SeqCst) {
                    debug!(path = %target.shown(), "Watched directory replaced or watcher failed; watching again.");
                    watching = probe.watch(&target, &signal, false).await;
                }
                on_change().await;
            }
            _ = tick(&mut ticks) => {
                let replaced = match &watching {
                    None => true,
                    Some(current) => match probe.identity(&target).await {
                        Ok(now) => now != current.identity,
                        Err(abandoned) => {
                            // A lost watch: dropped, tried again soon.
                            given_up(&watched_directory(&target), &abandoned);
                            watching = None;
                            false
                        }
                    },
                };
                if replaced {
                    watching = probe.watch(&target, &signal, false).await;
                }
                on_change().await;
            }
            // A lost watch is tried again soon, not only at the next
            // periodic re-read.
            () = tokio::time::sleep(REWATCH), if lost => {
                watching = probe.watch(&target, &signal, false).await;
                if watching.is_some() {
                    on_change().await;
                }
            }
        }
    }
    drop(watching);
}

/// The device and inode of `dir` (`None` where unknown).
fn identity(dir: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

/// Waits until events stop for [`DEBOUNCE`] (at most [`MAX_DEBOUNCE`]);
/// `false` if cancelled meanwhile.
async fn settle(signal: &Notify, token: &CancellationToken) -> bool {
    let deadline = Instant::now() + MAX_DEBOUNCE;
    loop {
        tokio::select! {
            _ = token.cancelled() => return false,
            _ = tokio::time::sleep(DEBOUNCE) => return true,
            _ = signal.notified() => {
                if Instant::now() >= deadline {
                    return true;
                }
            }
        }
    }
}

async fn tick(ticks: &mut Option<Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The directory watched for `target`.
fn watched_directory(target: &Target) -> PathBuf {
    match target {
        Target::File(path) => directory_of(path),
        Target::Folder(dir) => dir.clone(),
    }
}

/// Starts an OS watcher on the directory of the target that pokes `signal`
/// on relevant events (and marks it stale when the directory itself goes),
/// noting the directory's identity; blocks. If the OS refuses, the periodic
/// re-read carries on and the watch is tried again.
fn watch_directory(
    target: &Target,
    signal: &Signal,
    identity: &(dyn Fn(&Path) -> Option<(u64, u64)> + Send + Sync),
) -> notify::Result<Watching> {
    let dir = watched_directory(target);
    let file_name = match target {
        Target::File(path) => Some(path.file_name().map(OsString::from).unwrap_or_default()),
        Target::Folder(_) => None,
    };
    let signal = signal.clone();
    let watched = dir.clone();
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) if is_about_directory(&event, &watched) => {
            signal.stale.store(true, Ordering::SeqCst);
            signal.poke.notify_one();
        }
        Ok(event) if !is_relevant(&event, file_name.as_ref()) => {}
        Ok(_) => signal.poke.notify_one(),
        Err(err) => {
            debug!(error = %err, "File watcher reported an error; watching again and re-reading.");
            signal.stale.store(true, Ordering::SeqCst);
            signal.poke.notify_one();
        }
    };
    let identity = identity(&dir);
    let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map(|()| watcher)
    })?;
    Ok(Watching {
        _watcher: watcher,
        identity,
    })
}

/// Whether `event` says the watched directory itself was removed or
/// renamed (replaced): its watch sees nothing of the new one.
fn is_about_directory(event: &Event, dir: &Path) -> bool {
    let gone = matches!(
        event.kind,
        EventKind::Remove(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))
    );
    gone && event.paths.iter().any(|path| path == dir)
}

/// Whether `event` may mean the file's content changed: anything but plain
/// opens and reads, on the file itself (for a folder: any `.yaml`/`.yml`
/// file) or on a `..`-prefixed entry (the Kubernetes ConfigMap `..data`
/// link and its timestamped directories).
fn is_relevant(event: &Event, file_name: Option<&OsString>) -> bool {
    if let EventKind::Access(kind) = event.kind {
        if kind != AccessKind::Close(AccessMode::Write) {
            return false;
        }
    }
    event.need_rescan()
        || event.paths.is_empty()
        || event.paths.iter().any(|path| {
            path.file_name().is_some_and(|name| {
                let shown = name.to_string_lossy();
                let watched = match file_name {
                    Some(file_name) => name == file_name.as_os_str(),
                    None => shown.ends_with(".yaml") || shown.ends_with(".yml"),
                };
                watched || shown.starts_with("..")
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind, RenameMode};

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn relevant_events() {
        let file = OsString::from("config.json");
        let name = Some(&file);
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(is_relevant(&event(renamed, "/d/config.json"), name));
        assert!(is_relevant(&event(renamed, "/d/..data"), name));
        assert!(is_relevant(
            &event(EventKind::Create(CreateKind::Folder), "/d/..2026_v2"),
            name
        ));
        assert!(is_relevant(
            &event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                "/d/config.json"
            ),
            name
        ));
        assert!(!is_relevant(
            &event(
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                "/d/config.json"
            ),
            name
        ));
        assert!(!is_relevant(&event(renamed, "/d/other.json"), name));
        assert!(is_relevant(&event(renamed, "/d/statestore.yaml"), None));
        assert!(is_relevant(&event(renamed, "/d/lock.yml"), None));
        assert!(is_relevant(&event(renamed, "/d/..data"), None));
        assert!(!is_relevant(&event(renamed, "/d/notes.txt"), None));
    }

    #[tokio::test]
    async fn a_zero_resync_is_raised_to_the_minimum_and_does_not_panic() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let on_change: OnChange = Arc::new(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async {})
        });
        let token = CancellationToken::new();
        let mut watch = FileWatch::start(
            std::env::temp_dir().join(format!("rewire-zero-resync-{}.json", std::process::id())),
            on_change,
            Some(Duration::ZERO),
            token.clone(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(std::sync::atomic::Ordering::SeqCst) < 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            calls.load(std::sync::atomic::Ordering::SeqCst) >= 3,
            "re-read periodically"
        );
        token.cancel();
        let task = watch.task.take().expect("the task");
        assert!(task.await.is_ok(), "the watch task ended without a panic");
    }

    #[tokio::test]
    async fn a_hung_directory_check_pins_one_thread_and_neither_the_async_thread_nor_the_re_reads()
    {
        use std::sync::atomic::AtomicUsize;
        use std::sync::atomic::Ordering::SeqCst;
        let checks = Arc::new(AtomicUsize::new(0));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = std::sync::Mutex::new(hung);
        let counted = Arc::clone(&checks);
        // The first `stat` hangs, as on a hung NFS mount: 3 s at most, so
        // that without the fix it stalls this runtime's only thread (and
        // fails the test) rather than hanging it.
        let stat: IdentityOf = Arc::new(move |_: &Path| {
            if counted.fetch_add(1, SeqCst) == 0 {
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(3));
            }
            Some((1, 1))
        });
        let rereads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&rereads);
        let on_change: OnChange = Arc::new(move || {
            counted.fetch_add(1, SeqCst);
            Box::pin(async {})
        });
        let path = std::env::temp_dir().join(format!("rewire-hung-{}.json", std::process::id()));
        let started = Instant::now();
        let watch = FileWatch::start_probed(
            Target::File(path),
            on_change,
            Some(MIN_RESYNC),
            CancellationToken::new(),
            Probe::new(stat, Duration::from_millis(50)),
        );
        while rereads.load(SeqCst) < 5 {
            let waited = started.elapsed();
            assert!(
                waited < Duration::from_secs(2),
                "re-reads stalled: {waited:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(checks.load(SeqCst), 1, "checks started while one hangs");
        release.send(()).unwrap_or_else(|e| panic!("{e}"));
        watch.stop().await;
    }

    #[tokio::test]
    async fn a_stop_ends_the_watch_in_the_middle_of_a_read_that_hangs() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::atomic::Ordering::SeqCst;
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        // The first read answers; the re-reads hang (a hung mount).
        let on_change: OnChange = Arc::new(move || {
            let first = counted.fetch_add(1, SeqCst) == 0;
            Box::pin(async move {
                if !first {
                    std::future::pending::<()>().await;
                }
            })
        });
        let stat: IdentityOf = Arc::new(|_: &Path| Some((1, 1)));
        let path = std::env::temp_dir().join(format!("rewire-stop-{}.json", std::process::id()));
        let watch = FileWatch::start_probed(
            Target::File(path),
            on_change,
            Some(MIN_RESYNC),
            CancellationToken::new(),
            Probe::new(stat, Duration::from_secs(5)),
        );
        while reads.load(SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stopped = tokio::time::timeout(Duration::from_secs(1), watch.stop()).await;
        assert!(stopped.is_ok(), "the stop waited for the hung re-read");
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory() {
        assert_eq!(directory_of(Path::new("c.json")), PathBuf::from("."));
        assert_eq!(
            directory_of(Path::new("/etc/app/c.json")),
            PathBuf::from("/etc/app")
        );
    }
}
