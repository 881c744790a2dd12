//! Reading a file a user names, bounded: only regular files (a FIFO would
//! block the reader for good, a device could stream forever) and never more
//! than a limit, whatever the file claims its size is. The file is opened
//! without blocking (a FIFO swapped in after the check is refused at once),
//! and [`DetachedReader`] bounds a read in time (a hung network or FUSE
//! mount) without piling up threads stuck in the kernel.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    /// It could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is a FIFO, a device, a directory...
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The file.
        path: String,
    },
    /// It is larger than the limit.
    #[error("{path} is larger than the {limit} bytes accepted")]
    TooLarge {
        /// The file.
        path: String,
        /// The limit, in bytes.
        limit: usize,
    },
}

/// Reads the regular file at `path` (symlinks followed), refusing one
/// larger than `limit` bytes without reading more than that.
pub fn read_bounded(path: &Path, limit: usize) -> Result<Vec<u8>, FileReadError> {
    let shown = || path.display().to_string();
    let io = |source| FileReadError::Io {
        path: shown(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(FileReadError::NotRegular { path: shown() });
    }
    let too_large = || FileReadError::TooLarge {
        path: shown(),
        limit,
    };
    if meta.len() > limit as u64 {
        return Err(too_large());
    }
    // The file may have been swapped since the check: open it without
    // blocking, re-check what was opened, and read at most one byte past
    // the limit.
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > limit {
        return Err(too_large());
    }
    note_progress();
    Ok(bytes)
}

/// Opens the file at `path` for reading without waiting (a FIFO with no
/// writer does not hold the open) and refuses what is not a regular file
/// once opened. On a regular file the flag changes nothing.
fn open_regular(path: &Path) -> Result<std::fs::File, FileReadError> {
    let shown = || path.display().to_string();
    let io = |source| FileReadError::Io {
        path: shown(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Bits of an `int` flag: the cast keeps them as they are.
        options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    }
    let file = options.open(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(FileReadError::NotRegular { path: shown() });
    }
    Ok(file)
}

/// How long one read of the configuration file may take before a watcher
/// gives up on it; for the configuration's sources (the file and a folder
/// of manifests), how long one step of the read (a file read, a folder
/// entry looked at) may take: see [`CONFIG_SOURCES_READ`].
pub(crate) const CONFIG_READ_DEADLINE: Duration = Duration::from_secs(5);

/// The deadlines of a read of the configuration's sources: a folder of a
/// thousand manifests on a slow network mount takes longer than any one
/// file, and is given up only when it stops moving on (or at the cap).
pub(crate) const CONFIG_SOURCES_READ: ProgressDeadlines = ProgressDeadlines {
    without_progress: CONFIG_READ_DEADLINE,
    in_all: Duration::from_secs(60),
};

/// The deadlines of a read that reports its progress (see
/// [`DetachedReader::read_with_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProgressDeadlines {
    /// Given up when no step (see [`note_progress`]) ends for this long.
    pub without_progress: Duration,
    /// Given up after this long in all, however it moves on.
    pub in_all: Duration,
}

thread_local! {
    /// The step counter of the read running on this thread, if it reports
    /// progress (set by [`DetachedReader::read_with_progress`] on the
    /// read's own thread).
    static STEPS: std::cell::RefCell<Option<Arc<AtomicU64>>> = const { std::cell::RefCell::new(None) };
}

/// Notes that the read running on this thread made a step (a file read, a
/// folder entry looked at): a read given up for want of progress (see
/// [`DetachedReader::read_with_progress`]) gets more time. Elsewhere it
/// does nothing. [`read_bounded`] calls it after each file.
pub(crate) fn note_progress() {
    STEPS.with(|steps| {
        if let Some(steps) = steps.borrow().as_ref() {
            steps.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Why [`DetachedReader::read_within`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum Abandoned {
    /// The read did not finish within the deadline; its thread is left to
    /// end (or not) on its own.
    #[error("did not finish within {}", shown_duration(*.0))]
    TimedOut(Duration),
    /// An earlier read, given up, has not returned yet: no other is started
    /// until it does (one stuck thread at most, not one per attempt).
    #[error("is not started: an earlier read, given up, has not returned yet")]
    StillReading,
    /// No thread could be started, or it ended without an answer.
    #[error("{0}")]
    Failed(String),
}

/// `d` as people write it: `5 s`, `250 ms`.
fn shown_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Reads bounded in time for one watch, each on a thread of its own,
/// detached, with at most one such thread alive: while a read given up at
/// its deadline has not returned (a hung NFS or FUSE mount, where `stat`
/// may still answer), the next ones are refused at once
/// ([`Abandoned::StillReading`]) instead of each leaving one more thread
/// (a stack, an open file) stuck in the kernel. Once it returns, the next
/// read runs.
///
/// Keep one per thing read again and again (a watched file, a polled
/// folder) for as long as it is read: a new reader per read bounds nothing.
/// Any blocking call fits (`stat`, `canonicalize`, adding an inotify
/// watch), not only reads.
#[derive(Debug, Default)]
pub struct DetachedReader {
    /// Set while a reading thread has not returned.
    reading: Arc<AtomicBool>,
}

/// Clears the reader's flag when the read returns (or panics).
struct Returned(Arc<AtomicBool>);

impl Drop for Returned {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl DetachedReader {
    /// Whether a read started here has not returned yet (the next one
    /// would be refused with [`Abandoned::StillReading`]).
    pub fn is_reading(&self) -> bool {
        self.reading.load(Ordering::Acquire)
    }

    /// Runs `read` on a thread of its own, detached, and waits for it at
    /// most `deadline`. A read that never returns pins that one thread, not
    /// the async runtime's blocking pool (whose shutdown would wait for
    /// it), and the caller carries on; while it stays blocked, no other
    /// read is started.
    pub async fn read_within<T, R>(&self, deadline: Duration, read: R) -> Result<T, Abandoned>
    where
        T: Send + 'static,
        R: FnOnce() -> T + Send + 'static,
    {
        let mut receiver = self.start(None, read)?;
        match tokio::time::timeout(deadline, &mut receiver).await {
            Err(_) => Err(Abandoned::TimedOut(deadline)),
            Ok(answer) => answered(answer),
        }
    }

    /// Like [`read_within`](Self::read_within), for a read of many steps
    /// (the files of a folder) that notes each with [`note_progress`]: it
    /// is given up when no step ends for `deadlines.without_progress`
    /// ([`Abandoned::TimedOut`] with that duration), or after
    /// `deadlines.in_all` ([`Abandoned::TimedOut`] with that one), not
    /// when the whole read takes longer than one step may.
    pub(crate) async fn read_with_progress<T, R>(
        &self,
        deadlines: ProgressDeadlines,
        read: R,
    ) -> Result<T, Abandoned>
    where
        T: Send + 'static,
        R: FnOnce() -> T + Send + 'static,
    {
        let steps = Arc::new(AtomicU64::new(0));
        let mut receiver = self.start(Some(Arc::clone(&steps)), read)?;
        let cap = tokio::time::Instant::now() + deadlines.in_all;
        let mut seen = 0;
        loop {
            let window = deadlines
                .without_progress
                .min(cap.saturating_duration_since(tokio::time::Instant::now()));
            match tokio::time::timeout(window, &mut receiver).await {
                Ok(answer) => return answered(answer),
                Err(_) if tokio::time::Instant::now() >= cap => {
                    return Err(Abandoned::TimedOut(deadlines.in_all));
                }
                Err(_) => {
                    let now = steps.load(Ordering::Relaxed);
                    if now == seen {
                        return Err(Abandoned::TimedOut(deadlines.without_progress));
                    }
                    seen = now;
                }
            }
        }
    }

    /// Starts `read` on a detached thread (with `steps` as its progress
    /// counter, if given) unless an earlier read has not returned.
    fn start<T, R>(
        &self,
        steps: Option<Arc<AtomicU64>>,
        read: R,
    ) -> Result<tokio::sync::oneshot::Receiver<T>, Abandoned>
    where
        T: Send + 'static,
        R: FnOnce() -> T + Send + 'static,
    {
        if self
            .reading
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Abandoned::StillReading);
        }
        let returned = Returned(Arc::clone(&self.reading));
        let (sender, receiver) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("rewire-detached-read".into())
            .spawn(move || {
                let value = {
                    let _returned = returned;
                    STEPS.with(|counter| *counter.borrow_mut() = steps);
                    read()
                };
                // Cleared before the answer is sent: a caller that has it
                // may read again at once. The receiver is gone if the read
                // was abandoned: nothing to do.
                let _ = sender.send(value);
            })
            // The closure (and the flag's guard in it) is dropped when no
            // thread starts: the flag is cleared.
            .map_err(|e| Abandoned::Failed(format!("cannot start a reading thread: {e}")))?;
        Ok(receiver)
    }
}

/// The answer of a reading thread, or why there is none.
fn answered<T>(answer: Result<T, tokio::sync::oneshot::error::RecvError>) -> Result<T, Abandoned> {
    answer.map_err(|_| Abandoned::Failed("the reading thread ended without an answer".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_at_the_open_without_waiting_for_a_writer() {
        let dir = std::env::temp_dir().join(format!("rewire-fs-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        // On a thread: a blocking open would wait for a writer forever.
        let (sender, receiver) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = sender.send(open_regular(&path).map(|_| ()));
        });
        let opened = receiver.recv_timeout(Duration::from_secs(2));
        assert!(
            matches!(opened, Ok(Err(FileReadError::NotRegular { .. }))),
            "{opened:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_read_that_never_returns_is_given_up_at_the_deadline() {
        let (_keep, never) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let reader = DetachedReader::default();
        let read = reader
            .read_within(Duration::from_millis(100), move || never.recv())
            .await;
        assert!(matches!(read, Err(Abandoned::TimedOut(_))), "{read:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(
            Abandoned::TimedOut(Duration::from_secs(5)).to_string(),
            "did not finish within 5 s"
        );
        let read = DetachedReader::default()
            .read_within(Duration::from_secs(5), || 7)
            .await;
        assert!(matches!(read, Ok(7)));
    }

    #[tokio::test]
    async fn a_stuck_read_leaves_one_thread_and_later_reads_are_refused_until_it_returns() {
        use std::sync::atomic::AtomicUsize;
        let reader = DetachedReader::default();
        let starts = Arc::new(AtomicUsize::new(0));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        // Counts the reading threads started: the read runs on its own.
        let blocking = |stuck: Option<std::sync::mpsc::Receiver<()>>| {
            let starts = Arc::clone(&starts);
            move || {
                starts.fetch_add(1, Ordering::SeqCst);
                if let Some(stuck) = stuck {
                    let _ = stuck.recv();
                }
                "read"
            }
        };
        let deadline = Duration::from_millis(100);
        let first = reader.read_within(deadline, blocking(Some(stuck))).await;
        assert!(matches!(first, Err(Abandoned::TimedOut(_))), "{first:?}");
        // Three more while the first is stuck: none starts a thread, each
        // answers at once.
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let later = reader.read_within(deadline, blocking(None)).await;
            assert!(matches!(later, Err(Abandoned::StillReading)), "{later:?}");
            assert!(started.elapsed() < deadline, "{:?}", started.elapsed());
        }
        assert_eq!(starts.load(Ordering::SeqCst), 1, "threads started");
        assert_eq!(
            Abandoned::StillReading.to_string(),
            "is not started: an earlier read, given up, has not returned yet"
        );
        // Released, the stuck read returns: the next read runs and succeeds.
        release.send(()).unwrap();
        let waited = std::time::Instant::now();
        while reader.reading.load(Ordering::Acquire) {
            assert!(waited.elapsed() < Duration::from_secs(5), "never returned");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let next = reader.read_within(deadline, blocking(None)).await;
        assert!(matches!(next, Ok("read")), "{next:?}");
        assert_eq!(starts.load(Ordering::SeqCst), 2, "threads started");
    }

    /// A read of `steps` steps of `each`, noting each as progress.
    fn stepping(steps: u32, each: Duration) -> impl FnOnce() -> u32 + Send + 'static {
        move || {
            for _ in 0..steps {
                std::thread::sleep(each);
                note_progress();
            }
            steps
        }
    }

    #[tokio::test]
    async fn a_read_that_moves_on_is_bounded_per_step_and_by_a_cap_not_in_all() {
        let deadlines = ProgressDeadlines {
            without_progress: Duration::from_millis(200),
            in_all: Duration::from_secs(30),
        };
        let reader = DetachedReader::default();
        // 20 steps of 40 ms: 800 ms in all, four times the step deadline.
        let read = reader
            .read_with_progress(deadlines, stepping(20, Duration::from_millis(40)))
            .await;
        assert!(matches!(read, Ok(20)), "{read:?}");
        // A step that never ends is given up for want of progress.
        let (_keep, never) = std::sync::mpsc::channel::<()>();
        let stalled = DetachedReader::default()
            .read_with_progress(deadlines, move || never.recv())
            .await;
        assert!(
            matches!(stalled, Err(Abandoned::TimedOut(d)) if d == deadlines.without_progress),
            "{stalled:?}"
        );
        // A read that moves on forever is given up at the cap.
        let capped = ProgressDeadlines {
            without_progress: Duration::from_millis(200),
            in_all: Duration::from_millis(500),
        };
        let endless = DetachedReader::default()
            .read_with_progress(capped, stepping(100, Duration::from_millis(20)))
            .await;
        assert!(
            matches!(endless, Err(Abandoned::TimedOut(d)) if d == capped.in_all),
            "{endless:?}"
        );
    }

    #[test]
    fn refuses_what_is_not_a_regular_file_or_too_large() {
        let dir = std::env::temp_dir().join(format!("rewire-fs-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_bounded(&file, 4),
            Err(FileReadError::TooLarge { .. })
        ));
        assert!(matches!(
            read_bounded(&dir, 4),
            Err(FileReadError::NotRegular { .. })
        ));
        assert!(matches!(
            read_bounded(Path::new("/dev/zero"), 4),
            Err(FileReadError::NotRegular { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
