//! A delivery that ends on its own (its broker ended the subscription, not
//! a reload) is started again without waiting for a generation. Paused
//! clock: every wait is virtual and bounded.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rewire_runtime::config::{parse, validate, SubscriptionRoutes};
use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry, Runtime,
    RuntimeOptions, SubscribeRequest, SubscriptionFeed,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Deliveries;
use crate::app::routed::AppTarget;
use crate::app::{AppChannel, AppSubscription};

/// Subscribes made to [`EndingBroker`].
static SUBSCRIBES: AtomicUsize = AtomicUsize::new(0);
/// The broker's side of each subscription: dropped, it ends it.
static FEEDS: Mutex<Vec<SubscriptionFeed>> = Mutex::new(Vec::new());

/// A broker that delivers nothing and ends its subscriptions when told.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.ending")]
struct EndingBroker {}

#[async_trait]
impl Component for EndingBroker {}

#[async_trait]
impl PubSub for EndingBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(1);
        FEEDS.lock().unwrap_or_else(|p| p.into_inner()).push(feed);
        SUBSCRIBES.fetch_add(1, Ordering::SeqCst);
        Ok(subscription)
    }
}

async fn subscribes_reach(count: usize) {
    let wait = async {
        while SUBSCRIBES.load(Ordering::SeqCst) < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("{count} subscribes not made within a minute"));
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_ended_on_its_own_is_started_again() {
    let file = parse(
        br#"{"appId": "app", "components": {"pubsub": {"p": {"type": "test.follow.ending"}}}}"#,
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
    let subscription = AppSubscription {
        pubsub_name: "p".into(),
        topic: "t".into(),
        routes: SubscriptionRoutes::default(),
        dead_letter_topic: None,
        metadata: BTreeMap::new(),
    };
    let shutdown = CancellationToken::new();
    let (subscribed, _) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(vec![("given#0".into(), subscription)]));
    subscribes_reach(1).await;
    // The broker ends the subscription: no reload follows.
    FEEDS.lock().unwrap_or_else(|p| p.into_inner()).clear();
    subscribes_reach(2).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), following)
        .await
        .expect("stopped within a minute")
        .expect("joined");
    runtime.shutdown().await;
}

/// Subscribes made to [`CountingBroker`].
static COUNTED: AtomicUsize = AtomicUsize::new(0);

/// A broker that delivers nothing and counts its subscribes.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.counting")]
struct CountingBroker {}

#[async_trait]
impl Component for CountingBroker {}

#[async_trait]
impl PubSub for CountingBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(1);
        // Held open until the subscriber lets go.
        tokio::spawn(async move { feed.stopped().await });
        COUNTED.fetch_add(1, Ordering::SeqCst);
        Ok(subscription)
    }
}

fn counting_config(dead_letter: &str, rev: &str) -> rewire_runtime::config::Config {
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.counting"}}},
            "subscriptions": {"s": {"pubsubname": "p", "topic": "t", "route": "/r",
                "deadLetterTopic": dead_letter, "metadata": {"rev": rev}}}})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_topic_change_is_applied_in_place() {
    let registry = Registry::collected();
    let config =
        validate(counting_config("dead1", "1"), &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel: AppChannel::local(9),
    };
    let shutdown = CancellationToken::new();
    let (subscribed, _) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(Vec::new()));
    let counted = || COUNTED.load(Ordering::SeqCst);
    let settle = || tokio::time::sleep(Duration::from_secs(1));
    let wait = async {
        while counted() < 1 {
            settle().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("subscribed within a minute");
    // Only the dead-letter topic changes: the subscription stays.
    runtime
        .apply(counting_config("dead2", "1"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    settle().await;
    assert_eq!(counted(), 1, "a dead-letter change subscribed again");
    // A metadata change does subscribe again (the test sees reconciles).
    runtime
        .apply(counting_config("dead2", "2"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    settle().await;
    assert_eq!(counted(), 2);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(300), following)
        .await
        .expect("stopped")
        .expect("joined");
    runtime.shutdown().await;
}
