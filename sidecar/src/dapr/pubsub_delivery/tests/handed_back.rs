//! A retired subscription that handed an event back to its broker (the
//! app asked for it again) does not end on catching up while that event
//! may still come back to it alone (the memory broker gives it again to
//! the subscription that failed it, and drops it with that subscription):
//! the test acts as such a broker. Paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::*;

/// A subscriber that asks for every event again until `succeed` is told,
/// then answers SUCCESS; counts the events it took.
struct FailingUntil {
    succeed: watch::Receiver<bool>,
    took: AtomicU32,
}

#[tonic::async_trait]
impl EventSink for FailingUntil {
    async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
        if *self.succeed.borrow() {
            self.took.fetch_add(1, Ordering::SeqCst);
            DeliveryOutcome::Success
        } else {
            DeliveryOutcome::Retry
        }
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// The memory broker's wait before it gives a handed-back event again.
const REDELIVER_AFTER: Duration = Duration::from_millis(500);

/// A retiring subscription on `old` and a running one on `new` (one
/// lineage); `old` has event `b1` failed by the app and handed back, and
/// meets `b2`, which `new` delivered: caught up. `in_flight`: it meets
/// `b2` while `b1` is still being retried (else once `b1` was handed
/// back). Then the broker gives `b1` again to `old` alone, and the app
/// takes it: it reaches the app (it was lost: `old` had ended).
async fn handed_back_then_caught_up(old: &str, new: &str, in_flight: bool) {
    let runtime = runtime_with(serde_json::json!({})).await;
    let lineage = Arc::new(crate::dapr::handover::Lineage::default());
    let (succeed, failing) = watch::channel(false);
    let old_sink = Arc::new(FailingUntil {
        succeed: failing,
        took: AtomicU32::new(0),
    });
    let (old_task, retire_old) =
        deliver_in(&runtime, old, None, lineage.member(), old_sink.clone()).await;
    let new_sink = Arc::new(Counting::default());
    let (_new_task, _retire_new) =
        deliver_in(&runtime, new, None, lineage.member(), new_sink.clone()).await;
    lineage.remember(true);
    let _ = retire_old.send(true);

    let failed = feed_event(old, "b1").await;
    let failed = if in_flight {
        Some(failed)
    } else {
        assert_eq!(settled(failed).await, DeliveryOutcome::Retry);
        None
    };
    let delivered = feed_event(new, "b2").await;
    assert_eq!(settled(delivered).await, DeliveryOutcome::Success);
    let caught_up = feed_event(old, "b2").await;
    assert_eq!(settled(caught_up).await, DeliveryOutcome::Success);
    if let Some(failed) = failed {
        assert_eq!(settled(failed).await, DeliveryOutcome::Retry);
    }

    // The broker gives it again to the subscription that failed it.
    tokio::time::sleep(REDELIVER_AFTER).await;
    succeed.send_replace(true);
    let again = feed_of(old)
        .deliver(event_message(old, "b1"))
        .await
        .unwrap_or_else(|| panic!("the retiring subscription let go of its broker"));
    let outcome = tokio::time::timeout(Duration::from_secs(60), again)
        .await
        .unwrap_or_else(|_| panic!("the handed-back event was not sent again"))
        .unwrap_or_else(|_| panic!("the retiring subscription ended with it unsent"));
    assert_eq!(outcome, DeliveryOutcome::Success);
    assert_eq!(old_sink.took.load(Ordering::SeqCst), 1, "taken by the app");
    assert_eq!(new_sink.sent.load(Ordering::SeqCst), 1, "b2, once");

    // Nothing more handed back: it ends, within its bounds.
    tokio::time::timeout(HANDOVER_LIMIT, old_task)
        .await
        .unwrap_or_else(|_| panic!("the retiring subscription did not end"))
        .unwrap_or_else(|e| panic!("{e}"));
    runtime.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_gets_back_an_event_it_handed_back() {
    handed_back_then_caught_up("back-old", "back-new", false).await;
}

#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_reads_again_for_an_event_handed_back_meanwhile() {
    handed_back_then_caught_up("back-flight-old", "back-flight-new", true).await;
}
