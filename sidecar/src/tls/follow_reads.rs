//! The follower's reads of one listener's TLS files, bounded in time: a
//! hung mount (NFS, FUSE, a CSI volume) must neither stop rotation for
//! good nor keep the follower past shutdown, nor pile up threads.
//!
//! Each read runs on a thread of its own ([`DetachedReader`]) and is given
//! up after [`READ_DEADLINE`]. While a read given up has not returned, the
//! next turns are refused at once: one thread stuck per listener, not one
//! more per second. A thread stuck for good (a mount lazily unmounted and
//! mounted again, where a fresh read would answer) must not freeze the
//! certificate in force until it expires: after [`TRY_AGAIN_AFTER`] the
//! read is tried again on a new thread, then after twice as long each time
//! up to [`LONGEST_WAIT`] (the schedule of component TLS files,
//! `rewire_components`' `component_file::stuck_paths`).
//!
//! A ceiling bounds what a mount hung for good can pin: at most
//! [`MAX_READS_ALIVE_PER_FILE`] reads of one file are alive at once in the
//! process ([`ReadAlive`]: the start-up reads and every listener's follower
//! naming the file count together). At the ceiling a turn is refused,
//! naming the file (status and the log say so), and the certificate in
//! force keeps serving; once one of those reads returns, the schedule goes
//! on. Reads stuck for good never return, while a path mounted again
//! would answer: so one read past the ceiling is still started every
//! [`WAIT_AT_THE_CEILING`] (4 threads a day, as component TLS files), up
//! to [`MOST_READS_ALIVE_PER_FILE`] (16 days into such a hang), after which
//! only a read returning, or a restart, lets the file be read again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use rewire_runtime::{Abandoned, DetachedReader};
use tokio::time::Instant;

/// How long one read of a listener's files may take: 5 s.
pub(super) const READ_DEADLINE: Duration = Duration::from_secs(5);

/// How long a read given up stays the only one before the files are read
/// again on a new thread beside it, the first time: 5 min.
pub(super) const TRY_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The longest wait between two tries while reads stay stuck: the wait
/// doubles from [`TRY_AGAIN_AFTER`] up to this.
pub(super) const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How many reads of one file may be alive at once in the process: 8. A
/// mount hung for good pins at most these threads (and open files) per
/// file, reached about 4 h 15 min into the hang by one follower's
/// schedule; no other read of the file is started until one returns.
pub(super) const MAX_READS_ALIVE_PER_FILE: u32 = 8;

/// The wait between two reads past [`MAX_READS_ALIVE_PER_FILE`] while that
/// many stay stuck: 6 h (a path mounted again is read within it).
pub(super) const WAIT_AT_THE_CEILING: Duration = Duration::from_secs(6 * 3600);

/// How many reads of one file may be alive at once, past the ceiling's
/// reads every [`WAIT_AT_THE_CEILING`]: 72.
pub(super) const MOST_READS_ALIVE_PER_FILE: u32 = 72;

/// What reads a listener's files: their bytes in `Files::paths` order, or
/// an error naming the file. `Files::contents` but in tests.
pub(super) type ReadFiles = Arc<dyn Fn() -> Result<Vec<Vec<u8>>, String> + Send + Sync>;

/// Reads alive (started, not returned) per file, in the process.
static READS_ALIVE: LazyLock<Mutex<HashMap<PathBuf, Alive>>> = LazyLock::new(Default::default);

/// The reads of one file alive.
#[derive(Default)]
struct Alive {
    /// How many.
    count: u32,
    /// While at the ceiling: when a read past it may start.
    past_ceiling_at: Option<Instant>,
}

impl Alive {
    /// Whether one more read may start now; at the ceiling, starts the
    /// wait for a read past it if none runs.
    fn admits(&mut self, now: Instant) -> bool {
        if self.count < MAX_READS_ALIVE_PER_FILE {
            return true;
        }
        let at = *self
            .past_ceiling_at
            .get_or_insert(now + WAIT_AT_THE_CEILING);
        self.count < MOST_READS_ALIVE_PER_FILE && now >= at
    }

    /// One more read started: past the ceiling, the next one waits again.
    fn start(&mut self, now: Instant) {
        if self.count >= MAX_READS_ALIVE_PER_FILE {
            self.past_ceiling_at = Some(now + WAIT_AT_THE_CEILING);
        }
        self.count += 1;
    }
}

fn reads_alive() -> MutexGuard<'static, HashMap<PathBuf, Alive>> {
    READS_ALIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// One read of some files, counted in [`READS_ALIVE`] until dropped: kept
/// by the reading thread, so counted out when the read returns (or at
/// once, if no thread starts).
pub(super) struct ReadAlive {
    /// The files read, each once.
    paths: Vec<PathBuf>,
}

impl ReadAlive {
    /// Counts a read of `paths` in, unless one of them already has
    /// [`MAX_READS_ALIVE_PER_FILE`] reads alive (and no read past them is
    /// due): then an error saying so, naming that file; `files` names the
    /// whole set in it.
    pub(super) fn count_in(paths: &[&Path], files: &str) -> Result<Self, String> {
        let mut paths: Vec<PathBuf> = paths.iter().map(|path| path.to_path_buf()).collect();
        paths.sort();
        paths.dedup();
        let mut alive = reads_alive();
        let now = Instant::now();
        // Every file asked (each starts its wait at the ceiling), before
        // any read is counted in.
        let refused: Vec<&PathBuf> = paths
            .iter()
            .filter(|path| alive.get_mut(*path).is_some_and(|reads| !reads.admits(now)))
            .collect();
        if let Some(full) = refused.first() {
            let count = alive.get(*full).map_or(0, |reads| reads.count);
            return Err(format!(
                "{files} are not read: {count} reads of `{}` have not returned (a hung mount?); no other read of it is started until one does, or every {} hours one past them",
                full.display(),
                WAIT_AT_THE_CEILING.as_secs() / 3600
            ));
        }
        for path in &paths {
            alive.entry(path.clone()).or_default().start(now);
        }
        Ok(Self { paths })
    }

    /// Reads of `path` alive now (tests).
    #[cfg(test)]
    pub(super) fn of(path: &Path) -> u32 {
        reads_alive().get(path).map_or(0, |reads| reads.count)
    }
}

impl Drop for ReadAlive {
    fn drop(&mut self) {
        let mut alive = reads_alive();
        for path in &self.paths {
            if let Some(reads) = alive.get_mut(path) {
                reads.count = reads.count.saturating_sub(1);
                if reads.count < MAX_READS_ALIVE_PER_FILE {
                    reads.past_ceiling_at = None;
                }
                if reads.count == 0 {
                    alive.remove(path);
                }
            }
        }
    }
}

/// How a follower paces itself.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    /// The wait between two turns.
    pub(super) every: Duration,
    /// How long one read may take.
    pub(super) deadline: Duration,
    /// The first wait before a stuck read is tried again.
    pub(super) try_again_after: Duration,
}

/// One follower's reads of its files.
pub(super) struct FollowerReads {
    read: ReadFiles,
    pace: Pace,
    /// What messages name: the listener and its files (never content).
    files: String,
    /// The files read, counted in [`READS_ALIVE`] while a read runs.
    paths: Vec<PathBuf>,
    /// Runs the current read; replaced by a new one to try again.
    reader: DetachedReader,
    stuck: Option<Stuck>,
}

/// The last read was given up and may still be stuck.
struct Stuck {
    /// When the files may be read again on a new thread.
    try_again_at: Instant,
    /// The wait that led to `try_again_at`.
    wait: Duration,
}

impl FollowerReads {
    /// Reads `paths` with `read`, paced by `pace`; `files` names what is
    /// read in messages.
    pub(super) fn new(read: ReadFiles, pace: Pace, files: String, paths: Vec<PathBuf>) -> Self {
        Self {
            read,
            pace,
            files,
            paths,
            reader: DetachedReader::default(),
            stuck: None,
        }
    }

    /// The files' bytes, or why they were not read this turn (naming the
    /// files). Never waits longer than the deadline.
    pub(super) async fn read(&mut self) -> Result<Vec<Vec<u8>>, String> {
        if self.reader.is_reading() {
            // Not counted in: this turn starts no read unless it is due.
            return self.try_again().await;
        }
        let read = self.counted_read()?;
        match self.reader.read_within(self.pace.deadline, read).await {
            Err(Abandoned::StillReading) => self.try_again().await,
            outcome => self.settle(outcome),
        }
    }

    /// A read of the files counted in [`READS_ALIVE`] until it returns (or
    /// is dropped unstarted), or why none may start: the ceiling reached.
    fn counted_read(
        &self,
    ) -> Result<impl FnOnce() -> Result<Vec<Vec<u8>>, String> + Send + 'static, String> {
        let paths: Vec<&Path> = self.paths.iter().map(PathBuf::as_path).collect();
        let counted = ReadAlive::count_in(&paths, &self.files)
            .map_err(|err| format!("{err}; the certificate in force stays"))?;
        let read = Arc::clone(&self.read);
        Ok(move || {
            let _counted = counted;
            read()
        })
    }

    /// The reader is busy with a read given up: refused, or tried again on
    /// a new thread once the wait has passed and the ceiling allows it.
    async fn try_again(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let now = Instant::now();
        let due = self
            .stuck
            .as_ref()
            .is_some_and(|stuck| now >= stuck.try_again_at);
        if !due {
            return Err(format!(
                "{} are not read again yet: an earlier read, given up after {:?}, has not returned (a hung mount?); tried again on a new thread after {:?}, then at doubling intervals; the certificate in force stays",
                self.files, self.pace.deadline, self.pace.try_again_after
            ));
        }
        let read = self.counted_read()?;
        if let Some(stuck) = self.stuck.as_mut() {
            stuck.wait = (stuck.wait * 2).min(LONGEST_WAIT);
            stuck.try_again_at = now + stuck.wait;
        }
        tracing::info!(files = %self.files, "TLS files read again on a new thread: an earlier read is still stuck.");
        self.reader = DetachedReader::default();
        let outcome = self.reader.read_within(self.pace.deadline, read).await;
        self.settle(outcome)
    }

    /// What a read that was started came to.
    fn settle(
        &mut self,
        outcome: Result<Result<Vec<Vec<u8>>, String>, Abandoned>,
    ) -> Result<Vec<Vec<u8>>, String> {
        match outcome {
            Ok(read) => {
                self.stuck = None;
                read
            }
            Err(abandoned @ Abandoned::TimedOut(_)) => {
                // A retry given up keeps the wait it was tried with.
                if self.stuck.is_none() {
                    self.stuck = Some(Stuck {
                        try_again_at: Instant::now() + self.pace.try_again_after,
                        wait: self.pace.try_again_after,
                    });
                }
                Err(format!(
                    "reading {} {abandoned}; given up (a hung mount?), the certificate in force stays",
                    self.files
                ))
            }
            Err(abandoned) => Err(format!("reading {} {abandoned}", self.files)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::*;

    /// Moves the clock `by` (paused meanwhile, so reads run on real time).
    async fn advance(by: Duration) {
        tokio::time::pause();
        tokio::time::advance(by).await;
        tokio::time::resume();
    }

    /// Reads that all hang (a mount lazily unmounted leaves each thread
    /// stuck for good) until a message is sent (one read returns per
    /// message) or the sender is dropped (all return), 30 s at most; and
    /// the count of reads started.
    fn hanging_reads() -> (ReadFiles, Arc<AtomicUsize>, mpsc::Sender<()>) {
        let started = Arc::new(AtomicUsize::new(0));
        let (release, hung) = mpsc::channel::<()>();
        let hung = Arc::new(Mutex::new(hung));
        let counted = Arc::clone(&started);
        let read: ReadFiles = Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
            let _ = hung.recv_timeout(Duration::from_secs(30));
            Ok(Vec::new())
        });
        (read, started, release)
    }

    /// Paths no other test reads (the ceiling is per file, process-wide).
    fn paths_of(test: &str) -> Vec<PathBuf> {
        let dir = PathBuf::from(format!("/rewire-follow-reads-test/{test}"));
        vec![dir.join("cert.pem"), dir.join("key.pem")]
    }

    /// Files whose reads all hang are read again on a new thread after 5,
    /// 10, 20, 40, then every 60 min, until 8 reads of the file are alive:
    /// then no read is started however long the hang lasts (a month here),
    /// by this follower or another one naming the file (the other
    /// listener), and the refusal names the file. Once one read returns,
    /// the next try starts one again. In between, turns start no thread.
    /// Before: a read tried again every 6 h at the cap, for ever (4 more
    /// threads a day).
    #[tokio::test]
    async fn stuck_reads_are_tried_again_at_growing_intervals_up_to_eight_alive_per_file() {
        let (read, started, release) = hanging_reads();
        let pace = Pace {
            every: Duration::from_secs(1),
            deadline: Duration::from_millis(50),
            try_again_after: TRY_AGAIN_AFTER,
        };
        let paths = paths_of("ceiling");
        let files = "the grpc listener's files";
        let mut reads = FollowerReads::new(Arc::clone(&read), pace, files.into(), paths.clone());
        let err = reads.read().await.expect_err("hung");
        assert!(err.contains("did not finish within 50 ms"), "{err}");
        let mut wait = TRY_AGAIN_AFTER;
        for tried in 1..MAX_READS_ALIVE_PER_FILE as usize {
            advance(wait - Duration::from_secs(1)).await;
            let err = reads.read().await.expect_err("refused");
            assert!(err.contains("has not returned"), "try {tried}: {err}");
            assert_eq!(started.load(Ordering::SeqCst), tried, "threads");
            advance(Duration::from_secs(1)).await;
            let err = reads.read().await.expect_err("tried again, hung");
            assert!(err.contains("did not finish"), "try {tried}: {err}");
            assert_eq!(started.load(Ordering::SeqCst), tried + 1);
            wait = (wait * 2).min(LONGEST_WAIT);
        }
        assert_eq!(wait, LONGEST_WAIT);
        let ceiling = MAX_READS_ALIVE_PER_FILE as usize;
        assert_eq!(ReadAlive::of(&paths[0]), MAX_READS_ALIVE_PER_FILE);
        advance(LONGEST_WAIT).await;
        let err = reads.read().await.expect_err("at the ceiling");
        assert!(
            err.contains(
                "8 reads of `/rewire-follow-reads-test/ceiling/cert.pem` have not returned"
            ) && err.contains("certificate in force stays"),
            "{err}"
        );
        assert_eq!(started.load(Ordering::SeqCst), ceiling, "none past it yet");
        let other_listener = "the http listener's files".to_string();
        let mut other = FollowerReads::new(Arc::clone(&read), pace, other_listener, paths.clone());
        let err = other.read().await.expect_err("at the ceiling too");
        assert!(err.contains("8 reads of"), "{err}");
        // Six hours into the ceiling, one read past it (it hangs too);
        // the next only six hours later.
        advance(WAIT_AT_THE_CEILING).await;
        let err = reads.read().await.expect_err("past the ceiling, hung");
        assert!(err.contains("did not finish"), "{err}");
        assert_eq!(started.load(Ordering::SeqCst), ceiling + 1);
        advance(LONGEST_WAIT).await;
        let err = reads.read().await.expect_err("at the ceiling again");
        assert!(err.contains("9 reads of"), "{err}");
        assert_eq!(started.load(Ordering::SeqCst), ceiling + 1);
        // Two stuck reads return: below the ceiling, the next try starts
        // one at once.
        for _ in 0..2 {
            release.send(()).expect("release one");
        }
        testkit::soon("two reads counted out", async {
            while ReadAlive::of(&paths[0]) >= MAX_READS_ALIVE_PER_FILE {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let err = reads.read().await.expect_err("tried again, hung");
        assert!(err.contains("did not finish"), "{err}");
        assert_eq!(started.load(Ordering::SeqCst), ceiling + 2);
        assert_eq!(ReadAlive::of(&paths[0]), MAX_READS_ALIVE_PER_FILE);
        drop(release);
    }

    /// A mount hung for good, then mounted again: its 8 reads never
    /// return, yet the renewed files are read (past the ceiling, within
    /// six hours of reaching it), so the certificate in force does not
    /// expire for want of a read. Before: refused for good.
    #[tokio::test]
    async fn a_remounted_path_is_read_while_eight_reads_stay_stuck_for_good() {
        let calls = Arc::new(AtomicUsize::new(0));
        let (_never, hung) = mpsc::channel::<()>();
        let hung = Arc::new(Mutex::new(hung));
        let counted = Arc::clone(&calls);
        let read: ReadFiles = Arc::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) < MAX_READS_ALIVE_PER_FILE as usize {
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(30));
            }
            Ok(vec![b"renewed".to_vec()])
        });
        let pace = Pace {
            every: Duration::from_secs(1),
            deadline: Duration::from_millis(50),
            try_again_after: TRY_AGAIN_AFTER,
        };
        let files = "the grpc listener's files".to_string();
        let mut reads = FollowerReads::new(read, pace, files, paths_of("remounted"));
        let _ = reads.read().await;
        for _ in 0..(30 * 24) {
            advance(LONGEST_WAIT).await;
            if let Ok(read) = reads.read().await {
                assert_eq!(read, vec![b"renewed".to_vec()]);
                return;
            }
        }
        panic!("the remounted files were never read again");
    }

    /// A turn while the follower's own read is stuck and no retry is due
    /// counts no read in: another listener at 7 reads of the file is not
    /// refused for the ceiling meanwhile, and the turn says why it waits.
    #[tokio::test]
    async fn a_turn_on_a_busy_reader_counts_no_read() {
        let (read, _started, release) = hanging_reads();
        let pace = Pace {
            every: Duration::from_secs(1),
            deadline: Duration::from_millis(50),
            try_again_after: TRY_AGAIN_AFTER,
        };
        let paths = paths_of("busy");
        let mut reads = FollowerReads::new(read, pace, "files".into(), paths.clone());
        let _ = reads.read().await.expect_err("hung");
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let held: Vec<ReadAlive> = (1..MAX_READS_ALIVE_PER_FILE)
            .map(|_| ReadAlive::count_in(&refs, "f").expect("room"))
            .collect();
        assert_eq!(ReadAlive::of(&paths[0]), MAX_READS_ALIVE_PER_FILE);
        let err = reads.read().await.expect_err("busy");
        assert!(err.contains("not read again yet"), "{err}");
        drop(held);
        drop(release);
    }

    /// A file named twice in one set (a combined PEM as certificate and
    /// key) counts once per read; a read that returns counts out.
    #[tokio::test]
    async fn a_read_counts_once_per_file_and_out_when_it_returns() {
        let file = PathBuf::from("/rewire-follow-reads-test/once/combined.pem");
        let read: ReadFiles = Arc::new(|| Ok(vec![b"pem".to_vec()]));
        let pace = Pace {
            every: Duration::from_secs(1),
            deadline: Duration::from_secs(10),
            try_again_after: TRY_AGAIN_AFTER,
        };
        let paths = vec![file.clone(), file.clone()];
        let counted = ReadAlive::count_in(&[file.as_path(), file.as_path()], "f").expect("in");
        assert_eq!(ReadAlive::of(&file), 1);
        drop(counted);
        let mut reads = FollowerReads::new(read, pace, "files".into(), paths);
        assert_eq!(reads.read().await.expect("read"), vec![b"pem".to_vec()]);
        assert_eq!(ReadAlive::of(&file), 0);
    }
}
