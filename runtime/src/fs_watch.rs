//! Watching one file (or the YAML files of a folder) for changes of its
//! content: the directory is watched (so editors' rename-writes and
//! Kubernetes ConfigMap `..data` symlink swaps are seen), debounces bursts
//! of events, and re-reads the file periodically in case events are lost.
//! The content is compared, never the inode, so any way of replacing the
//! file works.
//!
//! A file written in place is read once its writer closes it, not at the
//! first pause: where the OS reports closes (inotify), a watched file
//! modified and not yet closed holds the re-read back until its close, its
//! removal or renaming, or a rescan (the OS queue overflowed); the
//! periodic re-read is skipped meanwhile. A manifest caught between two
//! writes (`{ gen_a; gen_b; } > x.yaml`, `kustomize build > x.yaml` that
//! spends seconds fetching its bases) still parses as YAML, and applied it
//! would remove components and lose their data. A writer still open after
//! [`MAX_WRITER_WAIT`] gets a warning, the read then due is skipped, and
//! the writer is forgotten: later reads take the file as it is (a process
//! that keeps its file open for good, `tee -a`, an editor, must not stop
//! every read of the sources), until it writes again. Renames (editors' rename-writes,
//! ConfigMap `..data` swaps) are atomic and read after the usual
//! [`DEBOUNCE`].
//!
//! The watches of one set of sources (the configuration file and the
//! manifests folder) share their [`Writers`]: a read of the set, whoever
//! asks for it, waits until none of their files is being written, and is
//! discarded if one was modified while it read.
//!
//! A watched file that is a symlink into another directory has that
//! directory watched too (its target re-resolved at each re-watch, and
//! checked at each periodic re-read): an edit of the target is seen at
//! once, and a link pointed elsewhere is followed.
//!
//! The watch's own blocking calls on the directory (its `stat`, adding the
//! OS watch) run on a detached thread bounded by [`PROBE_DEADLINE`], never
//! on an async worker: on a hung hard NFS mount a `stat` blocks in the
//! kernel for good, and would pin the worker with it. One that does not
//! answer in time is a lost watch; the periodic re-read carries on.

use std::collections::HashMap;
use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, ModifyKind};
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
/// How long after its first modification a watched file's writer may keep
/// it open before a read stops waiting for it: that read is skipped, with
/// a warning, and the writer forgotten, so the reads after it take the
/// file as it is (see the module's doc).
pub(crate) const MAX_WRITER_WAIT: Duration = Duration::from_secs(120);
/// Whether the OS watcher reports a writer closing a file (inotify does):
/// elsewhere nothing is held back waiting for a close that never comes.
const REPORTS_CLOSES: bool = cfg!(any(target_os = "linux", target_os = "android"));
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
        let writers = Arc::default();
        Self::start_target(Target::File(path), on_change, resync, token, writers)
    }

    /// Like [`start`](Self::start), noting the writers of the file in
    /// `writers`, shared with the other watches of the same sources and
    /// with their reads (see the module's doc).
    pub(crate) fn start_sharing(
        path: PathBuf,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
        writers: Arc<Writers>,
    ) -> Self {
        Self::start_target(Target::File(path), on_change, resync, token, writers)
    }

    /// Like [`start`](Self::start), for the `*.yaml` / `*.yml` files of the
    /// folder `dir`: one added, changed, renamed or removed is a change.
    pub fn start_folder(
        dir: PathBuf,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
    ) -> Self {
        let writers = Arc::default();
        Self::start_target(Target::Folder(dir), on_change, resync, token, writers)
    }

    /// Like [`start_folder`](Self::start_folder), sharing `writers` as
    /// [`start_sharing`](Self::start_sharing) does.
    pub(crate) fn start_folder_sharing(
        dir: PathBuf,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
        writers: Arc<Writers>,
    ) -> Self {
        Self::start_target(Target::Folder(dir), on_change, resync, token, writers)
    }

    fn start_target(
        target: Target,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
        writers: Arc<Writers>,
    ) -> Self {
        let probe = Probe::new(Arc::new(identity), PROBE_DEADLINE);
        Self::start_probed(target, on_change, resync, token, probe, writers)
    }

    fn start_probed(
        target: Target,
        on_change: OnChange,
        resync: Option<Duration>,
        token: CancellationToken,
        probe: Probe,
        writers: Arc<Writers>,
    ) -> Self {
        let signal = Signal {
            poke: Arc::default(),
            stale: Arc::default(),
            writers,
        };
        let running = run(target, on_change, probe, signal, resync, token.clone());
        let task = tokio::spawn(running.in_current_span());
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

/// How the OS watcher reaches the task: pokes on relevant events, marks
/// the watch stale when a watched directory itself was removed or renamed
/// (replaced), the file's link may point elsewhere, or the watcher failed,
/// and notes the watched files being written.
#[derive(Clone)]
struct Signal {
    poke: Arc<Notify>,
    stale: Arc<AtomicBool>,
    writers: Arc<Writers>,
}

/// The OS watcher, and what it was set up for, to tell when that changed
/// under it.
struct Watching {
    _watcher: RecommendedWatcher,
    seen: Snapshot,
}

/// What a watch is set up for: the watched directory's identity (device
/// and inode), and where the file's symlink leads if into another
/// directory (watched too).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    identity: Option<(u64, u64)>,
    resolved: Option<PathBuf>,
}

/// The watched files being written in place (modified, not closed yet by
/// their writer), each with when it was first modified, and a count of the
/// modifications seen: one open holds reads back (see the module's doc).
/// Shared by the watches of one set of sources and by their reads.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    open: std::sync::Mutex<HashMap<PathBuf, OpenWriter>>,
    modifications: AtomicU64,
    /// Told when a writer closes (or its entry is dropped otherwise).
    closed: Notify,
}

/// A watched file being written.
#[derive(Debug, Clone, Copy)]
struct OpenWriter {
    /// When it was first modified since its last close.
    since: std::time::Instant,
}

/// Whether the watched files are being written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Writing {
    /// None is.
    Idle,
    /// One is, for less than [`MAX_WRITER_WAIT`].
    Open,
    /// One was, for longer: the files found so, now forgotten.
    Overdue(Vec<PathBuf>),
}

impl Writers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, OpenWriter>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes what `event` says of the writers of `watched`'s files.
    fn note(&self, event: &Event, watched: &Watched) {
        if !REPORTS_CLOSES {
            return;
        }
        let mut open = self.lock();
        if event.need_rescan() {
            // Events were lost, closes among them: nothing is known open.
            open.clear();
            self.modifications.fetch_add(1, Ordering::SeqCst);
            self.closed.notify_waiters();
            return;
        }
        for path in event.paths.iter().filter(|path| watched.is_file(path)) {
            match event.kind {
                EventKind::Modify(ModifyKind::Data(_)) => {
                    open.entry(path.clone()).or_insert(OpenWriter {
                        since: std::time::Instant::now(),
                    });
                    self.modifications.fetch_add(1, Ordering::SeqCst);
                }
                // Closed, or gone from under the watched name.
                EventKind::Access(AccessKind::Close(AccessMode::Write))
                | EventKind::Remove(_)
                | EventKind::Modify(ModifyKind::Name(_)) => {
                    open.remove(path);
                    self.closed.notify_waiters();
                }
                _ => {}
            }
        }
    }

    /// Forgets the writers of `watched`'s files: its OS watch is replaced,
    /// and closes made meanwhile were not seen.
    fn forget(&self, watched: &Watched) {
        let mut open = self.lock();
        let before = open.len();
        open.retain(|path, _| !watched.owns(path));
        if open.len() != before {
            self.closed.notify_waiters();
        }
    }

    /// The modifications of watched files seen so far: a read that sees
    /// this count move while it reads read a file being written.
    pub(crate) fn modifications(&self) -> u64 {
        self.modifications.load(Ordering::SeqCst)
    }

    /// Whether a watched file is being written, and for how long.
    pub(crate) fn writing(&self) -> Writing {
        let mut open = self.lock();
        if open.is_empty() {
            return Writing::Idle;
        }
        // Overdue writers are reported once and forgotten: one read is
        // skipped for them, the next takes their files as they are.
        let mut newly = Vec::new();
        open.retain(|path, writer| {
            let overdue = writer.since.elapsed() >= MAX_WRITER_WAIT;
            if overdue {
                newly.push(path.clone());
            }
            !overdue
        });
        if !newly.is_empty() {
            self.closed.notify_waiters();
            Writing::Overdue(newly)
        } else if open.is_empty() {
            Writing::Idle
        } else {
            Writing::Open
        }
    }

    /// Waits until no watched file is being written, answering the count
    /// of [`modifications`](Self::modifications) then; or, once one has
    /// been written for [`MAX_WRITER_WAIT`], answers at once with those
    /// newly found so (see [`Writing::Overdue`]).
    pub(crate) async fn until_closed(&self) -> Result<u64, Vec<PathBuf>> {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            let until = match self.writing() {
                Writing::Idle => return Ok(self.modifications()),
                Writing::Overdue(newly) => return Err(newly),
                Writing::Open => self.first_overdue(),
            };
            // Woken by a close, or when the oldest writer turns overdue.
            let _ = tokio::time::timeout_at(until, closed).await;
        }
    }

    /// When the oldest open writer turns overdue.
    fn first_overdue(&self) -> Instant {
        let open = self.lock();
        let oldest = open.values().map(|writer| writer.since).min();
        let left = oldest.map_or(Duration::ZERO, |since| {
            MAX_WRITER_WAIT.saturating_sub(since.elapsed())
        });
        Instant::now() + left
    }
}

/// Logs the files found written for longer than [`MAX_WRITER_WAIT`] (once
/// each) and that a read is skipped because of them.
pub(crate) fn still_being_written(newly: &[PathBuf]) {
    for path in newly {
        warn!(path = %path.display(), waited = ?MAX_WRITER_WAIT, "File still open by its writer; this read is skipped, the next takes it as it is.");
    }
    debug!("A read of a watched file skipped: still being written; not applied.");
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

    /// What a watch of `target` would be set up for now.
    async fn snapshot(&self, target: &Target) -> Result<Snapshot, Abandoned> {
        let (identity, owned) = (Arc::clone(&self.identity), target.clone());
        self.reader
            .read_within(self.deadline, move || snapshot(&owned, identity.as_ref()))
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
    signal: Signal,
    resync: Option<Duration>,
    token: CancellationToken,
) {
    let shown = target.shown().to_string();
    tokio::select! {
        () = token.cancelled() => {}
        () = follow(target, on_change, probe, signal, resync, token.clone()) => {}
    }
    debug!(path = %shown, "File watcher stopped.");
}

async fn follow(
    target: Target,
    on_change: OnChange,
    probe: Probe,
    signal: Signal,
    resync: Option<Duration>,
    token: CancellationToken,
) {
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
                let settled = settle(&signal, &token).await;
                if settled == Settled::Cancelled {
                    break;
                }
                if signal.stale.swap(false, Ordering::SeqCst) {
                    debug!(path = %target.shown(), "Watched directory replaced or watcher failed; watching again.");
                    watching = probe.watch(&target, &signal, false).await;
                }
                match settled {
                    Settled::StillWriting(newly) => still_being_written(&newly),
                    _ => on_change().await,
                }
            }
            _ = tick(&mut ticks) => {
                let replaced = match &watching {
                    None => true,
                    Some(current) => match probe.snapshot(&target).await {
                        Ok(now) => now != current.seen,
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
                // A file being written is read once closed, not now.
                match signal.writers.writing() {
                    Writing::Idle => on_change().await,
                    Writing::Open => debug!(path = %target.shown(), "Periodic re-read skipped: a watched file is being written."),
                    Writing::Overdue(newly) => still_being_written(&newly),
                }
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

/// How a burst of events settled.
#[derive(Debug, PartialEq, Eq)]
enum Settled {
    /// Quiet, and no watched file is being written: read.
    Ready,
    /// A watched file has been written for [`MAX_WRITER_WAIT`]: this read
    /// is skipped, the next takes it as it is (see [`Writing::Overdue`]).
    StillWriting(Vec<PathBuf>),
    /// The watch was stopped.
    Cancelled,
}

/// Waits until events stop for [`DEBOUNCE`] (at most [`MAX_DEBOUNCE`])
/// and no watched file is being written (see [`Writers::writing`]).
async fn settle(signal: &Signal, token: &CancellationToken) -> Settled {
    let busy = Instant::now() + MAX_DEBOUNCE;
    loop {
        tokio::select! {
            _ = token.cancelled() => return Settled::Cancelled,
            _ = tokio::time::sleep(DEBOUNCE) => match signal.writers.writing() {
                Writing::Idle => return Settled::Ready,
                Writing::Open => {}
                Writing::Overdue(newly) => return Settled::StillWriting(newly),
            },
            _ = signal.poke.notified() => match signal.writers.writing() {
                Writing::Idle if Instant::now() >= busy => return Settled::Ready,
                Writing::Idle | Writing::Open => {}
                Writing::Overdue(newly) => return Settled::StillWriting(newly),
            },
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

/// What a watch of `target` is set up for now; blocks.
fn snapshot(
    target: &Target,
    identity: &(dyn Fn(&Path) -> Option<(u64, u64)> + Send + Sync),
) -> Snapshot {
    let dir = watched_directory(target);
    Snapshot {
        identity: identity(&dir),
        resolved: match target {
            Target::File(path) => resolved_elsewhere(path, &dir),
            Target::Folder(_) => None,
        },
    }
}

/// The file the symlink at `path` leads to, when it lies in another
/// directory than `dir` (the link's); blocks.
fn resolved_elsewhere(path: &Path, dir: &Path) -> Option<PathBuf> {
    if !std::fs::symlink_metadata(path)
        .ok()?
        .file_type()
        .is_symlink()
    {
        return None;
    }
    let resolved = std::fs::canonicalize(path).ok()?;
    let link_dir = std::fs::canonicalize(dir).ok();
    (resolved.parent() != link_dir.as_deref()).then_some(resolved)
}

/// Starts an OS watcher on the directory of the target (and on the
/// directory its symlink leads to) that pokes `signal` on relevant events
/// (and marks it stale when a directory itself goes or the link may point
/// elsewhere), noting what it was set up for; blocks. If the OS refuses,
/// the periodic re-read carries on and the watch is tried again.
fn watch_directory(
    target: &Target,
    signal: &Signal,
    identity: &(dyn Fn(&Path) -> Option<(u64, u64)> + Send + Sync),
) -> notify::Result<Watching> {
    let dir = watched_directory(target);
    let seen = snapshot(target, identity);
    let watched = Watched {
        dir: dir.clone(),
        file_name: match target {
            Target::File(path) => Some(path.file_name().map(OsString::from).unwrap_or_default()),
            Target::Folder(_) => None,
        },
        resolved: seen.resolved.clone(),
    };
    // The watch replaced (if any) saw closes this one cannot know of.
    signal.writers.forget(&watched);
    let signal = signal.clone();
    let resolved_dir = watched.resolved_directory();
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) if watched.is_about_a_directory(&event) => {
            signal.stale.store(true, Ordering::SeqCst);
            signal.poke.notify_one();
        }
        Ok(event) if !watched.is_relevant(&event) => {}
        Ok(event) => {
            if watched.may_point_elsewhere(&event) {
                signal.stale.store(true, Ordering::SeqCst);
            }
            signal.writers.note(&event, &watched);
            signal.poke.notify_one();
        }
        Err(err) => {
            debug!(error = %err, "File watcher reported an error; watching again and re-reading.");
            signal.stale.store(true, Ordering::SeqCst);
            signal.poke.notify_one();
        }
    };
    let mut watcher = notify::recommended_watcher(handler)?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    if let Some(resolved_dir) = resolved_dir {
        // The link's own directory is watched: its target's is a bonus (the
        // periodic re-read still sees an edit there).
        if let Err(err) = watcher.watch(&resolved_dir, RecursiveMode::NonRecursive) {
            debug!(directory = %resolved_dir.display(), error = %err, "Cannot watch the directory the file's link leads to.");
        }
    }
    Ok(Watching {
        _watcher: watcher,
        seen,
    })
}

/// Which entries of the watched directories are the watched files.
#[derive(Debug, Clone)]
struct Watched {
    /// The directory watched for the target.
    dir: PathBuf,
    /// The file's name (`None`: a folder's `*.yaml` / `*.yml` files).
    file_name: Option<OsString>,
    /// The file the file's symlink leads to, in another directory.
    resolved: Option<PathBuf>,
}

impl Watched {
    /// The directory of the file the symlink leads to, if any.
    fn resolved_directory(&self) -> Option<PathBuf> {
        self.resolved
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
    }

    /// Whether `path` is a watched file (by name in the watched directory;
    /// exactly, for the file a symlink leads to).
    fn is_file(&self, path: &Path) -> bool {
        if self.resolved.as_deref() == Some(path) {
            return true;
        }
        path.file_name().is_some_and(|name| match &self.file_name {
            Some(file_name) => name == file_name.as_os_str(),
            None => {
                let shown = name.to_string_lossy();
                shown.ends_with(".yaml") || shown.ends_with(".yml")
            }
        })
    }

    /// Whether `path` is a watched file in one of the watched directories.
    fn owns(&self, path: &Path) -> bool {
        let dir = directory_of(path);
        self.is_file(path) && (dir == self.dir || Some(dir) == self.resolved_directory())
    }

    /// Whether `event` says a watched directory itself was removed or
    /// renamed (replaced): its watch sees nothing of the new one.
    fn is_about_a_directory(&self, event: &Event) -> bool {
        let gone = matches!(
            event.kind,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        );
        let resolved_dir = self.resolved_directory();
        gone && event
            .paths
            .iter()
            .any(|path| *path == self.dir || Some(path) == resolved_dir.as_ref())
    }

    /// Whether `event` may mean the file's symlink now leads elsewhere
    /// (the file itself created, renamed over or removed): the watch is set
    /// up again, following it.
    fn may_point_elsewhere(&self, event: &Event) -> bool {
        let replaced = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        );
        replaced
            && self.file_name.is_some()
            && event.paths.iter().any(|path| {
                directory_of(path) == self.dir && path.file_name() == self.file_name.as_deref()
            })
    }

    /// Whether `event` may mean the file's content changed: anything but
    /// plain opens and reads, on a watched file or on a `..`-prefixed
    /// entry (the Kubernetes ConfigMap `..data` link and its timestamped
    /// directories).
    fn is_relevant(&self, event: &Event) -> bool {
        if let EventKind::Access(kind) = event.kind {
            if kind != AccessKind::Close(AccessMode::Write) {
                return false;
            }
        }
        event.need_rescan()
            || event.paths.is_empty()
            || event.paths.iter().any(|path| {
                self.is_file(path)
                    || path
                        .file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with(".."))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind, RenameMode};

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    /// The watch of `file` (`None`: a folder) in `/d`.
    fn watched(file: Option<&str>) -> Watched {
        Watched {
            dir: PathBuf::from("/d"),
            file_name: file.map(OsString::from),
            resolved: None,
        }
    }

    #[test]
    fn relevant_events() {
        let file = watched(Some("config.json"));
        let folder = watched(None);
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(file.is_relevant(&event(renamed, "/d/config.json")));
        assert!(file.is_relevant(&event(renamed, "/d/..data")));
        assert!(file.is_relevant(&event(
            EventKind::Create(CreateKind::Folder),
            "/d/..2026_v2"
        )));
        assert!(file.is_relevant(&event(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            "/d/config.json"
        )));
        assert!(!file.is_relevant(&event(
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            "/d/config.json"
        )));
        assert!(!file.is_relevant(&event(renamed, "/d/other.json")));
        assert!(folder.is_relevant(&event(renamed, "/d/statestore.yaml")));
        assert!(folder.is_relevant(&event(renamed, "/d/lock.yml")));
        assert!(folder.is_relevant(&event(renamed, "/d/..data")));
        assert!(!folder.is_relevant(&event(renamed, "/d/notes.txt")));
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
            Arc::default(),
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
            Arc::default(),
        );
        while reads.load(SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stopped = tokio::time::timeout(Duration::from_secs(1), watch.stop()).await;
        assert!(stopped.is_ok(), "the stop waited for the hung re-read");
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_file_modified_is_being_written_until_its_writer_closes_it() {
        let writers = Writers::default();
        let folder = watched(None);
        let modified = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        writers.note(&event(modified, "/d/notes.txt"), &folder);
        assert_eq!(writers.writing(), Writing::Idle, "not a watched file");
        assert_eq!(writers.modifications(), 0);
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        assert_eq!(writers.writing(), Writing::Open);
        assert_eq!(writers.modifications(), 1);
        writers.note(&event(closed, "/d/all.yaml"), &folder);
        assert_eq!(writers.writing(), Writing::Idle);
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::From));
        writers.note(&event(renamed, "/d/all.yaml"), &folder);
        assert_eq!(writers.writing(), Writing::Idle, "renamed away");
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_writer_stays_open_past_the_old_5_s_until_its_close_a_rescan_or_a_re_watch() {
        let writers = Writers::default();
        let folder = watched(None);
        let modified = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        // Opened 6 s ago (`kustomize build > all.yaml` fetching its bases).
        let six_s_ago = std::time::Instant::now()
            .checked_sub(Duration::from_secs(6))
            .unwrap_or_else(std::time::Instant::now);
        for writer in writers.lock().values_mut() {
            writer.since = six_s_ago;
        }
        assert_eq!(writers.writing(), Writing::Open, "still open after 6 s");
        // A rescan (the OS queue overflowed): closes may have been lost.
        writers.note(
            &Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan),
            &folder,
        );
        assert_eq!(writers.writing(), Writing::Idle);
        assert_eq!(writers.modifications(), 2, "a rescan counts as a change");
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        writers.forget(&watched(Some("other.json")));
        assert_eq!(writers.writing(), Writing::Open, "another watch's re-watch");
        writers.forget(&folder);
        assert_eq!(writers.writing(), Writing::Idle, "its own watch replaced");
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_writer_open_past_the_long_limit_is_reported_once_then_forgotten() {
        let writers = Writers::default();
        let folder = watched(None);
        let modified = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        let long_ago = std::time::Instant::now()
            .checked_sub(MAX_WRITER_WAIT)
            .unwrap_or_else(std::time::Instant::now);
        for writer in writers.lock().values_mut() {
            writer.since = long_ago;
        }
        assert_eq!(
            writers.writing(),
            Writing::Overdue(vec![PathBuf::from("/d/all.yaml")])
        );
        // Forgotten: a writer that keeps its file open for good (`tee -a`)
        // does not stop every later read of the sources.
        assert_eq!(writers.writing(), Writing::Idle, "reported once, then read");
        writers.note(&event(modified, "/d/all.yaml"), &folder);
        assert_eq!(
            writers.writing(),
            Writing::Open,
            "written again: held again"
        );
    }

    /// Waits (10 s at most) until `calls` reaches `count`.
    async fn calls_reach(calls: &std::sync::atomic::AtomicUsize, count: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < count {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    #[cfg(unix)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_edit_of_the_file_a_symlink_leads_to_is_seen_and_a_link_pointed_elsewhere_is_followed(
    ) {
        let root = std::env::temp_dir().join(format!("rewire-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in ["app", "real", "other"] {
            std::fs::create_dir_all(root.join(dir)).unwrap_or_else(|e| panic!("{e}"));
        }
        let write = |path: &str, text: &str| {
            std::fs::write(root.join(path), text).unwrap_or_else(|e| panic!("{e}"))
        };
        write("real/c.json", "1");
        write("other/c.json", "1");
        let link = root.join("app/c.json");
        std::os::unix::fs::symlink("../real/c.json", &link).unwrap_or_else(|e| panic!("{e}"));
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let on_change: OnChange = Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {})
        });
        // No periodic re-read: only the OS watch can see a change.
        let watch = FileWatch::start(link.clone(), on_change, None, CancellationToken::new());
        assert!(calls_reach(&calls, 1).await, "the first read");
        write("real/c.json", "2");
        assert!(
            calls_reach(&calls, 2).await,
            "the edit of the target is not seen"
        );
        // Pointed elsewhere (as `ln -sfn` does: a new link renamed over).
        let next = root.join("app/c.json.next");
        std::os::unix::fs::symlink("../other/c.json", &next).unwrap_or_else(|e| panic!("{e}"));
        std::fs::rename(&next, &link).unwrap_or_else(|e| panic!("{e}"));
        assert!(calls_reach(&calls, 3).await, "the link pointed elsewhere");
        // Settled: the watch follows the new target.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = calls.load(Ordering::SeqCst);
        write("other/c.json", "2");
        assert!(
            calls_reach(&calls, before + 1).await,
            "the edit of the new target is not seen"
        );
        watch.stop().await;
        std::fs::remove_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
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
