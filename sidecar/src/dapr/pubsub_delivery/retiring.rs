//! When a retired subscription may end early: it caught up with a later
//! subscription of its lineage, and it has read again every event it
//! handed back to its broker since it was retired (or its broker, given
//! the time to, gave it nothing).
//!
//! An event handed back (settled `RETRY`: the app failed it, or it was
//! cut when the subscription stopped) goes back to the broker, which may
//! give it again to this subscription alone: the memory broker re-queues
//! it for the subscription that failed it (after its `REDELIVER_AFTER`,
//! 500 ms, behind what that one already holds) and drops it with that
//! subscription's queue. One published before the later subscription
//! subscribed reaches that one by no other way: ended before it read it
//! again, this one lost it, acknowledged to its publisher. So the events
//! handed back while retired are *owed* (kept by a hash of their broker
//! id and payload) until read again, and a caught-up subscription that
//! owes one ends only once it has read it again, or once it waited ready
//! to take an event (a slot in flight free) for [`HANDOVER_GRACE`] with
//! nothing handed back meanwhile and its broker gave it nothing (the
//! bound within which a broker that gives a failed event back to the same
//! subscription does so, as the idle grace already assumes). Redis
//! Streams keeps a handed-back entry pending for the group, whose readers
//! all share one consumer name: any of them (the running subscription
//! too) takes it over after `processingTimeout`, so it may never come
//! back to this one, nor is it lost when this one ends; the grace ends
//! the wait there. One handed back shortly before the retirement (within
//! [`HANDOVER_LIMIT`]: it may still be queued behind others), or past
//! [`MAX_OWED`], is not known by its hash: owing only such ones, it ends
//! [`HANDOVER_GRACE`] after the last hand-back, whatever its broker gives
//! it, and never while a delivery is queued for it (see
//! [`Handover::caught_up_and_owing_nothing`]).
//!
//! Every wait stays within [`HANDOVER_LIMIT`], at which an event still
//! failing goes back to the broker as at a replaced broker's drain limit
//! (on the memory broker: lost). Before it is retired, a subscription
//! only counts its hand-backs (two atomic stores, on a failure only) and
//! reads nothing of this.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rewire_runtime::Message;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{HANDOVER_GRACE, HANDOVER_LIMIT};

/// Handed-back events a retired subscription keeps owed, at most (past
/// them, it waits for its broker's quiet instead).
pub const MAX_OWED: usize = 4096;

/// What a retired subscription knows of its hand-over: whether it caught
/// up, and what it handed back and has not read again.
#[derive(Debug)]
pub(super) struct Handover {
    /// Told by an event a later subscription of its lineage delivered.
    pub caught_up: CancellationToken,
    /// Events handed back so far.
    handed_back: AtomicU64,
    /// When an event was last handed back, in nanoseconds after `since`
    /// plus one (0: none yet).
    last_handed_back: AtomicU64,
    since: Instant,
    /// Set once retired: from then on hand-backs are owed.
    retired: AtomicBool,
    /// Events owed, so a read looks at `owed` only when there are some.
    owing: AtomicUsize,
    /// How many times each event (by its hash) is owed.
    owed: Mutex<HashMap<u64, u32>>,
    /// Something handed back may come back that `owed` does not know.
    owes_unknown: AtomicBool,
}

impl Handover {
    pub fn new() -> Self {
        Self {
            caught_up: CancellationToken::new(),
            handed_back: AtomicU64::new(0),
            last_handed_back: AtomicU64::new(0),
            since: Instant::now(),
            retired: AtomicBool::new(false),
            owing: AtomicUsize::new(0),
            owed: Mutex::new(HashMap::new()),
            owes_unknown: AtomicBool::new(false),
        }
    }

    /// The subscription is retired: what it hands back from now on is
    /// owed; one handed back shortly before may be queued still.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        let Some(nanos) = self.last_handed_back.load(Ordering::SeqCst).checked_sub(1) else {
            return;
        };
        let last = self.since + Duration::from_nanos(nanos);
        if Instant::now().saturating_duration_since(last) < HANDOVER_LIMIT {
            self.owes_unknown.store(true, Ordering::SeqCst);
        }
    }

    /// `message` is handed back to the broker (settled `RETRY`): told
    /// before it is settled and its permit let go. A delivered event does
    /// not come here.
    pub fn handed_back(&self, message: &Message) {
        let after = Instant::now().saturating_duration_since(self.since);
        let nanos = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX - 1);
        self.last_handed_back
            .store(nanos.saturating_add(1), Ordering::SeqCst);
        // Told after the time, so either this owes it or `retire` sees
        // the time.
        if self.retired.load(Ordering::SeqCst) {
            self.owe(message);
        }
        // Counted last: a count that includes this event finds it owed
        // (read first, then `owing`, by `caught_up_and_owing_nothing`).
        self.handed_back.fetch_add(1, Ordering::SeqCst);
    }

    /// Keeps `message` owed (hashed before the lock is taken).
    fn owe(&self, message: &Message) {
        let key = key_of(message);
        let mut owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        if owed.len() >= MAX_OWED {
            self.owes_unknown.store(true, Ordering::SeqCst);
            return;
        }
        *owed.entry(key).or_default() += 1;
        self.owing.store(owed.len(), Ordering::SeqCst);
    }

    /// A retired subscription read `message`: owed, it is owed no more.
    /// One atomic load when nothing is owed.
    pub fn read_again(&self, message: &Message) {
        if self.owing.load(Ordering::SeqCst) == 0 {
            return;
        }
        let key = key_of(message);
        let mut owed = self.owed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(times) = owed.get_mut(&key) {
            *times -= 1;
            if *times == 0 {
                owed.remove(&key);
            }
        }
        self.owing.store(owed.len(), Ordering::SeqCst);
    }

    /// How many events it handed back so far.
    pub fn handed_back_count(&self) -> u64 {
        self.handed_back.load(Ordering::SeqCst)
    }

    /// Whether it owes no event handed back, known or not.
    pub fn owes_nothing(&self) -> bool {
        self.owing.load(Ordering::SeqCst) == 0 && !self.owes_unknown.load(Ordering::SeqCst)
    }

    /// Resolves once caught up and owing nothing; owing events it knows,
    /// once [`HANDOVER_GRACE`] passed with nothing handed back (the
    /// caller drops it when an event comes, so the grace is one its
    /// broker gave it nothing in); owing only events it does not know
    /// (handed back before the retirement, or past [`MAX_OWED`]), once
    /// [`HANDOVER_GRACE`] passed since the last hand-back, whatever its
    /// broker gives it meanwhile (so steady traffic does not hold it to
    /// [`HANDOVER_LIMIT`]): the memory broker queues a handed-back event
    /// again after its `REDELIVER_AFTER` (500 ms), ahead of new ones, and
    /// the caller never ends while a delivery is queued for it, so by then
    /// that event was read or is queued. To the count of events handed
    /// back by then, which the caller reads again for if it grows.
    pub async fn caught_up_and_owing_nothing(&self) -> u64 {
        self.caught_up.cancelled().await;
        loop {
            // Counted first: one handed back after is read again for.
            let seen = self.handed_back_count();
            if self.owes_nothing() {
                return seen;
            }
            if self.owing.load(Ordering::SeqCst) == 0 {
                // Only unknown ones: a deadline that events do not move.
                tokio::time::sleep_until(self.last_handed_back_at() + HANDOVER_GRACE).await;
                // Still owed: the caller keeps from ending over a queued
                // delivery until it ends.
                if self.handed_back_count() == seen {
                    return seen;
                }
                continue;
            }
            tokio::time::sleep(HANDOVER_GRACE).await;
            if self.handed_back_count() == seen {
                return seen;
            }
        }
    }

    /// When an event was last handed back (`since`, if none was).
    fn last_handed_back_at(&self) -> Instant {
        let nanos = self.last_handed_back.load(Ordering::SeqCst);
        self.since + Duration::from_nanos(nanos.saturating_sub(1))
    }
}

/// What identifies an event as its broker gives it again: its broker id
/// and its payload.
fn key_of(message: &Message) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    message.id.hash(&mut hasher);
    message.data.hash(&mut hasher);
    hasher.finish()
}
