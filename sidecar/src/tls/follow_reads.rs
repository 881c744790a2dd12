//! The follower's reads of one listener's TLS files, bounded in time: a
//! hung mount (NFS, FUSE, a CSI volume) must neither stop rotation for
//! good nor keep the follower past shutdown.
//!
//! Each read runs on a thread of its own ([`DetachedReader`]) and is given
//! up after [`READ_DEADLINE`]. While a read given up has not returned, the
//! next turns are refused at once: one thread stuck per listener, not one
//! more per second. A thread stuck for good (a mount lazily unmounted and
//! mounted again, where a fresh read would answer) must not freeze the
//! certificate in force until it expires: after [`TRY_AGAIN_AFTER`] the
//! read is tried again on a new thread, then after twice as long each time
//! up to [`LONGEST_WAIT`]; once [`MAX_RETRIES_ALIVE`] retries are stuck
//! too, every [`WAIT_AT_THE_CAP`]. The schedule is that of component TLS
//! files (`rewire_components`' `component_file::stuck_paths`), here per
//! listener: only its follower reads its files.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
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

/// How many retry threads may be stuck before retries slow to every
/// [`WAIT_AT_THE_CAP`].
pub(super) const MAX_RETRIES_ALIVE: u32 = 8;

/// The wait between two retries while [`MAX_RETRIES_ALIVE`] are stuck: a
/// mount hung for good pins 4 more threads a day, and is never given up.
pub(super) const WAIT_AT_THE_CAP: Duration = Duration::from_secs(6 * 3600);

/// What reads a listener's files: their bytes in `Files::paths` order, or
/// an error naming the file. `Files::contents` but in tests.
pub(super) type ReadFiles = Arc<dyn Fn() -> Result<Vec<Vec<u8>>, String> + Send + Sync>;

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
    /// Runs the current read; replaced by a new one to try again.
    reader: DetachedReader,
    stuck: Option<Stuck>,
    /// Retry threads that have not returned.
    retries_alive: Arc<AtomicU32>,
}

/// The last read was given up and may still be stuck.
struct Stuck {
    /// When the files may be read again on a new thread.
    try_again_at: Instant,
    /// The wait that led to `try_again_at`.
    wait: Duration,
}

/// Kept by a retry's thread: counts it out when it returns.
struct RetryAlive(Arc<AtomicU32>);

impl Drop for RetryAlive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl FollowerReads {
    /// Reads with `read`, paced by `pace`; `files` names what is read in
    /// messages.
    pub(super) fn new(read: ReadFiles, pace: Pace, files: String) -> Self {
        Self {
            read,
            pace,
            files,
            reader: DetachedReader::default(),
            stuck: None,
            retries_alive: Arc::default(),
        }
    }

    /// The files' bytes, or why they were not read this turn (naming the
    /// files). Never waits longer than the deadline.
    pub(super) async fn read(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let read = Arc::clone(&self.read);
        match self
            .reader
            .read_within(self.pace.deadline, move || read())
            .await
        {
            Err(Abandoned::StillReading) => self.try_again().await,
            outcome => self.settle(outcome),
        }
    }

    /// The reader is busy with a read given up: refused, or tried again on
    /// a new thread once the wait has passed.
    async fn try_again(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let now = Instant::now();
        let still_reading = || {
            format!(
                "{} are not read again yet: an earlier read, given up after {:?}, has not returned (a hung mount?); tried again on a new thread after {:?}, then at doubling intervals; the certificate in force stays",
                self.files, self.pace.deadline, self.pace.try_again_after
            )
        };
        let Some(stuck) = self.stuck.as_mut() else {
            return Err(still_reading());
        };
        if now < stuck.try_again_at {
            return Err(still_reading());
        }
        let alive = self.retries_alive.fetch_add(1, Ordering::AcqRel) + 1;
        stuck.wait = if alive >= MAX_RETRIES_ALIVE {
            WAIT_AT_THE_CAP
        } else {
            (stuck.wait * 2).min(LONGEST_WAIT)
        };
        stuck.try_again_at = now + stuck.wait;
        tracing::info!(files = %self.files, retries_stuck = alive - 1, "TLS files read again on a new thread: an earlier read is still stuck.");
        self.reader = DetachedReader::default();
        let read = Arc::clone(&self.read);
        // Dropped with the closure: when the thread returns, or at once if
        // none starts.
        let counted = RetryAlive(Arc::clone(&self.retries_alive));
        let outcome = self
            .reader
            .read_within(self.pace.deadline, move || {
                let _counted = counted;
                read()
            })
            .await;
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
    use std::sync::atomic::AtomicUsize;
    use std::sync::{mpsc, Mutex};

    use super::*;

    /// Moves the clock `by` (paused meanwhile, so reads run on real time).
    async fn advance(by: Duration) {
        tokio::time::pause();
        tokio::time::advance(by).await;
        tokio::time::resume();
    }

    /// Files whose reads all hang (a mount lazily unmounted leaves each
    /// thread stuck for good) are read again on a new thread after 5, 10,
    /// 20, 40, then every 60 min while fewer than 8 retries are stuck;
    /// then every 6 h. In between, turns start no thread.
    #[tokio::test]
    async fn stuck_reads_are_tried_again_at_growing_intervals_then_every_six_hours() {
        let started = Arc::new(AtomicUsize::new(0));
        let (release, hung) = mpsc::channel::<()>();
        let hung = Arc::new(Mutex::new(hung));
        let read: ReadFiles = {
            let started = Arc::clone(&started);
            Arc::new(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let hung = hung.lock().unwrap_or_else(|p| p.into_inner());
                let _ = hung.recv_timeout(Duration::from_secs(30));
                Ok(Vec::new())
            })
        };
        let pace = Pace {
            every: Duration::from_secs(1),
            deadline: Duration::from_millis(50),
            try_again_after: TRY_AGAIN_AFTER,
        };
        let mut reads = FollowerReads::new(read, pace, "the grpc listener's files".into());
        let err = reads.read().await.expect_err("hung");
        assert!(err.contains("did not finish within 50 ms"), "{err}");
        let mut wait = TRY_AGAIN_AFTER;
        for tried in 1..=MAX_RETRIES_ALIVE + 1 {
            advance(wait - Duration::from_secs(1)).await;
            let err = reads.read().await.expect_err("refused");
            assert!(err.contains("has not returned"), "try {tried}: {err}");
            assert_eq!(started.load(Ordering::SeqCst), tried as usize, "threads");
            advance(Duration::from_secs(1)).await;
            let err = reads.read().await.expect_err("tried again, hung");
            assert!(err.contains("did not finish"), "try {tried}: {err}");
            assert_eq!(started.load(Ordering::SeqCst), tried as usize + 1);
            wait = if tried >= MAX_RETRIES_ALIVE {
                WAIT_AT_THE_CAP
            } else {
                (wait * 2).min(LONGEST_WAIT)
            };
        }
        assert_eq!(wait, WAIT_AT_THE_CAP);
        drop(release);
    }
}
