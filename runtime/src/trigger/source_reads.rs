//! The configuration sources' reads, run on demand: a control-plane change
//! first has what was saved to the file before it read and queued (the
//! watch settles events for 100 ms before reading), so the change is laid
//! over the file's newer content, not under it.
//!
//! The change waits [`CONFIG_READ_DEADLINE`] at most for them: a read may
//! wait for a file being written (minutes, see [`crate::fs_watch`]) or for
//! a large folder on a slow mount (a minute), and the change holds the
//! control plane's turn meanwhile. A read not done by then goes on in the
//! background (queued when done, as a watch's read is), the change goes
//! ahead of it, and a later change waits for that same read rather than
//! start another.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fs_read::CONFIG_READ_DEADLINE;
use crate::fs_watch::OnChange;

/// The reads of the watches running (one per runtime).
#[derive(Default)]
pub(crate) struct SourceReads {
    /// Each watch's read, until its watch stops.
    reads: Mutex<Vec<Registered>>,
}

/// One watch's read, and the run of it started on demand, if any.
#[derive(Clone)]
struct Registered {
    stop: CancellationToken,
    read: OnChange,
    /// Turns `true` when the run started on demand ends.
    running: std::sync::Arc<Mutex<Option<watch::Receiver<bool>>>>,
}

impl Registered {
    /// Starts a run of the read unless the one started earlier has not
    /// ended (its end is waited for instead); its end.
    fn run(&self) -> watch::Receiver<bool> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ends) = running.as_ref() {
            if !*ends.borrow() {
                return ends.clone();
            }
        }
        let (ended, ends) = watch::channel(false);
        let read = (self.read)();
        tokio::spawn(async move {
            read.await;
            let _ = ended.send(true);
        });
        *running = Some(ends.clone());
        ends
    }
}

/// Some configuration sources were not read in time for a control-plane
/// change.
#[derive(Debug, thiserror::Error)]
#[error("{late} of the configuration sources' reads did not finish within {} ms (a file still being written, or a slow read; it goes on and is applied when done); the change goes ahead of their newest content", .limit.as_millis())]
pub(crate) struct NotReadInTime {
    /// How many reads were not done.
    late: usize,
    /// How long they were waited for.
    limit: Duration,
}

impl SourceReads {
    /// Adds the read of a watch that ends when `stop` is cancelled.
    pub(crate) fn register(&self, stop: CancellationToken, read: OnChange) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.retain(|registered| !registered.stop.is_cancelled());
        reads.push(Registered {
            stop,
            read,
            running: Default::default(),
        });
    }

    /// Runs every running watch's read now (each bounded in time as a
    /// watch's own read is, and waiting for one in progress), sending
    /// what changed to the reload queue; waits [`CONFIG_READ_DEADLINE`]
    /// at most for them (see the module's doc).
    pub(crate) async fn read_now(&self) -> Result<(), NotReadInTime> {
        self.read_within(CONFIG_READ_DEADLINE).await
    }

    /// [`read_now`](Self::read_now), waiting `limit` at most.
    async fn read_within(&self, limit: Duration) -> Result<(), NotReadInTime> {
        let reads: Vec<Registered> = {
            let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
            reads.retain(|registered| !registered.stop.is_cancelled());
            reads.clone()
        };
        let until = tokio::time::Instant::now() + limit;
        let runs: Vec<_> = reads.iter().map(Registered::run).collect();
        let mut late = 0;
        for mut run in runs {
            // A run that panicked (its sender dropped) is over too.
            let ended = tokio::time::timeout_at(until, run.wait_for(|ended| *ended)).await;
            if ended.is_err() {
                late += 1;
            }
        }
        match late {
            0 => Ok(()),
            late => Err(NotReadInTime { late, limit }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_read_holds_a_control_plane_change_back_the_read_deadline_at_most() {
        let reads = SourceReads::default();
        let started = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&started);
        // A folder read of 40 steps of 500 ms (20 s), or a file still
        // being written.
        let slow: OnChange = Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(tokio::time::sleep(Duration::from_secs(20)))
        });
        reads.register(CancellationToken::new(), slow);
        let asked = tokio::time::Instant::now();
        let read = reads.read_now().await;
        assert_eq!(asked.elapsed(), CONFIG_READ_DEADLINE, "the change waited");
        let err = read.err().map(|err| err.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "1 of the configuration sources' reads did not finish within 5000 ms (a file \
                 still being written, or a slow read; it goes on and is applied when done); \
                 the change goes ahead of their newest content"
            )
        );
        // The next change waits for the same read, not a new one.
        let asked = tokio::time::Instant::now();
        assert!(reads.read_now().await.is_err());
        assert_eq!(asked.elapsed(), CONFIG_READ_DEADLINE);
        assert_eq!(started.load(Ordering::SeqCst), 1, "reads started");
        // Once it is done, a change starts a new one and has it.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let fast: OnChange = Arc::new(|| Box::pin(async {}));
        reads.register(CancellationToken::new(), fast);
        let asked = tokio::time::Instant::now();
        assert!(matches!(
            reads.read_now().await,
            Err(NotReadInTime { late: 1, .. })
        ));
        assert_eq!(started.load(Ordering::SeqCst), 2, "reads started");
        assert_eq!(asked.elapsed(), CONFIG_READ_DEADLINE);
        // Reads done in time: the change has them at once.
        let quick = SourceReads::default();
        quick.register(CancellationToken::new(), Arc::new(|| Box::pin(async {})));
        let asked = tokio::time::Instant::now();
        assert!(quick.read_now().await.is_ok());
        assert_eq!(asked.elapsed(), Duration::ZERO);
    }
}
