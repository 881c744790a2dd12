//! The events a stream has out with its client, so each answer settles
//! the event it is about.
//!
//! Answers name an event by its CloudEvent id alone, and publishers reuse
//! ids (their own events, a broker's redelivery). So a stream has at most
//! one event per id out at a time: the next one with that id is held
//! ([`Outstanding::hold`]) before it is written to the client until the
//! first is answered or given up on. Two events with one id out at once
//! could not be told apart: the client answering the later SUCCESS and
//! the earlier RETRY would acknowledge the failed one (lost) and
//! redeliver the other.
//!
//! It also keeps the order events were written in, so an event's own time
//! can start when every event written before it is settled
//! ([`Held::oldest`]): what a client handling events one at a time, in
//! order, as the Dapr SDKs do, starts on next.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use rewire_runtime::DeliveryOutcome;
use tokio::sync::{oneshot, watch};

/// The events out on one stream, by id.
pub(super) struct Outstanding {
    events: Mutex<Events>,
    /// Told each time an event leaves (answered or given up on): the
    /// events holding its id or written after it look again.
    left: watch::Sender<()>,
}

#[derive(Default)]
struct Events {
    /// At most one event per id: held (not yet written) or written.
    by_id: HashMap<String, Entry>,
    /// The written events not yet settled, by the order they were written.
    written: BTreeSet<u64>,
    /// Tells one holder from a later one of the same id.
    next_ticket: u64,
    /// The next order number to write.
    next_order: u64,
}

struct Entry {
    ticket: u64,
    /// Once written: its order number and where its answer goes.
    written: Option<(u64, oneshot::Sender<DeliveryOutcome>)>,
}

impl Default for Outstanding {
    fn default() -> Self {
        Self {
            events: Mutex::default(),
            left: watch::channel(()).0,
        }
    }
}

impl Outstanding {
    fn events(&self) -> MutexGuard<'_, Events> {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `id` for one event, once no other event with it is out. Not
    /// bounded here: its caller bounds the wait (the stream's end, the
    /// client's progress). Given back when the [`Held`] is dropped.
    pub(super) async fn hold(&self, id: &str) -> Held<'_> {
        let mut left = self.left.subscribe();
        loop {
            {
                let mut events = self.events();
                if !events.by_id.contains_key(id) {
                    let ticket = events.next_ticket;
                    events.next_ticket += 1;
                    let entry = Entry {
                        ticket,
                        written: None,
                    };
                    events.by_id.insert(id.to_owned(), entry);
                    return Held {
                        outstanding: self,
                        id: id.to_owned(),
                        ticket,
                    };
                }
            }
            // The sender lives as long as `self`: it cannot be dropped.
            let _ = left.changed().await;
        }
    }

    /// Settles the written event `id` with `outcome`; false when no
    /// written event has that id (answered late, after it was given up
    /// on; one held has not reached the client, so that answer is about
    /// an earlier event).
    pub(super) fn answer(&self, id: &str, outcome: DeliveryOutcome) -> bool {
        let mut events = self.events();
        let written = matches!(
            events.by_id.get(id),
            Some(Entry {
                written: Some(_),
                ..
            })
        );
        if !written {
            return false;
        }
        if let Some(Entry {
            written: Some((order, waiter)),
            ..
        }) = events.by_id.remove(id)
        {
            events.written.remove(&order);
            let _ = waiter.send(outcome);
        }
        drop(events);
        self.left.send_replace(());
        true
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
        if let Some(entry) = events.by_id.get_mut(&self.id) {
            if entry.ticket == self.ticket {
                entry.written = Some((order, waiter));
                events.written.insert(order);
            }
        }
        write();
        answer
    }

    /// Resolves once every event written before this one is settled (at
    /// once when this one is settled, or not written).
    pub(super) async fn oldest(&self) {
        let mut left = self.outstanding.left.subscribe();
        loop {
            {
                let events = self.outstanding.events();
                let order = match events.by_id.get(&self.id) {
                    Some(Entry {
                        ticket,
                        written: Some((order, _)),
                    }) if *ticket == self.ticket => *order,
                    _ => return,
                };
                if events.written.first() == Some(&order) {
                    return;
                }
            }
            let _ = left.changed().await;
        }
    }

    /// Gives the id back: the event is no longer waited on, and an answer
    /// to it is ignored. Does nothing once it was answered.
    pub(super) fn release(&self) {
        let mut events = self.outstanding.events();
        let ours = events
            .by_id
            .get(&self.id)
            .is_some_and(|entry| entry.ticket == self.ticket);
        if !ours {
            return;
        }
        if let Some(Entry {
            written: Some((order, _)),
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
