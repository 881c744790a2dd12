//! The deliveries of one source handed on and not yet settled: each one the
//! forwarder hands on carries a watch ([`Delivery::watched`]) that counts
//! it out once its subscriber settled it (its outcome already sent to the
//! broker) or dropped it unsettled. No task and no second channel per
//! delivery; a source that is not draining never wakes the forwarder.
//!
//! A broker such as Redis hands out `concurrency` deliveries, then waits for
//! their outcomes before it sends more: while a slow app works, such a
//! source sends nothing, though it has more. A draining source is not
//! silent while anything of it awaits its outcome; the forwarder is woken
//! when the last of them settles (its grace starts then).
//!
//! A draining source's deliveries are relayed ([`Relay`]): the subscriber
//! settles a copy, whose outcome is read at once when it is settled (no
//! task either) and passed on to the broker's delivery. Only an outcome
//! that moves the backlog (`Success`, `Drop`) is progress; a refused
//! message (`Retry`, or dropped unsettled) is remembered, so that its
//! redeliveries are no progress either: a message the app keeps refusing
//! does not hold the old broker up to the drain's cap.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{oneshot, Notify};

use crate::kinds::pubsub::SettleWatch;
use crate::kinds::{Delivery, DeliveryOutcome};

/// How many refused message ids a draining source remembers (the oldest
/// forgotten first): a broker redelivers a few refused messages in turn,
/// not thousands.
const REFUSED_REMEMBERED: usize = 64;

/// The count of one source's deliveries awaiting their outcome.
#[derive(Debug)]
pub(super) struct Outstanding {
    count: AtomicUsize,
    /// Whether the source drains: only then do its outcomes concern the
    /// forwarder.
    draining: AtomicBool,
    /// Whether one settled while draining since the forwarder last looked.
    /// Set before the count drops: a forwarder that reads the count, then
    /// this, sees the outcome that brought the count to what it read.
    settled: AtomicBool,
    /// Whether one settled while draining with an outcome that moved the
    /// backlog (`Success`, `Drop`, or one handed out before the drain, its
    /// outcome unknown) since the forwarder last looked. Set before the
    /// count drops, as `settled`.
    progressed: AtomicBool,
    /// The ids of the messages refused while draining, newest last (empty
    /// ids, which name no message, are not kept).
    refused: Mutex<VecDeque<String>>,
    /// The forwarder's: woken when a draining source's count drops to 0.
    wake: Arc<Notify>,
}

impl Outstanding {
    /// A count that wakes `wake` when it drops to 0 while draining.
    pub(super) fn new(wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            count: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            progressed: AtomicBool::new(false),
            refused: Mutex::new(VecDeque::new()),
            wake,
        })
    }

    /// How many deliveries await their outcome.
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether one settled while draining since the last call.
    pub(super) fn take_settled(&self) -> bool {
        self.settled.swap(false, Ordering::SeqCst)
    }

    /// Whether one settled while draining with an outcome that moved the
    /// backlog since the last call.
    pub(super) fn take_progressed(&self) -> bool {
        self.progressed.swap(false, Ordering::SeqCst)
    }

    /// Whether the message `id` was refused while draining (one of the
    /// last [`REFUSED_REMEMBERED`]): delivering it again is no progress.
    pub(super) fn refused(&self, id: &str) -> bool {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        !id.is_empty() && refused.iter().any(|known| known == id)
    }

    /// The source drains from now on: its outcomes are looked at (those
    /// before are not).
    pub(super) fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.settled.store(false, Ordering::SeqCst);
        self.progressed.store(false, Ordering::SeqCst);
    }

    /// `delivery`, counted until its subscriber settles it (or drops it
    /// unsettled, which reads as `Retry` at the broker, as before). The
    /// outcome reaches the broker first; the count drops after. While
    /// draining, the delivery is relayed, so its outcome is seen.
    pub(super) fn watch(self: &Arc<Self>, delivery: Delivery) -> Delivery {
        self.count.fetch_add(1, Ordering::SeqCst);
        if !self.draining.load(Ordering::SeqCst) {
            let watch: Arc<dyn SettleWatch> = self.clone();
            return delivery.watched(watch);
        }
        let mut at_broker = delivery;
        let message = std::mem::take(&mut at_broker.message);
        let id = message.id.clone();
        let (relayed, outcome) = Delivery::new(message);
        let relay: Arc<dyn SettleWatch> = Arc::new(Relay {
            outstanding: self.clone(),
            id,
            at_broker: Mutex::new(Some((at_broker, outcome))),
        });
        relayed.watched(relay)
    }

    /// One of its deliveries settled with `outcome` (`None`: unknown, it
    /// was handed out before the drain): the flags first, then the count.
    fn settled_with(&self, id: &str, outcome: Option<DeliveryOutcome>) {
        let draining = self.draining.load(Ordering::SeqCst);
        if draining {
            let moved = match outcome {
                Some(DeliveryOutcome::Retry) => false,
                Some(DeliveryOutcome::Success | DeliveryOutcome::Drop) | None => true,
            };
            self.remember(id, !moved);
            if moved {
                self.progressed.store(true, Ordering::SeqCst);
            }
            self.settled.store(true, Ordering::SeqCst);
        }
        let before = self.count.fetch_sub(1, Ordering::SeqCst);
        if draining && before == 1 {
            self.wake.notify_one();
        }
    }

    /// Remembers the message `id` as refused, or forgets it (it was taken
    /// at last).
    fn remember(&self, id: &str, refused: bool) {
        if id.is_empty() {
            return;
        }
        let mut known = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|known| known != id);
        if refused {
            if known.len() == REFUSED_REMEMBERED {
                known.pop_front();
            }
            known.push_back(id.to_owned());
        }
    }
}

impl SettleWatch for Outstanding {
    /// A delivery handed out before the drain settled: its outcome is not
    /// known, so it counts as progress (as many as were outstanding then).
    fn settled(&self) {
        self.settled_with("", None);
    }
}

/// A draining source's delivery, relayed: the subscriber settles a copy
/// (the message moved into it); when it is settled, its outcome is read at
/// once (it was sent just before) and passed on to the broker's delivery.
struct Relay {
    outstanding: Arc<Outstanding>,
    /// The message's id (to remember it refused).
    id: String,
    /// The broker's delivery and the copy's outcome, until settled.
    at_broker: Mutex<Option<(Delivery, oneshot::Receiver<DeliveryOutcome>)>>,
}

impl SettleWatch for Relay {
    /// The outcome reaches the broker (a copy dropped unsettled drops the
    /// broker's delivery: `Retry` there, as before); then it is counted.
    fn settled(&self) {
        let taken = self
            .at_broker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some((at_broker, mut outcome)) = taken else {
            return;
        };
        let outcome = outcome.try_recv().ok();
        match outcome {
            Some(outcome) => at_broker.settle(outcome),
            None => drop(at_broker),
        }
        self.outstanding
            .settled_with(&self.id, Some(outcome.unwrap_or(DeliveryOutcome::Retry)));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kinds::{DeliveryOutcome, Message};

    fn delivery(data: &str) -> (Delivery, tokio::sync::oneshot::Receiver<DeliveryOutcome>) {
        Delivery::new(Message {
            data: data.as_bytes().to_vec(),
            ..Message::default()
        })
    }

    /// Whether `wake` was notified (a stored permit; virtual time).
    async fn woken(wake: &Notify) -> bool {
        tokio::time::timeout(Duration::from_secs(1), wake.notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_delivery_is_counted_until_its_outcome_reaches_the_broker() {
        let wake = Arc::new(Notify::new());
        let outstanding = Outstanding::new(wake.clone());
        outstanding.drain();
        let (delivery, mut at_broker) = delivery("x");
        let watched = outstanding.watch(delivery);
        assert_eq!(watched.message.data, b"x");
        assert_eq!(outstanding.count(), 1);
        assert!(!outstanding.take_settled());
        watched.settle(DeliveryOutcome::Drop);
        // Sent before the count dropped: nothing to wait for.
        assert_eq!(at_broker.try_recv(), Ok(DeliveryOutcome::Drop));
        assert_eq!(outstanding.count(), 0);
        assert!(outstanding.take_settled());
        assert!(woken(&wake).await, "the forwarder was not woken");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_delivery_dropped_unsettled_is_counted_out_as_a_retry() {
        let wake = Arc::new(Notify::new());
        let outstanding = Outstanding::new(wake.clone());
        let (delivery, mut at_broker) = delivery("x");
        drop(outstanding.watch(delivery));
        assert!(at_broker.try_recv().is_err(), "read as Retry by the broker");
        assert_eq!(outstanding.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_of_a_source_not_draining_do_not_wake_the_forwarder() {
        let wake = Arc::new(Notify::new());
        let outstanding = Outstanding::new(wake.clone());
        for _ in 0..3 {
            let (delivery, _at_broker) = delivery("x");
            outstanding.watch(delivery).settle(DeliveryOutcome::Success);
        }
        assert_eq!(outstanding.count(), 0);
        assert!(!outstanding.take_settled());
        assert!(!woken(&wake).await, "woken for a source not draining");
    }

    #[tokio::test(start_paused = true)]
    async fn a_draining_source_wakes_the_forwarder_only_when_its_last_outcome_arrives() {
        let wake = Arc::new(Notify::new());
        let outstanding = Outstanding::new(wake.clone());
        let first = outstanding.watch(delivery("a").0);
        let second = outstanding.watch(delivery("b").0);
        outstanding.drain();
        first.settle(DeliveryOutcome::Success);
        assert_eq!(outstanding.count(), 1);
        assert!(!woken(&wake).await, "woken with an outcome still awaited");
        second.settle(DeliveryOutcome::Success);
        assert!(woken(&wake).await, "not woken at the last outcome");
    }

    #[tokio::test(start_paused = true)]
    async fn a_draining_sources_refusal_reaches_the_broker_and_is_no_progress() {
        let outstanding = Outstanding::new(Arc::new(Notify::new()));
        outstanding.drain();
        let message = |id: &str| Message {
            id: id.into(),
            data: b"x".to_vec(),
            ..Message::default()
        };
        let (refused, mut at_broker) = Delivery::new(message("7-0"));
        let relayed = outstanding.watch(refused);
        assert_eq!(relayed.message.data, b"x", "the message was not relayed");
        relayed.settle(DeliveryOutcome::Retry);
        assert_eq!(at_broker.try_recv(), Ok(DeliveryOutcome::Retry));
        assert_eq!(outstanding.count(), 0);
        assert!(outstanding.take_settled());
        assert!(
            !outstanding.take_progressed(),
            "a Retry counted as progress"
        );
        assert!(outstanding.refused("7-0"));
        // Dropped unsettled: a Retry at the broker, and no progress either.
        let (dropped, mut at_broker) = Delivery::new(message("8-0"));
        drop(outstanding.watch(dropped));
        assert!(at_broker.try_recv().is_err(), "read as Retry by the broker");
        assert!(!outstanding.take_progressed());
        assert!(outstanding.refused("8-0"));
        // Taken at last: progress, and no longer refused.
        let (taken, mut at_broker) = Delivery::new(message("7-0"));
        outstanding.watch(taken).settle(DeliveryOutcome::Success);
        assert_eq!(at_broker.try_recv(), Ok(DeliveryOutcome::Success));
        assert!(outstanding.take_progressed());
        assert!(!outstanding.refused("7-0"));
        // A message without an id is never taken for a refused one.
        let (anonymous, _at_broker) = Delivery::new(message(""));
        outstanding.watch(anonymous).settle(DeliveryOutcome::Retry);
        assert!(!outstanding.refused(""));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_watched_twice_is_counted_out_of_both() {
        let wake = Arc::new(Notify::new());
        let (inner, outer) = (Outstanding::new(wake.clone()), Outstanding::new(wake));
        let delivery = outer.watch(inner.watch(delivery("x").0));
        assert_eq!((inner.count(), outer.count()), (1, 1));
        delivery.settle(DeliveryOutcome::Success);
        assert_eq!((inner.count(), outer.count()), (0, 0));
    }
}
