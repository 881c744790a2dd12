//! Reading a file a component's metadata names (`secretsFile`, `path`),
//! bounded in bytes and in time.
//!
//! The read goes through [`rewire_runtime::read_bounded`], as the
//! configuration file does: only regular files (symlinks followed), so a
//! FIFO, `/dev/zero` or a watched file swapped for a symlink to one is
//! refused, and never more than [`MAX_COMPONENT_FILE_BYTES`]. It runs on a
//! thread of its own and is abandoned after [`COMPONENT_FILE_READ_DEADLINE`]:
//! a read that blocks (a hung NFS or FUSE mount) cannot outlive the init
//! timeout, wedge a watcher, or hold up the process's exit.
//!
//! A file read again and again (a watched file) is read through one
//! [`ComponentFile`]: while a read given up at its deadline has not
//! returned, the next ones are refused at once
//! ([`ComponentFileError::StillReading`]), so a hung mount pins one thread
//! per file, not one more per poll.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use rewire_runtime::{Abandoned, DetachedReader, FileReadError};

use stuck_paths::Ended;

mod stuck_paths;

/// The largest component file read: 16 MiB. Secrets and configuration
/// files are a few KiB; anything near this is a mistake or an attack.
pub const MAX_COMPONENT_FILE_BYTES: usize = 16 << 20;

/// How long one read of a component file may take: 5 s, well under the
/// init timeout.
pub const COMPONENT_FILE_READ_DEADLINE: Duration = Duration::from_secs(5);

/// Why a component file was not read. Names the metadata field and the
/// file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum ComponentFileError {
    /// Missing, unreadable, not a regular file, or too large.
    #[error("metadata field `{field}`: {source}")]
    Read {
        /// The metadata field naming the file.
        field: &'static str,
        /// What went wrong, with the path.
        source: FileReadError,
    },
    /// The read did not finish within the deadline.
    #[error("metadata field `{field}`: reading {} took longer than {:?}; given up", .path.display(), .deadline)]
    TimedOut {
        /// The metadata field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// An earlier read of the file, given up at its deadline, has not
    /// returned yet: no other is started until it does.
    #[error("metadata field `{field}`: {} is not read again: an earlier read, given up, has not returned yet", .path.display())]
    StillReading {
        /// The metadata field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The content is not UTF-8 text.
    #[error("metadata field `{field}`: {} is not UTF-8 text", .path.display())]
    NotText {
        /// The metadata field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
    },
}

impl ComponentFileError {
    /// Whether this is [`StillReading`](Self::StillReading): the problem
    /// that made the earlier read time out lasts, nothing new to report.
    pub fn is_still_reading(&self) -> bool {
        matches!(self, Self::StillReading { .. })
    }
}

/// Reads the file at `path`, named by metadata field `field`, as text,
/// with the default limit and deadline. For a one-off read: a file read
/// again and again is read through a [`ComponentFile`].
pub async fn read_component_file(
    field: &'static str,
    path: &Path,
) -> Result<String, ComponentFileError> {
    ComponentFile::new(field, path).read().await
}

/// How a [`ComponentFile`] reads its bytes: [`rewire_runtime::read_bounded`]
/// but in tests.
type ReadBytes = Arc<dyn Fn(&Path, usize) -> Result<Vec<u8>, FileReadError> + Send + Sync>;

/// A component file read again and again (a watched file), bounded as
/// [`read_component_file`], with at most one read stuck at a time: keep
/// one for as long as the file is read.
pub struct ComponentFile {
    field: &'static str,
    path: PathBuf,
    limit: usize,
    deadline: Duration,
    reader: DetachedReader,
    read: ReadBytes,
}

impl std::fmt::Debug for ComponentFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentFile")
            .field("field", &self.field)
            .field("path", &self.path)
            .field("limit", &self.limit)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ComponentFile {
    /// The file at `path`, named by metadata field `field`, read with the
    /// default limit and deadline.
    pub fn new(field: &'static str, path: impl Into<PathBuf>) -> Self {
        Self::with(
            field,
            path,
            MAX_COMPONENT_FILE_BYTES,
            COMPONENT_FILE_READ_DEADLINE,
            Arc::new(rewire_runtime::read_bounded),
        )
    }

    /// A file read with `limit`, `deadline` and `read`.
    pub(crate) fn with(
        field: &'static str,
        path: impl Into<PathBuf>,
        limit: usize,
        deadline: Duration,
        read: ReadBytes,
    ) -> Self {
        Self {
            field,
            path: path.into(),
            limit,
            deadline,
            reader: DetachedReader::default(),
            read,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text, or an error naming the field and the file. The read
    /// runs on a thread of its own, detached, and is given up at the
    /// deadline; while one given up has not returned, none is started.
    pub async fn read(&self) -> Result<String, ComponentFileError> {
        let (field, path) = (self.field, self.path.clone());
        let (read, owned, limit) = (Arc::clone(&self.read), path.clone(), self.limit);
        let read = self
            .reader
            .read_within(self.deadline, move || read(&owned, limit))
            .await;
        let bytes = match read {
            Ok(read) => read.map_err(|source| ComponentFileError::Read { field, source })?,
            Err(Abandoned::TimedOut(deadline)) => {
                return Err(ComponentFileError::TimedOut {
                    field,
                    path,
                    deadline,
                })
            }
            Err(Abandoned::StillReading) => {
                return Err(ComponentFileError::StillReading { field, path })
            }
            Err(Abandoned::Failed(reason)) => {
                let source = FileReadError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::other(reason),
                };
                return Err(ComponentFileError::Read { field, source });
            }
        };
        String::from_utf8(bytes).map_err(|_| ComponentFileError::NotText { field, path })
    }
}

/// `path` canonicalised (`std::fs::canonicalize`, which blocks on a hung
/// mount) on a thread of its own, given up after `deadline`.
pub async fn canonicalize_within(path: &Path, deadline: Duration) -> std::io::Result<PathBuf> {
    let owned = path.to_path_buf();
    on_path_within(path, deadline, move || owned.canonicalize()).await
}

/// Runs `call`, a blocking call on `path`, on a thread of its own, given up
/// after `deadline`; while an earlier call on `path` given up (at its
/// deadline, or by a caller that stopped waiting) has not returned, refused
/// at once ([`std::io::ErrorKind::WouldBlock`]), but tried again on a
/// thread of its own after 5 min, then up to every 60 min, and every 6 h
/// once 8 such retries are stuck too ([`stuck_paths`]). Calls on a path
/// that is not stuck (or whose given-up call returned) run side by side.
/// A call given up at the deadline fails with
/// [`std::io::ErrorKind::TimedOut`]; one whose thread could not start or
/// panicked, with [`std::io::ErrorKind::Other`].
pub(crate) async fn on_path_within<T, C>(
    path: &Path,
    deadline: Duration,
    call: C,
) -> std::io::Result<T>
where
    T: Send + 'static,
    C: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let (reader, live, pending) = stuck_paths::start(path);
    let call = move || {
        let _live = live;
        call()
    };
    let outcome = reader.read_within(deadline, call).await;
    let (ended, kind) = match &outcome {
        Ok(_) => (Ended::Answered, std::io::ErrorKind::Other),
        Err(Abandoned::TimedOut(_)) => (Ended::GivenUp, std::io::ErrorKind::TimedOut),
        Err(Abandoned::StillReading) => (Ended::Refused, std::io::ErrorKind::WouldBlock),
        // No thread left behind: nothing stuck.
        Err(Abandoned::Failed(_)) => (Ended::Answered, std::io::ErrorKind::Other),
    };
    pending.settle(ended);
    outcome.unwrap_or_else(|abandoned| {
        let message = match abandoned {
            Abandoned::Failed(reason) => format!("the call failed: {reason}"),
            hung => format!("given up (a hung mount?): the call {hung}"),
        };
        Err(std::io::Error::new(kind, message))
    })
}

/// The blocking calls on one path whose order matters (writes of a file
/// that must not land after a later one), by path; kept while a caller or
/// a call's thread holds them.
static IN_TURN: LazyLock<Mutex<HashMap<PathBuf, std::sync::Weak<InTurn>>>> =
    LazyLock::new(Default::default);

/// The turn and the one reader of a path's calls in turn.
#[derive(Debug, Default)]
struct InTurn {
    turn: tokio::sync::Mutex<()>,
    reader: DetachedReader,
}

/// Runs `call`, a blocking call on `path`, on a thread of its own, given up
/// after `deadline`, as [`on_path_within`] does, but strictly in turn: the
/// calls on `path` run one at a time (waiting for the turn at most
/// `deadline`), and while one given up (at its deadline, or by a caller
/// that stopped waiting) has not returned, every later one is refused at
/// once and none is ever tried again beside it. So a call never starts
/// before every earlier one ended (a late write cannot land over a later
/// one), and a hung mount pins one thread per path, however many callers
/// give up.
pub(crate) async fn on_path_in_turn<T, C>(
    path: &Path,
    deadline: Duration,
    call: C,
) -> Result<T, Abandoned>
where
    T: Send + 'static,
    C: FnOnce() -> T + Send + 'static,
{
    let in_turn = {
        let mut paths = IN_TURN.lock().unwrap_or_else(|p| p.into_inner());
        match paths.get(path).and_then(std::sync::Weak::upgrade) {
            Some(in_turn) => in_turn,
            None => {
                paths.retain(|_, in_turn| in_turn.strong_count() > 0);
                let in_turn = Arc::new(InTurn::default());
                paths.insert(path.to_path_buf(), Arc::downgrade(&in_turn));
                in_turn
            }
        }
    };
    let Ok(_turn) = tokio::time::timeout(deadline, in_turn.turn.lock()).await else {
        return Err(Abandoned::TimedOut(deadline));
    };
    // The thread keeps the path's reader (busy while it runs) registered.
    let kept = Arc::clone(&in_turn);
    let call = move || {
        let _kept = kept;
        call()
    };
    in_turn.reader.read_within(deadline, call).await
}

/// A file at `path` whose first read answers `content` and whose later
/// reads hang (as on a hung mount) until the sender is dropped or sent to
/// (10 s at most), given up after 50 ms; with the count of reads started.
#[cfg(test)]
pub(crate) fn hanging_after_first_read(
    field: &'static str,
    path: &str,
    content: &'static [u8],
) -> (
    ComponentFile,
    Arc<std::sync::atomic::AtomicUsize>,
    std::sync::mpsc::Sender<()>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let calls = Arc::new(AtomicUsize::new(0));
    let (release, hung) = std::sync::mpsc::channel::<()>();
    let hung = std::sync::Mutex::new(hung);
    let counted = Arc::clone(&calls);
    let read: ReadBytes = Arc::new(move |_: &Path, _: usize| {
        if counted.fetch_add(1, SeqCst) > 0 {
            let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
            let _ = hung.recv_timeout(Duration::from_secs(10));
        }
        Ok(content.to_vec())
    });
    let deadline = Duration::from_millis(50);
    let file = ComponentFile::with(field, path, 64, deadline, read);
    (file, calls, release)
}

#[cfg(test)]
mod tests {
    use super::stuck_paths::TRY_AGAIN_AFTER;
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    async fn read_within(
        field: &'static str,
        path: &Path,
        limit: usize,
        deadline: Duration,
    ) -> Result<String, ComponentFileError> {
        let read = Arc::new(rewire_runtime::read_bounded);
        ComponentFile::with(field, path, limit, deadline, read)
            .read()
            .await
    }

    #[tokio::test]
    async fn reads_text_and_refuses_too_large_files_naming_field_and_file() {
        let dir = dir();
        let path = dir.path().join("f.json");
        std::fs::write(&path, "12345").unwrap_or_else(|e| panic!("{e}"));
        let ok = read_within("path", &path, 5, COMPONENT_FILE_READ_DEADLINE).await;
        assert_eq!(ok.ok().as_deref(), Some("12345"));
        let err = read_within("path", &path, 4, COMPONENT_FILE_READ_DEADLINE)
            .await
            .expect_err("larger than the limit");
        let text = err.to_string();
        assert!(text.contains("`path`") && text.contains("f.json"), "{text}");
        assert!(text.contains("larger than the 4 bytes"), "{text}");
    }

    #[tokio::test]
    async fn refuses_devices_and_symlinks_to_them() {
        let dir = dir();
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap_or_else(|e| panic!("{e}"));
        for path in [Path::new("/dev/zero"), &link] {
            let err = read_component_file("secretsFile", path)
                .await
                .expect_err("a device is refused");
            let text = err.to_string();
            assert!(
                text.contains("`secretsFile`") && text.contains("not a regular file"),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn refuses_binary_content() {
        let dir = dir();
        let path = dir.path().join("bin");
        std::fs::write(&path, [0xff, 0xfe]).unwrap_or_else(|e| panic!("{e}"));
        let err = read_component_file("path", &path)
            .await
            .expect_err("binary");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }

    #[tokio::test]
    async fn a_read_that_never_returns_is_abandoned_at_the_deadline() {
        let wedged: ReadBytes = Arc::new(|_, _| {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(Vec::new())
        });
        let file =
            ComponentFile::with("path", "/wedged.json", 1, Duration::from_millis(50), wedged);
        let outcome = tokio::time::timeout(Duration::from_secs(5), file.read()).await;
        let err = match outcome {
            Err(_) => panic!("the deadline did not hold"),
            Ok(read) => read.expect_err("a wedged read cannot succeed"),
        };
        let text = err.to_string();
        assert!(
            text.contains("`path`") && text.contains("/wedged.json") && text.contains("given up"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_hung_read_pins_one_thread_and_later_reads_are_refused_until_it_returns() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let calls = Arc::new(AtomicUsize::new(0));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = std::sync::Mutex::new(hung);
        let counted = Arc::clone(&calls);
        // Every read blocks until released, as on a hung NFS mount.
        let blocking: ReadBytes = Arc::new(move |_, _| {
            counted.fetch_add(1, SeqCst);
            let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
            let _ = hung.recv_timeout(Duration::from_secs(10));
            Ok(b"{}".to_vec())
        });
        let deadline = Duration::from_millis(50);
        let file = ComponentFile::with("path", "/hung/c.json", 16, deadline, blocking);
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            outcomes.push(file.read().await.expect_err("a hung read cannot succeed"));
        }
        assert_eq!(calls.load(SeqCst), 1, "reads blocked");
        assert!(
            matches!(outcomes[0], ComponentFileError::TimedOut { .. }),
            "{}",
            outcomes[0]
        );
        assert!(outcomes[1..].iter().all(|e| e.is_still_reading()));
        let text = outcomes[1].to_string();
        assert!(
            text.contains("`path`") && text.contains("/hung/c.json"),
            "{text}"
        );
        // Released, the hung read returns; the next one runs.
        // One answer for the hung read, one for the next.
        for _ in 0..2 {
            release.send(()).unwrap_or_else(|e| panic!("{e}"));
        }
        let read = testkit::soon("the next read", async {
            loop {
                match file.read().await {
                    Err(err) if err.is_still_reading() => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    other => break other,
                }
            }
        })
        .await;
        assert_eq!(read.ok().as_deref(), Some("{}"));
        assert_eq!(calls.load(SeqCst), 2, "reads started");
    }

    /// Callers that stop waiting (a request timeout) before the deadline
    /// leave one thread stuck, not one each; later calls are refused at
    /// once until it returns, then run.
    #[tokio::test]
    async fn calls_in_turn_pin_one_thread_however_many_callers_give_up() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let calls = Arc::new(AtomicUsize::new(0));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = Arc::new(Mutex::new(hung));
        let path = Path::new("/hung/in-turn");
        let deadline = Duration::from_secs(5);
        for _ in 0..5 {
            let (calls, hung) = (Arc::clone(&calls), Arc::clone(&hung));
            let call = move || {
                calls.fetch_add(1, SeqCst);
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(10));
            };
            let waited = Duration::from_millis(20);
            let _ = tokio::time::timeout(waited, on_path_in_turn(path, deadline, call)).await;
        }
        assert_eq!(calls.load(SeqCst), 1, "calls started");
        let refused = on_path_in_turn(path, deadline, || ()).await;
        assert!(
            matches!(refused, Err(Abandoned::StillReading)),
            "{refused:?}"
        );
        let _ = release.send(());
        testkit::soon("a call once the hung one returned", async {
            while on_path_in_turn(path, deadline, || ()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    #[tokio::test]
    async fn a_hung_call_on_a_path_pins_one_thread_and_leaves_other_paths_alone() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let calls = Arc::new(AtomicUsize::new(0));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let hung = Arc::new(Mutex::new(hung));
        let path = Path::new("/hung/folder");
        let deadline = Duration::from_millis(50);
        let mut errors = Vec::new();
        for _ in 0..3 {
            let (calls, hung) = (Arc::clone(&calls), Arc::clone(&hung));
            let call = move || {
                calls.fetch_add(1, SeqCst);
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(10));
                Ok(())
            };
            let err = on_path_within(path, deadline, call)
                .await
                .expect_err("hung");
            errors.push(err.to_string());
        }
        assert_eq!(calls.load(SeqCst), 1, "calls started");
        assert!(
            errors[0].contains("did not finish within 50 ms"),
            "{errors:?}"
        );
        assert!(errors[1].contains("has not returned yet"), "{errors:?}");
        // Stuck for good (a mount lazily unmounted and mounted again): a
        // while later the path is tried once more, on a thread of its own.
        tokio::time::pause();
        tokio::time::advance(TRY_AGAIN_AFTER).await;
        tokio::time::resume();
        let again = on_path_within(path, deadline, || Ok(())).await;
        assert!(again.is_ok(), "{again:?}");
        let after = on_path_within(path, deadline, || Ok(())).await;
        assert!(after.is_ok(), "no longer stuck: {after:?}");
        // Another path, and a folder that answers, are not held up.
        let folder = dir();
        let canonical = canonicalize_within(folder.path(), deadline).await;
        assert!(canonical.is_ok(), "{canonical:?}");
        let _ = release.send(());
    }
}
