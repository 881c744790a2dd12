//! A reload that changes a running subscription's feed (its metadata)
//! and sets a dead-letter topic its broker never takes is refused before
//! any of it applies: the old subscription, stopped for it, keeps its
//! valid dead-letter topic for the event whose last attempt is still with
//! the app (before, it was given the refused topic first, so that event's
//! dead letter was refused and the event handed back to be delivered
//! again).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, DeliveryOutcome, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry,
    Runtime, RuntimeOptions, SubscribeRequest, SubscriptionFeed,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{parse, raw, running_are, validate, AppChannel, AppTarget, Deliveries};
use crate::dapr::MAX_ATTEMPTS;

/// The broker's side of each subscription to [`DeadLetterPickyBroker`].
static FEEDS: Mutex<Vec<SubscriptionFeed>> = Mutex::new(Vec::new());
/// The topics [`DeadLetterPickyBroker`] took a publish to (dead letters).
static PUBLISHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A broker that delivers what the test hands its feed, records the
/// topics it took a publish to and, as the redis pub/sub, never takes a
/// topic holding `||`.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.follow.dead_letter_picky")]
struct DeadLetterPickyBroker {}

#[async_trait]
impl Component for DeadLetterPickyBroker {}

#[async_trait]
impl PubSub for DeadLetterPickyBroker {
    async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
        self.check_topic(&request.topic)?;
        PUBLISHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request.topic);
        Ok(())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequest,
    ) -> Result<PubSubSubscription, PubSubError> {
        self.check_topic(&request.topic)?;
        let (subscription, feed) = PubSubSubscription::channel(4);
        FEEDS.lock().unwrap_or_else(|p| p.into_inner()).push(feed);
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

/// The declared subscription `s` to topic `t` of the broker, with
/// `metadata.rev` and `dead_letter`.
fn config(rev: &str, dead_letter: &str) -> rewire_runtime::config::Config {
    parse(
        serde_json::json!({"appId": "app",
            "components": {"pubsub": {"p": {"type": "test.follow.dead_letter_picky"}}},
            "subscriptions": {"s": {"pubsubname": "p", "topic": "t", "route": "/r",
                "deadLetterTopic": dead_letter, "metadata": {"rev": rev}}}})
        .to_string()
        .as_bytes(),
    )
    .unwrap_or_else(|p| panic!("{p}"))
}

/// The app: answers RETRY to every event, telling each request's number
/// (1 the first), and holds the one of the last attempt
/// ([`MAX_ATTEMPTS`]) until `open` is told.
async fn retrying_app() -> (
    AppChannel,
    tokio::sync::mpsc::UnboundedReceiver<usize>,
    watch::Sender<bool>,
) {
    use axum::Json;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (open, gate) = watch::channel(false);
    let requests = Arc::new(AtomicUsize::new(0));
    let last = usize::try_from(MAX_ATTEMPTS).unwrap_or(usize::MAX);
    let app = axum::Router::new().route(
        "/r",
        axum::routing::post(move || {
            let (tx, mut gate) = (tx.clone(), gate.clone());
            let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let _ = tx.send(n);
                if n == last {
                    let _ = gate.wait_for(|open| *open).await;
                }
                Json(serde_json::json!({"status": "RETRY"}))
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

/// The first subscription's feed, once it is made.
async fn first_feed() -> SubscriptionFeed {
    let wait = async {
        loop {
            if let Some(feed) = FEEDS.lock().unwrap_or_else(|p| p.into_inner()).first() {
                return feed.clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("subscribed within a minute")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_change_with_a_refused_dead_letter_topic_leaves_the_old_one_its_own() {
    let registry = Registry::collected();
    let config_1 = validate(config("1", "ok"), &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config_1, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (channel, mut requests, open) = retrying_app().await;
    let app = AppTarget::Http {
        client: testkit::http_client(),
        channel,
    };
    let shutdown = CancellationToken::new();
    let (subscribed, mut running) = watch::channel(BTreeSet::new());
    let deliveries = Deliveries::new(runtime.clone(), app, shutdown.clone(), subscribed);
    let following = tokio::spawn(deliveries.follow(Vec::new()));
    running_are(&mut running, &["s"]).await;
    let feed = first_feed().await;
    let outcome = feed.deliver(raw("x")).await.expect("subscribed");
    // Its last attempt is with the app, held there.
    let last = usize::try_from(MAX_ATTEMPTS).unwrap_or(usize::MAX);
    let wait = async { while requests.recv().await.expect("the app runs") < last {} };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("the last attempt reached the app within a minute");

    // The metadata changes (a new broker subscription) and the new
    // dead-letter topic is one the broker never takes: refused, and what
    // ran for the old settings stopped.
    runtime
        .apply(config("2", "d||x"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running_are(&mut running, &[]).await;

    // The last attempt fails: the event goes to the old, valid dead-letter
    // topic, and is settled.
    open.send_replace(true);
    let settled = tokio::time::timeout(Duration::from_secs(60), outcome)
        .await
        .expect("settled within a minute")
        .expect("settled");
    assert_eq!(
        settled,
        DeliveryOutcome::Success,
        "the dead letter was refused and the event handed back"
    );
    assert_eq!(*PUBLISHED.lock().unwrap_or_else(|p| p.into_inner()), ["ok"]);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), following)
        .await
        .expect("stopped within a minute")
        .expect("joined");
    runtime.shutdown().await;
}
