//! A retired subscription that caught up reads again every event it
//! handed back (the memory broker gives it again to the subscription
//! that failed it alone) before it ends, however busy it was when it
//! handed it back: waiting for a slow event in flight after it stopped
//! reading (it ended at once if that settled more than [`HANDOVER_GRACE`]
//! after the hand-back), or with every slot in flight taken until after
//! that grace (the end won over the queued event). The test acts as such
//! a broker. Paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::*;

/// The memory broker's wait before it gives a handed-back event again.
const REDELIVER_AFTER: Duration = Duration::from_millis(500);
/// How long the app takes to answer a `slow-` event: longer than the
/// grace after the failing event was handed back.
const SLOW: Duration = Duration::from_secs(8);

/// A subscriber that asks for `fail-` events again until `succeed` is
/// told (counting those it then takes), answers `slow-` ones SUCCESS
/// after [`SLOW`], and others SUCCESS at once.
struct Scripted {
    succeed: watch::Receiver<bool>,
    took_failing: AtomicU32,
}

#[tonic::async_trait]
impl EventSink for Scripted {
    async fn send(&self, event: &TopicEvent, _: Duration) -> DeliveryOutcome {
        if event.id.starts_with("fail-") {
            if !*self.succeed.borrow() {
                return DeliveryOutcome::Retry;
            }
            self.took_failing.fetch_add(1, Ordering::SeqCst);
        } else if event.id.starts_with("slow-") {
            tokio::time::sleep(SLOW).await;
        }
        DeliveryOutcome::Success
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// A subscription on `old`, retiring (once told), and a running one on
/// `new`, of one lineage.
struct Handing {
    runtime: Runtime,
    old: &'static str,
    new: &'static str,
    old_task: tokio::task::JoinHandle<()>,
    old_sink: Arc<Scripted>,
    succeed: watch::Sender<bool>,
    retire_old: watch::Sender<bool>,
    _retire_new: watch::Sender<bool>,
}

impl Handing {
    /// Both subscribed, `old` retired.
    async fn start(old: &'static str, new: &'static str) -> Self {
        let handing = Self::running(old, new).await;
        let _ = handing.retire_old.send(true);
        handing
    }

    /// Both subscribed, `old` not yet retired.
    async fn running(old: &'static str, new: &'static str) -> Self {
        let runtime = runtime_with(serde_json::json!({})).await;
        let lineage = Arc::new(crate::dapr::handover::Lineage::default());
        let (succeed, failing) = watch::channel(false);
        let old_sink = Arc::new(Scripted {
            succeed: failing,
            took_failing: AtomicU32::new(0),
        });
        let (old_task, retire_old) =
            deliver_in(&runtime, old, None, lineage.member(), old_sink.clone()).await;
        let new_sink = Arc::new(Counting::default());
        let (_new_task, retire_new) =
            deliver_in(&runtime, new, None, lineage.member(), new_sink).await;
        lineage.remember(true);
        Self {
            runtime,
            old,
            new,
            old_task,
            old_sink,
            succeed,
            retire_old,
            _retire_new: retire_new,
        }
    }

    /// `old` meets `id`, which `new` delivered: it caught up.
    async fn catch_up(&self, id: &str) {
        assert_eq!(
            settled(feed_event(self.new, id).await).await,
            DeliveryOutcome::Success
        );
        assert_eq!(
            settled(feed_event(self.old, id).await).await,
            DeliveryOutcome::Success
        );
    }

    /// The broker gives `id`, handed back by `old`, to it again, and the
    /// app now takes it; the outcome of that delivery.
    async fn given_again(&self, id: &str) -> tokio::sync::oneshot::Receiver<DeliveryOutcome> {
        tokio::time::sleep(REDELIVER_AFTER).await;
        self.succeed.send_replace(true);
        feed_of(self.old)
            .deliver(event_message(self.old, id))
            .await
            .unwrap_or_else(|| panic!("the retiring subscription let go of its broker"))
    }

    /// The event given again reached the app, and `old` then ended
    /// within its bounds.
    async fn taken_then_ended(self, again: tokio::sync::oneshot::Receiver<DeliveryOutcome>) {
        let outcome = tokio::time::timeout(Duration::from_secs(60), again)
            .await
            .unwrap_or_else(|_| panic!("the handed-back event was not sent again"))
            .unwrap_or_else(|_| panic!("the retiring subscription ended with it unsent"));
        assert_eq!(outcome, DeliveryOutcome::Success);
        assert_eq!(self.old_sink.took_failing.load(Ordering::SeqCst), 1);
        tokio::time::timeout(HANDOVER_LIMIT, self.old_task)
            .await
            .unwrap_or_else(|_| panic!("the retiring subscription did not end"))
            .unwrap_or_else(|e| panic!("{e}"));
        self.runtime.shutdown().await;
    }
}

/// Caught up with a failing event and a slow one in flight: it stops
/// reading, the failing one is handed back meanwhile, and the slow one
/// settles more than [`HANDOVER_GRACE`] later. It reads again for the
/// handed-back one (it ended: the hand-back was no longer recent).
#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_reads_again_for_one_handed_back_while_a_slow_one_settles() {
    let handing = Handing::start("busy-slow-old", "busy-slow-new").await;
    let failing = feed_event(handing.old, "fail-1").await;
    let slow = feed_event(handing.old, "slow-1").await;
    handing.catch_up("m-1").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    let again = handing.given_again("fail-1").await;
    assert_eq!(settled(slow).await, DeliveryOutcome::Success);
    handing.taken_then_ended(again).await;
}

/// Caught up just after it handed an event back, it fills every slot in
/// flight with slow events (the running one lags: none delivered yet);
/// the handed-back one is queued behind them. A slot frees more than
/// [`HANDOVER_GRACE`] after the hand-back: it reads the queued event
/// rather than end (it ended, the event still queued).
#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_with_every_slot_taken_reads_one_handed_back_before_ending() {
    let handing = Handing::start("busy-full-old", "busy-full-new").await;
    let failing = feed_event(handing.old, "fail-2").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    handing.catch_up("m-2").await;
    let mut slow = Vec::new();
    for n in 0..MAX_IN_FLIGHT {
        slow.push(feed_event(handing.old, &format!("slow-2-{n}")).await);
    }
    let again = handing.given_again("fail-2").await;
    for outcome in slow {
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    }
    handing.taken_then_ended(again).await;
}

/// Caught up owing an event its broker does not give it again (Redis
/// Streams: the running subscription may reclaim it), with a slow one in
/// flight: once its broker gave it nothing for [`HANDOVER_GRACE`] it
/// stops reading, and ends as soon as the slow one settled (not an idle
/// grace later, nor at its limit).
#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_owing_an_event_never_given_again_ends_once_its_broker_was_quiet()
{
    let handing = Handing::start("busy-kept-old", "busy-kept-new").await;
    let failing = feed_event(handing.old, "fail-3").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    let slow = feed_event(handing.old, "slow-3").await;
    handing.catch_up("m-3").await;
    assert_eq!(settled(slow).await, DeliveryOutcome::Success);
    tokio::time::timeout(Duration::from_secs(1), handing.old_task)
        .await
        .unwrap_or_else(|_| panic!("the retiring subscription outlived its last event"))
        .unwrap_or_else(|e| panic!("{e}"));
    handing.runtime.shutdown().await;
}

/// An event handed back just before its subscription was retired is not
/// owed by hash (it was not retired yet), yet may still come back to it
/// alone: caught up at once, it waits for its broker all the same, and
/// reads it again.
#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_reads_again_one_handed_back_just_before_it_was_retired() {
    let handing = Handing::running("busy-before-old", "busy-before-new").await;
    let failing = feed_event(handing.old, "fail-4").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    let _ = handing.retire_old.send(true);
    handing.catch_up("m-4").await;
    let again = handing.given_again("fail-4").await;
    handing.taken_then_ended(again).await;
}

/// An event handed back a minute before its subscription was retired
/// came back long ago (the memory broker gives it again within
/// [`REDELIVER_AFTER`]): caught up, it ends at once, though its broker
/// gives it an event a second (it gives every publish to every
/// subscription) — before, each event restarted its wait for a quiet
/// broker and it lived to its limit, delivering them by its old settings.
#[tokio::test(start_paused = true)]
async fn one_handed_back_long_before_the_retirement_does_not_hold_it_under_steady_traffic() {
    let handing = Handing::running("busy-steady-old", "busy-steady-new").await;
    let failing = feed_event(handing.old, "fail-5").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let _ = handing.retire_old.send(true);
    handing.catch_up("m-5").await;
    let mut fed = 0;
    while !handing.old_task.is_finished() {
        assert!(fed < 10, "still reading after {fed} events, a second apart");
        let Some(_outcome) = feed_of(handing.old)
            .deliver(event_message(handing.old, &format!("steady-{fed}")))
            .await
        else {
            break;
        };
        fed += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    handing.runtime.shutdown().await;
}

/// As [`a_caught_up_subscription_with_every_slot_taken_reads_one_handed_back_before_ending`],
/// the event handed back just before the retirement (not owed by hash):
/// the slots free past [`HANDOVER_GRACE`] after the hand-back, the event
/// queued behind them is read before it ends (it ended, the event still
/// queued: its end won over the queue).
#[tokio::test(start_paused = true)]
async fn one_handed_back_before_the_retirement_and_queued_behind_busy_slots_is_read_before_it_ends()
{
    let handing = Handing::running("busy-queued-old", "busy-queued-new").await;
    let failing = feed_event(handing.old, "fail-6").await;
    assert_eq!(settled(failing).await, DeliveryOutcome::Retry);
    let _ = handing.retire_old.send(true);
    handing.catch_up("m-6").await;
    let mut slow = Vec::new();
    for n in 0..MAX_IN_FLIGHT {
        slow.push(feed_event(handing.old, &format!("slow-6-{n}")).await);
    }
    let again = handing.given_again("fail-6").await;
    for outcome in slow {
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    }
    handing.taken_then_ended(again).await;
}

/// Caught up owing nothing, with events queued for it (newer than what
/// the later subscription delivered: that one has them too), it ends at
/// its next free slot over its queue rather than send them by its old
/// settings: the queue holds the end back only while it owes an event
/// handed back. (Held back by any queue, it sent them, and with an app
/// slower than its publishers lived to its limit.) The catch-up waits
/// for the running subscription's slow answer, its slots full, while the
/// queue fills.
#[tokio::test(start_paused = true)]
async fn a_caught_up_subscription_owing_nothing_ends_over_its_queue() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let lineage = Arc::new(crate::dapr::handover::Lineage::default());
    let scripted = || {
        Arc::new(Scripted {
            succeed: watch::channel(true).1,
            took_failing: AtomicU32::new(0),
        })
    };
    let (old, new) = ("busy-backlog-old", "busy-backlog-new");
    let (old_task, retire_old) =
        deliver_in(&runtime, old, None, lineage.member(), scripted()).await;
    let (_new_task, _retire_new) =
        deliver_in(&runtime, new, None, lineage.member(), scripted()).await;
    lineage.remember(true);
    let _ = retire_old.send(true);
    // The running one sends the catch-up event slowly (answered at 8 s).
    let later = feed_event(new, "slow-m-8").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The retiring one's slots: 31 slow events (answered at 9 s), and the
    // catch-up event, waiting for the running one's answer.
    let mut slow = Vec::new();
    for n in 0..MAX_IN_FLIGHT - 1 {
        slow.push(feed_event(old, &format!("slow-8-{n}")).await);
    }
    let caught_up = feed_event(old, "slow-m-8").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut queued = Vec::new();
    for n in 0..4 {
        queued.push(feed_event(old, &format!("queued-8-{n}")).await);
    }
    assert_eq!(settled(later).await, DeliveryOutcome::Success);
    assert_eq!(settled(caught_up).await, DeliveryOutcome::Success);
    for outcome in slow {
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    }
    tokio::time::timeout(Duration::from_secs(60), old_task)
        .await
        .unwrap_or_else(|_| panic!("the retiring subscription did not end"))
        .unwrap_or_else(|e| panic!("{e}"));
    for outcome in queued {
        assert!(
            outcome.await.is_err(),
            "a queued event was sent by the retiring subscription"
        );
    }
    runtime.shutdown().await;
}
