//! The deliveries of one source handed on and not yet settled: each one the
//! forwarder hands on is relayed (its subscriber settles a copy, whose
//! outcome goes to the broker's delivery), so the forwarder knows how many
//! still await their outcome and when one settled.
//!
//! A broker such as Redis hands out `concurrency` deliveries, then waits for
//! their outcomes before it sends more: while a slow app works, such a
//! source sends nothing, though it has more. A draining source is not
//! silent while anything of it awaits its outcome.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::kinds::Delivery;

/// The count of one source's deliveries awaiting their outcome.
#[derive(Debug)]
pub(super) struct Outstanding {
    count: AtomicUsize,
    /// Whether one settled since the forwarder last looked.
    settled: AtomicBool,
    /// The forwarder's: woken when any of its deliveries settles.
    wake: Arc<Notify>,
}

impl Outstanding {
    /// A count that wakes `wake` at each outcome.
    pub(super) fn new(wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            count: AtomicUsize::new(0),
            settled: AtomicBool::new(false),
            wake,
        })
    }

    /// How many deliveries await their outcome.
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether one settled since the last call.
    pub(super) fn take_settled(&self) -> bool {
        self.settled.swap(false, Ordering::SeqCst)
    }

    /// `delivery`, counted until its subscriber settles it (or drops it
    /// unsettled, which reads as `Retry` at the broker, as before). The
    /// outcome reaches the broker first; the count drops after.
    pub(super) fn relay(self: &Arc<Self>, mut delivery: Delivery) -> Delivery {
        let message = std::mem::take(&mut delivery.message);
        let (relayed, outcome) = Delivery::new(message);
        self.count.fetch_add(1, Ordering::SeqCst);
        let settled = Settled(self.clone());
        tokio::spawn(async move {
            if let Ok(outcome) = outcome.await {
                delivery.settle(outcome);
            }
            drop(settled);
        });
        relayed
    }
}

/// Counts one delivery out when dropped: its outcome went to the broker,
/// or it was dropped unsettled (also when the runtime drops the relay).
struct Settled(Arc<Outstanding>);

impl Drop for Settled {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.settled.store(true, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kinds::{DeliveryOutcome, Message};

    #[tokio::test]
    async fn a_relayed_delivery_is_counted_until_its_outcome_reaches_the_broker() {
        let wake = Arc::new(Notify::new());
        let outstanding = Outstanding::new(wake.clone());
        let message = Message {
            data: b"x".to_vec(),
            ..Message::default()
        };
        let (delivery, at_broker) = Delivery::new(message);
        let relayed = outstanding.relay(delivery);
        assert_eq!(relayed.message.data, b"x");
        assert_eq!(outstanding.count(), 1);
        assert!(!outstanding.take_settled());
        relayed.settle(DeliveryOutcome::Drop);
        let outcome = tokio::time::timeout(Duration::from_secs(10), at_broker)
            .await
            .expect("the outcome reached the broker in time");
        assert_eq!(outcome, Ok(DeliveryOutcome::Drop));
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("the forwarder was woken in time");
        assert_eq!(outstanding.count(), 0);
        assert!(outstanding.take_settled());
    }
}
