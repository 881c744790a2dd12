//! Subscriptions start side by side: brokers that never answer a
//! subscribe each hold their own start (for `SUBSCRIBE_WITHIN`, 40 s),
//! not every other start after them, nor the shutdown. Paused clock:
//! every wait is virtual and bounded.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::config::{parse, validate, SubscriptionRoutes};
use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry, Runtime,
    RuntimeOptions, SubscribeRequest,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::super::{Deliveries, Feed, Running};
use crate::app::routed::AppTarget;
use crate::app::{AppChannel, AppSubscription};

/// A broker whose subscribe never answers (a server that took the
/// connection and went silent).
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.silent")]
struct SilentBroker {}

#[async_trait]
impl Component for SilentBroker {}

#[async_trait]
impl PubSub for SilentBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        std::future::pending().await
    }
}

/// Subscribes answered by [`AnsweringBroker`].
static ANSWERED: AtomicUsize = AtomicUsize::new(0);

/// A broker that answers each subscribe at once (and delivers nothing).
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.answering")]
struct AnsweringBroker {}

#[async_trait]
impl Component for AnsweringBroker {}

#[async_trait]
impl PubSub for AnsweringBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(1);
        // The broker's side is kept, so the subscription does not end.
        std::mem::forget(feed);
        ANSWERED.fetch_add(1, Ordering::SeqCst);
        Ok(subscription)
    }
}

fn on(pubsub: &str, topic: &str) -> AppSubscription {
    AppSubscription {
        pubsub_name: pubsub.into(),
        topic: topic.into(),
        routes: SubscriptionRoutes::single("/r"),
        dead_letter_topic: None,
        metadata: BTreeMap::new(),
    }
}

/// Ten subscriptions on a silent broker, then one on an answering broker
/// listed last: the last one subscribes within one `SUBSCRIBE_WITHIN`
/// (at most eight start at once; one after another, it waited 10 × 40 s),
/// and a shutdown while silent subscribes are still pending ends the
/// task at once (it was not seen until the pass ended).
#[tokio::test(start_paused = true)]
async fn silent_brokers_do_not_hold_the_other_starts_nor_the_shutdown() {
    let file = parse(
        br#"{"appId": "app", "components": {"pubsub": {
            "silent": {"type": "test.follow.silent"},
            "answering": {"type": "test.follow.answering"}}}}"#,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel: AppChannel::local(9),
    };
    let mut fixed: Vec<(String, AppSubscription)> = (0..10)
        .map(|i| (format!("hung-{i:02}"), on("silent", &format!("t{i}"))))
        .collect();
    fixed.push(("z-answering".into(), on("answering", "orders")));
    let shutdown = CancellationToken::new();
    let (subscribed, mut running) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(fixed));
    let answered = async {
        while ANSWERED.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // Past one SUBSCRIBE_WITHIN, well short of two.
    tokio::time::timeout(Duration::from_secs(60), answered)
        .await
        .expect("the answering broker's subscription waited for the silent ones");
    tokio::time::timeout(
        Duration::from_secs(1),
        running.wait_for(|ids| ids.contains("z-answering")),
    )
    .await
    .expect("told as running once started")
    .expect("following");
    // Two silent subscribes are still pending (started after the first
    // eight gave up): the shutdown does not wait for them.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), following)
        .await
        .expect("stopped at once, not after the pending subscribes")
        .expect("joined");
    runtime.shutdown().await;
}

/// `a` runs on pub/sub `silent`; the pass renames it `b` (the same pub/sub
/// and topic), so `b`'s start takes `a` over, and that start never
/// answers. A shutdown during it stops `a` too and waits for it: `a`'s
/// delivery, which takes a moment to end once stopped (an event still
/// being settled), has ended once the task returns (it went on, posting
/// to the app or acknowledging, after the subscriptions were stopped).
#[tokio::test(start_paused = true)]
async fn a_subscription_being_taken_over_is_stopped_and_waited_for_at_shutdown() {
    let file = parse(
        br#"{"appId": "app", "components": {"pubsub": {
            "silent": {"type": "test.follow.silent"}}}}"#,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel: AppChannel::local(9),
    };
    let shutdown = CancellationToken::new();
    let (subscribed, _running) = watch::channel(BTreeSet::new());
    let mut deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let stop = shutdown.child_token();
    let a_ended = Arc::new(AtomicBool::new(false));
    let a_delivery = tokio::spawn({
        let (stop, ended) = (stop.clone(), Arc::clone(&a_ended));
        async move {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            ended.store(true, Ordering::SeqCst);
        }
    });
    let a = on("silent", "orders");
    deliveries.running.insert(
        "a".into(),
        Running {
            feed: Feed::of(&a),
            routes: watch::channel(Arc::new(a.routes.clone())).0,
            dead_letter_topic: watch::channel(None).0,
            retire: watch::channel(false).0,
            stop,
            task: a_delivery,
        },
    );
    let following = tokio::spawn(deliveries.follow(vec![("b".to_string(), a)]));
    // `b` waits on its broker (for up to SUBSCRIBE_WITHIN, 40 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!a_ended.load(Ordering::SeqCst), "`a` runs while `b` starts");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), following)
        .await
        .expect("stopped within the stop wait")
        .expect("joined");
    assert!(
        a_ended.load(Ordering::SeqCst),
        "`a`, taken over by the abandoned start, was not stopped and waited for"
    );
    runtime.shutdown().await;
}
