//! The bookkeeping of [`super::on_path_within`]: per path, the threads of
//! its calls that have not returned, and whether its last call was given
//! up (at its deadline, or by a caller that stopped waiting) and may still
//! be stuck.
//!
//! While a path is stuck, its calls wait their turn on the stuck call's
//! reader (refused at once while it is busy), so a hung mount pins one
//! thread per path however often a component retries. Once the stuck call
//! returns (a slow read, not a hang), the record goes: calls run side by
//! side again. A thread stuck for good (a mount lazily unmounted and
//! mounted again) must not refuse the path for the life of the process:
//! after [`TRY_AGAIN_AFTER`] a call is tried once more on a thread of its
//! own (a retry), then after twice as long each time up to
//! [`LONGEST_WAIT`]; once [`MAX_RETRIES_ALIVE`] retries of the path are
//! alive (stuck for good too), every [`WAIT_AT_THE_CAP`]. Only retries
//! count: the threads of callers in flight when the path first hung (K
//! components sharing one file) use up none. So a mount hung for good pins
//! per path those threads, 8 retries in the first ~5 h, then 4 more a day,
//! however often components try; a retry thread that returns, late, frees
//! its place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use rewire_runtime::DetachedReader;
use tokio::time::Instant;

/// How long a stuck path is refused before a call is tried again beside
/// the stuck one, the first time.
pub(super) const TRY_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The longest wait between two tries on a path that stays stuck: the
/// wait doubles from [`TRY_AGAIN_AFTER`] up to this.
pub(super) const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How many retry threads (calls tried again on a stuck path) of one path
/// may be alive before its retries slow to every [`WAIT_AT_THE_CAP`].
pub(super) const MAX_RETRIES_ALIVE: u32 = 8;

/// The wait between two retries of a stuck path while
/// [`MAX_RETRIES_ALIVE`] of its retries are alive: the path is never
/// refused for good, and a mount hung for good pins 4 more threads a day.
pub(super) const WAIT_AT_THE_CAP: Duration = Duration::from_secs(6 * 3600);

/// The paths with a call's thread alive or a call given up.
static PATHS: LazyLock<Mutex<HashMap<PathBuf, PathCalls>>> = LazyLock::new(Default::default);

fn paths() -> MutexGuard<'static, HashMap<PathBuf, PathCalls>> {
    PATHS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The calls on one path.
#[derive(Default)]
struct PathCalls {
    /// Threads of calls on the path that have not returned (or calls not
    /// yet started or refused).
    live: u32,
    /// Of these, the retries: calls tried again on the path while stuck.
    retries: u32,
    /// The last call given up, while the path is taken for stuck.
    stuck: Option<Stuck>,
}

/// A path whose last call was given up.
struct Stuck {
    /// The reader of that call (busy while it stays stuck).
    reader: Arc<DetachedReader>,
    /// When a call may be tried again on a thread of its own.
    try_again_at: Instant,
    /// The wait that led to `try_again_at`.
    wait: Duration,
    /// Set when the thread of the call on `reader` returns: the record is
    /// stale (the call was slow, not hung) and goes at the next start.
    returned: Arc<AtomicBool>,
}

/// Starts a call on `path`: the reader to run it on (the stuck call's, or a
/// new one when the path is not stuck or is tried again), the guard its
/// thread keeps while it runs, and the guard of its caller.
pub(super) fn start(path: &Path) -> (Arc<DetachedReader>, Live, Pending) {
    let now = Instant::now();
    let returned = Arc::new(AtomicBool::new(false));
    let mut paths = paths();
    let calls = paths.entry(path.to_path_buf()).or_default();
    if calls
        .stuck
        .as_ref()
        .is_some_and(|s| s.returned.load(Ordering::Acquire))
    {
        calls.stuck = None;
    }
    let mut retry = false;
    let reader = match &mut calls.stuck {
        None => Arc::default(),
        Some(s) if now >= s.try_again_at => {
            // The try again, shared by calls made meanwhile (refused
            // while it runs): one new thread, not one per caller.
            retry = true;
            calls.retries += 1;
            s.reader = Arc::default();
            s.returned = Arc::clone(&returned);
            s.wait = if calls.retries >= MAX_RETRIES_ALIVE {
                WAIT_AT_THE_CAP
            } else {
                (s.wait * 2).min(LONGEST_WAIT)
            };
            s.try_again_at = now + s.wait;
            Arc::clone(&s.reader)
        }
        Some(s) => Arc::clone(&s.reader),
    };
    calls.live += 1;
    let path = path.to_path_buf();
    let live = Live {
        path: path.clone(),
        returned: Arc::clone(&returned),
        retry,
    };
    let pending = Pending {
        path,
        reader: Arc::clone(&reader),
        returned,
        settled: false,
    };
    (reader, live, pending)
}

/// Kept by a call's closure: dropped when the call returns (or panics), or
/// when the closure is dropped unstarted, it counts the thread out.
pub(super) struct Live {
    path: PathBuf,
    returned: Arc<AtomicBool>,
    /// Whether the call is a retry of a stuck path.
    retry: bool,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut paths = paths();
        self.returned.store(true, Ordering::Release);
        let Some(calls) = paths.get_mut(&self.path) else {
            return;
        };
        calls.live = calls.live.saturating_sub(1);
        if self.retry {
            calls.retries = calls.retries.saturating_sub(1);
        }
        if calls.live == 0 && calls.stuck.is_none() {
            paths.remove(&self.path);
        }
    }
}

/// How a call's caller saw it end.
pub(super) enum Ended {
    /// It returned (or failed without a thread left behind).
    Answered,
    /// It was given up at its deadline.
    GivenUp,
    /// It was not started: the path's reader is busy.
    Refused,
}

/// Kept by a call's caller until it [`settle`](Self::settle)s the call: a
/// caller dropped before (it stopped waiting, as a request timeout or a
/// stopped follower does) while the call's thread runs records the path
/// as stuck, as a call given up at its deadline does.
pub(super) struct Pending {
    path: PathBuf,
    reader: Arc<DetachedReader>,
    returned: Arc<AtomicBool>,
    settled: bool,
}

impl Pending {
    /// Records how the call ended.
    pub(super) fn settle(mut self, ended: Ended) {
        self.settled = true;
        match ended {
            Ended::Answered => answered(&self.path),
            Ended::GivenUp => given_up(&self.path, &self.reader, &self.returned),
            Ended::Refused => {}
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut paths = paths();
        if !self.returned.load(Ordering::Acquire) {
            record_stuck(&mut paths, &self.path, &self.reader, &self.returned);
        }
    }
}

/// A call on `path` answered: the path is not stuck.
fn answered(path: &Path) {
    let mut paths = paths();
    let Some(calls) = paths.get_mut(path) else {
        return;
    };
    calls.stuck = None;
    if calls.live == 0 {
        paths.remove(path);
    }
}

/// A call on `path`, run by `reader`, was given up; `returned` is set when
/// its thread returns.
fn given_up(path: &Path, reader: &Arc<DetachedReader>, returned: &Arc<AtomicBool>) {
    record_stuck(&mut paths(), path, reader, returned);
}

/// Takes `path` for stuck on `reader` (whose call sets `returned` when its
/// thread returns), unless it already is (a try again given up keeps the
/// wait it was tried with).
fn record_stuck(
    paths: &mut HashMap<PathBuf, PathCalls>,
    path: &Path,
    reader: &Arc<DetachedReader>,
    returned: &Arc<AtomicBool>,
) {
    let calls = paths.entry(path.to_path_buf()).or_default();
    match &mut calls.stuck {
        None => {
            calls.stuck = Some(Stuck {
                reader: Arc::clone(reader),
                try_again_at: Instant::now() + TRY_AGAIN_AFTER,
                wait: TRY_AGAIN_AFTER,
                returned: Arc::clone(returned),
            })
        }
        // This call ran on the stuck reader (its last call returned just
        // before): the reader is busy with this one now.
        Some(s) if Arc::ptr_eq(&s.reader, reader) => s.returned = Arc::clone(returned),
        Some(_) => {}
    }
}

/// How many threads of calls on `path` have not returned.
#[cfg(test)]
pub(super) fn live_calls(path: &Path) -> u32 {
    paths().get(path).map_or(0, |calls| calls.live)
}

/// How many retries of `path` have not returned.
#[cfg(test)]
pub(super) fn live_retries(path: &Path) -> u32 {
    paths().get(path).map_or(0, |calls| calls.retries)
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::mpsc;

    use super::super::on_path_within;
    use super::*;

    /// A call that blocks (as on a hung mount) until its sender is sent to
    /// or dropped (30 s at most), and the sender.
    fn hung_call() -> (
        impl FnOnce() -> std::io::Result<()> + Send + 'static,
        mpsc::Sender<()>,
    ) {
        let (release, hung) = mpsc::channel::<()>();
        let call = move || {
            let _ = hung.recv_timeout(Duration::from_secs(30));
            Ok(())
        };
        (call, release)
    }

    /// Moves the clock `by` (paused meanwhile, so calls run on real time).
    async fn advance(by: Duration) {
        tokio::time::pause();
        tokio::time::advance(by).await;
        tokio::time::resume();
    }

    /// A path whose calls hang, thread after thread (a mount lazily
    /// unmounted leaves each stuck for good), is tried again after 5, 10,
    /// 20, 40 then every 60 min while fewer than 8 of its retries are
    /// alive; then every 6 h: never refused for good, though no thread
    /// ever returns.
    #[tokio::test]
    async fn a_stuck_path_is_tried_again_at_growing_intervals_then_every_six_hours() {
        let path = Path::new("/hung/for-good");
        let deadline = Duration::from_millis(50);
        let mut releases = Vec::new();
        let mut hang = || {
            let (call, release) = hung_call();
            releases.push(release);
            on_path_within(path, deadline, call)
        };
        let err = hang().await.expect_err("hung");
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        let mut wait = TRY_AGAIN_AFTER;
        for tried in 1..=MAX_RETRIES_ALIVE + 1 {
            advance(wait - Duration::from_secs(1)).await;
            let err = on_path_within(path, deadline, || Ok(())).await;
            let err = err.expect_err("refused before the wait passed");
            assert_eq!(err.kind(), ErrorKind::WouldBlock, "try {tried}: {err}");
            advance(Duration::from_secs(1)).await;
            let err = hang().await.expect_err("tried again, hung");
            assert_eq!(err.kind(), ErrorKind::TimedOut, "try {tried}: {err}");
            wait = if tried >= MAX_RETRIES_ALIVE {
                WAIT_AT_THE_CAP
            } else {
                (wait * 2).min(LONGEST_WAIT)
            };
        }
        assert_eq!(live_retries(path), MAX_RETRIES_ALIVE + 1);
        assert_eq!(live_calls(path), MAX_RETRIES_ALIVE + 2);
        // Past the cap, no thread returned: refused until 6 h passed, then
        // tried again, and the path answers.
        advance(WAIT_AT_THE_CAP - Duration::from_secs(1)).await;
        let err = on_path_within(path, deadline, || Ok(())).await;
        let err = err.expect_err("refused before 6 h passed");
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
        advance(Duration::from_secs(1)).await;
        let again = on_path_within(path, deadline, || Ok(())).await;
        assert!(again.is_ok(), "{again:?}");
        let after = on_path_within(path, deadline, || Ok(())).await;
        assert!(after.is_ok(), "no longer stuck: {after:?}");
        drop(releases);
    }

    /// Eight callers in flight on a path when it hangs (eight components
    /// sharing one caCert) pin eight threads before the path is taken for
    /// stuck: they use up no retries, and the path is tried again.
    #[tokio::test]
    async fn callers_in_flight_at_the_first_hang_use_up_no_retries() {
        let path = Path::new("/hung/shared-ca.pem");
        let deadline = Duration::from_millis(50);
        let (calls, releases): (Vec<_>, Vec<_>) =
            (0..MAX_RETRIES_ALIVE).map(|_| hung_call()).unzip();
        let mut hangs = tokio::task::JoinSet::new();
        for call in calls {
            hangs.spawn(on_path_within(path, deadline, call));
        }
        while let Some(outcome) = hangs.join_next().await {
            let err = outcome.unwrap_or_else(|e| panic!("{e}")).expect_err("hung");
            assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        }
        assert_eq!(live_calls(path), MAX_RETRIES_ALIVE);
        advance(LONGEST_WAIT * 4).await;
        let again = on_path_within(path, deadline, || Ok(())).await;
        assert!(again.is_ok(), "tried again: {again:?}");
        drop(releases);
    }

    /// A caller that stops waiting while its read of a slow but healthy
    /// file runs leaves the path taken for stuck; once that read returned,
    /// two reads at once (two components sharing the file) both run.
    #[tokio::test]
    async fn a_given_up_read_that_returned_refuses_no_later_reads() {
        let path = Path::new("/slow/ca.pem");
        let slow = || {
            || {
                std::thread::sleep(Duration::from_millis(100));
                Ok(())
            }
        };
        let deadline = Duration::from_secs(5);
        let waited = Duration::from_millis(10);
        let gone = tokio::time::timeout(waited, on_path_within(path, deadline, slow())).await;
        assert!(gone.is_err(), "the slow read answered within 10 ms");
        testkit::soon("the slow read returned", async {
            while live_calls(path) > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let (first, second) = tokio::join!(
            on_path_within(path, deadline, slow()),
            on_path_within(path, deadline, slow()),
        );
        assert!(first.is_ok(), "{first:?}");
        assert!(second.is_ok(), "{second:?}");
    }

    /// A caller that stops waiting before the deadline (a follower
    /// stopped, a request timed out) while its call hangs on a FIFO (as on
    /// a hung mount) leaves the path stuck: the next call is refused at
    /// once, no second thread started.
    #[tokio::test]
    async fn a_caller_gone_before_the_deadline_leaves_the_path_stuck() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fifo = dir.path().join("ca.pem");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let started = Arc::new(AtomicUsize::new(0));
        let read = || {
            let (started, fifo) = (Arc::clone(&started), fifo.clone());
            move || {
                started.fetch_add(1, SeqCst);
                std::fs::read(fifo)
            }
        };
        let deadline = Duration::from_secs(2);
        let waited = Duration::from_millis(200);
        let gone = tokio::time::timeout(waited, on_path_within(&fifo, deadline, read())).await;
        assert!(gone.is_err(), "the read of a FIFO with no writer returned");
        let asked = std::time::Instant::now();
        let next = on_path_within(&fifo, deadline, read()).await;
        let took = asked.elapsed();
        let err = next.expect_err("stuck");
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(started.load(SeqCst), 1, "reads started");
        // A writer lets the stuck read return.
        std::thread::spawn(move || std::fs::write(fifo, b"released"));
    }
}
