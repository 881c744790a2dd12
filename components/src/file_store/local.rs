//! The `local` file store: files in a directory (`root`, relative to the
//! config file's folder), names confined to it.
//!
//! A name is checked ([`super::names`]), then resolved beneath a handle on
//! the root opened at init, never by walking its path again
//! ([`beneath`]): its folder is opened from that handle with every part a
//! real directory (a symbolic link anywhere on the way is refused, even
//! one swapped in midway by a process that can write in the root), and
//! the file is opened, created, renamed or removed relative to its
//! folder's handle, a symbolic link there refused too. A put streams into
//! a temporary file in the target's folder, syncs it, renames it over the
//! target and syncs the folder (so an acknowledged put survives a crash);
//! it answers the size and time of the file it wrote, whatever another put
//! of the name did since. Readers see the old file or the new one, never
//! half of one; a put that fails or passes `maxFileSize` (default 1 GiB)
//! leaves nothing behind, nor one abandoned midway (a client's deadline, a
//! reset stream, shutdown): its temporary file is removed when the put is
//! dropped, and the rename (off the runtime) runs only if the put was not
//! abandoned before it started, so an abandoned put is never put in place
//! behind its caller's back (one abandoned while the rename runs or the
//! folder syncs is in place already). Temporary files are named with this
//! host's tag, the process id and a serial; those a crashed process left
//! (one of this host whose process is gone, or any untouched for
//! [`STALE_TEMP`]) are removed by a bounded sweep that init starts in the
//! background, never one this process is writing (a put whose client
//! stalled mid-body, when a reload inits a store on the same root). A
//! temporary file removed all the same (by another process) fails the put
//! with a backend error saying so, not "not found". A put's blocking work
//! (its writes, syncs, rename, and the removal of an abandoned put's
//! temporary file) keeps the upload's hold (the sidecar's `max_uploads`
//! place) until it has returned, however long after the put's future is
//! gone ([`held`]): a hung disk never has more puts' blocking writes than
//! uploads admitted. Its other blocking work (opens, stats, listings,
//! deletes) runs at most [`blocking_ops::MAX_BLOCKING_OPS`] at once per
//! filesystem (device), shared by every store with its root on it (two
//! stores, roots in different folders of one mount, or the instances
//! reloads build while an old one's stuck operations still run:
//! [`blocking_ops`]): a hung mount never takes the process's whole
//! blocking pool, however many stores have their roots on it.
//!
//! Unix only (names are resolved with `openat`; on Linux `openat2`).

#[cfg(not(unix))]
compile_error!(
    "the `local` file store resolves names beneath a directory handle (`openat`): it needs a Unix"
);

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rewire_runtime::{
    Component, ComponentError, FileError, FileInfo, FileRead, FileStore, InitContext, ListPage,
    ListRequest, PutFileRequest,
};
use serde::Deserialize;

use super::names::{self, TEMP_PREFIX};
use super::{copy_bounded, deserialize_size, page_size, DEFAULT_MAX_FILE_SIZE};

mod beneath;
mod blocking_ops;
mod go_mode;
mod held;
mod listing;

use beneath::{Entry, Kind};
use blocking_ops::BlockingOps;
use held::{Held, HeldFile};

/// A temporary file untouched this long is a dead put's, whoever wrote it.
pub const STALE_TEMP: Duration = Duration::from_secs(5 * 60);

/// A root's identity: its device (`st_dev`, the filesystem: its places
/// for blocking work, [`BlockingOps::of_device`]) and inode (with the
/// device, the folder: its sweep).
type RootKey = (u64, u64);

/// Numbers temporary files across every store of the process (two
/// instances on one root, as across a reload, never pick the same name).
static TEMP_SERIAL: AtomicU64 = AtomicU64::new(0);

/// Metadata of the `local` file store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalFileMetadata {
    /// The directory holding the files (created if missing).
    pub root: String,
    /// Largest file, in bytes (default 1 GiB).
    #[serde(default = "default_max", deserialize_with = "deserialize_size")]
    pub max_file_size: u64,
}

fn default_max() -> u64 {
    DEFAULT_MAX_FILE_SIZE
}

/// Files in a directory.
#[derive(rewire_runtime::Component, Debug)]
#[component(
    kind = "file",
    type = "local",
    example = r#"{"root": "files", "maxFileSize": 1073741824}"#
)]
pub struct LocalFileStore {
    #[metadata]
    metadata: LocalFileMetadata,
    /// What init opens (the root and its places for blocking work).
    opened: OnceLock<Opened>,
}

/// The root of an initialised store.
#[derive(Debug)]
struct Opened {
    /// A handle on the root, resolved and canonical: every name is
    /// resolved beneath it.
    root: Arc<OwnedFd>,
    /// The places of its opens, stats, listings and deletes, shared with
    /// every store with its root on the same filesystem: a hung disk keeps
    /// at most [`blocking_ops::MAX_BLOCKING_OPS`] threads, however many
    /// stores (or reloads, or roots) it has.
    ops: BlockingOps,
}

fn backend(what: &str, name: &str, err: std::io::Error) -> FileError {
    match err.kind() {
        std::io::ErrorKind::NotFound => FileError::NotFound(name.to_string()),
        _ => FileError::Backend(format!("{what} `{name}`: {err}")),
    }
}

fn refused(name: &str, why: &str) -> FileError {
    FileError::Invalid(format!("file name `{name}`: {why}"))
}

impl LocalFileStore {
    /// A store on `metadata.root`, taken as is (not resolved against a
    /// config folder); created and checked by `init`.
    pub fn new(metadata: LocalFileMetadata) -> Self {
        Self {
            metadata,
            opened: OnceLock::new(),
        }
    }

    /// Takes `root` (whose identity is `key`) as the store's root, with
    /// the places of the stores on its filesystem.
    fn open(&self, root: Arc<OwnedFd>, key: RootKey) {
        let (device, _) = key;
        let _ = self.opened.set(Opened {
            root,
            ops: BlockingOps::of_device(device),
        });
    }

    fn opened(&self) -> Result<&Opened, FileError> {
        self.opened
            .get()
            .ok_or_else(|| FileError::Backend("the file store is not initialised".into()))
    }

    /// Runs `op` off the runtime (holding one of the store's places for
    /// blocking work, [`BlockingOps`]) with the handle on the folder of `name`
    /// (checked: [`beneath::folder`]; with `create`, missing folders are
    /// made), the name and its last part.
    async fn beneath<T: Send + 'static>(
        &self,
        name: &str,
        create: bool,
        op: impl FnOnce(Arc<OwnedFd>, &str, &str) -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        names::parts(name)?;
        let opened = self.opened()?;
        let root = Arc::clone(&opened.root);
        let name = name.to_string();
        opened
            .ops
            .run(move || {
                let parts = names::parts(&name)?;
                let Some((last, folders)) = parts.split_last() else {
                    return Err(FileError::Invalid("the file name is empty".into()));
                };
                let folder = beneath::folder(root.as_fd(), &name, folders, create)?;
                op(Arc::new(folder), &name, last)
            })
            .await
    }
}

/// The metadata of the regular file `last` (of `name`) in `folder`.
fn existing(folder: &OwnedFd, name: &str, last: &str) -> Result<std::fs::Metadata, FileError> {
    match beneath::look(folder.as_fd(), last).map_err(|err| backend("reading", name, err))? {
        Entry::File(meta) => Ok(meta),
        Entry::Link => Err(refused(name, "is a symbolic link")),
        Entry::Folder(_) | Entry::Other | Entry::Missing => {
            Err(FileError::NotFound(name.to_string()))
        }
    }
}

/// The metadata of `last` (of `name`) in `folder` for a stat: a regular
/// file's or, as Layotto's `local` store's `Stat` (`os.Stat`), a folder's.
fn stated(folder: &OwnedFd, name: &str, last: &str) -> Result<std::fs::Metadata, FileError> {
    match beneath::look(folder.as_fd(), last).map_err(|err| backend("reading", name, err))? {
        Entry::Folder(meta) => Ok(meta),
        _ => existing(folder, name, last),
    }
}

/// Size and age: what a listing, a put and a read answer (no metadata:
/// Layotto's `local` store lists none, and a listing builds none for each
/// of up to a page of files).
fn info(name: &str, meta: &std::fs::Metadata) -> FileInfo {
    FileInfo {
        name: name.to_string(),
        size: meta.len(),
        modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
        metadata: Default::default(),
    }
}

/// What `stat` answers: size, age and, as Layotto's `local` store's
/// `Stat`, `FileMode` and `IsDir` ([`go_mode::stat_metadata`]).
fn stat_info(name: &str, meta: &std::fs::Metadata) -> FileInfo {
    FileInfo {
        metadata: go_mode::stat_metadata(meta),
        ..info(name, meta)
    }
}

/// A put's temporary file (`name` in `folder`), removed when dropped
/// unless it was renamed into place.
struct TempFile {
    folder: Arc<OwnedFd>,
    name: String,
    placed: bool,
    /// Keeps the sweep off the file until it is placed or removed.
    writing: Option<Writing>,
    /// The upload's hold, kept by the rename or the removal until done.
    held: Held,
}

/// The temporary files this process is writing now (their names, unique
/// in the process: [`temp_name`]).
fn writing() -> std::sync::MutexGuard<'static, std::collections::HashSet<String>> {
    static WRITING: OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    WRITING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A temporary file name taken for a put: in [`writing`] until dropped,
/// so no sweep of this process (a reload's init on the same root) takes a
/// stalled put's file for a dead one, however long it is untouched.
struct Writing(String);

impl Writing {
    fn new() -> Self {
        let name = temp_name();
        writing().insert(name.clone());
        Self(name)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        writing().remove(&self.0);
    }
}

/// Where a put's rename into place stands: the put's future and the
/// blocking task that renames race to claim it, so a rename still queued
/// when the put is abandoned never runs (it would put the file in place
/// behind its caller's back, perhaps over a later put of the name).
const PENDING: u8 = 0;
const RENAMING: u8 = 1;
const ABANDONED: u8 = 2;

/// Marks the rename abandoned if the put is dropped before it started.
struct AbandonGuard(Arc<std::sync::atomic::AtomicU8>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        let _ = self
            .0
            .compare_exchange(PENDING, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl TempFile {
    /// Renames the file over `target` (in its folder) off the runtime. A
    /// put dropped before the rename started never has it run (the
    /// temporary file is removed instead); one dropped while it runs is in
    /// place, as one dropped while the folder syncs.
    async fn place(mut self, target: String) -> std::io::Result<Arc<OwnedFd>> {
        let state = Arc::new(std::sync::atomic::AtomicU8::new(PENDING));
        let guard = AbandonGuard(Arc::clone(&state));
        let folder = Arc::clone(&self.folder);
        let renamed = tokio::task::spawn_blocking(move || {
            if state
                .compare_exchange(PENDING, RENAMING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Abandoned: `self` is dropped here, its file removed.
                return Err(std::io::Error::other("the put was abandoned"));
            }
            let renamed = beneath::rename(self.folder.as_fd(), &self.name, &target);
            self.placed = renamed.is_ok();
            // Removes the file unless it is in place.
            drop(self);
            renamed
        })
        .await
        .map_err(std::io::Error::other);
        drop(guard);
        renamed??;
        Ok(folder)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.placed {
            return;
        }
        let (folder, name) = (Arc::clone(&self.folder), std::mem::take(&mut self.name));
        let writing = self.writing.take();
        let held = std::mem::take(&mut self.held);
        let remove = move || {
            let _ = beneath::remove(folder.as_fd(), &name);
            drop(writing);
            drop(folder);
            drop(held);
        };
        // Off the runtime when there is one (an unlink can be slow on a
        // network volume); synchronously otherwise.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

/// This host's part of temporary names: a short stable hash of what
/// scopes its process ids (on Linux the boot id, the pid namespace and
/// the host name; elsewhere process ids are never judged). Only files named with it are judged by their
/// process; another host's (a root shared over a network volume) only by
/// age.
fn host_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let mut identity = String::new();
        #[cfg(target_os = "linux")]
        {
            identity.push_str(
                std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                    .unwrap_or_default()
                    .trim(),
            );
            if let Ok(ns) = std::fs::read_link("/proc/self/ns/pid") {
                identity.push_str(&ns.to_string_lossy());
            }
        }
        identity.push_str(
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim(),
        );
        // FNV-1a: stable across builds, unlike the std hasher.
        let hash = identity.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{hash:016x}")
    })
}

/// The name of a new temporary file: `.rewire-tmp-<host>-<pid>-<serial>`.
fn temp_name() -> String {
    let serial = TEMP_SERIAL.fetch_add(1, Ordering::Relaxed);
    format!(
        "{TEMP_PREFIX}{}-{}-{serial}",
        host_tag(),
        std::process::id()
    )
}

/// Whether the temporary file `name` (with `meta`) is a dead put's: one
/// of this host whose process is gone, or any untouched for
/// [`STALE_TEMP`] — but never one this process is writing (a put whose
/// client stalled mid-body is alive, however long it waits).
fn stale_temp(name: &str, meta: &std::fs::Metadata) -> bool {
    if writing().contains(name) {
        return false;
    }
    let untouched = meta
        .modified()
        .ok()
        .and_then(|at| at.elapsed().ok())
        .is_some_and(|age| age >= STALE_TEMP);
    let mut parts = name.strip_prefix(TEMP_PREFIX).unwrap_or("").split('-');
    let ours = parts.next() == Some(host_tag());
    let pid = parts.next().and_then(|pid| pid.parse::<u32>().ok());
    untouched || (ours && pid.is_some_and(|pid| pid != std::process::id() && !process_alive(pid)))
}

/// Whether a process `pid` may run on this host (where that cannot be
/// told, yes: the file is then left to [`STALE_TEMP`]).
fn process_alive(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        Path::new("/proc").join(pid.to_string()).exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        true
    }
}

/// Most entries one sweep looks at: a huge root is swept in part (the
/// rest at a later init, or left to age).
const SWEEP_ENTRIES: usize = 100_000;

/// Removes the temporary files dead puts left beneath the handle `root`
/// (folders walked to [`listing::MAX_DEPTH`], at most [`SWEEP_ENTRIES`]
/// entries, symbolic links not followed; a folder is opened when it is
/// walked, so handles are held only along the current path).
fn sweep_temp_files(root: &OwnedFd) {
    let mut pending: Vec<(beneath::Later, usize)> = vec![(None, 0)];
    let mut budget = SWEEP_ENTRIES;
    while let Some((later, depth)) = pending.pop() {
        let Ok(folder) = beneath::open_later(root.as_fd(), later).map(Arc::new) else {
            continue;
        };
        let Ok(entries) = beneath::entries(folder.as_fd()) else {
            continue;
        };
        for (part, kind) in entries.flatten() {
            let Some(left) = budget.checked_sub(1) else {
                return;
            };
            budget = left;
            if kind == Kind::Folder && depth < listing::MAX_DEPTH {
                pending.push((Some((Arc::clone(&folder), part)), depth + 1));
            } else if kind == Kind::File
                && part.starts_with(TEMP_PREFIX)
                && matches!(
                    beneath::look(folder.as_fd(), &part),
                    Ok(Entry::File(meta)) if stale_temp(&part, &meta)
                )
            {
                let _ = beneath::remove(folder.as_fd(), &part);
            }
        }
    }
}

/// Roots (by device and inode) being swept now: an init while one is
/// swept (a quick reload) does not start another.
fn sweeping() -> &'static std::sync::Mutex<std::collections::HashSet<RootKey>> {
    static SWEEPING: OnceLock<std::sync::Mutex<std::collections::HashSet<RootKey>>> =
        OnceLock::new();
    SWEEPING.get_or_init(Default::default)
}

/// The identity of the root `handle`: its device and inode (stores on
/// one root share its sweep; stores on one device, its places for
/// blocking work).
fn root_key(handle: BorrowedFd<'_>) -> std::io::Result<RootKey> {
    let stat = rustix::fs::fstat(handle)?;
    #[allow(clippy::useless_conversion)]
    Ok((u64::from(stat.st_dev), u64::from(stat.st_ino)))
}

/// Sweeps `root` (whose identity is `key`) in the background (never
/// holding up init).
fn sweep_in_background(root: Arc<OwnedFd>, key: RootKey) {
    if !sweeping()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key)
    {
        return;
    }
    tokio::task::spawn_blocking(move || {
        sweep_temp_files(&root);
        sweeping()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    });
}

/// Stops a listing's walk (off the runtime) when dropped: a caller that
/// gives up (a deadline, a reset stream) leaves no walk reading on in the
/// blocking pool.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The walk of one page of `req` beneath `root`, reading at most `budget`
/// entries, and what stops it when dropped.
fn list_task(
    root: Arc<OwnedFd>,
    req: ListRequest,
    budget: usize,
) -> (
    StopOnDrop,
    impl FnOnce() -> Result<ListPage, FileError> + Send + 'static,
) {
    let stopped = Arc::new(AtomicBool::new(false));
    let stop = StopOnDrop(Arc::clone(&stopped));
    let walk = move || {
        let stop = || stopped.load(Ordering::Acquire);
        listing::page(root.as_fd(), &req, page_size(&req), budget, &stop)
    };
    (stop, walk)
}

#[rewire_runtime::prelude::async_trait]
impl Component for LocalFileStore {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let root = cx.resolve_path(&self.metadata.root);
        let failed = |err: std::io::Error| {
            ComponentError::new(format!("metadata field `root`: {}: {err}", root.display()))
        };
        tokio::fs::create_dir_all(&root).await.map_err(failed)?;
        let canonical = tokio::fs::canonicalize(&root).await.map_err(failed)?;
        let (handle, key) = tokio::task::spawn_blocking(move || {
            let handle = beneath::open_root(&canonical)?;
            let key = root_key(handle.as_fd())?;
            Ok((handle, key))
        })
        .await
        .map_err(|err| ComponentError::new(format!("opening {}: {err}", root.display())))?
        .map_err(failed)?;
        let handle = Arc::new(handle);
        sweep_in_background(Arc::clone(&handle), key);
        self.open(handle, key);
        Ok(())
    }
}

#[rewire_runtime::prelude::async_trait]
impl FileStore for LocalFileStore {
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError> {
        let name = req.name.as_str();
        let held = Held::of_upload();
        let kept = held.clone();
        // The hold goes with the closure: kept while the folders are
        // opened and the file created, however long after this put is gone.
        let (temp, file, last) = self
            .beneath(name, true, move |folder, name, last| {
                if let Ok(Entry::Link | Entry::Folder(_) | Entry::Other) =
                    beneath::look(folder.as_fd(), last)
                {
                    return Err(refused(name, "is not a regular file"));
                }
                // Known as being written before it exists: a sweep never
                // sees it otherwise.
                let writing = Writing::new();
                let temp = writing.0.clone();
                let file = beneath::create(folder.as_fd(), &temp)
                    .map_err(|err| backend("creating", name, err))?;
                // From here the temporary file goes with the put, however
                // it ends (dropped even before this task's answer is
                // taken: the answer is dropped, and the file with it).
                let temp = TempFile {
                    folder,
                    name: temp,
                    placed: false,
                    writing: Some(writing),
                    held: kept,
                };
                Ok((temp, file, last.to_string()))
            })
            .await?;
        let mut file = HeldFile::new(file, held.clone());
        let limit = self.metadata.max_file_size;
        copy_bounded(name, req.body, &mut file, limit, |_| Ok(())).await?;
        // What was written, from the file itself: after the rename, the
        // name may already be another put's.
        let meta = file.sync_and_close(name).await?;
        // A missing file here is the temporary one (removed by another
        // process), never the name: not "not found" on a put.
        let folder = temp.place(last).await.map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => FileError::Backend(format!(
                "renaming into `{name}`: its temporary file vanished before the rename \
                 (removed by another process?)"
            )),
            _ => backend("renaming into", name, err),
        })?;
        // The rename is durable once the folder is synced.
        let synced = name.to_string();
        held.blocking(move || {
            beneath::sync(folder.as_fd())
                .map_err(|err| backend("syncing the folder of", &synced, err))
        })
        .await?;
        Ok(info(name, &meta))
    }

    async fn get(&self, name: &str) -> Result<FileRead, FileError> {
        let (file, meta) = self
            .beneath(name, false, |folder, name, last| {
                existing(&folder, name, last)?;
                beneath::open_read(folder.as_fd(), name, last)
            })
            .await?;
        Ok(FileRead {
            info: info(name, &meta),
            body: Box::pin(tokio::fs::File::from_std(file)),
        })
    }

    async fn list(&self, req: ListRequest) -> Result<ListPage, FileError> {
        let opened = self.opened()?;
        // Held by this future: dropped with it, the walk stops.
        let (_stop, walk) = list_task(Arc::clone(&opened.root), req, listing::LIST_ENTRIES);
        opened.ops.run(walk).await
    }

    async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
        let meta = self
            .beneath(name, false, |folder, name, last| {
                stated(&folder, name, last)
            })
            .await?;
        Ok(stat_info(name, &meta))
    }

    async fn delete(&self, name: &str) -> Result<(), FileError> {
        self.beneath(name, false, |folder, name, last| {
            existing(&folder, name, last)?;
            beneath::remove(folder.as_fd(), last).map_err(|err| backend("deleting", name, err))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store on `dir`, opened as init opens it (without the sweep).
    fn store_on(dir: &Path) -> LocalFileStore {
        let store = LocalFileStore::new(LocalFileMetadata {
            root: dir.display().to_string(),
            max_file_size: DEFAULT_MAX_FILE_SIZE,
        });
        let root = beneath::open_root(dir).unwrap();
        let key = root_key(root.as_fd()).unwrap();
        store.open(Arc::new(root), key);
        store
    }

    /// Two stores with their roots in two folders of one filesystem (one
    /// root per tenant under one mount; one root shared, as by two
    /// components or a reload's new instance, is the same case), the first
    /// with every place of the filesystem taken by an operation stuck on
    /// its disk (time paused: moved by hand): a stat on the second waits,
    /// never starting, and fails once nothing has returned for the bound.
    /// Before, places were a root's (device and inode): the stat started
    /// another thread on the stuck disk, and each root on the mount added
    /// 32 more.
    #[tokio::test(start_paused = true)]
    async fn stores_on_one_filesystem_share_its_places_for_blocking_operations() {
        let dir = tempfile::tempdir().unwrap();
        let (tenant_a, tenant_b) = (dir.path().join("tenant-a"), dir.path().join("tenant-b"));
        std::fs::create_dir(&tenant_a).unwrap();
        std::fs::create_dir(&tenant_b).unwrap();
        std::fs::write(tenant_b.join("report.txt"), "x").unwrap();
        let (first, second) = (store_on(&tenant_a), store_on(&tenant_b));
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Arc::new(std::sync::Mutex::new(released));
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let ops = first.opened().unwrap().ops.clone();
        let mut stuck = Vec::new();
        for _ in 0..blocking_ops::MAX_BLOCKING_OPS {
            let (ops, released, started_tx) =
                (ops.clone(), Arc::clone(&released), started_tx.clone());
            stuck.push(tokio::spawn(async move {
                ops.run(move || {
                    let _ = started_tx.send(());
                    let _ = released.lock().unwrap().recv();
                    Ok(())
                })
                .await
            }));
        }
        for _ in 0..blocking_ops::MAX_BLOCKING_OPS {
            started.recv().await.unwrap();
        }
        let stat = tokio::spawn(async move { second.stat("report.txt").await });
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        // Past the bound twice over: other tests' operations on this
        // filesystem may have returned (on their own clocks) just before
        // the stat was called.
        tokio::time::advance(2 * blocking_ops::PLACE_WAIT).await;
        let refused = stat
            .await
            .unwrap()
            .expect_err("no place left on the filesystem");
        assert!(
            refused
                .to_string()
                .contains("has not returned an operation"),
            "{refused}"
        );
        drop(release);
        for call in stuck {
            call.await.unwrap().unwrap();
        }
    }

    #[test]
    fn a_listing_whose_caller_is_gone_stops_and_one_within_its_budget_runs() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..20 {
            std::fs::write(dir.path().join(format!("{i:02}")), "x").unwrap();
        }
        let root = || Arc::new(beneath::open_root(dir.path()).unwrap());
        let req = ListRequest::default();
        // Its future dropped (the stop with it) before the walk runs.
        let (stop, walk) = list_task(root(), req.clone(), listing::LIST_ENTRIES);
        drop(stop);
        assert_eq!(walk(), Err(listing::abandoned()));
        // Kept: the whole page, within 20 entries but not 19.
        let (_stop, walk) = list_task(root(), req.clone(), 20);
        assert_eq!(walk().unwrap().files.len(), 20);
        let (_stop, walk) = list_task(root(), req, 19);
        assert_eq!(walk(), Err(listing::too_large(19)));
    }

    #[test]
    fn the_deepest_name_a_store_takes_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let deepest = vec!["d"; crate::file_store::names::MAX_PARTS].join("/");
        let path = dir.path().join(&deepest);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "x").unwrap();
        let root = Arc::new(beneath::open_root(dir.path()).unwrap());
        let (_stop, walk) = list_task(root, ListRequest::default(), listing::LIST_ENTRIES);
        let page = walk().unwrap();
        let names: Vec<&str> = page.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [deepest.as_str()]);
    }

    #[tokio::test]
    async fn a_put_abandoned_on_a_hung_disk_keeps_its_upload_hold_until_its_write_returns() {
        const WITHIN: Duration = Duration::from_secs(30);
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(store_on(dir.path()));
        let (disk, mut probes) = held::HungDisk::new();
        let put = tokio::spawn(async move {
            let req = PutFileRequest {
                name: "slow.bin".into(),
                body: Box::pin(&b"contents"[..]),
                metadata: Default::default(),
            };
            PutFileRequest::holding(Arc::new(disk), store.put(req)).await
        });
        tokio::time::timeout(WITHIN, probes.stalled.recv())
            .await
            .expect("within the deadline")
            .expect("the write reaches the hung disk");
        // The client gives up: the put's future is gone, its write is not.
        put.abort();
        assert!(put.await.expect_err("aborted").is_cancelled());
        assert!(
            probes.released.try_recv().is_err(),
            "the upload's hold was let go while its blocking write still runs"
        );
        drop(probes.open);
        tokio::time::timeout(WITHIN, probes.released.recv())
            .await
            .expect("within the deadline")
            .expect("the hold is let go once the write has returned");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "the abandoned put left {left:?}");
    }

    #[tokio::test]
    async fn a_listing_carries_no_metadata_and_a_stat_the_files_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.txt");
        std::fs::write(&path, "quarterly").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let store = store_on(dir.path());
        let page = store.list(ListRequest::default()).await.unwrap();
        let [listed] = page.files.as_slice() else {
            panic!("one file: {page:?}");
        };
        assert_eq!((listed.name.as_str(), listed.size), ("report.txt", 9));
        assert!(listed.metadata.is_empty(), "{listed:?}");
        let stated = store.stat("report.txt").await.unwrap();
        assert_eq!(
            stated.metadata,
            [
                ("FileMode".to_string(), "416".to_string()),
                ("IsDir".to_string(), "false".to_string()),
            ]
            .into()
        );
    }
}
