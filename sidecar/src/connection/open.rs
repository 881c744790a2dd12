//! The open connections of one listener and their slots under the cap:
//! at the cap, a new client takes the place of the connection idle the
//! longest, so keep-alive connections that made a request and went quiet
//! cannot lock other clients out for the idle timeout.
//!
//! Only a connection that has finished a request and has none in flight
//! is evicted: one with a request in flight never is, nor one that has not
//! started its first (a client just arrived; those are closed after
//! [`FIRST_REQUEST_LIMIT`](super::FIRST_REQUEST_LIMIT) anyway). The set is
//! locked when a connection comes, goes or is looked for at the cap, never
//! per request: a connection reads its notice with an atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Context;

use futures_util::task::AtomicWaker;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::in_flight::InFlight;

/// One listener's open connections and the slots they hold.
#[derive(Debug)]
pub struct OpenConnections {
    slots: Arc<Semaphore>,
    members: Mutex<HashMap<u64, Member>>,
    next_id: AtomicU64,
    /// Told when the last connection goes.
    emptied: Notify,
}

#[derive(Debug)]
struct Member {
    in_flight: InFlight,
    notice: Arc<Notice>,
}

/// What a connection is asked to do: close gracefully (evicted at the cap,
/// or the server draining); read by its server task and its socket.
#[derive(Debug, Default)]
pub struct Notice {
    evicted: AtomicBool,
    draining: AtomicBool,
    /// The task serving the connection (HTTP: it shuts hyper's connection
    /// down gracefully, with GOAWAY on HTTP/2).
    serving: AtomicWaker,
    /// The connection's socket wrapper, waiting to read (it closes an
    /// evicted connection that is still idle, see `io`).
    socket: AtomicWaker,
}

impl Notice {
    /// Whether the server should shut the connection down gracefully;
    /// wakes `cx` when it should, if not yet.
    pub fn poll_close(&self, cx: &mut Context<'_>) -> bool {
        if self.asked_to_close() {
            return true;
        }
        self.serving.register(cx.waker());
        self.asked_to_close()
    }

    /// Whether the connection was evicted at the cap; wakes `cx` when it
    /// is, if not yet.
    pub(super) fn poll_evicted(&self, cx: &mut Context<'_>) -> bool {
        if self.evicted.load(Ordering::Acquire) {
            return true;
        }
        self.socket.register(cx.waker());
        self.evicted.load(Ordering::Acquire)
    }

    fn asked_to_close(&self) -> bool {
        self.evicted.load(Ordering::Acquire) || self.draining.load(Ordering::Acquire)
    }

    fn wake(&self) {
        self.serving.wake();
        self.socket.wake();
    }
}

/// A slot taken under the cap, for the connection about to be made.
#[derive(Debug)]
pub struct Slot {
    permit: OwnedSemaphorePermit,
    open: Arc<OpenConnections>,
}

/// A connection's place in the set, and its slot, until it is dropped.
#[derive(Debug)]
pub struct Membership {
    _permit: OwnedSemaphorePermit,
    open: Arc<OpenConnections>,
    id: u64,
    notice: Arc<Notice>,
}

impl OpenConnections {
    /// At most `max_connections` open at once (at least one).
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max_connections.max(1))),
            members: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            emptied: Notify::new(),
        })
    }

    /// A free slot, if there is one now.
    pub fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        Some(self.slot_of(permit))
    }

    /// The next slot that frees (`None` once the semaphore is closed,
    /// which it never is).
    pub async fn slot(self: &Arc<Self>) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).acquire_owned().await.ok()?;
        Some(self.slot_of(permit))
    }

    fn slot_of(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            permit,
            open: Arc::clone(self),
        }
    }

    /// Asks the connection idle the longest (a request finished, none in
    /// flight, not already asked) to close, so that its slot frees;
    /// `false` when there is none.
    pub fn evict_longest_idle(&self) -> bool {
        let members = self.members();
        let longest = members
            .values()
            .filter(|member| !member.notice.asked_to_close() && !member.in_flight.never_started())
            .filter_map(|member| Some((member.in_flight.idle_since()?, member)))
            .min_by_key(|(since, _)| *since);
        let Some((since, member)) = longest else {
            return false;
        };
        member.notice.evicted.store(true, Ordering::Release);
        member.notice.wake();
        tracing::debug!(
            idle_for = ?Instant::now().saturating_duration_since(since),
            "Connection cap reached: the connection idle the longest is closed for a new client."
        );
        true
    }

    /// Asks every connection to close gracefully (the server stops).
    pub fn drain(&self) {
        for member in self.members().values() {
            member.notice.draining.store(true, Ordering::Release);
            member.notice.wake();
        }
    }

    /// Waits until no connection is open (bounded by the shutdown cut,
    /// which ends every connection).
    pub async fn closed(&self) {
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.members().is_empty() {
                return;
            }
            emptied.await;
        }
    }

    fn members(&self) -> MutexGuard<'_, HashMap<u64, Member>> {
        // Nothing panics while holding it; a poisoned set is still whole.
        self.members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Slot {
    /// The slot, held by the connection counted by `in_flight`.
    pub fn join(self, in_flight: &InFlight) -> Membership {
        let id = self.open.next_id.fetch_add(1, Ordering::Relaxed);
        let notice = Arc::new(Notice::default());
        self.open.members().insert(
            id,
            Member {
                in_flight: in_flight.clone(),
                notice: Arc::clone(&notice),
            },
        );
        Membership {
            _permit: self.permit,
            open: self.open,
            id,
            notice,
        }
    }
}

impl Membership {
    /// What the connection is asked to do.
    pub fn notice(&self) -> &Arc<Notice> {
        &self.notice
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut members = self.open.members();
        members.remove(&self.id);
        if members.is_empty() {
            self.open.emptied.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn noop() -> Context<'static> {
        Context::from_waker(std::task::Waker::noop())
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_is_evicted_never_a_busy_or_a_new_one() {
        let open = OpenConnections::new(4);
        let join = |open: &Arc<OpenConnections>| {
            let in_flight = InFlight::new();
            let membership = open.try_slot().expect("a free slot").join(&in_flight);
            (in_flight, membership)
        };
        let (_, never_started) = join(&open);
        let (older, older_member) = join(&open);
        drop(older.start());
        tokio::time::advance(Duration::from_secs(1)).await;
        let (busy, busy_member) = join(&open);
        drop(busy.start());
        let (newer, newer_member) = join(&open);
        let _held = busy.start();
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(newer.start());
        assert!(open.try_slot().is_none(), "the cap is 4");

        assert!(open.evict_longest_idle());
        let mut cx = noop();
        assert!(older_member.notice().poll_evicted(&mut cx));
        assert!(!newer_member.notice().poll_evicted(&mut cx));
        assert!(open.evict_longest_idle(), "the next longest idle");
        assert!(newer_member.notice().poll_evicted(&mut cx));
        assert!(!open.evict_longest_idle(), "one busy, one never started");
        assert!(!busy_member.notice().poll_evicted(&mut cx));
        assert!(!never_started.notice().poll_evicted(&mut cx));

        drop(older_member);
        assert!(open.try_slot().is_some(), "its slot freed when it went");
    }

    #[tokio::test]
    async fn drained_connections_are_asked_to_close_and_waited_for() {
        let open = OpenConnections::new(2);
        let member = open.try_slot().expect("slot").join(&InFlight::new());
        open.drain();
        assert!(member.notice().poll_close(&mut noop()));
        assert!(!member.notice().poll_evicted(&mut noop()));
        let waiting = tokio::spawn({
            let open = Arc::clone(&open);
            async move { open.closed().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one is still open");
        drop(member);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("closed once the last went")
            .expect("task");
    }
}
