//! The events a stream has out with its client, so each answer settles
//! the event it is about.
//!
//! Answers name an event by its CloudEvent id alone, and publishers reuse
//! ids (their own events, a broker's redelivery). So a stream has at most
//! one event per id out at a time: the next one with that id is held
//! ([`Outstanding::hold`]) before it is written to the client until the
//! first is answered. Two events with one id out at once could not be
//! told apart: the client answering the later SUCCESS and the earlier
//! RETRY would acknowledge the failed one (lost) and redeliver the other.
//!
//! An event given up on (its inbound policy's timeout,
//! [`Held::give_up`]) is still with the client, which answers it late:
//! it leaves a marker that keeps its id taken, and keeps it among the
//! events out, until that late answer comes (taken and ignored), its
//! grace passes, or the stream ends. Otherwise the late answer would
//! settle the next event with its id (its retry), acknowledging it before
//! the client saw it. At most [`MAX_GIVEN_UP`] markers are kept.
//!
//! It also keeps the order events were written in, so an event's own time
//! can start when every event written before it is settled
//! ([`Held::oldest`]): what a client handling events one at a time, in
//! order, as the Dapr SDKs do, starts on next. A marker counts as out
//! there only until the client answers an event written after it: a
//! client in order never does that before answering the marker's, so one
//! that has is handling events at once, and a hung event's marker must
//! not hold back every later event's time for the stall limit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rewire_runtime::DeliveryOutcome;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Most events given up on whose late answer a stream still waits for
/// (their markers): past it the oldest marker is dropped (its id free at
/// once), so a client answering nothing late cannot grow them. Many
/// times the engine's in-flight events per subscription (32).
pub(super) const MAX_GIVEN_UP: usize = 256;

/// The events out on one stream, by id.
pub(super) struct Outstanding {
    events: Mutex<Events>,
    /// Told each time an event leaves (answered, given up on, its marker
    /// gone): the events holding its id or written after it look again.
    left: watch::Sender<()>,
}

#[derive(Default)]
struct Events {
    /// At most one event per id: held (not yet written), written, or
    /// given up on and not yet answered.
    by_id: HashMap<String, Entry>,
    /// The events out with the client, by the order they were written:
    /// written and not settled, or given up on and not yet answered.
    written: BTreeSet<u64>,
    /// The events given up on and not yet answered, by when their grace
    /// ends (then their order).
    given_up_until: BTreeSet<(Instant, u64)>,
    /// The same, by their order, with their id.
    given_up: BTreeMap<u64, String>,
    /// Tells one holder from a later one of the same id.
    next_ticket: u64,
    /// The next order number to write.
    next_order: u64,
    /// The latest-written event the client has answered (settled, or
    /// answered late), by its order: markers written before it no longer
    /// count as out for [`Held::oldest`].
    latest_answered: Option<u64>,
}

struct Entry {
    ticket: u64,
    state: State,
}

enum State {
    /// Its id taken, not yet written.
    Held,
    /// Written: its order number and where its answer goes.
    Written {
        order: u64,
        waiter: oneshot::Sender<DeliveryOutcome>,
    },
    /// Given up on with no answer yet: its order number and the end of
    /// its grace.
    GivenUp { order: u64, until: Instant },
}

/// What an answer was about.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Matched {
    /// An event out: settled with it.
    Settled,
    /// An event given up on: the late answer is taken, and ignored.
    Late,
    /// No event out (never sent, answered already, its grace passed, or
    /// one held has not reached the client): ignored.
    Unknown,
}

impl Default for Outstanding {
    fn default() -> Self {
        Self {
            events: Mutex::default(),
            left: watch::channel(()).0,
        }
    }
}

impl Events {
    /// Forgets the marker of the event given up on written `order`: its
    /// id is free, and it is no longer out.
    fn forget_given_up(&mut self, order: u64) {
        let Some(id) = self.given_up.remove(&order) else {
            return;
        };
        if let Some(Entry {
            state: State::GivenUp { order: ours, until },
            ..
        }) = self.by_id.get(&id)
        {
            if *ours == order {
                self.given_up_until.remove(&(*until, order));
                self.by_id.remove(&id);
            }
        }
        self.written.remove(&order);
    }

    /// Forgets the markers whose grace has passed; whether any was.
    fn expire(&mut self, now: Instant) -> bool {
        let mut expired = false;
        while let Some(&(until, order)) = self.given_up_until.first() {
            if until > now {
                break;
            }
            self.given_up_until.remove(&(until, order));
            self.forget_given_up(order);
            expired = true;
        }
        expired
    }

    /// Whether the event written `order` is a marker the client has gone
    /// past (answered an event written after it), so not out for
    /// [`Held::oldest`]: its id stays taken.
    fn passed_marker(&self, order: u64) -> bool {
        self.given_up.contains_key(&order)
            && self.latest_answered.is_some_and(|latest| latest > order)
    }

    /// Notes that the client answered the event written `order`.
    fn answered(&mut self, order: u64) {
        self.latest_answered = Some(self.latest_answered.map_or(order, |l| l.max(order)));
    }

    /// When the next marker's grace ends, if any is kept.
    fn next_expiry(&self) -> Option<Instant> {
        self.given_up_until.first().map(|(until, _)| *until)
    }
}

impl Outstanding {
    /// The events, with the markers whose grace has passed forgotten
    /// (and those waiting on them told).
    fn events(&self) -> MutexGuard<'_, Events> {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if events.expire(Instant::now()) {
            self.left.send_replace(());
        }
        events
    }

    /// Takes `id` for one event, once no other event with it is out (nor
    /// given up on and unanswered, within its grace). Not bounded here
    /// beyond that grace: its caller bounds the wait (the stream's end,
    /// the client's progress). Given back when the [`Held`] is dropped.
    pub(super) async fn hold(&self, id: &str) -> Held<'_> {
        let mut left = self.left.subscribe();
        loop {
            let next_expiry = {
                let mut events = self.events();
                if !events.by_id.contains_key(id) {
                    let ticket = events.next_ticket;
                    events.next_ticket += 1;
                    let entry = Entry {
                        ticket,
                        state: State::Held,
                    };
                    events.by_id.insert(id.to_owned(), entry);
                    return Held {
                        outstanding: self,
                        id: id.to_owned(),
                        ticket,
                    };
                }
                events.next_expiry()
            };
            changed_or_expired(&mut left, next_expiry).await;
        }
    }

    /// Settles the written event `id` with `outcome`, or takes the late
    /// answer to one given up on; `counted` is called first when it was
    /// either (the client answered an event it had), so the client's
    /// progress is seen before the event settles.
    pub(super) fn answer(
        &self,
        id: &str,
        outcome: DeliveryOutcome,
        counted: impl FnOnce(),
    ) -> Matched {
        let mut events = self.events();
        let (matched, late) = match events.by_id.get(id).map(|entry| &entry.state) {
            Some(State::Written { .. }) => (Matched::Settled, None),
            Some(State::GivenUp { order, .. }) => (Matched::Late, Some(*order)),
            Some(State::Held) | None => return Matched::Unknown,
        };
        counted();
        if let Some(order) = late {
            events.answered(order);
            events.forget_given_up(order);
        } else if let Some(Entry {
            state: State::Written { order, waiter },
            ..
        }) = events.by_id.remove(id)
        {
            events.answered(order);
            events.written.remove(&order);
            let _ = waiter.send(outcome);
        }
        drop(events);
        self.left.send_replace(());
        matched
    }
}

/// Resolves once an event leaves, or at `deadline` (a marker's grace
/// ending) when there is one.
async fn changed_or_expired(left: &mut watch::Receiver<()>, deadline: Option<Instant>) {
    let expired = async {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        // The sender lives as long as the `Outstanding`: it cannot be
        // dropped while this waits.
        _ = left.changed() => {}
        () = expired => {}
    }
}

/// One event's hold on its id, given back when dropped (or
/// [`released`](Held::release)): an answer to it after that is ignored.
pub(super) struct Held<'a> {
    outstanding: &'a Outstanding,
    id: String,
    ticket: u64,
}

impl Held<'_> {
    /// Writes the event with `write` (called under the lock, so the order
    /// numbers are the order the client reads in); its answer comes on
    /// what is returned.
    pub(super) fn write(&self, write: impl FnOnce()) -> oneshot::Receiver<DeliveryOutcome> {
        let (waiter, answer) = oneshot::channel();
        let mut events = self.outstanding.events();
        let order = events.next_order;
        events.next_order += 1;
        let mut written = false;
        if let Some(entry) = events.by_id.get_mut(&self.id) {
            if entry.ticket == self.ticket && matches!(entry.state, State::Held) {
                entry.state = State::Written { order, waiter };
                written = true;
            }
        }
        if written {
            events.written.insert(order);
        }
        write();
        answer
    }

    /// Resolves once every event written before this one is settled, or
    /// given up on and answered late (or past its grace, or passed: the
    /// client answered an event written after it): at once when this one
    /// is settled, or not written.
    pub(super) async fn oldest(&self) {
        let mut left = self.outstanding.left.subscribe();
        loop {
            let next_expiry = {
                let events = self.outstanding.events();
                let order = match events.by_id.get(&self.id) {
                    Some(Entry {
                        ticket,
                        state: State::Written { order, .. },
                    }) if *ticket == self.ticket => *order,
                    _ => return,
                };
                let first_out = events
                    .written
                    .iter()
                    .find(|&&before| !events.passed_marker(before));
                if first_out == Some(&order) {
                    return;
                }
                events.next_expiry()
            };
            changed_or_expired(&mut left, next_expiry).await;
        }
    }

    /// Gives the event up unanswered: its answer is no longer waited on,
    /// but its id stays taken, and it stays out, until the client's late
    /// answer to it (then taken and ignored) or for `grace`. Does nothing
    /// once it was answered; gives the id back at once if never written.
    pub(super) fn give_up(&self, grace: Duration) {
        let mut events = self.outstanding.events();
        let now = Instant::now();
        let until = now.checked_add(grace).unwrap_or(now);
        let order = match events.by_id.get_mut(&self.id) {
            Some(entry) if entry.ticket == self.ticket => match entry.state {
                State::Written { order, .. } => {
                    // The answer's waiter is dropped with its state.
                    entry.state = State::GivenUp { order, until };
                    order
                }
                State::GivenUp { .. } => return,
                State::Held => {
                    drop(events);
                    self.release();
                    return;
                }
            },
            _ => return,
        };
        events.given_up_until.insert((until, order));
        events.given_up.insert(order, self.id.clone());
        while events.given_up.len() > MAX_GIVEN_UP {
            let Some((&oldest, _)) = events.given_up.first_key_value() else {
                break;
            };
            events.forget_given_up(oldest);
        }
        drop(events);
        self.outstanding.left.send_replace(());
    }

    /// Gives the id back: the event is no longer waited on, and an answer
    /// to it is ignored. Does nothing once it was answered, or given up
    /// on (its marker stays).
    pub(super) fn release(&self) {
        let mut events = self.outstanding.events();
        let ours = events.by_id.get(&self.id).is_some_and(|entry| {
            entry.ticket == self.ticket && !matches!(entry.state, State::GivenUp { .. })
        });
        if !ours {
            return;
        }
        if let Some(Entry {
            state: State::Written { order, .. },
            ..
        }) = events.by_id.remove(&self.id)
        {
            events.written.remove(&order);
        }
        drop(events);
        self.outstanding.left.send_replace(());
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
