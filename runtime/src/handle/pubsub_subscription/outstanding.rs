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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::kinds::pubsub::SettleWatch;
use crate::kinds::Delivery;

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

    /// The source drains from now on: its outcomes are looked at (those
    /// before are not).
    pub(super) fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.settled.store(false, Ordering::SeqCst);
    }

    /// `delivery`, counted until its subscriber settles it (or drops it
    /// unsettled, which reads as `Retry` at the broker, as before). The
    /// outcome reaches the broker first; the count drops after.
    pub(super) fn watch(self: &Arc<Self>, delivery: Delivery) -> Delivery {
        self.count.fetch_add(1, Ordering::SeqCst);
        let watch: Arc<dyn SettleWatch> = self.clone();
        delivery.watched(watch)
    }
}

impl SettleWatch for Outstanding {
    fn settled(&self) {
        let draining = self.draining.load(Ordering::SeqCst);
        if draining {
            self.settled.store(true, Ordering::SeqCst);
        }
        let before = self.count.fetch_sub(1, Ordering::SeqCst);
        if draining && before == 1 {
            self.wake.notify_one();
        }
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
    async fn a_delivery_watched_twice_is_counted_out_of_both() {
        let wake = Arc::new(Notify::new());
        let (inner, outer) = (Outstanding::new(wake.clone()), Outstanding::new(wake));
        let delivery = outer.watch(inner.watch(delivery("x").0));
        assert_eq!((inner.count(), outer.count()), (1, 1));
        delivery.settle(DeliveryOutcome::Success);
        assert_eq!((inner.count(), outer.count()), (0, 0));
    }
}
