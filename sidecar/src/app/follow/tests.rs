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

/// The last subscription made to [`CountingBroker`].
static COUNTED_FEED: Mutex<Option<SubscriptionFeed>> = Mutex::new(None);
/// The topics published to [`CountingBroker`] (dead letters).
static COUNTED_PUBLISHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A broker that delivers what the test hands its feed, records the
/// topics published to it and counts its subscribes.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.counting")]
struct CountingBroker {}

#[async_trait]
impl Component for CountingBroker {}

#[async_trait]
impl PubSub for CountingBroker {
    async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
        COUNTED_PUBLISHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.topic);
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(1);
        *COUNTED_FEED.lock().unwrap_or_else(|p| p.into_inner()) = Some(feed);
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
    // An event the app cannot take (past its expiration: not sent; an
    // app that is not listening is waited for, not dead-lettered) goes to
    // the new dead-letter topic.
    let feed = COUNTED_FEED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .expect("subscribed");
    let expired = serde_json::json!({"specversion": "1.0", "id": "x1", "source": "test",
        "type": "t", "data": "x", "expiration": "2001-01-01T00:00:00Z"});
    let expired = rewire_runtime::Message {
        content_type: Some("application/cloudevents+json".into()),
        data: expired.to_string().into_bytes(),
        ..raw("")
    };
    let outcome = feed.deliver(expired).await.expect("subscribed");
    tokio::time::timeout(Duration::from_secs(300), outcome)
        .await
        .expect("settled within its attempts")
        .expect("settled");
    assert_eq!(
        *COUNTED_PUBLISHED.lock().unwrap_or_else(|p| p.into_inner()),
        ["dead2"]
    );
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

/// The broker's side of each subscription to [`ScriptedBroker`], in the
/// order they were made.
static SCRIPTED: Mutex<Vec<SubscriptionFeed>> = Mutex::new(Vec::new());

/// A broker that delivers what the test hands each subscription's feed.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.scripted")]
struct ScriptedBroker {}

#[async_trait]
impl Component for ScriptedBroker {}

#[async_trait]
impl PubSub for ScriptedBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(16);
        SCRIPTED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(feed);
        Ok(subscription)
    }
}

fn scripted_config(rev: &str) -> rewire_runtime::config::Config {
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.scripted"}}},
            "subscriptions": {"s": {"pubsubname": "p", "topic": "t", "route": "/r",
                "metadata": {"rev": rev}}}})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

/// The `n`th subscription's feed (0 the first), once it is made.
async fn scripted_feed(n: usize) -> SubscriptionFeed {
    let wait = async {
        loop {
            if let Some(feed) = SCRIPTED.lock().unwrap_or_else(|p| p.into_inner()).get(n) {
                return feed.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("subscription {n} not made within a minute"))
}

/// A raw (not CloudEvent) payload.
fn raw(text: &str) -> rewire_runtime::Message {
    rewire_runtime::Message {
        id: String::new(),
        topic: "t".into(),
        data: text.as_bytes().to_vec(),
        content_type: Some("text/plain".into()),
        metadata: Default::default(),
    }
}

/// A CloudEvent of `id` carrying `text`.
fn cloud_event(id: &str, text: &str) -> rewire_runtime::Message {
    let event = serde_json::json!({"specversion": "1.0", "id": id, "source": "test",
        "type": "t", "datacontenttype": "text/plain", "data": text});
    rewire_runtime::Message {
        content_type: Some("application/cloudevents+json".into()),
        data: event.to_string().into_bytes(),
        ..raw("")
    }
}

/// The app: records each event's `data` and answers SUCCESS, holding the
/// one whose data is `block` until `open` is told.
async fn recording_app() -> (
    AppChannel,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    watch::Sender<bool>,
) {
    use axum::Json;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (open, gate) = watch::channel(false);
    let app = axum::Router::new().route(
        "/r",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (tx, mut gate) = (tx.clone(), gate.clone());
            async move {
                let event: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let data = event["data"].as_str().unwrap_or_default().to_string();
                let _ = tx.send(data.clone());
                if data == "block" {
                    let _ = gate.wait_for(|open| *open).await;
                }
                Json(serde_json::json!({"status": "SUCCESS"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let channel = AppChannel::local(listener.local_addr().expect("an address").port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx, open)
}

/// The app got `wanted` (each once at least), in any order.
async fn app_got(got: &mut tokio::sync::mpsc::UnboundedReceiver<String>, wanted: &[&str]) {
    let mut missing: BTreeSet<&str> = wanted.iter().copied().collect();
    let wait = async {
        while !missing.is_empty() {
            let data = got.recv().await.expect("the app runs");
            missing.remove(data.as_str());
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .is_err()
    {
        panic!("the app did not get {missing:?} within a minute");
    }
}

/// A retiring subscription is caught up only by the same event (its
/// CloudEvent's source and id), not by the same bytes: a payload of its
/// backlog identical to one published after the change (and delivered by
/// its successor) is still delivered, and so is what follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_payload_identical_to_a_later_one_is_still_delivered() {
    let registry = Registry::collected();
    let config = validate(scripted_config("1"), &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (channel, mut got, open) = recording_app().await;
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel,
    };
    let shutdown = CancellationToken::new();
    let (subscribed, mut reconciled) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(Vec::new()));
    let old = scripted_feed(0).await;
    // Held by the app: the old subscription is never idle, so only what
    // it meets ends it (not its grace).
    let _held = old.deliver(raw("block")).await.expect("subscribed");
    app_got(&mut got, &["block"]).await;

    reconciled.borrow_and_update();
    runtime
        .apply(scripted_config("2"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let new = scripted_feed(1).await;
    // The reconcile that retired the old one is done.
    tokio::time::timeout(Duration::from_secs(60), reconciled.changed())
        .await
        .expect("reconciled within a minute")
        .expect("following");
    // The successor delivers a payload (settled once remembered)...
    let outcome = new.deliver(raw("same")).await.expect("subscribed");
    outcome.await.expect("settled");
    // ... that the old one holds too, published before the change.
    for message in [raw("same"), raw("after")] {
        drop(old.deliver(message).await.expect("still delivering"));
    }
    app_got(&mut got, &["same", "after"]).await;

    // The same CloudEvent does mean it caught up: not delivered again.
    let outcome = new
        .deliver(cloud_event("e-1", "event"))
        .await
        .expect("subscribed");
    outcome.await.expect("settled");
    let outcome = old
        .deliver(cloud_event("e-1", "event"))
        .await
        .expect("still delivering");
    outcome.await.expect("settled");
    let mut events = 0;
    while let Ok(data) = got.try_recv() {
        events += usize::from(data == "event");
    }
    assert_eq!(events, 1, "the successor's event was delivered again");
    open.send_replace(true);
    tokio::time::timeout(Duration::from_secs(60), old.stopped())
        .await
        .expect("the old subscription ended");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), following)
        .await
        .expect("stopped")
        .expect("joined");
    runtime.shutdown().await;
}

fn on(topic: &str, route: &str) -> AppSubscription {
    AppSubscription {
        pubsub_name: "p".into(),
        topic: topic.into(),
        routes: SubscriptionRoutes::single(route),
        dead_letter_topic: None,
        metadata: BTreeMap::new(),
    }
}

/// As Dapr's component store: one subscription per pub/sub and topic; the
/// app's own win over declared ones (the last listed of them), and the
/// first declared by name over the other declared ones.
#[test]
fn one_subscription_runs_per_pubsub_and_topic_as_in_dapr() {
    let fixed = vec![
        ("app#0".to_string(), on("t", "/first")),
        ("app#1".to_string(), on("t", "/second")),
        ("app#2".to_string(), on("u", "/u")),
    ];
    let declared = vec![
        ("a-declared".to_string(), on("t", "/declared")),
        ("b-declared".to_string(), on("v", "/v1")),
        ("c-declared".to_string(), on("v", "/v2")),
    ];
    let (wanted, shadowed) = super::one_per_topic(&fixed, declared);
    let wanted: Vec<&str> = wanted.keys().map(String::as_str).collect();
    assert_eq!(wanted, ["app#1", "app#2", "b-declared"]);
    let shadowed: Vec<(&str, &str)> = shadowed
        .iter()
        .map(|(id, (winner, _))| (id.as_str(), winner.as_str()))
        .collect();
    assert_eq!(
        shadowed,
        [
            ("a-declared", "app#1"),
            ("app#0", "app#1"),
            ("c-declared", "b-declared")
        ]
    );
}

/// A declared subscription named as one of the app's own (`app#0`) is
/// kept apart from it: both run (here on other topics). Before, the
/// declared one replaced the app's own by id and one silently vanished.
#[test]
fn a_declared_subscription_named_as_an_apps_own_id_keeps_both() {
    let fixed = vec![("app#0".to_string(), on("t", "/own"))];
    let declared = vec![
        ("app#0".to_string(), on("u", "/declared")),
        ("given#0".to_string(), on("v", "/v")),
        ("declared#app#0".to_string(), on("w", "/w")),
    ];
    let (wanted, shadowed) = super::one_per_topic(&fixed, declared);
    let wanted: Vec<(&str, &str)> = wanted
        .iter()
        .map(|(id, s)| (id.as_str(), s.topic.as_str()))
        .collect();
    assert_eq!(
        wanted,
        [
            ("app#0", "t"),
            ("declared#app#0", "u"),
            ("declared#declared#app#0", "w"),
            ("declared#given#0", "v"),
        ]
    );
    assert!(shadowed.is_empty(), "{shadowed:?}");
}

/// Subscribes made to [`TopicCountingBroker`], by topic.
static SUBSCRIBED_TOPICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A broker that delivers nothing and records the topic of each subscribe.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.topics")]
struct TopicCountingBroker {}

#[async_trait]
impl Component for TopicCountingBroker {}

#[async_trait]
impl PubSub for TopicCountingBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(1);
        // Kept, so the subscription does not end.
        std::mem::forget(feed);
        SUBSCRIBED_TOPICS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.topic);
        Ok(subscription)
    }
}

/// The app listing a topic twice, and the configuration declaring it too,
/// make one subscription (two had a memory broker deliver each event
/// twice, and split a consumer group's events between two routes).
#[tokio::test(start_paused = true)]
async fn the_same_topic_listed_twice_and_declared_is_subscribed_once() {
    let file = parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.topics"}}},
            "subscriptions": {"declared": {"pubsubname": "p", "topic": "twice", "route": "/d"}}})
        .to_string()
        .as_bytes(),
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
    let (subscribed, mut running) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let fixed = vec![
        ("app#0".to_string(), on("twice", "/a")),
        ("app#1".to_string(), on("twice", "/b")),
    ];
    let following = tokio::spawn(deliveries.follow(fixed));
    let running_now = tokio::time::timeout(
        Duration::from_secs(60),
        running.wait_for(|running| !running.is_empty()),
    )
    .await
    .expect("subscribed within a minute")
    .expect("following")
    .clone();
    assert_eq!(running_now, BTreeSet::from(["app#1".to_string()]));
    let subscribes = SUBSCRIBED_TOPICS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|t| *t == "twice")
        .count();
    assert_eq!(subscribes, 1);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), following)
        .await
        .expect("stopped")
        .expect("joined");
    runtime.shutdown().await;
}

/// A broker with the memory broker's semantics: a publish goes to the
/// subscriptions of its topic there when it is made, each queued without
/// bound and delivered again when settled `Retry`; a stopped
/// subscription's queue is dropped with it.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.memory")]
struct MemoryLikeBroker {
    topics: Mutex<std::collections::HashMap<String, Vec<UnboundedSender<rewire_runtime::Message>>>>,
}

type UnboundedSender<T> = tokio::sync::mpsc::UnboundedSender<T>;

#[async_trait]
impl Component for MemoryLikeBroker {}

#[async_trait]
impl PubSub for MemoryLikeBroker {
    async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
        let message = rewire_runtime::Message {
            id: String::new(),
            topic: request.topic.clone(),
            data: request.data,
            content_type: request.content_type,
            metadata: request.metadata,
        };
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let queues = topics.entry(request.topic).or_default();
        queues.retain(|queue| !queue.is_closed());
        for queue in queues.iter() {
            let _ = queue.send(message.clone());
        }
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        let (subscription, feed) = PubSubSubscription::channel(16);
        let (queue, mut queued) = tokio::sync::mpsc::unbounded_channel();
        self.topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(request.topic)
            .or_default()
            .push(queue.clone());
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    () = feed.stopped() => return,
                    Some(message) = queued.recv() => message,
                };
                let Some(outcome) = feed.deliver(message.clone()).await else {
                    return;
                };
                let again = queue.clone();
                tokio::spawn(async move {
                    use rewire_runtime::DeliveryOutcome;
                    let outcome = outcome.await.unwrap_or(DeliveryOutcome::Retry);
                    if outcome == DeliveryOutcome::Retry {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = again.send(message);
                    }
                });
            }
        });
        Ok(subscription)
    }
}

/// `subscriptions` (name, route) all on the pub/sub `p` and topic `orders`.
fn orders_config(subscriptions: &[(&str, &str)]) -> rewire_runtime::config::Config {
    let declared: serde_json::Map<String, serde_json::Value> = subscriptions
        .iter()
        .map(|(name, route)| {
            let declared =
                serde_json::json!({"pubsubname": "p", "topic": "orders", "route": route});
            (name.to_string(), declared)
        })
        .collect();
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.memory"}}},
            "subscriptions": declared})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

/// The app: records each event's `data` on every route and answers
/// SUCCESS once `open` is told (a slow app: what it has not taken waits in
/// the broker).
async fn held_app() -> (
    AppChannel,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    watch::Sender<bool>,
) {
    use axum::Json;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (open, gate) = watch::channel(false);
    let app = axum::Router::new().route(
        "/{*route}",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (tx, mut gate) = (tx.clone(), gate.clone());
            async move {
                let event: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                let data = event["data"].as_str().unwrap_or_default().to_string();
                let _ = tx.send(data);
                let _ = gate.wait_for(|open| *open).await;
                Json(serde_json::json!({"status": "SUCCESS"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let channel = AppChannel::local(listener.local_addr().expect("an address").port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx, open)
}

/// A runtime with `orders-a` (route `/a`) on the pub/sub `p`, whose
/// deliveries to the app at `channel` are followed.
struct OrdersFollowed {
    runtime: Runtime,
    running: watch::Receiver<BTreeSet<String>>,
    shutdown: CancellationToken,
    following: tokio::task::JoinHandle<()>,
}

impl OrdersFollowed {
    async fn start(channel: AppChannel) -> Self {
        let registry = Registry::collected();
        let config = validate(orders_config(&[("orders-a", "/a")]), &registry)
            .unwrap_or_else(|p| panic!("{p}"));
        let runtime = Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let app = AppTarget::Http {
            client: testkit::http_client(),
            channel,
        };
        let shutdown = CancellationToken::new();
        let (subscribed, mut running) = watch::channel(BTreeSet::new());
        let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
        let following = tokio::spawn(deliveries.follow(Vec::new()));
        running_are(&mut running, &["orders-a"]).await;
        Self {
            runtime,
            running,
            shutdown,
            following,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.following)
            .await
            .expect("stopped")
            .expect("joined");
        self.runtime.shutdown().await;
    }
}

/// Order `n` on the topic `orders`: a CloudEvent whose `data` is `n`.
fn order(n: u32) -> PublishRequest {
    let event = serde_json::json!({"specversion": "1.0", "id": format!("e-{n}"),
        "source": "test", "type": "t", "datacontenttype": "text/plain",
        "data": n.to_string()});
    PublishRequest {
        topic: "orders".into(),
        data: event.to_string().into_bytes(),
        content_type: Some("application/cloudevents+json".into()),
        metadata: Default::default(),
    }
}

/// Waits until the running subscriptions are `ids`.
async fn running_are(running: &mut watch::Receiver<BTreeSet<String>>, ids: &[&str]) {
    let ids: BTreeSet<String> = ids.iter().map(|id| id.to_string()).collect();
    tokio::time::timeout(Duration::from_secs(60), running.wait_for(|now| *now == ids))
        .await
        .unwrap_or_else(|_| panic!("{ids:?} not running within a minute"))
        .expect("following");
}

/// Another subscription taking over a pub/sub and topic in a reload
/// (one that now wins over the running one, then the running one
/// removed and another declared) starts before the one it replaces
/// retires: with the memory broker, every publish acknowledged across
/// both reloads reaches the app, the slow app's backlog included (the
/// old one was stopped first: its backlog was dropped, and what was
/// published until the new one subscribed reached nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_taking_over_a_topic_loses_no_publish() {
    let (channel, mut got, open) = held_app().await;
    let mut orders = OrdersFollowed::start(channel).await;
    let (runtime, running) = (orders.runtime.clone(), &mut orders.running);

    // Published without a pause across both reloads; the acknowledged.
    let publishing = CancellationToken::new();
    let publisher = tokio::spawn({
        let (runtime, publishing) = (runtime.clone(), publishing.clone());
        async move {
            let mut acknowledged = Vec::new();
            let mut n = 0u32;
            while !publishing.is_cancelled() {
                let broker = runtime.pubsub("p").load().expect("the pub/sub runs");
                if broker.publish(order(n)).await.is_ok() {
                    acknowledged.push(n.to_string());
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            acknowledged
        }
    });
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    settle().await;
    // `a-orders` wins over `orders-a` (the first declared by name).
    runtime
        .apply(orders_config(&[("orders-a", "/a"), ("a-orders", "/b")]))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(running, &["a-orders"]).await;
    settle().await;
    // `a-orders` removed, `orders-b` declared.
    runtime
        .apply(orders_config(&[("orders-b", "/c")]))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(running, &["orders-b"]).await;
    settle().await;
    publishing.cancel();
    let acknowledged = publisher.await.expect("published");
    assert!(acknowledged.len() > 100, "published {}", acknowledged.len());

    // The app takes what it held: every acknowledged publish comes.
    open.send_replace(true);
    let wanted: Vec<&str> = acknowledged.iter().map(String::as_str).collect();
    app_got(&mut got, &wanted).await;

    orders.stop().await;
}

/// The app: records each event's route and `data`, and answers SUCCESS
/// once `open` is told.
async fn held_app_by_route() -> (
    AppChannel,
    tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
    watch::Sender<bool>,
) {
    use axum::Json;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (open, gate) = watch::channel(false);
    let app = axum::Router::new().route(
        "/{*route}",
        axum::routing::post(
            move |axum::extract::Path(route): axum::extract::Path<String>,
                  body: axum::body::Bytes| {
                let (tx, mut gate) = (tx.clone(), gate.clone());
                async move {
                    let event: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                    let n = event["data"].as_str().and_then(|d| d.parse().ok());
                    if let Some(n) = n {
                        let _ = tx.send((route, n));
                    }
                    let _ = gate.wait_for(|open| *open).await;
                    Json(serde_json::json!({"status": "SUCCESS"}))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let channel = AppChannel::local(listener.local_addr().expect("an address").port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx, open)
}

/// What a subscription that another takes over still delivers goes by
/// the taker's routes: on a broker whose consumers share a group (Redis
/// Streams) both read new entries until the old one retires, and the
/// reload removed the old routes. Here the old one's backlog (published
/// before the reload, not yet sent to the held app) arrives on `/b`: only
/// the events already sent before the reload (at most 32 in flight)
/// arrive on `/a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_subscription_delivers_by_the_takers_routes() {
    let (channel, mut got, open) = held_app_by_route().await;
    let mut orders = OrdersFollowed::start(channel).await;
    let (runtime, running) = (orders.runtime.clone(), &mut orders.running);
    let publish = |n: u32| {
        let runtime = runtime.clone();
        async move {
            let broker = runtime.pubsub("p").load().expect("the pub/sub runs");
            broker.publish(order(n)).await.expect("published");
        }
    };
    for n in 0..100 {
        publish(n).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    runtime
        .apply(orders_config(&[("orders-a", "/a"), ("a-orders", "/b")]))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(running, &["a-orders"]).await;
    for n in 100..120 {
        publish(n).await;
    }
    open.send_replace(true);
    let mut missing: BTreeSet<u32> = (0..120).collect();
    let mut on_a = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !missing.is_empty() {
            let (route, n) = got.recv().await.expect("the app runs");
            missing.remove(&n);
            if route == "a" {
                on_a.push(n);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the app did not get {missing:?} within a minute"));
    assert!(
        on_a.len() <= 32 && on_a.iter().all(|n| *n < 100),
        "by the removed route: {on_a:?}"
    );

    orders.stop().await;
}

/// Subscribes made to [`PickyBroker`].
static PICKY_SUBSCRIBES: AtomicUsize = AtomicUsize::new(0);
/// The broker's side of each subscription to [`PickyBroker`].
static PICKY_FEEDS: Mutex<Vec<SubscriptionFeed>> = Mutex::new(Vec::new());

/// A broker that delivers nothing and, as the redis pub/sub, never takes
/// a topic holding `||`.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.picky")]
struct PickyBroker {}

#[async_trait]
impl Component for PickyBroker {}

#[async_trait]
impl PubSub for PickyBroker {
    async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
        self.check_topic(&request.topic)
    }

    async fn subscribe(
        &self,
        request: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        self.check_topic(&request.topic)?;
        let (subscription, feed) = PubSubSubscription::channel(1);
        PICKY_FEEDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(feed);
        PICKY_SUBSCRIBES.fetch_add(1, Ordering::SeqCst);
        Ok(subscription)
    }

    fn check_topic(&self, topic: &str) -> Result<(), PubSubError> {
        match topic.contains("||") {
            true => Err(PubSubError::Invalid(format!(
                "topic `{topic}` can't contain `||`"
            ))),
            false => Ok(()),
        }
    }
}

/// The declared subscription `s` to topic `t` of [`PickyBroker`], with
/// `dead_letter`.
fn picky_config(dead_letter: &str) -> rewire_runtime::config::Config {
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.picky"}}},
            "subscriptions": {"s": {"pubsubname": "p", "topic": "t", "route": "/r",
                "deadLetterTopic": dead_letter}}})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

/// A declared subscription whose dead-letter topic its broker never takes
/// is refused as one whose topic it refuses: not started (tried again at
/// each reload and every RETRY_EVERY), and stopped when a reload sets such
/// a dead-letter topic on it while it runs (applied in place, it ran with
/// every dead letter refused, its events delivered and failed again for
/// ever); a reload that mends it starts it.
#[tokio::test(start_paused = true)]
async fn a_dead_letter_topic_its_broker_never_takes_refuses_the_subscription() {
    let registry = Registry::collected();
    let config = validate(picky_config("orders||dlq"), &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel: AppChannel::local(9),
    };
    let shutdown = CancellationToken::new();
    let (subscribed, mut running) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(Vec::new()));
    let subscribes = || PICKY_SUBSCRIBES.load(Ordering::SeqCst);
    // Refused at its start, and at each retry.
    tokio::time::sleep(super::RETRY_EVERY * 3).await;
    assert_eq!(subscribes(), 0, "started with a dead-letter topic refused");
    assert!(running.borrow().is_empty());

    let apply = |dead_letter: &str| runtime.apply(picky_config(dead_letter));
    apply("dlq").await.unwrap_or_else(|e| panic!("{e}"));
    running_are(&mut running, &["s"]).await;
    assert_eq!(subscribes(), 1);

    // Set on the running one: it stops, and is not started again.
    apply("orders||dlq2")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(&mut running, &[]).await;
    let feed = PICKY_FEEDS.lock().unwrap_or_else(|p| p.into_inner())[0].clone();
    tokio::time::timeout(Duration::from_secs(60), feed.stopped())
        .await
        .expect("the running subscription let go of its broker within a minute");
    tokio::time::sleep(super::RETRY_EVERY * 3).await;
    assert_eq!(
        subscribes(),
        1,
        "started again with a dead-letter topic refused"
    );

    apply("dlq2").await.unwrap_or_else(|e| panic!("{e}"));
    running_are(&mut running, &["s"]).await;
    assert_eq!(subscribes(), 2);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(300), following)
        .await
        .expect("stopped")
        .expect("joined");
    runtime.shutdown().await;
}

mod concurrent_starts;
mod dead_letter_on_feed_change;
mod replaced_routes;
mod reused_ids;
mod takeover_chain;
