//! The bound on a `local` store's blocking operations running at once
//! (opens, stats, listings, deletes). Each runs on tokio's blocking pool,
//! shared by the whole process (every `tokio::fs` read, DNS lookups): on a
//! hung mount (NFS, FUSE) each call would keep a thread for good, and a
//! flood of calls would take the pool's 512 threads, stalling every other
//! user of it — downloads, redis reconnections. An operation takes a place
//! before it starts and keeps it until it returns, however long after its
//! caller gave up; a call finding no place within [`PLACE_WAIT`] fails
//! naming the bound, never starting another thread on the stuck disk.
//! Puts are bounded by the sidecar's uploads instead ([`super::held`]).

use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::FileError;
use tokio::sync::Semaphore;

/// Blocking operations of one store running at once.
pub(super) const MAX_BLOCKING_OPS: usize = 32;
/// How long a call waits for a place.
pub(super) const PLACE_WAIT: Duration = Duration::from_secs(10);

/// The places of one store's blocking operations.
#[derive(Debug, Clone)]
pub(super) struct BlockingOps {
    places: Arc<Semaphore>,
    max: usize,
    wait: Duration,
}

impl Default for BlockingOps {
    fn default() -> Self {
        Self::new(MAX_BLOCKING_OPS, PLACE_WAIT)
    }
}

impl BlockingOps {
    /// `max` places, each waited for `wait` at most.
    pub(super) fn new(max: usize, wait: Duration) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max)),
            max,
            wait,
        }
    }

    /// Runs the blocking `op` off the runtime (as `tokio::fs` does) once a
    /// place is free, keeping it until `op` returns.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        let place = tokio::time::timeout(self.wait, Arc::clone(&self.places).acquire_owned())
            .await
            .map_err(|_| {
                FileError::Backend(format!(
                    "the file store's disk has not returned {} operations for {:?} (a hung \
                     mount?); no more are started until one returns",
                    self.max, self.wait
                ))
            })?
            .map_err(|_| FileError::Backend("the file store is closed".into()))?;
        tokio::task::spawn_blocking(move || {
            let _place = place;
            op()
        })
        .await
        .map_err(|err| FileError::Backend(format!("the file store's task failed: {err}")))?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::*;

    /// Two operations stuck on a hung disk, their callers gone: a third
    /// is refused after the wait without starting, naming the bound; once
    /// one returns, the next runs. Failed before the bound: every call
    /// started a blocking thread on the stuck disk.
    #[tokio::test]
    async fn operations_past_the_bound_wait_for_a_stuck_one_to_return_and_start_no_thread() {
        let ops = BlockingOps::new(2, Duration::from_millis(200));
        let started = Arc::new(AtomicUsize::new(0));
        let (recover, stuck) = mpsc::channel::<()>();
        let stuck = Arc::new(std::sync::Mutex::new(stuck));
        for _ in 0..2 {
            let (started, stuck) = (Arc::clone(&started), Arc::clone(&stuck));
            let call = ops.run(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = stuck.lock().unwrap().recv();
                Ok(())
            });
            // The caller gives up; its operation runs on.
            assert!(tokio::time::timeout(Duration::from_millis(50), call)
                .await
                .is_err());
        }
        let counted = Arc::clone(&started);
        let refused = ops
            .run(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await
            .expect_err("no place");
        assert!(
            refused
                .to_string()
                .contains("has not returned 2 operations"),
            "{refused}"
        );
        assert_eq!(started.load(Ordering::SeqCst), 2, "nothing more started");
        recover.send(()).unwrap();
        let counted = Arc::clone(&started);
        ops.run(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .await
        .expect("a place given back by the operation that returned");
        assert_eq!(started.load(Ordering::SeqCst), 3);
        drop(recover);
    }
}
