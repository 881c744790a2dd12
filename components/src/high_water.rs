//! A sequencer's high-water marks: what keeps an id from being handed out
//! twice — not after a server switch, not after the sequencer is rebuilt
//! (on another server, as another type, with another file), and (with a
//! file) not after the process restarts.
//!
//! Per key, the marks keep the largest id handed out and the value ids
//! must stay above (`biggerThan`, the file). A backend's ids are accepted
//! only above both, and only if the backend is still the one in force
//! ([`HighWater::accept`]); otherwise the caller asks again, passing the
//! floor so the backend jumps above it.
//!
//! The marks belong to the *component*, not to one instance of it: an
//! instance started with [`HighWater::adopt`] takes the marks its live
//! predecessors of the same component (`kind/name`) in the same runtime
//! left in the runtime's handover area, and leaves them for its own
//! successors. So a rebuilt sequencer — built while its predecessor still
//! serves, as a reload does — starts above every id the predecessor
//! handed out, whatever forced the rebuild (another server, type, file or
//! app id) and whatever its server's counter says. The marks live as long
//! as one instance of the component does; another runtime in the process,
//! even of the same app and name, has marks of its own.
//!
//! With a file, ids are handed out only inside *reservations*: before an
//! id above its reservation, an instance reads the files of every live
//! instance of the component (under a lock per file, so instances take
//! turns), moves its floor above the highest reservation anyone made, and
//! writes a new one a block (1,000 ids) higher into each of them (temp
//! file, fsync, rename, fsync of the folder). Two reservations never
//! overlap, so ids never do; ids between reservations are skipped, never
//! repeated. A file an instance brings along that the component did not
//! use yet gets a reservation above everything handed out before the next
//! id of each key, so a restart on either file is safe.
//!
//! Limits: keys of at most [`MAX_KEY_BYTES`] bytes; at most [`MAX_KEYS`]
//! keys per component (a key takes room once its backend answered, not
//! when it is asked for, nor when its request failed); a file is never
//! written past [`MAX_FILE_BYTES`] (a new key is refused once the file
//! holds [`NEW_KEY_FILE_BYTES`]). Both refusals are
//! [`SequencerError::Capacity`]: the request is valid, the sequencer full.
//! A backend sequencer asks [`HighWater::has_room`] before its backend, so
//! a refused key leaves nothing there. A file that is larger, or not readable, stops the
//! sequencer from starting (starting at 0 could repeat ids) with an error
//! saying what to do.
//!
//! Every operation on a file (a look at it, a read, a whole write with its
//! fsyncs and rename) runs off the async workers, one at a time per file
//! ([`on_path_in_turn`]), bounded by [`HIGH_WATER_FILE_DEADLINE`] (a look,
//! a read) or [`HIGH_WATER_WRITE_DEADLINE`] (a write), once waiting for
//! its turn and once running, so up to twice that: on a hung mount, one
//! operation is given up and pins one thread; until it returns, requests
//! needing the file fail at once (a backend error naming `highWaterFile`)
//! instead of each pinning another thread, and no write starts before an
//! earlier one ended, so a late write never lands over a later
//! reservation. A write given up is a reservation not made: no id is
//! handed out under it. An operation that never returns (a lazily
//! unmounted NFS mount, its thread in D state) keeps requests needing the
//! file failing until a restart, or until `highWaterFile` names another
//! file.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use rewire_runtime::{Abandoned, IdRange, InitContext, SequencerError};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::component_file::{on_path_in_turn, COMPONENT_FILE_READ_DEADLINE};

/// How long a look at, or a read of, a high-water file may take (and
/// wait for its turn): 5 s, as a component file read.
pub const HIGH_WATER_FILE_DEADLINE: Duration = COMPONENT_FILE_READ_DEADLINE;

/// How long a whole write of a high-water file may take (and wait for its
/// turn): temp file, fsync, rename and fsync of the folder, up to
/// [`MAX_FILE_BYTES`] — 30 s, for storage that is slow but working (NFS,
/// a throttled cloud disk, a writeback stall). A write given up is a
/// reservation not made, and once it lands its value is read back as
/// another instance's, so the floor jumps above it: on storage where every
/// whole write takes longer than this, every reservation fails, each
/// skipping at least [`RESERVE_BLOCK`] ids, until writes get faster. (An
/// init that brings a file, writing it, is also held to the runtime's init
/// timeout, 30 s by default.)
pub const HIGH_WATER_WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// Ids reserved per file write, beyond what the request needs.
pub const RESERVE_BLOCK: i64 = 1_000;

/// Most keys a sequencer tracks (each costs memory, and a file entry).
pub const MAX_KEYS: usize = 100_000;

/// Longest key, in bytes (the key is kept in memory and in the file).
pub const MAX_KEY_BYTES: usize = 1024;

/// Largest high-water file read back or written.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Size past which a file takes no new key (the keys it holds may still
/// move up: [`MAX_KEYS`] entries growing to 19 digits fit in the rest).
pub const NEW_KEY_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Bytes a file entry takes beside its key (quoted, as JSON): the `:`,
/// the largest reservation (19 digits) and the `,`.
const ENTRY_BYTES_BESIDE_KEY: u64 = 21;

/// Most bytes one new entry can add to a file: its longest key with every
/// byte escaped (`\u00XX`), quoted, and what goes beside it.
const MAX_ENTRY_BYTES: u64 = 6 * MAX_KEY_BYTES as u64 + 2 + ENTRY_BYTES_BESIDE_KEY;

/// Layotto's separator after `sequencer` in a counter's key
/// (`sequencer|||{key}`).
pub const KEY_SEPARATOR: &str = "|||";

/// Layotto's separator between a key prefix and the key
/// (`{appId}||{key}`): refused in keys and in a literal `keyPrefix`, as
/// Layotto's `GetModifiedSeqKey` does (it also rules out
/// [`KEY_SEPARATOR`]).
pub const PART_SEPARATOR: &str = "||";

/// The key of `key`'s counter as Layotto's `GetModifiedSeqKey` makes it:
/// `sequencer|||` and then, by the `keyPrefix` strategy
/// (case-insensitive; see [`strategy_base`](crate::key_prefix::strategy_base)):
///
/// * empty or `appid` (the default): `{appId}||{key}` (`{key}` when the
///   app has no id);
/// * `name`: `{component name}||{key}`;
/// * `none`: `{key}`;
/// * anything else, lowercased: `{keyPrefix}||{key}`.
///
/// The redis sequencer uses it as is; the etcd one puts `keyPrefixPath`
/// in front.
pub fn layotto_key(key_prefix: &str, app_id: &str, component: &str, key: &str) -> String {
    let base = crate::key_prefix::strategy_base(key_prefix, app_id, component);
    format!("sequencer{KEY_SEPARATOR}{base}{key}")
}

/// The key of `key`'s counter in rewire's layout before it followed
/// Layotto's: `{keyPrefix}sequencer|||{key}`, `keyPrefix` literal. Read
/// once per key and process so counters left there go on.
pub fn old_rewire_key(key_prefix: &str, key: &str) -> String {
    format!("{key_prefix}sequencer{KEY_SEPARATOR}{key}")
}

/// Checks a sequencer's `keyPrefix` as Layotto does: no `||`.
pub fn check_key_prefix(key_prefix: &str) -> Result<(), String> {
    match key_prefix.contains(PART_SEPARATOR) {
        true => Err(format!(
            "metadata field `keyPrefix`: `{key_prefix}` contains `{PART_SEPARATOR}` \
             (it is a key prefix strategy: `appid`, `name`, `none` or a literal \
             without `{PART_SEPARATOR}`)"
        )),
        false => Ok(()),
    }
}

/// Why a high-water file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("metadata field `highWaterFile`: {path}: {reason}")]
pub struct HighWaterFileError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
    /// Whether the file itself is at fault.
    pub kind: HighWaterFileErrorKind,
}

/// Whether a high-water file is at fault, or only could not be used now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HighWaterFileErrorKind {
    /// Its content, or the system's answer about it (missing folder,
    /// permissions, not JSON, too large): the operator has to act on it.
    File,
    /// It did not answer in time (a hung mount), or an earlier operation
    /// on it that did not has not returned: nothing is known to be wrong
    /// with its content.
    NotAnswering,
    /// Another operation on it, still running, held it past the bound:
    /// this one was not started.
    Busy,
    /// The operation could not run (no thread could be started, or it
    /// panicked): nothing is known to be wrong with the file.
    NotRun,
}

impl HighWaterFileError {
    fn new(path: &Path, reason: String) -> Self {
        Self::of_kind(path, HighWaterFileErrorKind::File, reason)
    }

    fn of_kind(path: &Path, kind: HighWaterFileErrorKind, reason: String) -> Self {
        Self {
            path: path.display().to_string(),
            reason,
            kind,
        }
    }
}

/// What to do when a file cannot be read at start.
const UNREADABLE_HELP: &str = "the sequencer does not start without it, since starting \
     below the ids it reserved could repeat them; fix or restore the file, or remove the \
     entries of keys no longer used (an entry is `key: highest reserved id`), or point \
     `highWaterFile` at a new file and set `biggerThan` of each key above its value in \
     the old one";

/// Checks a request's key and size, as every sequencer does.
pub fn check_request(key: &str, size: u32) -> Result<(), SequencerError> {
    if key.is_empty() {
        return Err(SequencerError::Invalid("the key is empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(SequencerError::Invalid(format!(
            "the key is {} bytes long; at most {MAX_KEY_BYTES} bytes",
            key.len()
        )));
    }
    if key.contains(PART_SEPARATOR) {
        return Err(SequencerError::Invalid(format!(
            "key `{key}` contains `{PART_SEPARATOR}`"
        )));
    }
    if size == 0 {
        return Err(SequencerError::Invalid(format!(
            "segment of `{key}` must hold at least one id"
        )));
    }
    Ok(())
}

/// The marks one instance of a sequencer uses: the component's (shared
/// with its other live instances) and its own file.
#[derive(Debug)]
pub struct HighWater {
    file: Option<PathBuf>,
    /// The lock of `file`, held so that what is known of the file (kept
    /// under it) lives as long as an instance using the file does.
    _file_lock: Option<Arc<Mutex<FileState>>>,
    shared: Arc<Shared>,
    /// Held while this instance lives: its file stays written to.
    user: Arc<()>,
}

/// The marks of one component.
#[derive(Debug, Default)]
struct Shared {
    table: std::sync::Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    keys: HashMap<String, Arc<Mutex<Interval>>>,
    bigger_than: BTreeMap<String, i64>,
    /// The files of the live instances, by the instance holding each.
    files: Vec<(Weak<()>, PathBuf)>,
    /// Bumped when a file joins: reservations made before it do not hold
    /// in that file.
    files_epoch: u64,
}

impl Table {
    /// The files of live instances, each once, in lock order.
    fn live_files(&mut self) -> Vec<PathBuf> {
        self.files.retain(|(user, _)| user.strong_count() > 0);
        let mut files: Vec<PathBuf> = self.files.iter().map(|(_, path)| path.clone()).collect();
        files.sort();
        files.dedup();
        files
    }
}

/// What the marks know of one key.
#[derive(Debug)]
struct Interval {
    /// Ids must be above this.
    above: i64,
    /// Largest id handed out.
    handed: i64,
    /// Ids up to this are reserved in every file of `epoch` (no file: all).
    reserved: i64,
    /// The file set `reserved` was made in.
    epoch: u64,
    /// The backend (session) that last gave an accepted id; held weakly,
    /// so it is never mistaken for a new one at the same address. `None`
    /// after ids were counted here (the `memory` sequencer).
    backend: Option<Weak<dyn Any + Send + Sync>>,
    /// Ids from `backend` must be above this: the largest id handed out
    /// before it was first used.
    backend_floor: i64,
}

impl Interval {
    fn floor(&self) -> i64 {
        self.above.max(self.handed)
    }

    /// What is reserved in the files of `epoch` (nothing above the floor
    /// if a file joined since the last reservation).
    fn reserved_in(&self, epoch: u64) -> i64 {
        if self.epoch == epoch {
            self.reserved
        } else {
            self.reserved.min(self.floor())
        }
    }
}

/// What to do with a range a backend gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it out.
    Accept,
    /// Ask the backend again, for ids above `floor`.
    Retry {
        /// The value ids must be above.
        floor: i64,
    },
}

/// What the file looked like when its entries were last read or written
/// here: if it still looks so, they are still its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    /// A rename over the file (as [`write_file`] does) changes it.
    #[cfg(unix)]
    inode: (u64, u64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            inode: (meta.dev(), meta.ino()),
        }
    }
}

/// What is known of one high-water file, kept under its lock: the entries
/// of a nearly full one, so that [`HighWater::has_room`] answers for a new
/// key without reading (and parsing) up to [`MAX_FILE_BYTES`] per request.
#[derive(Default)]
struct FileState {
    /// The entries the file held, and how it looked then; only while it
    /// is too full to take any new key without a look at them.
    nearly_full: Option<(Stamp, BTreeMap<String, i64>)>,
}

/// The number of entries, not up to 16 MiB of them in a log line.
impl std::fmt::Debug for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known = self.nearly_full.as_ref().map(|(_, entries)| entries.len());
        f.debug_struct("FileState")
            .field("nearly_full_entries", &known)
            .finish()
    }
}

impl FileState {
    /// Keeps `entries` if the file (as `stamp` says) is nearly full.
    fn remember(&mut self, stamp: Option<Stamp>, entries: BTreeMap<String, i64>) {
        self.nearly_full = stamp
            .filter(|stamp| stamp.len.saturating_add(MAX_ENTRY_BYTES) > NEW_KEY_FILE_BYTES)
            .map(|stamp| (stamp, entries));
    }

    /// Whether the file at `path` holds `key`: from what is known while the
    /// file looks as it did, else read (under the lock held on `self`).
    async fn holds(&mut self, path: &Path, key: &str) -> Result<bool, HighWaterFileError> {
        let now = stamp(path).await?;
        if let Some((known, entries)) = &self.nearly_full {
            if now.as_ref() == Some(known) {
                return Ok(entries.contains_key(key));
            }
        }
        let (entries, stamp) = read_file_stamped(path).await?;
        let holds = entries.contains_key(key);
        self.remember(stamp, entries);
        Ok(holds)
    }
}

/// One lock per high-water file (by its canonical path), shared by every
/// instance in the process, with what is known of the file.
static FILE_LOCKS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Weak<Mutex<FileState>>>>> =
    LazyLock::new(Default::default);

fn file_lock(path: &Path) -> Arc<Mutex<FileState>> {
    let mut locks = FILE_LOCKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(lock) = locks.get(path).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, lock| lock.strong_count() > 0);
    let lock = Arc::new(Mutex::new(FileState::default()));
    locks.insert(path.to_path_buf(), Arc::downgrade(&lock));
    lock
}

/// `path` with its folder canonicalised, so that every spelling of one
/// file shares one lock; off the async thread and given up after 5 s (a
/// hung mount), failing the init.
async fn canonical(path: &Path) -> Result<PathBuf, HighWaterFileError> {
    let failed = |reason: String| HighWaterFileError::new(path, reason);
    let name = path
        .file_name()
        .ok_or_else(|| failed("not a file name".into()))?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let deadline = crate::component_file::COMPONENT_FILE_READ_DEADLINE;
    let folder = crate::component_file::canonicalize_within(folder, deadline)
        .await
        .map_err(|err| failed(format!("its folder: {err}")))?;
    Ok(folder.join(name))
}

impl HighWater {
    /// Marks of their own (shared with no other instance), starting above
    /// `bigger_than`, and above what `file` (if any) reserved; the file is
    /// read (and checked) now.
    pub async fn load(
        file: Option<PathBuf>,
        bigger_than: &BTreeMap<String, i64>,
    ) -> Result<Self, HighWaterFileError> {
        Self::join(Arc::default(), file, bigger_than).await
    }

    /// The marks of the component `cx` initialises, shared with its other
    /// live instances in the same runtime (a rebuilt sequencer starts
    /// above every id its predecessor handed out): those its newest live
    /// predecessor left in the runtime's handover area, else new ones;
    /// left there in turn for its successors. Raised to `bigger_than`;
    /// `file` (if any) is read (and checked) now, and written from now on
    /// with every other live instance's file.
    pub async fn adopt(
        cx: &InitContext,
        file: Option<PathBuf>,
        bigger_than: &BTreeMap<String, i64>,
    ) -> Result<Self, HighWaterFileError> {
        let shared = cx
            .left_by_predecessors::<Shared>()
            .into_iter()
            .next()
            .unwrap_or_default();
        let marks = Self::join(shared, file, bigger_than).await?;
        cx.leave_for_successor(&marks.shared);
        Ok(marks)
    }

    async fn join(
        shared: Arc<Shared>,
        file: Option<PathBuf>,
        bigger_than: &BTreeMap<String, i64>,
    ) -> Result<Self, HighWaterFileError> {
        let (file, file_lock) = match file {
            Some(path) => {
                let path = canonical(&path).await?;
                let lock = file_lock(&path);
                {
                    let mut state = lock.lock().await;
                    let (entries, stamp) =
                        read_file_stamped(&path)
                            .await
                            .map_err(|err| match err.kind {
                                HighWaterFileErrorKind::File => HighWaterFileError {
                                    reason: format!("{}; {UNREADABLE_HELP}", err.reason),
                                    ..err
                                },
                                _ => err,
                            })?;
                    state.remember(stamp, entries);
                }
                (Some(path), Some(lock))
            }
            None => (None, None),
        };
        let marks = Self {
            file,
            _file_lock: file_lock,
            shared,
            user: Arc::new(()),
        };
        marks.raise(bigger_than).await;
        if let Some(path) = &marks.file {
            marks.bring(path).await?;
        }
        Ok(marks)
    }

    /// Adds `path` to the files the component writes. A file it did not
    /// use yet is written at once with every key's reservation (or floor),
    /// so that it covers every id handed out so far even if no other id is
    /// ever asked for before a restart on it.
    async fn bring(&self, path: &Path) -> Result<(), HighWaterFileError> {
        let (intervals, epoch) = {
            let mut table = self.table();
            let known = table.live_files().iter().any(|file| file == path);
            table
                .files
                .push((Arc::downgrade(&self.user), path.to_path_buf()));
            if known {
                return Ok(());
            }
            // Every reservation made from now on includes `path`.
            table.files_epoch += 1;
            let intervals: Vec<(String, Arc<Mutex<Interval>>)> = table
                .keys
                .iter()
                .map(|(key, interval)| (key.clone(), interval.clone()))
                .collect();
            (intervals, table.files_epoch)
        };
        if intervals.is_empty() {
            return Ok(());
        }
        // Marks first, then the file, as a reservation takes them: what
        // was in flight with the files before is over once all are held.
        let mut held = Vec::with_capacity(intervals.len());
        for (key, interval) in &intervals {
            held.push((key, interval.lock().await));
        }
        let lock = file_lock(path);
        let mut state = lock.lock().await;
        let failed = |reason: String| HighWaterFileError::new(path, reason);
        let mut all = read_file(path).await?;
        for (key, interval) in &mut held {
            // Whether `reserved` holds in every other live file.
            let valid = interval.epoch == epoch - 1;
            let covered = if interval.reserved == i64::MAX {
                // No file reserved it: reserve from the floor up.
                interval.floor().saturating_add(RESERVE_BLOCK)
            } else {
                interval.reserved.max(interval.floor())
            };
            let entry = all.entry(key.to_string()).or_insert(covered);
            *entry = (*entry).max(covered);
            if valid && *entry == covered {
                // Reserved in the other files, and now in this one.
                interval.reserved = covered;
                interval.epoch = epoch;
            }
        }
        let text = serde_json::to_vec(&all).map_err(|err| failed(err.to_string()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(failed(format!(
                "the sequencer's {} keys would make it larger than {MAX_FILE_BYTES} bytes",
                held.len()
            )));
        }
        let stamp = write_file(path, text).await?;
        state.remember(stamp, all);
        Ok(())
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.shared
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The file this instance brought, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Raises the values ids must stay above (a new `biggerThan`).
    pub async fn raise(&self, bigger_than: &BTreeMap<String, i64>) {
        let raised: Vec<(Arc<Mutex<Interval>>, i64)> = {
            let mut table = self.table();
            for (key, value) in bigger_than {
                let entry = table.bigger_than.entry(key.clone()).or_insert(*value);
                *entry = (*entry).max(*value);
            }
            bigger_than
                .iter()
                .filter_map(|(key, value)| Some((table.keys.get(key)?.clone(), *value)))
                .collect()
        };
        for (interval, value) in raised {
            let mut interval = interval.lock().await;
            interval.above = interval.above.max(value);
        }
    }

    /// Whether a request for `key` may go to the backend: always for a
    /// key with marks; for a new one only while the component tracks
    /// fewer than [`MAX_KEYS`] keys and every live file holds it or has
    /// room for its entry (as [`NEW_KEY_FILE_BYTES`] counts it, with the
    /// longest reservation). Asked before the backend, so a refused key creates
    /// nothing there (a counter that never expires) nor marks here. New
    /// keys racing for the last place may all pass; [`accept`](Self::accept)
    /// refuses the ones past it (their counters stay, one per racer).
    pub async fn has_room(&self, key: &str) -> Result<(), SequencerError> {
        let files = {
            let mut table = self.table();
            if table.keys.contains_key(key) {
                return Ok(());
            }
            if table.keys.len() >= MAX_KEYS {
                return Err(too_many_keys(key));
            }
            table.live_files()
        };
        let quoted = serde_json::to_string(key).map_or(key.len(), |quoted| quoted.len());
        let entry = quoted as u64 + ENTRY_BYTES_BESIDE_KEY;
        let failed = |err: HighWaterFileError| SequencerError::Backend(err.to_string());
        for path in &files {
            let size = stamp(path)
                .await
                .map_err(failed)?
                .map_or(0, |stamp| stamp.len);
            if size.saturating_add(entry) <= NEW_KEY_FILE_BYTES {
                continue;
            }
            // Nearly full: a key the file holds (its marks not read back
            // since a restart) only moves up, as reserve lets it. Its
            // entries are known under its lock, read only once it changed,
            // so requests for new keys do not each read the file at once.
            let lock = file_lock(path);
            let holds = lock.lock().await.holds(path, key).await.map_err(failed)?;
            if !holds {
                return Err(file_full(path, NEW_KEY_FILE_BYTES, key));
            }
        }
        Ok(())
    }

    /// The value ids of `key` must be above now. A key without marks
    /// gets none here: a key takes room only once the backend answered
    /// ([`accept`](Self::accept)), so requests that fail take none.
    pub async fn floor(&self, key: &str) -> Result<i64, SequencerError> {
        let known = {
            let table = self.table();
            match table.keys.get(key) {
                Some(interval) => interval.clone(),
                None => return Ok(table.bigger_than.get(key).copied().unwrap_or(0).max(0)),
            }
        };
        let floor = known.lock().await.floor();
        Ok(floor)
    }

    /// Hands out the next `size` ids of `key` right here: the marks are
    /// the counter (the `memory` sequencer).
    pub async fn take(&self, key: &str, size: u32) -> Result<IdRange, SequencerError> {
        let mut interval = self.locked(key).await?;
        let taken = self.count(&mut interval, key, size).await;
        if taken.is_err() {
            self.forget_unused(key, &interval);
        }
        taken
    }

    /// [`take`](Self::take) on the locked marks of `key`.
    async fn count(
        &self,
        interval: &mut Interval,
        key: &str,
        size: u32,
    ) -> Result<IdRange, SequencerError> {
        let mut range = next_range(key, interval.floor(), size)?;
        // A counter here: every range lies above every earlier one.
        let (files, epoch) = self.files();
        if range.to > interval.reserved_in(epoch) {
            self.reserve(interval, key, range, &files, epoch).await?;
            range = next_range(key, interval.floor(), size)?;
        }
        interval.handed = range.to;
        // Ids counted here are not a backend's: the next backend range
        // must lie above them, as after a server switch.
        interval.backend = None;
        Ok(range)
    }

    /// Whether `range`, from `backend`, may be handed out: only if
    /// `still_current` (the backend is still the one in force), above what
    /// anyone else reserved, and — the first time an id comes from this
    /// backend, and every time after — above every id handed out before
    /// it was first used. (Ids from one backend are unique among
    /// themselves, so they need not arrive in order.) An accepted range is
    /// recorded (and reserved) before this returns.
    pub async fn accept<B: Any + Send + Sync>(
        &self,
        key: &str,
        range: IdRange,
        backend: &Arc<B>,
        still_current: impl FnOnce() -> bool,
    ) -> Result<Verdict, SequencerError> {
        let mut interval = self.locked(key).await?;
        let (files, epoch) = self.files();
        if range.to > interval.reserved_in(epoch) {
            if let Err(err) = self.reserve(&mut interval, key, range, &files, epoch).await {
                self.forget_unused(key, &interval);
                return Err(err);
            }
        }
        let current = still_current();
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(backend) as _;
        if current && !interval.backend.as_ref().is_some_and(|b| b.ptr_eq(&weak)) {
            interval.backend = Some(weak);
            interval.backend_floor = interval.handed;
        }
        let floor = interval.above.max(interval.backend_floor);
        let verdict = if !current || range.from <= floor {
            Verdict::Retry {
                floor: interval.floor(),
            }
        } else {
            interval.handed = interval.handed.max(range.to);
            Verdict::Accept
        };
        Ok(verdict)
    }

    /// The files to reserve in, and their epoch.
    fn files(&self) -> (Vec<PathBuf>, u64) {
        let mut table = self.table();
        (table.live_files(), table.files_epoch)
    }

    /// The marks of `key`, new ones if it had none.
    fn interval(&self, key: &str) -> Result<Arc<Mutex<Interval>>, SequencerError> {
        let mut table = self.table();
        if let Some(interval) = table.keys.get(key) {
            return Ok(interval.clone());
        }
        if table.keys.len() >= MAX_KEYS {
            return Err(too_many_keys(key));
        }
        let above = table.bigger_than.get(key).copied().unwrap_or(0).max(0);
        let interval = Arc::new(Mutex::new(Interval {
            above,
            handed: 0,
            // With a file nothing is reserved yet: the first id reads it.
            reserved: i64::MAX,
            epoch: u64::MAX,
            backend: None,
            backend_floor: 0,
        }));
        table.keys.insert(key.to_string(), interval.clone());
        Ok(interval)
    }

    /// The marks of `key` (new ones if it had none), locked. Marks
    /// [`forget_unused`](Self::forget_unused) dropped while this waited
    /// for them are not used: the key's marks in the table are.
    async fn locked(&self, key: &str) -> Result<OwnedMutexGuard<Interval>, SequencerError> {
        loop {
            let interval = self.interval(key)?;
            let locked = interval.clone().lock_owned().await;
            let table = self.table();
            if table
                .keys
                .get(key)
                .is_some_and(|current| Arc::ptr_eq(current, &interval))
            {
                return Ok(locked);
            }
        }
    }

    /// Drops the marks of `key` that a failed request just made (nothing
    /// handed out, reserved or heard from a backend under them), so that
    /// a key refused for a full file, or a failed file write, takes none
    /// of the [`MAX_KEYS`] places. What they held comes back on the next
    /// request: `biggerThan` from the table, the files' reservations from
    /// the files.
    fn forget_unused(&self, key: &str, interval: &OwnedMutexGuard<Interval>) {
        let unused =
            interval.handed == 0 && interval.reserved == i64::MAX && interval.backend.is_none();
        if !unused {
            return;
        }
        let mut table = self.table();
        let ours = OwnedMutexGuard::mutex(interval);
        if table
            .keys
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, ours))
        {
            table.keys.remove(key);
        }
    }

    /// Reserves ids of `key` up to at least the end of `range` in every
    /// one of `files`, moving the floor above every reservation made by
    /// anyone else. Only this key's marks are held meanwhile (and the
    /// files').
    async fn reserve(
        &self,
        interval: &mut Interval,
        key: &str,
        range: IdRange,
        files: &[PathBuf],
        epoch: u64,
    ) -> Result<(), SequencerError> {
        if files.is_empty() {
            interval.reserved = i64::MAX;
            interval.epoch = epoch;
            return Ok(());
        }
        let failed = |err: HighWaterFileError| SequencerError::Backend(err.to_string());
        // In path order: two reservations never wait on each other.
        let locks: Vec<_> = files.iter().map(|path| file_lock(path)).collect();
        let mut turns = Vec::with_capacity(locks.len());
        for lock in &locks {
            turns.push(lock.lock().await);
        }
        let mut contents = Vec::with_capacity(files.len());
        let mut theirs = 0;
        for path in files {
            let all = read_file(path).await.map_err(failed)?;
            theirs = theirs.max(all.get(key).copied().unwrap_or(0));
            contents.push(all);
        }
        let needed = range.to;
        // Room for the request, and for as much again as the counter moved
        // since the floor, up to one block: a counter shared with busy
        // clients is not reserved twice its distance (which forced etcd
        // counters to jump), nor written to the file at every id.
        let size = range.to.saturating_sub(range.from).saturating_add(1).max(0);
        let moved = needed
            .saturating_sub(interval.floor())
            .clamp(0, RESERVE_BLOCK);
        let span = size.max(moved);
        if theirs > interval.reserved_in(epoch) {
            interval.above = interval.above.max(theirs);
        }
        let top = theirs.max(needed).max(interval.floor());
        // Room for the request even if the floor just moved up to `theirs`.
        let reserved = top.saturating_add(span).saturating_add(RESERVE_BLOCK);
        for ((path, mut all), state) in files.iter().zip(contents).zip(&mut turns) {
            let new_key = all.insert(key.to_string(), reserved).is_none();
            let text = serde_json::to_vec(&all)
                .map_err(|err| failed(HighWaterFileError::new(path, err.to_string())))?;
            let limit = if new_key {
                NEW_KEY_FILE_BYTES
            } else {
                MAX_FILE_BYTES
            };
            if text.len() as u64 > limit {
                return Err(file_full(path, limit, key));
            }
            // Given up, the write may still land, or not: the reservation
            // is not made, and no other operation on the file starts
            // before it ended.
            let stamp = write_file(path, text).await.map_err(failed)?;
            state.remember(stamp, all);
        }
        interval.reserved = reserved;
        interval.epoch = epoch;
        Ok(())
    }
}

/// The refusal of a new `key` past [`MAX_KEYS`].
fn too_many_keys(key: &str) -> SequencerError {
    SequencerError::Capacity(format!(
        "too many sequences (at most {MAX_KEYS} keys per sequencer, kept until \
         the process restarts or the sequencer is removed); key `{key}` is refused"
    ))
}

/// The refusal of `key` by a file that would grow past `limit` bytes.
fn file_full(path: &Path, limit: u64, key: &str) -> SequencerError {
    SequencerError::Capacity(format!(
        "high-water file {} is full: it would grow past {limit} bytes with key \
         `{key}`; remove the entries of keys no longer used",
        path.display()
    ))
}

/// The floor to ask a backend for after `refused` of its ranges were
/// refused: the marks' floor, plus a lead that doubles from the second
/// refusal on (64, 128, ...), so that a request racing a faster counter of
/// the same component — a rebuilt instance counting in memory while the
/// old one finishes its requests — lands above it. The ids skipped are
/// never handed out.
pub fn retry_floor(floor: i64, refused: u32) -> i64 {
    match refused {
        0 | 1 => floor,
        n => floor.saturating_add(1_i64 << (n + 4).min(40)),
    }
}

fn next_range(key: &str, floor: i64, size: u32) -> Result<IdRange, SequencerError> {
    let exhausted = || SequencerError::Exhausted(key.to_string());
    let from = floor.checked_add(1).ok_or_else(exhausted)?;
    let to = from
        .checked_add(i64::from(size) - 1)
        .ok_or_else(exhausted)?;
    Ok(IdRange { from, to })
}

/// Runs `op` on the high-water file at `path` off the async workers,
/// in turn with every other operation on the file (see
/// [`on_path_in_turn`]), waiting for its turn at most `bound` and given up
/// `bound` after it started; `what` says what it does, for the error.
async fn on_file<T: Send + 'static>(
    path: &Path,
    what: &str,
    bound: Duration,
    op: impl FnOnce(&Path) -> Result<T, String> + Send + 'static,
) -> Result<T, HighWaterFileError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use HighWaterFileErrorKind::{Busy, NotAnswering, NotRun};
    let owned = path.to_path_buf();
    // Set once `op` runs: a bound passed before, it only waited its turn.
    let started = Arc::new(AtomicBool::new(false));
    let starts = Arc::clone(&started);
    let outcome = on_path_in_turn(path, bound, move || {
        starts.store(true, Ordering::Release);
        op(&owned)
    })
    .await;
    let (kind, reason) = match outcome {
        Ok(done) => return done.map_err(|reason| HighWaterFileError::new(path, reason)),
        Err(Abandoned::Failed(reason)) => (
            NotRun,
            format!("{what} could not run ({reason}); nothing is known to be wrong with the file"),
        ),
        Err(Abandoned::StillReading) => (
            NotAnswering,
            "not answering (a hung mount?): an earlier operation on it, given up, has not \
             returned yet; none is started until it does"
                .to_string(),
        ),
        Err(_) if !started.load(Ordering::Acquire) => (
            Busy,
            format!(
                "busy: {what} waited {} for an earlier operation on it, still running, \
                 and was not started",
                shown(bound)
            ),
        ),
        Err(abandoned) => (
            NotAnswering,
            format!("not answering (a hung mount?): {what} {abandoned}; given up"),
        ),
    };
    Err(HighWaterFileError::of_kind(path, kind, reason))
}

/// `d` as people write it: `5 s`, `50 ms`.
fn shown(d: Duration) -> String {
    match d.subsec_nanos() {
        0 => format!("{} s", d.as_secs()),
        _ => format!("{} ms", d.as_millis()),
    }
}

/// The bound of a look at, or a read of, the file at `path`.
fn read_bound(path: &Path) -> Duration {
    #[cfg(test)]
    if let Some(short) = tests::short_deadline(path) {
        return short;
    }
    let _ = path;
    HIGH_WATER_FILE_DEADLINE
}

/// The bound of a whole write of the file at `path`: as much longer than
/// a read's as [`HIGH_WATER_WRITE_DEADLINE`] is (in tests too).
fn write_bound(path: &Path) -> Duration {
    let times = HIGH_WATER_WRITE_DEADLINE.as_millis() / HIGH_WATER_FILE_DEADLINE.as_millis();
    read_bound(path).saturating_mul(u32::try_from(times).unwrap_or(u32::MAX))
}

/// How the file at `path` looks now (`None`: there is none).
async fn stamp(path: &Path) -> Result<Option<Stamp>, HighWaterFileError> {
    on_file(path, "a look at it", read_bound(path), stamp_now).await
}

fn stamp_now(path: &Path) -> Result<Option<Stamp>, String> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(Stamp::of(&meta))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err.to_string()),
    }
}

async fn read_file(path: &Path) -> Result<BTreeMap<String, i64>, HighWaterFileError> {
    Ok(read_file_stamped(path).await?.0)
}

/// The entries of the file at `path`, and how it looked before it was
/// read (if it changed meanwhile, the stamp no longer matches it).
async fn read_file_stamped(
    path: &Path,
) -> Result<(BTreeMap<String, i64>, Option<Stamp>), HighWaterFileError> {
    on_file(path, "reading it", read_bound(path), read_now).await
}

fn read_now(path: &Path) -> Result<(BTreeMap<String, i64>, Option<Stamp>), String> {
    let stamp = match stamp_now(path)? {
        None => return Ok((BTreeMap::new(), None)),
        Some(stamp) if stamp.len > MAX_FILE_BYTES => {
            return Err(format!("larger than {MAX_FILE_BYTES} bytes"))
        }
        Some(stamp) => stamp,
    };
    #[cfg(test)]
    tests::count_read(path);
    #[cfg(test)]
    tests::maybe_panic(path);
    let text = std::fs::read(path).map_err(|err| err.to_string())?;
    let entries = serde_json::from_slice(&text)
        .map_err(|err| format!("not a JSON object of key → highest reserved id: {err}"))?;
    Ok((entries, Some(stamp)))
}

/// Writes `text` over the file at `path` (see [`write_now`]), and says how
/// it looks then.
async fn write_file(path: &Path, text: Vec<u8>) -> Result<Option<Stamp>, HighWaterFileError> {
    on_file(path, "writing it", write_bound(path), move |path| {
        write_now(path, &text).map_err(|err| err.to_string())?;
        Ok(stamp_now(path).ok().flatten())
    })
    .await
}

/// Writes `text` to a temp file beside `path`, syncs it, renames it over
/// `path`, then syncs the folder: a crash leaves the old file or the new
/// one, never half, and a completed write survives it.
fn write_now(path: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    #[cfg(test)]
    tests::before_write(path);
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(text)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, path)?;
    sync_folder(path)
}

/// Syncs the folder of `path`, so that a rename in it is durable.
#[cfg(unix)]
fn sync_folder(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(folder) => std::fs::File::open(folder)?.sync_all(),
        None => Ok(()),
    }
}

/// Folders cannot be opened to sync them here; the rename stands alone.
#[cfg(not(unix))]
fn sync_folder(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads of each high-water file, by path (tests run side by side).
    static READS: LazyLock<std::sync::Mutex<HashMap<PathBuf, usize>>> =
        LazyLock::new(Default::default);

    pub(super) fn count_read(path: &Path) {
        *READS.lock().unwrap().entry(path.to_path_buf()).or_default() += 1;
    }

    fn reads(path: &Path) -> usize {
        READS.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Bounds shorter than 5 s, by file.
    static SHORT_DEADLINES: LazyLock<std::sync::Mutex<HashMap<PathBuf, Duration>>> =
        LazyLock::new(Default::default);

    pub(super) fn short_deadline(path: &Path) -> Option<Duration> {
        SHORT_DEADLINES.lock().unwrap().get(path).copied()
    }

    /// Writes of a file that hang until the sender is dropped or sent to
    /// (10 s at most), as on a hung mount.
    static HUNG_WRITES: LazyLock<std::sync::Mutex<HashMap<PathBuf, Hung>>> =
        LazyLock::new(Default::default);

    /// What a hung write waits on.
    type Hung = Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>;

    /// Writes of a file that take this long each (slow but working
    /// storage), with the number of them started.
    static SLOW_WRITES: LazyLock<std::sync::Mutex<HashMap<PathBuf, (Duration, usize)>>> =
        LazyLock::new(Default::default);

    /// Files whose reads panic (an operation that cannot run).
    static PANICKING_READS: LazyLock<std::sync::Mutex<Vec<PathBuf>>> =
        LazyLock::new(Default::default);

    pub(super) fn maybe_panic(path: &Path) {
        if PANICKING_READS.lock().unwrap().iter().any(|p| p == path) {
            panic!("a read of {} panicked (test)", path.display());
        }
    }

    pub(super) fn before_write(path: &Path) {
        let hung = HUNG_WRITES.lock().unwrap().get(path).cloned();
        if let Some(hung) = hung {
            let _ = hung.lock().unwrap().recv_timeout(Duration::from_secs(10));
        }
        let slow = SLOW_WRITES
            .lock()
            .unwrap()
            .get_mut(path)
            .map(|(took, started)| {
                *started += 1;
                *took
            });
        if let Some(took) = slow {
            std::thread::sleep(took);
        }
    }

    fn slow_writes_started(path: &Path) -> usize {
        SLOW_WRITES.lock().unwrap().get(path).map_or(0, |(_, n)| *n)
    }

    /// Storage that is slow but working: every write takes longer than a
    /// read's bound (80 ms against 50 ms), and still well within a
    /// write's. Reservations are made; before, every write was given up
    /// at the read's bound, landed, was read back as another instance's
    /// reservation, and the next one was given up again: every request
    /// failed, for ever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_but_working_storage_makes_reservations() {
        let dir = tempfile::tempdir().unwrap();
        let marks = HighWater::load(Some(dir.path().join("marks.json")), &BTreeMap::new())
            .await
            .unwrap();
        let path = marks.file().unwrap().to_path_buf();
        let first = marks.take("k", 1).await.unwrap();
        SHORT_DEADLINES
            .lock()
            .unwrap()
            .insert(path.clone(), Duration::from_millis(50));
        let took = Duration::from_millis(80);
        SLOW_WRITES.lock().unwrap().insert(path.clone(), (took, 0));
        let mut made = Vec::new();
        let mut failed = Vec::new();
        for _ in 0..20 {
            match marks.take("k", 5_000).await {
                Ok(range) => made.push(range),
                Err(err) => failed.push(err),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!made.is_empty(), "every reservation failed: {failed:?}");
        assert!(slow_writes_started(&path) > 0, "no slow write");
        assert!(made[0].from > first.to, "{made:?} {first:?}");
        // Durable: a restart on the file starts above every id.
        drop(marks);
        let restarted = HighWater::load(Some(path), &BTreeMap::new()).await.unwrap();
        let after = restarted.take("k", 1).await.unwrap();
        let top = made.iter().map(|range| range.to).max().unwrap();
        assert!(after.from > top, "{after:?} {made:?}");
    }

    /// An operation that waited its turn past its bound behind another,
    /// still running (a slow write), was not started: it says the file is
    /// busy, not that reading it did not finish.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_that_only_waited_its_turn_reports_the_file_busy() {
        let dir = tempfile::tempdir().unwrap();
        let marks = Arc::new(
            HighWater::load(Some(dir.path().join("marks.json")), &BTreeMap::new())
                .await
                .unwrap(),
        );
        let path = marks.file().unwrap().to_path_buf();
        marks.take("k", 1).await.unwrap();
        SHORT_DEADLINES
            .lock()
            .unwrap()
            .insert(path.clone(), Duration::from_millis(50));
        SLOW_WRITES
            .lock()
            .unwrap()
            .insert(path.clone(), (Duration::from_millis(250), 0));
        let writer = Arc::clone(&marks);
        let write = tokio::spawn(async move { writer.take("k", 5_000).await });
        testkit::soon("the slow write starts", async {
            while slow_writes_started(&path) == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        let err = stamp(&path).await.unwrap_err();
        assert_eq!(err.kind, HighWaterFileErrorKind::Busy, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("`highWaterFile`")
                && text.contains("busy")
                && text.contains("not started"),
            "{text}"
        );
        assert!(!text.contains("did not finish"), "{text}");
        assert!(write.await.unwrap().is_ok());
    }

    /// A read that cannot run (here it panics; or no thread starts): the
    /// init fails saying so, without the help for a broken file (fixing,
    /// trimming or replacing a sound file would be wrong, and risky).
    #[tokio::test]
    async fn an_operation_that_could_not_run_does_not_blame_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap().join("marks.json");
        std::fs::write(&path, r#"{"k": 5}"#).unwrap();
        PANICKING_READS.lock().unwrap().push(path.clone());
        let err = HighWater::load(Some(path.clone()), &BTreeMap::new())
            .await
            .unwrap_err();
        PANICKING_READS.lock().unwrap().retain(|p| p != &path);
        let text = err.to_string();
        assert_eq!(err.kind, HighWaterFileErrorKind::NotRun, "{text}");
        assert!(
            text.contains("`highWaterFile`") && text.contains("could not run"),
            "{text}"
        );
        assert!(!text.contains(UNREADABLE_HELP), "{text}");
        assert!(HighWater::load(Some(path), &BTreeMap::new()).await.is_ok());
    }

    /// A write given up may land later, or not: no id is handed out under
    /// its reservation, no other write starts before it ended (so it
    /// cannot land over a later one), and once it did, ids go on above
    /// every id handed out, and a restart on the file too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_given_up_reserves_nothing_and_lands_before_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let marks = HighWater::load(Some(dir.path().join("marks.json")), &BTreeMap::new())
            .await
            .unwrap();
        let path = marks.file().unwrap().to_path_buf();
        let mut handed = vec![marks.take("k", 1).await.unwrap().to];
        SHORT_DEADLINES
            .lock()
            .unwrap()
            .insert(path.clone(), Duration::from_millis(50));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = Arc::new(std::sync::Mutex::new(hung));
        HUNG_WRITES.lock().unwrap().insert(path.clone(), hung);
        let file_top = || -> i64 {
            let all: BTreeMap<String, i64> =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            all["k"]
        };
        let written = file_top();
        // Past the reservation: the write hangs and is given up.
        let given_up = marks.take("k", 5_000).await;
        assert!(not_answering(&given_up), "{given_up:?}");
        assert!(not_answering(&marks.take("k", 5_000).await));
        assert!(not_answering(&marks.take("other", 1).await));
        // Under the reservation written before: still handed out, the
        // ids of the one given up are not.
        let under = marks.take("k", 1).await.unwrap();
        assert!(under.to <= written, "{under:?} above {written}");
        handed.push(under.to);
        // The hung write lands; the next one starts only then.
        HUNG_WRITES.lock().unwrap().remove(&path);
        release.send(()).unwrap();
        let next = testkit::soon("a request once the write returned", async {
            loop {
                match marks.take("k", 5_000).await {
                    result if not_answering(&result) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    other => break other,
                }
            }
        })
        .await
        .unwrap();
        assert!(
            next.from > *handed.iter().max().unwrap(),
            "{next:?} {handed:?}"
        );
        assert!(file_top() >= next.to, "the file is below {next:?}");
        handed.push(next.to);
        drop(marks);
        let restarted = HighWater::load(Some(path), &BTreeMap::new()).await.unwrap();
        let after = restarted.take("k", 1).await.unwrap();
        assert!(
            after.from > *handed.iter().max().unwrap(),
            "{after:?} {handed:?}"
        );
    }

    /// A file that does not answer at start fails the init at the bound,
    /// naming the field (without the help for a broken file); inits
    /// meanwhile are refused at once, without another read; once it
    /// answers, an init goes through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_init_on_a_hung_file_fails_at_the_bound_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap().join("marks.json");
        fifo(&path);
        SHORT_DEADLINES
            .lock()
            .unwrap()
            .insert(path.clone(), Duration::from_millis(50));
        let none = BTreeMap::new();
        for _ in 0..3 {
            let load = HighWater::load(Some(path.clone()), &none);
            let loaded = tokio::time::timeout(Duration::from_secs(2), load).await;
            let err = loaded.expect("the init is bounded").unwrap_err();
            let text = err.to_string();
            assert_eq!(err.kind, HighWaterFileErrorKind::NotAnswering, "{text}");
            assert!(
                text.contains("`highWaterFile`") && text.contains("not answering (a hung mount?)"),
                "{text}"
            );
            assert!(!text.contains(UNREADABLE_HELP), "{text}");
        }
        assert_eq!(reads(&path), 1, "reads started");
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop(writer);
        std::fs::remove_file(&path).unwrap();
        testkit::soon("an init once the file answers", async {
            while HighWater::load(Some(path.clone()), &none).await.is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    /// Makes a FIFO at `path`: a look at it answers, a read blocks in the
    /// open until a writer comes, as on a hung mount.
    fn fifo(path: &Path) {
        let made = std::process::Command::new("mkfifo").arg(path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    }

    /// Whether `result` is the refusal of a file not answering, naming the
    /// field.
    fn not_answering<T: std::fmt::Debug>(result: &Result<T, SequencerError>) -> bool {
        matches!(result, Err(SequencerError::Backend(message))
            if message.contains("`highWaterFile`") && message.contains("not answering (a hung mount?)"))
    }

    /// A hung file (a FIFO): the first operation on it is given up and
    /// pins one thread; requests needing the file meanwhile fail at once
    /// naming `highWaterFile` without starting another (50 new keys, each
    /// given up by its caller as a request timeout does), ids already
    /// reserved go on; once the operation returns, requests go on, above
    /// every id handed out, and a restart on the file too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_file_pins_one_thread_and_fails_requests_at_once_until_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let marks = HighWater::load(Some(dir.path().join("marks.json")), &BTreeMap::new())
            .await
            .unwrap();
        let path = marks.file().unwrap().to_path_buf();
        let mut handed = vec![marks.take("k", 1).await.unwrap().to];
        let saved = std::fs::read(&path).unwrap();
        let deadline = Duration::from_millis(50);
        SHORT_DEADLINES
            .lock()
            .unwrap()
            .insert(path.clone(), deadline);
        std::fs::remove_file(&path).unwrap();
        fifo(&path);
        let before = reads(&path);
        let mut outcomes = Vec::new();
        for n in 0..50 {
            let key = format!("new-{n}");
            let asked = marks.take(&key, 1);
            outcomes.push(tokio::time::timeout(Duration::from_millis(100), asked).await);
        }
        assert!(
            reads(&path) - before <= 1,
            "{} reads started",
            reads(&path) - before
        );
        for outcome in &outcomes {
            assert!(
                matches!(outcome, Ok(result) if not_answering(result)),
                "{outcome:?}"
            );
        }
        assert!(not_answering(&marks.has_room("new-x").await));
        assert!(not_answering(&marks.take("k", 5_000).await));
        // Ids already reserved do not need the file.
        handed.push(marks.take("k", 1).await.unwrap().to);
        // The mount answers again: the hung read returns.
        let real = dir.path().join("real.json");
        std::fs::write(&real, &saved).unwrap();
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop(writer);
        std::fs::rename(&real, &path).unwrap();
        let next = testkit::soon("a request once the file answers", async {
            loop {
                match marks.take("k", 5_000).await {
                    result if not_answering(&result) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    other => break other,
                }
            }
        })
        .await
        .unwrap();
        assert!(
            next.from > *handed.iter().max().unwrap(),
            "{next:?} {handed:?}"
        );
        handed.push(next.to);
        assert!(marks.take("new-0", 1).await.is_ok());
        drop(marks);
        let restarted = HighWater::load(Some(path), &BTreeMap::new()).await.unwrap();
        let after = restarted.take("k", 1).await.unwrap();
        assert!(
            after.from > *handed.iter().max().unwrap(),
            "{after:?} {handed:?}"
        );
    }

    #[tokio::test]
    async fn a_new_instance_starts_above_the_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        let none = BTreeMap::new();
        let first = HighWater::load(Some(path.clone()), &none).await.unwrap();
        assert_eq!(
            first.take("k", 1).await.unwrap(),
            IdRange { from: 1, to: 1 }
        );
        assert_eq!(
            first.take("k", 5).await.unwrap(),
            IdRange { from: 2, to: 6 }
        );
        let second = HighWater::load(Some(path), &none).await.unwrap();
        let next = second.take("k", 1).await.unwrap();
        assert!(next.from > 6);
        // The old instance, still serving, moves above the new one's
        // reservation once its own runs out: the two never overlap.
        let mut old = Vec::new();
        for _ in 0..(2 * RESERVE_BLOCK) {
            old.push(first.take("k", 1).await.unwrap().from);
        }
        let mut new = Vec::new();
        for _ in 0..(2 * RESERVE_BLOCK) {
            new.push(second.take("k", 1).await.unwrap().from);
        }
        let both: std::collections::HashSet<i64> = old.iter().chain(&new).copied().collect();
        assert_eq!(both.len(), old.len() + new.len());
    }

    #[tokio::test]
    async fn ranges_from_an_old_backend_or_below_the_mark_are_refused() {
        let marks = HighWater::load(None, &BTreeMap::from([("k".into(), 10)]))
            .await
            .unwrap();
        assert_eq!(marks.floor("k").await, Ok(10));
        let (a, b) = (Arc::new("a"), Arc::new("b"));
        let range = |id| IdRange { from: id, to: id };
        let retry = |floor| Ok(Verdict::Retry { floor });
        assert_eq!(marks.accept("k", range(5), &a, || true).await, retry(10));
        assert_ne!(
            marks.accept("k", range(11), &a, || false).await,
            Ok(Verdict::Accept)
        );
        assert_eq!(
            marks.accept("k", range(12), &a, || true).await,
            Ok(Verdict::Accept)
        );
        // Out of order from the same backend: still unique, accepted.
        assert_eq!(
            marks.accept("k", range(11), &a, || true).await,
            Ok(Verdict::Accept)
        );
        // Another backend: only above what the first one gave.
        assert_eq!(marks.accept("k", range(12), &b, || true).await, retry(12));
        assert_eq!(
            marks.accept("k", range(13), &b, || true).await,
            Ok(Verdict::Accept)
        );
        // The first one, swapped out: refused.
        assert_eq!(marks.accept("k", range(14), &a, || false).await, retry(13));
    }

    #[tokio::test]
    async fn a_corrupt_file_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        std::fs::write(&path, "not json").unwrap();
        let err = HighWater::load(Some(path), &BTreeMap::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("highWaterFile"), "{err}");
    }

    #[tokio::test]
    async fn every_spelling_of_a_file_is_one_file_with_one_lock() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("x")).unwrap();
        let none = BTreeMap::new();
        let plain = HighWater::load(Some(dir.path().join("marks.json")), &none)
            .await
            .unwrap();
        let roundabout = dir.path().join("x").join("..").join("marks.json");
        let roundabout = HighWater::load(Some(roundabout), &none).await.unwrap();
        assert_eq!(plain.file(), roundabout.file());
        let (a, b) = (
            file_lock(plain.file().unwrap()),
            file_lock(roundabout.file().unwrap()),
        );
        assert!(Arc::ptr_eq(&a, &b));
    }

    /// The context of `sequencer/ids` of app `app` in the runtime whose
    /// handover area is `runtime`.
    fn context_in(runtime: &rewire_runtime::Handover) -> InitContext {
        let key = rewire_runtime::ComponentKey::new("sequencer", "ids");
        let mut cx = InitContext::new(key, "app", rewire_runtime::Metadata::default());
        cx.handover = runtime.clone();
        cx
    }

    /// A rebuild in the same runtime takes its predecessor's marks; two
    /// runtimes of the same app, folder and sequencer name in one process
    /// keep marks of their own.
    #[tokio::test]
    async fn marks_are_shared_within_a_runtime_only() {
        let none = BTreeMap::new();
        let (one, two) = (
            rewire_runtime::Handover::new(),
            rewire_runtime::Handover::new(),
        );
        let first = HighWater::adopt(&context_in(&one), None, &none)
            .await
            .unwrap();
        assert_eq!(first.take("k", 5).await.unwrap().to, 5);
        let other = HighWater::adopt(&context_in(&two), None, &none)
            .await
            .unwrap();
        assert_eq!(
            other.take("k", 1).await.unwrap(),
            IdRange { from: 1, to: 1 },
            "another runtime must not share the first's marks"
        );
        // Built while the first still serves, as a reload does.
        let rebuilt = HighWater::adopt(&context_in(&one), None, &none)
            .await
            .unwrap();
        assert_eq!(rebuilt.take("k", 1).await.unwrap().from, 6);
        assert_eq!(first.take("k", 1).await.unwrap().from, 7);
        // The first gone, the next rebuild goes on from the marks the
        // rebuilt one (alive) left.
        drop(first);
        let again = HighWater::adopt(&context_in(&one), None, &none)
            .await
            .unwrap();
        assert_eq!(again.take("k", 1).await.unwrap().from, 8);
        assert_eq!(other.take("k", 1).await.unwrap().from, 2);
    }

    /// Keys past the limit are refused as a sequencer out of room (not as
    /// a bad request), known keys go on, and keys only asked for (the
    /// backend never answered) take no room.
    #[tokio::test]
    async fn keys_past_the_limit_are_a_capacity_error_and_unanswered_ones_take_no_room() {
        let marks = HighWater::load(None, &BTreeMap::new()).await.unwrap();
        for n in 0..=MAX_KEYS {
            assert_eq!(marks.floor(&format!("asked{n}")).await, Ok(0));
        }
        for n in 0..MAX_KEYS {
            marks.take(&format!("k{n}"), 1).await.unwrap();
        }
        match marks.take("one-more", 1).await {
            Err(SequencerError::Capacity(message)) => {
                assert!(message.contains("100000 keys"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(marks.take("k7", 1).await.unwrap().from, 2);
        // Asked before a backend: refused there, known keys go on.
        assert!(matches!(
            marks.has_room("one-more").await,
            Err(SequencerError::Capacity(_))
        ));
        assert_eq!(marks.has_room("k7").await, Ok(()));
    }

    /// 8,400 keys of 1,000 bytes: past the 8 MiB where new keys stop.
    fn full_file(path: &Path) {
        let full: BTreeMap<String, i64> = (0..8_400).map(|n| (format!("{n:01000}"), 5)).collect();
        std::fs::write(path, serde_json::to_vec(&full).unwrap()).unwrap();
    }

    /// A new key a full file refuses: refused before a backend is asked;
    /// and when a backend answered anyway (a request racing another new
    /// key), refused without keeping marks, so it takes none of the
    /// `MAX_KEYS` places. Keys the file holds go on.
    #[tokio::test]
    async fn a_key_a_full_file_refuses_takes_no_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        full_file(&path);
        let marks = HighWater::load(Some(path), &BTreeMap::new()).await.unwrap();
        fn full<T>(result: Result<T, SequencerError>) -> bool {
            matches!(result, Err(SequencerError::Capacity(message)) if message.contains("full"))
        }
        assert!(full(marks.has_room("new").await));
        let backend = Arc::new(());
        let answer = IdRange { from: 1, to: 1 };
        assert!(full(marks.accept("new", answer, &backend, || true).await));
        assert!(full(marks.take("new", 1).await));
        assert!(marks.table().keys.is_empty());
        let known = format!("{:01000}", 7);
        assert_eq!(marks.has_room(&known).await, Ok(()));
        let answer = IdRange { from: 6, to: 6 };
        assert_eq!(
            marks.accept(&known, answer, &backend, || true).await,
            Ok(Verdict::Accept)
        );
    }

    /// Requests for new keys at once on a full file (a client asking for
    /// unique keys, or retrying): all refused, and the file read at most
    /// once for them, not once each (each read holds the whole file, and
    /// more again parsed). Once the file changes, it is read again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn new_keys_on_a_full_file_do_not_each_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks.json");
        full_file(&path);
        let marks = Arc::new(HighWater::load(Some(path), &BTreeMap::new()).await.unwrap());
        let path = marks.file().unwrap().to_path_buf();
        let before = reads(&path);
        let asks: Vec<_> = (0..64)
            .map(|n| {
                let marks = marks.clone();
                tokio::spawn(async move { marks.has_room(&format!("new-{n}")).await })
            })
            .collect();
        for ask in asks {
            let answer = ask.await.unwrap();
            assert!(
                matches!(&answer, Err(SequencerError::Capacity(message)) if message.contains("full")),
                "{answer:?}"
            );
        }
        assert!(
            reads(&path) - before <= 1,
            "read {} times",
            reads(&path) - before
        );
        // The operator made room (in place of an entry no longer used).
        let mut entries: BTreeMap<String, i64> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        entries.remove(&format!("{:01000}", 0));
        entries.insert("new-0".into(), 5);
        std::fs::write(&path, serde_json::to_vec(&entries).unwrap()).unwrap();
        assert_eq!(marks.has_room("new-0").await, Ok(()));
    }

    #[test]
    fn keys_and_sizes_are_checked() {
        assert!(check_request("", 1).is_err());
        assert!(check_request("a|||b", 1).is_err());
        assert!(check_request("a||b", 1).is_err());
        assert!(check_request("a|b", 1).is_ok());
        assert!(check_request("a", 0).is_err());
        assert!(check_request("orders", 1).is_ok());
    }
}
