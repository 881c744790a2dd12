//! The bound on the blocking operations of `local` stores on one
//! filesystem running at once (opens, stats, listings, deletes). Each runs
//! on tokio's blocking pool, shared by the whole process (every `tokio::fs`
//! read, DNS lookups): on a hung mount (NFS, FUSE) each call would keep a
//! thread for good, and a flood of calls would take the pool's 512
//! threads, stalling every other user of it — downloads, redis
//! reconnections. The places are the filesystem's (its device, `st_dev`),
//! not a store's nor a root's ([`BlockingOps::of_device`]): a hung mount
//! stalls every folder on it, so every store with its root there (two
//! stores, one root per tenant under one NFS mount, or the instances a
//! reload builds while the old one's stuck operations still run) shares
//! them. An operation takes a place before it starts and keeps it until it
//! returns, however long after its caller gave up. A call finding no place
//! waits for one, in turn; it fails (never starting another thread on the
//! disk) once it has waited [`PLACE_WAIT`] and no operation has returned
//! for that long either (the disk is stuck: the error says for how long),
//! or after [`BUSY_WAIT`] while operations keep returning (a slow disk
//! under load, a flood of listings, or one operation stuck while the
//! other places cycle, is not taken for a hung disk). Puts are bounded by
//! the sidecar's uploads instead ([`super::held`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rewire_runtime::FileError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Blocking operations on one filesystem running at once.
pub(super) const MAX_BLOCKING_OPS: usize = 32;
/// How long a call waits for a place before failing, if no operation has
/// returned for that long either (the disk is stuck).
pub(super) const PLACE_WAIT: Duration = Duration::from_secs(10);
/// Longest a call waits for a place while operations keep returning.
pub(super) const BUSY_WAIT: Duration = Duration::from_secs(60);

/// A filesystem's identity: the device (`st_dev`) of a folder on it.
pub(super) type Device = u64;

/// The places of the blocking operations on one filesystem (cheap to
/// clone: clones share them).
#[derive(Debug, Clone)]
pub(super) struct BlockingOps(Arc<Places>);

/// What the stores on one filesystem share.
#[derive(Debug)]
struct Places {
    free: Arc<Semaphore>,
    running: Mutex<Running>,
    max: usize,
    /// How long a waiting call waits, no operation returning meanwhile,
    /// before it fails.
    wait: Duration,
    /// How long a call waits at most.
    busy_wait: Duration,
}

/// When each running operation took its place, by serial (serials are
/// given in order of time: the first entry is the oldest), and when one
/// last returned.
#[derive(Debug, Default)]
struct Running {
    next: u64,
    started: BTreeMap<u64, Instant>,
    last_returned: Option<Instant>,
}

/// A place taken by an operation: given back, and the operation counted
/// as returned, when dropped (once it has returned).
struct Taken {
    places: Arc<Places>,
    serial: u64,
    // Dropped after `drop` below: the operation no longer counts as
    // running before its place goes to the next one.
    _place: OwnedSemaphorePermit,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut running = self.places.running();
        running.started.remove(&self.serial);
        running.last_returned = Some(Instant::now());
    }
}

/// The places of every filesystem with a store (or a stuck operation)
/// alive.
fn devices() -> MutexGuard<'static, HashMap<Device, Weak<Places>>> {
    static DEVICES: OnceLock<Mutex<HashMap<Device, Weak<Places>>>> = OnceLock::new();
    DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl Places {
    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the oldest running operation took its place, and when an
    /// operation last returned.
    fn oldest_and_last_returned(&self) -> (Option<Instant>, Option<Instant>) {
        let running = self.running();
        (
            running.started.values().next().copied(),
            running.last_returned,
        )
    }
}

impl BlockingOps {
    /// `max` places, not shared with any other store: a call waiting
    /// `wait` for one fails if no operation has returned for `wait` either.
    pub(super) fn new(max: usize, wait: Duration) -> Self {
        Self::with_waits(max, wait, BUSY_WAIT)
    }

    /// [`BlockingOps::new`], a call waiting `busy_wait` at most.
    fn with_waits(max: usize, wait: Duration, busy_wait: Duration) -> Self {
        Self(Arc::new(Places {
            free: Arc::new(Semaphore::new(max)),
            running: Default::default(),
            max,
            wait,
            busy_wait,
        }))
    }

    /// The places of the filesystem `device` ([`MAX_BLOCKING_OPS`]),
    /// shared by every store with its root on it (whatever folder) as long
    /// as one is alive or one of their operations still runs.
    pub(super) fn of_device(device: Device) -> Self {
        let mut devices = devices();
        if let Some(places) = devices.get(&device).and_then(Weak::upgrade) {
            return Self(places);
        }
        devices.retain(|_, places| places.strong_count() > 0);
        let ops = Self::new(MAX_BLOCKING_OPS, PLACE_WAIT);
        devices.insert(device, Arc::downgrade(&ops.0));
        ops
    }

    /// Runs the blocking `op` off the runtime (as `tokio::fs` does) once a
    /// place is free, keeping it until `op` returns.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        let taken = self.take().await?;
        tokio::task::spawn_blocking(move || {
            let _taken = taken;
            op()
        })
        .await
        .map_err(|err| FileError::Backend(format!("the file store's task failed: {err}")))?
    }

    /// Waits for a place (in turn: the semaphore is fair) until one is
    /// free, the call has waited the bound with no operation returning
    /// meanwhile, or the call has waited [`BUSY_WAIT`].
    async fn take(&self) -> Result<Taken, FileError> {
        let places = &self.0;
        let called = Instant::now();
        let give_up = called + places.busy_wait;
        let free = Arc::clone(&places.free).acquire_owned();
        tokio::pin!(free);
        loop {
            // Looked at again once the call has waited the bound since it
            // was called or an operation last returned, whichever is later.
            let (_, returned) = places.oldest_and_last_returned();
            let stuck_at = returned.map_or(called, |at| at.max(called)) + places.wait;
            tokio::select! {
                biased;
                place = &mut free => {
                    let place = place
                        .map_err(|_| FileError::Backend("the file store is closed".into()))?;
                    return Ok(self.taken(place));
                }
                () = tokio::time::sleep_until(stuck_at.min(give_up)) => {}
            }
            let now = Instant::now();
            let (oldest, returned) = places.oldest_and_last_returned();
            let quiet_since = returned.map_or(called, |at| at.max(called));
            // Stuck: operations run (none has returned for the bound,
            // while this call waited it); the error says how long the disk
            // has held operations without returning one.
            if let Some(oldest) = oldest {
                if now.saturating_duration_since(quiet_since) >= places.wait {
                    let held =
                        now.saturating_duration_since(returned.map_or(oldest, |at| at.max(oldest)));
                    return Err(FileError::Backend(format!(
                        "the file store's disk has not returned an operation for {held:?} \
                         (a hung mount?); while {} are running, no more are started until \
                         one returns",
                        places.max
                    )));
                }
            }
            if now >= give_up {
                return Err(FileError::Backend(format!(
                    "the file store is busy: its {} places for blocking operations stayed \
                     taken for {:?} by operations still returning (a slow disk?)",
                    places.max, places.busy_wait
                )));
            }
        }
    }

    /// Counts `place` as taken by an operation starting now.
    fn taken(&self, place: OwnedSemaphorePermit) -> Taken {
        let mut running = self.0.running();
        let serial = running.next;
        running.next += 1;
        running.started.insert(serial, Instant::now());
        Taken {
            places: Arc::clone(&self.0),
            serial,
            _place: place,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;

    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    use super::*;

    /// Lets the spawned calls run until they wait.
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    /// A call whose operation holds its place until `release` is sent or
    /// dropped; `started` fires once the operation runs.
    fn held_call(
        ops: &BlockingOps,
    ) -> (
        JoinHandle<Result<(), FileError>>,
        oneshot::Receiver<()>,
        mpsc::Sender<()>,
    ) {
        let (started_tx, started) = oneshot::channel();
        let (release, released) = mpsc::channel::<()>();
        let ops = ops.clone();
        let call = tokio::spawn(async move {
            ops.run(move || {
                let _ = started_tx.send(());
                let _ = released.recv();
                Ok(())
            })
            .await
        });
        (call, started, release)
    }

    /// Two operations stuck on a hung disk, their callers gone: a third
    /// is refused after the wait without starting, naming how long the
    /// oldest has run; once one returns, the next runs.
    /// Failed before the bound: every call started a blocking thread on
    /// the stuck disk.
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
                .contains("has not returned an operation for"),
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

    /// One place, a bound of 100 ms (time paused, moved by hand; it does
    /// not move by itself while an operation runs). A call waits 100 ms
    /// behind operations that return, none running that long: it waits
    /// on and runs (before, it failed as "the disk has not returned" after
    /// its own 100 ms, a failure the store's breaker counts). Then an
    /// operation stuck 140 ms, nothing returning since, the call behind it
    /// waiting 100 ms of them: the call fails, naming how long the disk
    /// has held the operation without returning it, and its operation
    /// never starts.
    #[tokio::test(start_paused = true)]
    async fn a_call_waits_behind_operations_that_return_and_fails_once_one_has_run_the_bound() {
        let ops = BlockingOps::new(1, Duration::from_millis(100));
        let (first, first_started, release_first) = held_call(&ops);
        first_started.await.unwrap();
        let (second, second_started, release_second) = held_call(&ops);
        settle().await;
        tokio::time::advance(Duration::from_millis(10)).await;
        let (third, third_started, release_third) = held_call(&ops);
        settle().await;
        tokio::time::advance(Duration::from_millis(50)).await;
        drop(release_first);
        first.await.unwrap().unwrap();
        // The second took the place in turn, ahead of the third.
        second_started.await.unwrap();
        // The third has waited 100 ms; the running operation ran 50 ms.
        tokio::time::advance(Duration::from_millis(50)).await;
        settle().await;
        assert!(
            !third.is_finished(),
            "a busy store failed a call: {:?}",
            third.await
        );
        drop(release_second);
        second.await.unwrap().unwrap();
        third_started.await.unwrap();
        drop(release_third);
        third.await.unwrap().expect("its turn came");

        let (stuck, stuck_started, release_stuck) = held_call(&ops);
        stuck_started.await.unwrap();
        tokio::time::advance(Duration::from_millis(40)).await;
        let ran = Arc::new(AtomicBool::new(false));
        let waiting = {
            let (ops, ran) = (ops.clone(), Arc::clone(&ran));
            tokio::spawn(async move {
                ops.run(move || {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .await
            })
        };
        settle().await;
        tokio::time::advance(Duration::from_millis(99)).await;
        settle().await;
        assert!(!waiting.is_finished(), "failed before its wait");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert!(waiting.is_finished(), "still waiting on a stuck operation");
        let refused = waiting.await.unwrap().expect_err("the disk is stuck");
        assert!(
            refused
                .to_string()
                .contains("has not returned an operation for 140ms (a hung mount?)"),
            "{refused}"
        );
        assert!(!ran.load(Ordering::SeqCst), "it started on the stuck disk");
        drop(release_stuck);
        stuck.await.unwrap().unwrap();
    }

    /// Two places, a bound of 100 ms (time paused, moved by hand): one
    /// operation stuck for good (a stale handle, one endless listing)
    /// while the other place keeps cycling. A call queued behind the
    /// cycling ones waits 120 ms, the stuck one having run all of them,
    /// but an operation returned 60 ms ago: the disk is not stuck, the
    /// call waits on and runs in its turn. Before, it failed as "the disk
    /// has not returned an operation (a hung mount?)", a failure the
    /// store's breaker counts, although operations returned all along.
    #[tokio::test(start_paused = true)]
    async fn one_stuck_operation_does_not_fail_calls_while_the_other_places_keep_returning() {
        let ops = BlockingOps::with_waits(2, Duration::from_millis(100), Duration::from_secs(1));
        let (stuck, stuck_started, release_stuck) = held_call(&ops);
        stuck_started.await.unwrap();
        let (b, b_started, release_b) = held_call(&ops);
        b_started.await.unwrap();
        let (c, c_started, release_c) = held_call(&ops);
        settle().await;
        let ran = Arc::new(AtomicBool::new(false));
        let waiting = {
            let (ops, ran) = (ops.clone(), Arc::clone(&ran));
            tokio::spawn(async move {
                ops.run(move || {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .await
            })
        };
        settle().await;
        tokio::time::advance(Duration::from_millis(60)).await;
        drop(release_b);
        b.await.unwrap().unwrap();
        // The place B gave back went to C, queued ahead of the call.
        c_started.await.unwrap();
        // The call has waited 120 ms, the stuck operation run 120 ms; B
        // returned 60 ms ago.
        tokio::time::advance(Duration::from_millis(60)).await;
        settle().await;
        assert!(
            !waiting.is_finished(),
            "failed as a hung disk while operations return: {:?}",
            waiting.await
        );
        assert!(!ran.load(Ordering::SeqCst), "it started out of turn");
        drop(release_c);
        c.await.unwrap().unwrap();
        waiting.await.unwrap().expect("its turn came");
        assert!(ran.load(Ordering::SeqCst));
        drop(release_stuck);
        stuck.await.unwrap().unwrap();
    }

    /// Operations that keep returning, never one running the bound, but
    /// so many queued ahead of a call that its turn does not come: it
    /// fails after the longest wait, saying the store is busy (not that
    /// its disk is stuck), and its operation never starts.
    #[tokio::test(start_paused = true)]
    async fn a_call_whose_turn_does_not_come_fails_after_the_longest_wait_saying_the_store_is_busy()
    {
        let ops =
            BlockingOps::with_waits(1, Duration::from_millis(100), Duration::from_millis(150));
        let mut ahead = std::collections::VecDeque::new();
        for _ in 0..4 {
            ahead.push_back(held_call(&ops));
            settle().await;
        }
        let ran = Arc::new(AtomicBool::new(false));
        let waiting = {
            let (ops, ran) = (ops.clone(), Arc::clone(&ran));
            tokio::spawn(async move {
                ops.run(move || {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .await
            })
        };
        settle().await;
        // Every 50 ms the running operation returns and the next one
        // queued ahead of the waiting call takes its place.
        for _ in 0..2 {
            let (call, started, release) = ahead.pop_front().unwrap();
            started.await.unwrap();
            tokio::time::advance(Duration::from_millis(50)).await;
            settle().await;
            assert!(!waiting.is_finished(), "failed: {:?}", waiting.await);
            drop(release);
            call.await.unwrap().unwrap();
        }
        (&mut ahead[0].1).await.unwrap();
        // 150 ms waited; the running operation has run 50 ms of them.
        tokio::time::advance(Duration::from_millis(50)).await;
        settle().await;
        assert!(waiting.is_finished(), "waited past the longest wait");
        let refused = waiting.await.unwrap().expect_err("its turn did not come");
        assert!(
            refused.to_string().contains("the file store is busy"),
            "{refused}"
        );
        assert!(!ran.load(Ordering::SeqCst), "it started out of turn");
        // The one running returns; the one queued behind it failed too.
        for (call, _, release) in ahead {
            drop(release);
            let _ = call.await.unwrap();
        }
    }
}
