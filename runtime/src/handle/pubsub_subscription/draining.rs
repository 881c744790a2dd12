//! Which replaced brokers a handle subscription still drains. The runtime's
//! close of a replaced pub/sub instance (`reload/drain.rs`) waits past its
//! usual bound while one does (up to [`DRAIN_CAP`] and [`STOP_GRACE`]),
//! and closes it as soon as none does: a drain that keeps delivering is
//! never cut by the close, and one that ended does not hold its broker.
//!
//! [`DRAIN_CAP`]: super::DRAIN_CAP
//! [`STOP_GRACE`]: super::STOP_GRACE

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::kinds::PubSub;

/// How many draining sources each broker has, by the address of its
/// instance (a source holds its broker while it is marked, so the address
/// names no other instance meanwhile).
static DRAINING: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// Woken whenever a broker's last mark is taken off: the closes waiting
/// for their broker's drain look again ([`undrained`]).
static UNMARKED: Notify = Notify::const_new();

/// One draining source's mark on its broker, taken off when dropped (when
/// the forwarder lets go of the source).
#[derive(Debug)]
pub(super) struct DrainMark(usize);

impl DrainMark {
    /// Marks `broker` drained, until the mark is dropped.
    pub(super) fn new(broker: &Arc<dyn PubSub>) -> Self {
        let address = address(broker);
        let mut draining = DRAINING.lock().unwrap_or_else(PoisonError::into_inner);
        *draining.entry(address).or_insert(0) += 1;
        Self(address)
    }
}

impl Drop for DrainMark {
    fn drop(&mut self) {
        let mut draining = DRAINING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = draining.get_mut(&self.0) {
            *count -= 1;
            if *count == 0 {
                draining.remove(&self.0);
                UNMARKED.notify_waiters();
            }
        }
    }
}

/// Whether a handle subscription still drains `broker` (it was replaced
/// and is still read from).
pub(crate) fn drained(broker: &Arc<dyn PubSub>) -> bool {
    let draining = DRAINING.lock().unwrap_or_else(PoisonError::into_inner);
    draining.contains_key(&address(broker))
}

/// Returns once no handle subscription drains `broker` any more (at once
/// if none does): woken by the last mark's drop, no polling. The caller
/// bounds the wait.
pub(crate) async fn undrained(broker: &Arc<dyn PubSub>) {
    loop {
        let unmarked = UNMARKED.notified();
        tokio::pin!(unmarked);
        // Registered before looking: a mark dropped in between wakes it.
        unmarked.as_mut().enable();
        if !drained(broker) {
            return;
        }
        unmarked.await;
    }
}

/// The address of `broker`'s instance.
fn address(broker: &Arc<dyn PubSub>) -> usize {
    Arc::as_ptr(broker).cast::<()>().addr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::Component;
    use crate::kinds::{PubSubError, PubSubSubscription, PublishRequest, SubscribeRequest};

    struct Broker;
    impl Component for Broker {}
    #[async_trait::async_trait]
    impl PubSub for Broker {
        async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
            Ok(())
        }
        async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
            Err(PubSubError::Backend("not in this test".into()))
        }
    }

    #[test]
    fn a_broker_is_drained_until_its_last_mark_is_dropped() {
        let (broker, other): (Arc<dyn PubSub>, Arc<dyn PubSub>) =
            (Arc::new(Broker), Arc::new(Broker));
        let first = DrainMark::new(&broker);
        let second = DrainMark::new(&broker);
        assert!(drained(&broker));
        assert!(!drained(&other), "another broker is marked");
        drop(first);
        assert!(drained(&broker), "unmarked while a source still drains it");
        drop(second);
        assert!(!drained(&broker), "still marked once let go");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_for_a_broker_to_be_undrained_ends_when_its_last_mark_is_dropped() {
        let broker: Arc<dyn PubSub> = Arc::new(Broker);
        let mark = DrainMark::new(&broker);
        let waiting = {
            let broker = broker.clone();
            tokio::spawn(async move { undrained(&broker).await })
        };
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "ended while still drained");
        drop(mark);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("not woken when its last mark was dropped")
            .expect("the wait panicked");
    }
}
