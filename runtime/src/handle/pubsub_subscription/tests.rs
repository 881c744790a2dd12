//! A handle subscription across rebuilds of its broker: what a replaced
//! broker holds is delivered even while the new one is busy, and a new
//! broker that refuses a subscribe at first is subscribed again; warming
//! misses no subscription and subscribes to no retired broker; a drain
//! lasts as long as the old broker makes progress (not counting the time
//! its subscriber is behind), up to a cap. Paused clock: every wait is
//! virtual and bounded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::super::{Generation, Instance, Live, LiveGeneration, PubSubHandle};
use super::{drained, DRAIN_CAP, DRAIN_GRACE, DRAIN_LIMIT, STOP_GRACE};
use crate::component::{Component, ComponentKey};
use crate::kinds::{
    DeliveryOutcome, Message, PubSub, PubSubError, PubSubSubscription, PublishRequest,
    SubscribeRequest,
};

/// A broker that queues every publish for each subscription without
/// bound, and on a drain delivers what is queued, then ends.
#[derive(Default)]
struct QueueBroker {
    queues: Mutex<Vec<mpsc::UnboundedSender<Message>>>,
    /// Subscribes still to refuse.
    refuse: AtomicUsize,
    /// Subscribes asked for so far (refused ones too).
    subscribes: AtomicUsize,
    /// How long a subscribe takes.
    delay: Duration,
    /// How long each delivery takes.
    pace: Duration,
    /// Whether a drain is ignored: the subscription delivers on until
    /// stopped.
    ignores_drain: bool,
    /// Whether each message is delivered only once the one before it
    /// settled (a Redis subscription with `concurrency` 1).
    one_at_a_time: bool,
    /// How long a drain waits before it delivers (a Redis one waits for
    /// the publishes under way to end).
    drain_delay: Duration,
    /// Drains asked of its subscriptions (not stops): a Redis broker closes
    /// its publishes on one.
    drains: Arc<AtomicUsize>,
}

impl QueueBroker {
    fn refusing(subscribes: usize) -> Arc<Self> {
        Arc::new(Self {
            refuse: AtomicUsize::new(subscribes),
            ..Self::default()
        })
    }

    fn slow(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            delay,
            ..Self::default()
        })
    }

    fn paced(pace: Duration) -> Arc<Self> {
        Arc::new(Self {
            pace,
            ..Self::default()
        })
    }

    fn ignoring_drains() -> Arc<Self> {
        Arc::new(Self {
            ignores_drain: true,
            ..Self::default()
        })
    }

    fn one_at_a_time() -> Arc<Self> {
        Arc::new(Self {
            one_at_a_time: true,
            ..Self::default()
        })
    }

    fn draining_after(delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            drain_delay: delay,
            ..Self::default()
        })
    }

    fn send(&self, data: &str) {
        let message = Message {
            id: data.into(),
            topic: "t".into(),
            data: data.as_bytes().to_vec(),
            ..Message::default()
        };
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.retain(|q| q.send(message.clone()).is_ok());
    }

    fn subscriptions(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().filter(|q| !q.is_closed()).count()
    }

    /// Subscribes asked for so far (refused ones too).
    fn subscribes(&self) -> usize {
        self.subscribes.load(Ordering::SeqCst)
    }

    /// Drains asked of its subscriptions so far (stops not counted).
    fn drains(&self) -> usize {
        self.drains.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Component for QueueBroker {}

#[async_trait]
impl PubSub for QueueBroker {
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
        self.send(&String::from_utf8_lossy(&req.data));
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        self.subscribes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let refused = self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(PubSubError::Backend("not yet".into()));
        }
        let (queue, mut messages) = mpsc::unbounded_channel();
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue);
        let (subscription, feed) = PubSubSubscription::channel(16);
        let (pace, ignores_drain) = (self.pace, self.ignores_drain);
        let (one_at_a_time, drain_delay) = (self.one_at_a_time, self.drain_delay);
        let drains = self.drains.clone();
        tokio::spawn(async move {
            let mut draining = false;
            // A message whose send was given up for a drain: sent first
            // after the drain's wait.
            let mut held: Option<Message> = None;
            loop {
                let message = tokio::select! {
                    biased;
                    () = feed.stopped() => return,
                    () = feed.draining(), if !draining && !ignores_drain => {
                        drains.fetch_add(1, Ordering::SeqCst);
                        draining = true;
                        messages.close();
                        tokio::select! {
                            () = feed.stopped() => return,
                            () = tokio::time::sleep(drain_delay) => {}
                        }
                        continue;
                    }
                    message = async { held.take() }, if held.is_some() => message,
                    message = messages.recv() => message,
                };
                let Some(message) = message else { return };
                tokio::time::sleep(pace).await;
                // As a Redis reader: a send waiting for room is given up
                // for a drain asked meanwhile, and made after its wait.
                let sent = tokio::select! {
                    biased;
                    () = feed.draining(), if !draining && !ignores_drain => {
                        held = Some(message);
                        continue;
                    }
                    sent = feed.deliver(message.clone()) => sent,
                };
                let Some(outcome) = sent else {
                    return;
                };
                if one_at_a_time {
                    tokio::select! {
                        () = feed.stopped() => return,
                        _ = outcome => {}
                    }
                }
            }
        });
        Ok(subscription)
    }
}

fn key() -> ComponentKey {
    ComponentKey::new("pubsub", "p")
}

fn instances(broker: &Arc<QueueBroker>) -> BTreeMap<ComponentKey, Instance> {
    let broker: Arc<dyn PubSub> = broker.clone();
    BTreeMap::from([(key(), Instance::PubSub(broker))])
}

fn publish(live: &LiveGeneration, number: u64, broker: &Arc<QueueBroker>) {
    live.publish(Generation::new(number, instances(broker)));
}

/// A reload to `broker`: warm (bounded), then publish.
async fn reload(live: &LiveGeneration, number: u64, broker: &Arc<QueueBroker>) {
    live.warm(|| instances(broker)).await;
    publish(live, number, broker);
}

async fn subscribe(live: &LiveGeneration) -> PubSubSubscription {
    let req = SubscribeRequest {
        topic: "t".into(),
        ..SubscribeRequest::default()
    };
    let handle = PubSubHandle::new(key(), live.clone());
    handle.subscribe(req).await.expect("subscribed")
}

/// Waits (virtual time, bounded) until `broker` has a subscription.
async fn subscribed(broker: &QueueBroker) {
    let wait = async {
        while broker.subscriptions() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("the new broker was never subscribed to");
}

/// The next delivery's data, settled `Success`; `None` once it ended.
async fn next(sub: &mut PubSubSubscription) -> Option<String> {
    let delivery = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
        .await
        .expect("no delivery within 30 s")?;
    let data = String::from_utf8_lossy(&delivery.message.data).to_string();
    delivery.settle(DeliveryOutcome::Success);
    Some(data)
}

#[tokio::test(start_paused = true)]
async fn a_replaced_brokers_backlog_is_delivered_while_the_new_one_is_busy() {
    let live = Live::new();
    let old = Arc::new(QueueBroker::default());
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for i in 0..200 {
        old.send(&format!("old-{i}"));
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    // Publishers keep the new broker busy; the subscriber reads slowly.
    let mut old_seen = 0;
    let mut sent = 0;
    while old_seen < 200 {
        for _ in 0..2 {
            new.send(&format!("new-{sent}"));
            sent += 1;
        }
        let data = next(&mut sub).await.expect("the subscription ended");
        if data.starts_with("old-") {
            old_seen += 1;
        }
        assert!(
            sent < 2_000,
            "only {old_seen} of 200 messages of the replaced broker arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_rebuilt_broker_that_refuses_the_first_subscribe_is_subscribed_again() {
    let live = Live::new();
    let old = Arc::new(QueueBroker::default());
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for i in 0..3 {
        old.send(&format!("old-{i}"));
    }
    let new = QueueBroker::refusing(1);
    publish(&live, 2, &new);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next(&mut sub).await.expect("the old broker's backlog"));
    }
    assert_eq!(seen, ["old-0", "old-1", "old-2"]);
    subscribed(&new).await;
    new.send("after");
    assert_eq!(next(&mut sub).await.as_deref(), Some("after"));
}

#[tokio::test(start_paused = true)]
async fn a_subscription_made_while_a_reload_warms_is_on_the_broker_it_publishes() {
    let live = Live::new();
    let old = Arc::new(QueueBroker::default());
    publish(&live, 1, &old);
    // A subscription that never answers keeps the reload warming.
    let (_deaf, _) = live.warmer();
    let late = tokio::spawn({
        let live = live.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            subscribe(&live).await
        }
    });
    let new = Arc::new(QueueBroker::default());
    reload(&live, 2, &new).await;
    let mut sub = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .expect("subscribed within a minute")
        .expect("joined");
    new.send("after the publish");
    assert_eq!(next(&mut sub).await.as_deref(), Some("after the publish"));
}

#[tokio::test(start_paused = true)]
async fn a_warm_request_older_than_the_generation_published_is_ignored() {
    let live = Live::new();
    publish(&live, 1, &Arc::new(QueueBroker::default()));
    let _sub = subscribe(&live).await;
    // The subscription is busy subscribing to a slow broker while two
    // more reloads warm (in vain) and publish.
    reload(&live, 2, &QueueBroker::slow(Duration::from_secs(20))).await;
    let retired = Arc::new(QueueBroker::default());
    reload(&live, 3, &retired).await;
    let serving = Arc::new(QueueBroker::default());
    reload(&live, 4, &serving).await;
    subscribed(&serving).await;
    // Answered only once the requests queued before it were handled.
    tokio::time::timeout(Duration::from_secs(1), live.warm(|| instances(&serving)))
        .await
        .expect("warmed at once");
    assert_eq!(retired.subscriptions(), 0, "subscribed to a retired broker");
    assert_eq!(serving.subscriptions(), 1);
}

/// Reads `count` deliveries, each `every` apart; their data.
async fn read(sub: &mut PubSubSubscription, count: usize, every: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..count {
        seen.push(next(sub).await.expect("the subscription ended"));
        tokio::time::sleep(every).await;
    }
    seen
}

fn numbered(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_delivering_slowly_drains_its_whole_backlog() {
    let live = Live::new();
    // One delivery a second: 20 s of backlog, four times the grace.
    let old = QueueBroker::paced(Duration::from_secs(1));
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for data in numbered("old", 20) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    assert_eq!(
        read(&mut sub, 20, Duration::ZERO).await,
        numbered("old", 20)
    );
}

#[tokio::test(start_paused = true)]
async fn the_time_a_subscriber_is_behind_does_not_count_against_the_drain() {
    let live = Live::new();
    let old = Arc::new(QueueBroker::default());
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for data in numbered("old", 200) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    let mut seen = read(&mut sub, 10, Duration::ZERO).await;
    // The subscriber stops reading for six times the grace.
    tokio::time::sleep(DRAIN_GRACE * 6).await;
    seen.extend(read(&mut sub, 190, Duration::ZERO).await);
    assert_eq!(seen, numbered("old", 200));
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_silent_for_the_grace_after_delivering_is_let_go() {
    let live = Live::new();
    let old = QueueBroker::ignoring_drains();
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    old.send("old-0");
    assert_eq!(next(&mut sub).await.as_deref(), Some("old-0"));
    tokio::time::sleep(DRAIN_GRACE + STOP_GRACE + Duration::from_secs(1)).await;
    assert_eq!(old.subscriptions(), 0, "a silent old broker is held");
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_that_never_delivers_is_let_go_at_the_limit() {
    let live = Live::new();
    let old = QueueBroker::ignoring_drains();
    publish(&live, 1, &old);
    let _sub = subscribe(&live).await;
    publish(&live, 2, &Arc::new(QueueBroker::default()));
    tokio::time::sleep(DRAIN_LIMIT + STOP_GRACE + Duration::from_secs(1)).await;
    assert_eq!(old.subscriptions(), 0, "a silent old broker is held");
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_waiting_for_outcomes_of_a_slow_subscriber_drains_its_backlog() {
    let live = Live::new();
    // Hands out the next message only once the one before it settled.
    let old = QueueBroker::one_at_a_time();
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for data in numbered("old", 5) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    // Each delivery settles past the grace after it arrived.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
            .await
            .expect("no delivery within 30 s")
            .expect("the subscription ended");
        let data = String::from_utf8_lossy(&delivery.message.data).to_string();
        tokio::time::sleep(DRAIN_GRACE + Duration::from_secs(1)).await;
        delivery.settle(DeliveryOutcome::Success);
        seen.push(data);
    }
    assert_eq!(seen, numbered("old", 5));
}

/// Takes `count` deliveries, each settled `Success` `work` after it
/// arrived (an app working on it); their data.
async fn work_through(sub: &mut PubSubSubscription, count: usize, work: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..count {
        let delivery = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
            .await
            .expect("no delivery within 30 s")
            .expect("the subscription ended");
        seen.push(String::from_utf8_lossy(&delivery.message.data).to_string());
        tokio::time::sleep(work).await;
        delivery.settle(DeliveryOutcome::Success);
    }
    seen
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_delivering_steadily_past_the_no_progress_limit_drains_its_whole_backlog()
{
    let live = Live::new();
    // `concurrency` 1: the next message only once the one before settled.
    let old = QueueBroker::one_at_a_time();
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    // 30 messages of 10 s of app work each: 300 s of backlog, past the
    // no-progress limit (120 s).
    for data in numbered("old", 30) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    let work = Duration::from_secs(10);
    assert!(work * 30 > DRAIN_LIMIT * 2);
    assert_eq!(work_through(&mut sub, 30, work).await, numbered("old", 30));
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_that_stops_making_progress_is_stopped_the_limit_after_its_last() {
    let live = Live::new();
    let old = QueueBroker::one_at_a_time();
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for data in numbered("old", 21) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    // 200 s of steady progress, past the limit after the replacement.
    let seen = work_through(&mut sub, 20, Duration::from_secs(10)).await;
    assert_eq!(seen, numbered("old", 20));
    // The app hangs on the last one: nothing moves from its arrival on.
    let hung = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
        .await
        .expect("no delivery within 30 s")
        .expect("the subscription ended");
    let broker: Arc<dyn PubSub> = old.clone();
    tokio::time::sleep(DRAIN_LIMIT - Duration::from_secs(10)).await;
    assert!(drained(&broker), "stopped while within the limit");
    tokio::time::sleep(Duration::from_secs(10) + STOP_GRACE + Duration::from_secs(1)).await;
    assert!(
        !drained(&broker),
        "held past the limit after its last progress"
    );
    drop(hung);
}

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_delivering_forever_is_let_go_at_the_cap() {
    let live = Live::new();
    let old = QueueBroker::ignoring_drains();
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    publish(&live, 2, &Arc::new(QueueBroker::default()));
    let feeding = tokio::spawn({
        let old = old.clone();
        async move {
            for i in 0.. {
                old.send(&format!("old-{i}"));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    });
    let reading = tokio::spawn(async move {
        while let Some(delivery) = sub.deliveries.recv().await {
            delivery.settle(DeliveryOutcome::Success);
        }
    });
    tokio::time::sleep(DRAIN_CAP - Duration::from_secs(10)).await;
    assert_eq!(old.subscriptions(), 1, "a delivering old broker is read on");
    tokio::time::sleep(Duration::from_secs(10) + STOP_GRACE + Duration::from_secs(1)).await;
    assert_eq!(old.subscriptions(), 0, "an old broker is read past the cap");
    feeding.abort();
    reading.abort();
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_stalled_on_a_delivery_holds_no_replaced_broker_past_the_cap() {
    let live = Live::new();
    let first = Arc::new(QueueBroker::default());
    publish(&live, 1, &first);
    let mut sub = subscribe(&live).await;
    // More than the subscriber's buffer, the delivery being given and the
    // source's channel hold: the forwarder is behind from here on.
    for data in numbered("old", 100) {
        first.send(&data);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The app hangs: three rebuilds leave three replaced brokers.
    let mut replaced = vec![first];
    for number in 2..=4 {
        let next = Arc::new(QueueBroker::default());
        publish(&live, number, &next);
        subscribed(&next).await;
        replaced.push(next);
    }
    let serving = replaced.pop().expect("four brokers");
    tokio::time::sleep(DRAIN_CAP + STOP_GRACE + Duration::from_secs(1)).await;
    for (i, broker) in replaced.iter().enumerate() {
        assert_eq!(
            Arc::strong_count(broker),
            1,
            "replaced broker {i} is still held past the cap"
        );
    }
    // The subscriber's buffer and the delivery it was being given are
    // kept; the rest of the first broker's backlog went with it.
    let buffered = super::HANDLE_SUBSCRIPTION_BUFFER + 1;
    assert_eq!(
        read(&mut sub, buffered, Duration::ZERO).await,
        numbered("old", buffered)
    );
    serving.send("after");
    assert_eq!(next(&mut sub).await.as_deref(), Some("after"));
}

/// A drain's wait before it delivers: past the grace (a Redis broker
/// waits for the publishes under way, up to its dialTimeout + readTimeout
/// + writeTimeout, ~11 s by default).
const SLOW_GATE: Duration = Duration::from_secs(8);

#[tokio::test(start_paused = true)]
async fn a_replaced_broker_that_starts_its_drain_after_the_grace_drains_its_backlog() {
    let live = Live::new();
    let old = QueueBroker::draining_after(SLOW_GATE);
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    // More than the forwarder and the broker's channel hold: some are in
    // the broker's channel at the drain (sent before it), the rest only
    // come after its wait.
    for data in numbered("old", 100) {
        old.send(&data);
    }
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    new.send("new-0");
    // The new broker's message comes while the old one waits.
    let mut seen = read(&mut sub, 101, Duration::ZERO).await;
    seen.retain(|data| data != "new-0");
    assert_eq!(seen, numbered("old", 100));
}

#[tokio::test(start_paused = true)]
async fn an_outcome_settled_before_a_replaced_broker_starts_its_drain_does_not_start_its_grace() {
    let live = Live::new();
    // `concurrency` 1, and a drain that waits before it delivers.
    let old = Arc::new(QueueBroker {
        one_at_a_time: true,
        drain_delay: SLOW_GATE,
        ..QueueBroker::default()
    });
    publish(&live, 1, &old);
    let mut sub = subscribe(&live).await;
    for data in numbered("old", 3) {
        old.send(&data);
    }
    let held = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
        .await
        .expect("no delivery within 30 s")
        .expect("the subscription ended");
    let new = Arc::new(QueueBroker::default());
    publish(&live, 2, &new);
    subscribed(&new).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.settle(DeliveryOutcome::Success);
    assert_eq!(
        read(&mut sub, 2, Duration::ZERO).await,
        numbered("old", 3)[1..]
    );
}

/// A rebuilt broker whose subscribe does not answer, or answers slowly:
/// the forwarder is not held by it, nor does it give up on it.
mod hanging_subscribe {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::super::super::{Generation, Instance, Live, LiveGeneration, PubSubHandle};
    use super::super::*;
    use crate::component::{Component, ComponentKey};
    use crate::kinds::{DeliveryOutcome, Message, PublishRequest, SubscriptionFeed};
    use crate::kinds::{PubSub, PubSubError, PubSubSubscription, SubscribeRequest};

    /// A broker whose first subscribe never answers (when told so); it
    /// keeps the feeds of the others, to deliver on.
    #[derive(Default)]
    struct Broker {
        hang_first: AtomicBool,
        feeds: Mutex<Vec<SubscriptionFeed>>,
    }

    #[async_trait]
    impl Component for Broker {}

    #[async_trait]
    impl PubSub for Broker {
        async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
            Ok(())
        }

        async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
            if self.hang_first.swap(false, Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let (subscription, feed) = PubSubSubscription::channel(4);
            self.feeds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(feed);
            Ok(subscription)
        }
    }

    fn publish(live: &LiveGeneration, number: u64, broker: &Arc<Broker>) {
        let broker: Arc<dyn PubSub> = broker.clone();
        let instances =
            BTreeMap::from([(ComponentKey::new("pubsub", "p"), Instance::PubSub(broker))]);
        live.publish(Generation::new(number, instances));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_broker_whose_subscribe_hangs_is_subscribed_again() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(Broker::default()));
        let handle = PubSubHandle::new(ComponentKey::new("pubsub", "p"), live.clone());
        let req = SubscribeRequest {
            topic: "t".into(),
            ..SubscribeRequest::default()
        };
        let mut sub = handle.subscribe(req).await.expect("subscribed");
        let rebuilt = Arc::new(Broker {
            hang_first: AtomicBool::new(true),
            ..Broker::default()
        });
        publish(&live, 2, &rebuilt);
        let feed = async {
            loop {
                if let Some(feed) = rebuilt
                    .feeds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop()
                {
                    return feed;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let feed = tokio::time::timeout(Duration::from_secs(60), feed)
            .await
            .expect("the forwarder is stuck on the subscribe that hangs");
        let message = Message {
            id: "1".into(),
            topic: "t".into(),
            data: b"after".to_vec(),
            ..Message::default()
        };
        drop(feed.deliver(message).await);
        let delivery = tokio::time::timeout(Duration::from_secs(60), sub.deliveries.recv())
            .await
            .expect("no delivery")
            .expect("the subscription ended");
        assert_eq!(delivery.message.data, b"after");
        delivery.settle(DeliveryOutcome::Success);
    }

    /// A broker whose subscribe answers only after `SLOW` (a redis broker
    /// with a 10 s dialTimeout on a slow link), every time.
    struct SlowBroker(Broker);

    const SLOW: Duration = Duration::from_secs(12);

    #[async_trait]
    impl Component for SlowBroker {}

    #[async_trait]
    impl PubSub for SlowBroker {
        async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
            self.0.publish(req).await
        }

        async fn subscribe(
            &self,
            req: SubscribeRequest,
        ) -> Result<PubSubSubscription, PubSubError> {
            tokio::time::sleep(SLOW).await;
            self.0.subscribe(req).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rebuilt_broker_slower_than_the_first_bound_is_subscribed_to() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(Broker::default()));
        let handle = PubSubHandle::new(ComponentKey::new("pubsub", "p"), live.clone());
        let req = SubscribeRequest {
            topic: "t".into(),
            ..SubscribeRequest::default()
        };
        let mut sub = handle.subscribe(req).await.expect("subscribed");
        let rebuilt = Arc::new(SlowBroker(Broker::default()));
        let as_pubsub: Arc<dyn PubSub> = rebuilt.clone();
        let instances = BTreeMap::from([(
            ComponentKey::new("pubsub", "p"),
            Instance::PubSub(as_pubsub),
        )]);
        live.publish(Generation::new(2, instances));
        // Past the resubscribe deadline: a slow broker is not given up on.
        tokio::time::sleep(RESUBSCRIBE_DEADLINE * 2).await;
        let feed = rebuilt
            .0
            .feeds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .expect("the slow broker was never subscribed to");
        let message = Message {
            id: "1".into(),
            topic: "t".into(),
            data: b"after".to_vec(),
            ..Message::default()
        };
        drop(feed.deliver(message).await);
        let delivery = tokio::time::timeout(Duration::from_secs(60), sub.deliveries.recv())
            .await
            .expect("no delivery")
            .expect("the subscription ended");
        assert_eq!(delivery.message.data, b"after");
        delivery.settle(DeliveryOutcome::Success);
    }

    /// A broker whose first `hangs` subscribes never answer; `awaited`
    /// counts those still waited for (not abandoned).
    #[derive(Default)]
    struct Hanging {
        hangs: std::sync::atomic::AtomicUsize,
        awaited: Arc<std::sync::atomic::AtomicUsize>,
        inner: Broker,
    }

    /// Counts a subscribe waited for while it lives.
    struct Awaited(Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Awaited {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Hanging {
        fn new(hangs: usize) -> Arc<Self> {
            Arc::new(Self {
                hangs: hangs.into(),
                ..Self::default()
            })
        }

        fn awaited(&self) -> usize {
            self.awaited.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl Component for Hanging {}

    #[async_trait]
    impl PubSub for Hanging {
        async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
            self.inner.publish(req).await
        }

        async fn subscribe(
            &self,
            req: SubscribeRequest,
        ) -> Result<PubSubSubscription, PubSubError> {
            let hangs = self
                .hangs
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if hangs.is_ok() {
                self.awaited.fetch_add(1, Ordering::SeqCst);
                let _awaited = Awaited(self.awaited.clone());
                std::future::pending::<()>().await;
            }
            self.inner.subscribe(req).await
        }
    }

    fn publish_hanging(live: &LiveGeneration, number: u64, broker: &Arc<Hanging>) {
        let broker: Arc<dyn PubSub> = broker.clone();
        let instances =
            BTreeMap::from([(ComponentKey::new("pubsub", "p"), Instance::PubSub(broker))]);
        live.publish(Generation::new(number, instances));
    }

    async fn subscribed_on_a_first_broker(live: &LiveGeneration) -> PubSubSubscription {
        publish(live, 1, &Arc::new(Broker::default()));
        let handle = PubSubHandle::new(ComponentKey::new("pubsub", "p"), live.clone());
        let req = SubscribeRequest {
            topic: "t".into(),
            ..SubscribeRequest::default()
        };
        handle.subscribe(req).await.expect("subscribed")
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscriber_leaving_while_a_subscribe_hangs_is_let_go_at_once() {
        let live = Live::new();
        let sub = subscribed_on_a_first_broker(&live).await;
        let rebuilt = Hanging::new(usize::MAX);
        publish_hanging(&live, 2, &rebuilt);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(rebuilt.awaited(), 1, "the rebuilt broker is subscribed to");
        drop(sub);
        // Well within the subscribe's bound (5 s).
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            rebuilt.awaited(),
            0,
            "the subscribe is still waited for after its subscriber left"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_broker_after_a_slow_one_is_first_waited_on_with_the_first_bound() {
        let live = Live::new();
        let mut sub = subscribed_on_a_first_broker(&live).await;
        // Two subscribes time out (5 s, then 10 s): the third is waited
        // for 20 s, and under way.
        let slow = Hanging::new(usize::MAX);
        publish_hanging(&live, 2, &slow);
        tokio::time::sleep(SUBSCRIBE_BOUND * 3 + Duration::from_secs(2)).await;
        assert_eq!(slow.awaited(), 1);
        // Its first subscribe hangs: given up on after SUBSCRIBE_BOUND
        // (not 20 s, nor 40 s), then tried again at once.
        let next = Hanging::new(1);
        publish_hanging(&live, 3, &next);
        let published = tokio::time::Instant::now();
        let feed = async {
            loop {
                if let Some(feed) = next
                    .inner
                    .feeds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop()
                {
                    return feed;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let feed = tokio::time::timeout(Duration::from_secs(120), feed)
            .await
            .expect("the new broker was never subscribed to");
        assert!(
            published.elapsed() <= SUBSCRIBE_BOUND + Duration::from_secs(1),
            "the new broker was first waited on for {:?}",
            published.elapsed()
        );
        assert_eq!(slow.awaited(), 0, "the replaced broker is still waited on");
        let message = Message {
            id: "1".into(),
            topic: "t".into(),
            data: b"after".to_vec(),
            ..Message::default()
        };
        drop(feed.deliver(message).await);
        let delivery = tokio::time::timeout(Duration::from_secs(60), sub.deliveries.recv())
            .await
            .expect("no delivery")
            .expect("the subscription ended");
        assert_eq!(delivery.message.data, b"after");
        delivery.settle(DeliveryOutcome::Success);
    }
}

/// What a delivery costs: no task of its own while its subscriber holds
/// it, and an outcome that reaches a drain's grace in time.
mod outcomes {
    use tokio::sync::Notify;
    use tokio::time::Instant;

    use super::super::{Forwarder, Source};
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deliveries_held_by_a_slow_subscriber_cost_no_task_each() {
        let live = Live::new();
        let broker = Arc::new(QueueBroker::default());
        publish(&live, 1, &broker);
        let mut sub = subscribe(&live).await;
        broker.send("first");
        assert_eq!(next(&mut sub).await.as_deref(), Some("first"));
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        for data in numbered("held", 20) {
            broker.send(&data);
        }
        let mut held = Vec::new();
        for _ in 0..20 {
            let delivery = tokio::time::timeout(Duration::from_secs(30), sub.deliveries.recv())
                .await
                .expect("no delivery within 30 s")
                .expect("the subscription ended");
            held.push(delivery);
        }
        let alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert_eq!(alive, tasks, "20 held deliveries cost tasks of their own");
        for delivery in held {
            delivery.settle(DeliveryOutcome::Success);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_outcome_that_ended_a_drains_wait_restarts_its_grace_before_it_is_looked_at() {
        let live = Live::new();
        let broker = Arc::new(QueueBroker::default());
        publish(&live, 1, &broker);
        let req = SubscribeRequest {
            topic: "t".into(),
            ..SubscribeRequest::default()
        };
        let subscription = broker.subscribe(req.clone()).await.expect("subscribed");
        let settled = Arc::new(Notify::new());
        let mut source = Source::new(broker.clone(), subscription, &settled);
        // Draining, its grace run out while a delivery awaited its
        // outcome, which has just arrived; the forwarder has not yet seen
        // to it.
        source.outstanding.drain();
        let (delivery, _at_broker) = crate::kinds::Delivery::new(Message::default());
        source
            .outstanding
            .watch(delivery)
            .settle(DeliveryOutcome::Success);
        let now = Instant::now();
        source.drain_until = Some(now + DRAIN_LIMIT);
        source.stop_at = Some(now - Duration::from_secs(1));
        let (_outer, feed) = PubSubSubscription::channel(1);
        let mut forwarder = Forwarder {
            handle: PubSubHandle::new(key(), live.clone()),
            req,
            current: None,
            settled,
            refused: None,
            subscribing: None,
            slow: None,
            warmed: None,
            draining: vec![source],
            feed,
        };
        forwarder.expire(false);
        assert!(
            !forwarder.draining[0].stopped,
            "stopped on a grace the outcome restarted"
        );
        assert!(forwarder.draining[0].stop_at > Some(now));
    }
}

/// A rebuilt broker that refuses the subscription while it keeps being
/// published (another component reloads): its retry is kept as it is, the
/// subscription is never on it twice, and a warmed broker published
/// meanwhile supersedes the retry.
mod refusing_broker {
    use super::super::RESUBSCRIBE_DEADLINE;
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_retry_due_after_a_publish_of_the_same_broker_subscribes_no_second_time() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        let rebuilt = QueueBroker::refusing(1);
        publish(&live, 2, &rebuilt);
        // Refused: tried again 100 ms later. Another component reloads
        // before that; the broker is the same instance.
        tokio::time::sleep(Duration::from_millis(10)).await;
        publish(&live, 3, &rebuilt);
        subscribed(&rebuilt).await;
        // More than the subscriber's buffer and the source's channel hold:
        // the rest waits in the broker's queue of the subscription.
        for data in numbered("m", 200) {
            rebuilt.send(&data);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            rebuilt.subscribes(),
            2,
            "subscribed again while subscribed (one refused, one taken)"
        );
        assert_eq!(
            read(&mut sub, 200, Duration::ZERO).await,
            numbered("m", 200)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_warmed_broker_published_while_a_retry_is_pending_is_subscribed_to_once() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        publish(&live, 2, &QueueBroker::refusing(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Refused, tried again 100 ms later; before that, a reload warms
        // and publishes another broker.
        let warmed = Arc::new(QueueBroker::default());
        reload(&live, 3, &warmed).await;
        subscribed(&warmed).await;
        for data in numbered("m", 200) {
            warmed.send(&data);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(warmed.subscribes(), 1, "subscribed again while subscribed");
        assert_eq!(
            read(&mut sub, 200, Duration::ZERO).await,
            numbered("m", 200)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_warming_while_the_broker_serving_is_subscribed_to_subscribes_once() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        // Its subscribe is under way while another component's reload
        // warms and publishes with the same broker.
        let rebuilt = QueueBroker::slow(Duration::from_secs(1));
        publish(&live, 2, &rebuilt);
        tokio::time::sleep(Duration::from_millis(10)).await;
        reload(&live, 3, &rebuilt).await;
        subscribed(&rebuilt).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rebuilt.subscribes(), 1, "subscribed twice to one broker");
        for data in numbered("m", 10) {
            rebuilt.send(&data);
        }
        assert_eq!(read(&mut sub, 10, Duration::ZERO).await, numbered("m", 10));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(sub.deliveries.try_recv().is_err(), "a message came twice");
    }

    #[tokio::test(start_paused = true)]
    async fn publishes_of_a_refusing_broker_neither_hurry_its_retries_nor_put_off_its_deadline() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        let refusing = QueueBroker::refusing(usize::MAX);
        publish(&live, 2, &refusing);
        // Another component reloads every second, the broker unchanged.
        let publishing = tokio::spawn({
            let (live, refusing) = (live.clone(), refusing.clone());
            async move {
                for number in 3.. {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    publish(&live, number, &refusing);
                }
            }
        });
        let ended = tokio::time::timeout(
            RESUBSCRIBE_DEADLINE + Duration::from_secs(10),
            sub.deliveries.recv(),
        )
        .await;
        publishing.abort();
        assert!(
            matches!(ended, Ok(None)),
            "the subscription did not end at the deadline"
        );
        // Backing off to one try in 5 s: about 18 in the minute, against
        // one a publish (60) when each publish tries at once.
        assert!(
            refusing.subscribes() < 30,
            "{} subscribes in a minute",
            refusing.subscribes()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusing_broker_given_up_on_is_not_tried_again_at_a_publish() {
        let live = Live::new();
        // Drains until its no-progress limit: the subscription outlives
        // the give-up.
        publish(&live, 1, &QueueBroker::ignoring_drains());
        let mut sub = subscribe(&live).await;
        let refusing = QueueBroker::refusing(usize::MAX);
        publish(&live, 2, &refusing);
        tokio::time::sleep(RESUBSCRIBE_DEADLINE + Duration::from_secs(1)).await;
        let tried = refusing.subscribes();
        publish(&live, 3, &refusing);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(refusing.subscribes(), tried, "tried again once given up on");
        let ended = tokio::time::timeout(
            DRAIN_LIMIT + STOP_GRACE + Duration::from_secs(1),
            sub.deliveries.recv(),
        )
        .await;
        assert!(
            matches!(ended, Ok(None)),
            "the subscription did not end once the old broker drained"
        );
    }
}

/// A retry of a refusal coming due while a reload warms another broker:
/// the warmed subscription is never asked to drain (a Redis one would close
/// the publishes of the broker about to serve).
mod retry_while_warming {
    use super::super::WARMED_HOLD;
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_retry_due_while_a_reload_warms_leaves_the_warmed_broker_undrained() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        // Refused at once: tried again 100 ms later, and on.
        let refusing = QueueBroker::refusing(usize::MAX);
        publish(&live, 2, &refusing);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The fixed broker's warm subscribe outlasts the retry's wait.
        let fixed = QueueBroker::slow(Duration::from_millis(300));
        let reloading = tokio::spawn({
            let (live, fixed) = (live.clone(), fixed.clone());
            async move { reload(&live, 3, &fixed).await }
        });
        tokio::time::timeout(Duration::from_secs(30), reloading)
            .await
            .expect("the reload did not end")
            .expect("the reload panicked");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(fixed.drains(), 0, "the warmed broker was asked to drain");
        assert_eq!(
            fixed.subscribes(),
            1,
            "the warmed subscription was not the one made current"
        );
        fixed.send("after");
        assert_eq!(next(&mut sub).await.as_deref(), Some("after"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_warmed_broker_never_published_is_stopped_not_drained_and_the_retry_goes_on() {
        let live = Live::new();
        publish(&live, 1, &Arc::new(QueueBroker::default()));
        let mut sub = subscribe(&live).await;
        let refusing = QueueBroker::refusing(1);
        publish(&live, 2, &refusing);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A reload warms another broker, then ends without its publish
        // (rolled back); the broker does not end its subscriptions.
        let abandoned = Arc::new(QueueBroker::default());
        live.warm(|| instances(&abandoned)).await;
        assert_eq!(abandoned.subscriptions(), 1, "the broker was not warmed");
        tokio::time::sleep(WARMED_HOLD + Duration::from_secs(1)).await;
        assert_eq!(abandoned.drains(), 0, "an unpublished broker was drained");
        assert_eq!(
            abandoned.subscriptions(),
            0,
            "an unpublished broker is held"
        );
        subscribed(&refusing).await;
        refusing.send("after");
        assert_eq!(next(&mut sub).await.as_deref(), Some("after"));
    }
}
