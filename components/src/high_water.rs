//! A sequencer's high-water marks: what keeps an id from being handed out
//! twice — not after a server switch, and (with a file) not after the
//! sequencer is rebuilt, moved to another server, or the process restarts.
//!
//! Per key, an instance keeps the largest id it handed out and the value
//! ids must stay above (`biggerThan`, the file). A backend's ids are
//! accepted only above both, and only if the backend is still the one in
//! force ([`HighWater::accept`]); otherwise the caller asks again, passing
//! the floor so the backend jumps above it.
//!
//! With a file, ids are handed out only inside *reservations*: before an
//! id above its reservation, an instance reads the file (under a lock per
//! file, so the instance being replaced and its successor take turns),
//! moves its floor above the highest reservation anyone made, and writes
//! a new one a block (1,000 ids) higher (temp file, fsync, rename). Two
//! instances' reservations never overlap, so their ids never do; ids
//! between reservations are skipped, never repeated.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};

use rewire_runtime::{IdRange, SequencerError};
use tokio::sync::Mutex;

/// Ids reserved per file write, beyond what the request needs.
pub const RESERVE_BLOCK: i64 = 1_000;

/// Most keys a sequencer tracks (each costs memory, and a file entry).
pub const MAX_KEYS: usize = 100_000;

/// Largest size of a high-water file read back.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Layotto's separator in sequencer keys, refused inside a key.
pub const KEY_SEPARATOR: &str = "|||";

/// Why a high-water file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("metadata field `highWaterFile`: {path}: {reason}")]
pub struct HighWaterFileError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks a request's key and size, as every sequencer does.
pub fn check_request(key: &str, size: u32) -> Result<(), SequencerError> {
    if key.is_empty() {
        return Err(SequencerError::Invalid("the key is empty".into()));
    }
    if key.contains(KEY_SEPARATOR) {
        return Err(SequencerError::Invalid(format!(
            "key `{key}` contains `{KEY_SEPARATOR}`"
        )));
    }
    if size == 0 {
        return Err(SequencerError::Invalid(format!(
            "segment of `{key}` must hold at least one id"
        )));
    }
    Ok(())
}

/// The marks of one sequencer instance.
#[derive(Debug)]
pub struct HighWater {
    file: Option<PathBuf>,
    marks: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    keys: HashMap<String, Interval>,
    bigger_than: BTreeMap<String, i64>,
}

/// What an instance knows of one key.
#[derive(Debug, Clone)]
struct Interval {
    /// Ids must be above this.
    above: i64,
    /// Largest id handed out.
    handed: i64,
    /// Ids up to this are reserved for this instance (no file: all).
    reserved: i64,
    /// The backend (session) that last gave an accepted id; held weakly,
    /// so it is never mistaken for a new one at the same address.
    backend: Option<Weak<dyn Any + Send + Sync>>,
    /// Ids from `backend` must be above this: the largest id handed out
    /// before it was first used.
    backend_floor: i64,
}

impl Interval {
    fn floor(&self) -> i64 {
        self.above.max(self.handed)
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

/// One lock per high-water file, shared by every instance in the process.
static FILE_LOCKS: LazyLock<std::sync::Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> =
    LazyLock::new(Default::default);

fn file_lock(path: &Path) -> Arc<Mutex<()>> {
    let mut locks = FILE_LOCKS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    locks.entry(path.to_path_buf()).or_default().clone()
}

impl HighWater {
    /// Marks starting above `bigger_than`, and above what `file` (if any)
    /// reserved; the file is read (and checked) now.
    pub async fn load(
        file: Option<PathBuf>,
        bigger_than: &BTreeMap<String, i64>,
    ) -> Result<Self, HighWaterFileError> {
        if let Some(path) = &file {
            read_file(path).await?;
        }
        Ok(Self {
            file,
            marks: Mutex::new(Marks {
                keys: HashMap::new(),
                bigger_than: bigger_than.clone(),
            }),
        })
    }

    /// The file in use, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Raises the values ids must stay above (a new `biggerThan`).
    pub async fn raise(&self, bigger_than: &BTreeMap<String, i64>) {
        let mut marks = self.marks.lock().await;
        for (key, value) in bigger_than {
            if let Some(interval) = marks.keys.get_mut(key) {
                interval.above = interval.above.max(*value);
            }
            let entry = marks.bigger_than.entry(key.clone()).or_insert(*value);
            *entry = (*entry).max(*value);
        }
    }

    /// The value ids of `key` must be above now.
    pub async fn floor(&self, key: &str) -> Result<i64, SequencerError> {
        let mut marks = self.marks.lock().await;
        Ok(self.interval(&mut marks, key)?.floor())
    }

    /// Hands out the next `size` ids of `key` right here: the marks are
    /// the counter (the `memory` sequencer).
    pub async fn take(&self, key: &str, size: u32) -> Result<IdRange, SequencerError> {
        let mut marks = self.marks.lock().await;
        let mut interval = self.interval(&mut marks, key)?;
        let mut range = next_range(key, interval.floor(), size)?;
        // A counter here: every range lies above every earlier one.
        if range.to > interval.reserved {
            self.reserve(&mut interval, key, range.to).await?;
            range = next_range(key, interval.floor(), size)?;
        }
        interval.handed = range.to;
        marks.keys.insert(key.to_string(), interval);
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
        let mut marks = self.marks.lock().await;
        let mut interval = self.interval(&mut marks, key)?;
        if range.to > interval.reserved {
            self.reserve(&mut interval, key, range.to).await?;
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
        marks.keys.insert(key.to_string(), interval);
        Ok(verdict)
    }

    fn interval(&self, marks: &mut Marks, key: &str) -> Result<Interval, SequencerError> {
        if let Some(interval) = marks.keys.get(key) {
            return Ok(interval.clone());
        }
        if marks.keys.len() >= MAX_KEYS {
            return Err(SequencerError::Invalid(format!(
                "too many sequences (at most {MAX_KEYS} keys per sequencer)"
            )));
        }
        let above = marks.bigger_than.get(key).copied().unwrap_or(0).max(0);
        // With a file nothing is reserved yet: the first id reads it.
        let reserved = match self.file {
            Some(_) => above,
            None => i64::MAX,
        };
        Ok(Interval {
            above,
            handed: 0,
            reserved,
            backend: None,
            backend_floor: 0,
        })
    }

    /// Reserves ids of `key` up to at least `needed` in the file, moving
    /// the floor above every reservation made by anyone else.
    async fn reserve(
        &self,
        interval: &mut Interval,
        key: &str,
        needed: i64,
    ) -> Result<(), SequencerError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let failed = |err: &dyn std::fmt::Display| {
            SequencerError::Backend(format!("high-water file {}: {err}", path.display()))
        };
        let lock = file_lock(path);
        let _turn = lock.lock().await;
        let mut all = read_file(path).await.map_err(|err| failed(&err))?;
        let theirs = all.get(key).copied().unwrap_or(0);
        let span = needed.saturating_sub(interval.floor()).max(0);
        if theirs > interval.reserved {
            interval.above = interval.above.max(theirs);
        }
        let top = theirs.max(needed).max(interval.floor());
        // Room for the request even if the floor just moved up to `theirs`.
        let reserved = top.saturating_add(span).saturating_add(RESERVE_BLOCK);
        all.insert(key.to_string(), reserved);
        write_file(path, &all).await.map_err(|err| failed(&err))?;
        interval.reserved = reserved;
        Ok(())
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

async fn read_file(path: &Path) -> Result<BTreeMap<String, i64>, HighWaterFileError> {
    let failed = |reason: String| HighWaterFileError {
        path: path.display().to_string(),
        reason,
    };
    match tokio::fs::metadata(path).await {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(err) => return Err(failed(err.to_string())),
        Ok(meta) if meta.len() > MAX_FILE_BYTES => {
            return Err(failed(format!("larger than {MAX_FILE_BYTES} bytes")))
        }
        Ok(_) => {}
    }
    let text = tokio::fs::read(path)
        .await
        .map_err(|err| failed(err.to_string()))?;
    serde_json::from_slice(&text).map_err(|err| {
        failed(format!(
            "not a JSON object of key → highest reserved id: {err}"
        ))
    })
}

/// Writes `marks` to a temp file beside `path`, syncs it, then renames it
/// over `path`: a crash leaves the old file or the new one, never half.
async fn write_file(path: &Path, marks: &BTreeMap<String, i64>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let text = serde_json::to_vec(marks).map_err(std::io::Error::other)?;
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    let mut file = tokio::fs::File::create(&temp).await?;
    file.write_all(&text).await?;
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(&temp, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn keys_and_sizes_are_checked() {
        assert!(check_request("", 1).is_err());
        assert!(check_request("a|||b", 1).is_err());
        assert!(check_request("a", 0).is_err());
        assert!(check_request("orders", 1).is_ok());
    }
}
