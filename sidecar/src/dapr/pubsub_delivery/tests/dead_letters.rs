//! Dead letters that fail, or race a reload: an event the app DROPs is
//! acknowledged only once its dead-letter topic took it (as Dapr; else it
//! was in neither topic, though acknowledged to its publisher), and a
//! dead letter refused by a broker a reload retired goes to the broker
//! serving now, as the publish API's publishes do; an event whose routes
//! a reload changed while it was retried is set aside as unrouted.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rewire_runtime::config::parse;
use rewire_runtime::{Component, ComponentKey, PubSub, PubSubError};

use super::*;

/// A subscriber that answers DROP to every event.
struct AlwaysDrop;

#[tonic::async_trait]
impl EventSink for AlwaysDrop {
    async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
        DeliveryOutcome::Drop
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// As Dapr (`return nil, pErr` when the dead letter of a dropped message
/// fails): an event the app DROPs whose dead-letter publish fails goes
/// back to the broker, which delivers it again; one the dead-letter topic
/// took, and one without a dead-letter topic, are dropped.
#[tokio::test]
async fn a_dropped_event_its_dead_letter_topic_refuses_goes_back_to_the_broker() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let sink: Arc<dyn EventSink> = Arc::new(AlwaysDrop);
    let (_task, _retire) =
        deliver_with_dead_letters(&runtime, "dropping", Some("dropping-refused"), sink.clone())
            .await;
    let outcome = feed_event("dropping", "d1").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Retry);
    assert_eq!(published_to("dropping-refused"), 1, "dead-lettering tried");

    let (_task, _retire) = deliver_with_dead_letters(
        &runtime,
        "dropping-ok",
        Some("dropping-ok-dead"),
        sink.clone(),
    )
    .await;
    let outcome = feed_event("dropping-ok", "d2").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Drop);
    assert_eq!(published_to("dropping-ok-dead"), 1, "dead-lettered");

    let (_task, _retire) = deliver_to(&runtime, "dropping-plain", sink).await;
    let outcome = feed_event("dropping-plain", "d3").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Drop);
    runtime.shutdown().await;
}

/// A subscription whose dead-letter topic its broker never takes (the
/// redis pub/sub's holding `||`) is refused at its start, as its topic
/// would be, before the broker is asked to subscribe (a streamed one
/// answers INVALID_ARGUMENT; an app's is tried again at each reload).
/// Before, it ran: every dead letter was refused and its event handed
/// back to the broker, delivered and failed again for ever.
#[tokio::test]
async fn a_subscription_whose_dead_letter_topic_its_broker_never_takes_is_refused() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let delivery = TopicDelivery {
        pubsub_name: "p".into(),
        topic: "dead-letter-refused".into(),
        dead_letter_topic: watch::channel(Some("orders||dlq".to_string())).1,
        retire: Retire::never(),
        delivered: Default::default(),
    };
    let started = delivery
        .start(
            &runtime,
            Arc::new(AlwaysDrop),
            Default::default(),
            CancellationToken::new(),
        )
        .await;
    match started {
        Err(PubSubOpError::Subscribe {
            topic,
            source: PubSubError::Invalid(message),
            ..
        }) => {
            assert_eq!(topic, "dead-letter-refused");
            assert!(
                message.contains("dead-letter topic is refused")
                    && message.contains("topic `orders||dlq` can't contain `||`"),
                "{message}"
            );
        }
        Err(other) => panic!("refused otherwise: {other}"),
        Ok(_) => panic!("a subscription whose dead letters all fail was started"),
    }
    let subscribed = FEEDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|(t, _)| t == "dead-letter-refused");
    assert!(!subscribed, "the broker was asked to subscribe");
    // With a dead-letter topic it takes, it starts.
    let sink: Arc<dyn EventSink> = Arc::new(AlwaysDrop);
    let taken = Some("orders|dlq");
    let (_task, _retire) =
        deliver_with_dead_letters(&runtime, "dead-letter-taken", taken, sink).await;
    runtime.shutdown().await;
}

/// A subscriber whose routes a reload replaces by ones that take no event
/// while an event is retried: it answers RETRY until attempt `swap_at`,
/// whose answer (RETRY) comes once the routes no longer take it; asked
/// again, it answers SUCCESS, as its app client did for an event no route
/// took any more when sent.
struct RoutesSwappedWhileRetried {
    swap_at: u32,
    sent: AtomicU32,
    routed: AtomicBool,
}

impl RoutesSwappedWhileRetried {
    fn at(swap_at: u32) -> Arc<Self> {
        Arc::new(Self {
            swap_at,
            sent: AtomicU32::new(0),
            routed: AtomicBool::new(true),
        })
    }
}

#[tonic::async_trait]
impl EventSink for RoutesSwappedWhileRetried {
    async fn send(&self, _: &TopicEvent, _: Duration) -> DeliveryOutcome {
        let attempt = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if attempt == self.swap_at {
            self.routed.store(false, Ordering::SeqCst);
        }
        match self.routed.load(Ordering::SeqCst) || attempt == self.swap_at {
            true => DeliveryOutcome::Retry,
            false => DeliveryOutcome::Success,
        }
    }

    async fn closed(&self) {
        std::future::pending().await
    }

    fn takes(&self, _: &TopicEvent) -> bool {
        self.routed.load(Ordering::SeqCst)
    }
}

/// An event being retried when a reload changes its subscription's routes
/// so that none takes it (after its first attempt, or during its last) is
/// unrouted, as if the new routes had been there first: it goes to the
/// dead-letter topic, is not sent again, and is not counted delivered for
/// its lineage, so the running subscription sends it by its own routes.
/// Before, the next attempt was acknowledged unsent (no dead letter), or
/// the last one's dead letter counted as delivered.
#[tokio::test(start_paused = true)]
async fn an_event_whose_routes_change_while_it_is_retried_is_set_aside_as_unrouted() {
    let runtime = runtime_with(serde_json::json!({})).await;
    for (case, swap_at) in [("first", 1), ("last", MAX_ATTEMPTS)] {
        let lineage = Arc::new(crate::dapr::handover::Lineage::default());
        let (old_topic, dead_topic) = (format!("reroute-{case}"), format!("reroute-{case}-dead"));
        let new_topic = format!("reroute-{case}-running");
        let old_sink = RoutesSwappedWhileRetried::at(swap_at);
        let new_sink = Arc::new(Counting::default());
        let (_old, _retire_old) = deliver_in(
            &runtime,
            &old_topic,
            Some(&dead_topic),
            lineage.member(),
            old_sink.clone(),
        )
        .await;
        let (_new, _retire_new) = deliver_in(
            &runtime,
            &new_topic,
            None,
            lineage.member(),
            new_sink.clone(),
        )
        .await;
        lineage.remember(true);

        let outcome = feed_event(&old_topic, "r1").await;
        assert_eq!(settled(outcome).await, DeliveryOutcome::Success, "{case}");
        assert_eq!(published_to(&dead_topic), 1, "{case}: dead-lettered");
        assert_eq!(
            old_sink.sent.load(Ordering::SeqCst),
            swap_at,
            "{case}: sent once no route took it"
        );
        let sent = feed_event(&new_topic, "r1").await;
        assert_eq!(settled(sent).await, DeliveryOutcome::Success, "{case}");
        assert_eq!(
            new_sink.sent.load(Ordering::SeqCst),
            1,
            "{case}: counted delivered, the running one did not send it"
        );
    }
    runtime.shutdown().await;
}

/// Publishes [`RetiringBroker`] has begun.
static RETIRING_PUBLISHES: AtomicU32 = AtomicU32::new(0);
/// Told once the reload replaced [`RetiringBroker`].
static REPLACED: AtomicBool = AtomicBool::new(false);
/// The topics published to [`ServingBroker`].
static SERVED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A broker a reload replaces while a publish is on its way to it: it
/// holds each publish until it was replaced, then refuses it as retired.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.delivery.retiring")]
struct RetiringBroker {}

#[async_trait]
impl Component for RetiringBroker {}

#[async_trait]
impl PubSub for RetiringBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        RETIRING_PUBLISHES.fetch_add(1, Ordering::SeqCst);
        let replaced = async {
            while !REPLACED.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        match tokio::time::timeout(Duration::from_secs(60), replaced).await {
            Ok(()) => Err(PubSubError::Retired),
            Err(_) => Err(PubSubError::Backend("never replaced".into())),
        }
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Ok(PubSubSubscription::channel(1).0)
    }
}

/// The broker replacing [`RetiringBroker`]: records what is published.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.delivery.serving")]
struct ServingBroker {}

#[async_trait]
impl Component for ServingBroker {}

#[async_trait]
impl PubSub for ServingBroker {
    async fn publish(&self, request: PublishRequest) -> Result<(), PubSubError> {
        let mut served = SERVED.lock().unwrap_or_else(|p| p.into_inner());
        served.push(request.topic);
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Ok(PubSubSubscription::channel(1).0)
    }
}

/// A runtime whose pub/sub `p` is of `broker_type`, started.
async fn started_with_broker(broker_type: &str) -> Runtime {
    let registry = Registry::collected();
    let config = validate(broker_config(broker_type), &registry).unwrap_or_else(|p| panic!("{p}"));
    Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The delivery of `topic` on `p`, dead-lettering to `{topic}-dead`.
fn dead_lettering(topic: &str) -> TopicDelivery {
    TopicDelivery {
        pubsub_name: "p".into(),
        topic: topic.into(),
        dead_letter_topic: watch::channel(Some(format!("{topic}-dead"))).1,
        retire: Retire::channel().1,
        delivered: Default::default(),
    }
}

/// A configuration whose pub/sub `p` is of `broker_type`.
fn broker_config(broker_type: &str) -> rewire_runtime::config::Config {
    let file = serde_json::json!({"appId": "app",
        "components": {"pubsub": {"p": {"type": broker_type}}}});
    parse(file.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A dead letter on its way to a broker that a reload replaces refuses
/// it as retired: it goes to the broker serving now (sent once, it was
/// lost, and an expired or unrouted event acknowledged without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_a_replaced_broker_refuses_reaches_the_one_serving() {
    let runtime = started_with_broker("test.delivery.retiring").await;
    let delivery = dead_lettering("reloading");
    let (message, _outcome) = Delivery::new(event_message("reloading", "r1"));
    let event = TopicEvent::of(&message.message, "p", "reloading");
    let handle = runtime.pubsub("p");
    let sending = tokio::spawn(async move {
        let sent = delivery.dead_letter(&event, &message, &handle).await;
        matches!(sent, DeadLetter::Sent)
    });
    let on_its_way = async {
        while RETIRING_PUBLISHES.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), on_its_way)
        .await
        .unwrap_or_else(|_| panic!("the dead letter was not sent within a minute"));

    let reload = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(broker_config("test.delivery.serving")).await }
    });
    let serving = async {
        let key = || ComponentKey::new("pubsub", "p");
        while runtime.component(key()).load_as::<ServingBroker>().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .unwrap_or_else(|_| panic!("the reload did not replace the broker within a minute"));
    REPLACED.store(true, Ordering::SeqCst);

    let sent = tokio::time::timeout(Duration::from_secs(60), sending)
        .await
        .unwrap_or_else(|_| panic!("the dead letter settled within a minute"))
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::timeout(Duration::from_secs(60), reload)
        .await
        .unwrap_or_else(|_| panic!("the reload ended within a minute"))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(sent, "the dead letter was sent");
    let served = SERVED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(served, ["reloading-dead"], "on the broker serving");
    runtime.shutdown().await;
}

/// A broker whose publishes never answer (a black-holed server with no
/// read timeout).
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.delivery.hanging")]
struct HangingBroker {}

#[async_trait]
impl Component for HangingBroker {}

#[async_trait]
impl PubSub for HangingBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        std::future::pending().await
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Ok(PubSubSubscription::channel(1).0)
    }
}

/// A dead letter whose broker never answers fails within its bound (the
/// event goes back to its broker), rather than holding the delivery, and
/// a replaced broker's drain, for ever.
#[tokio::test(start_paused = true)]
async fn a_dead_letter_whose_broker_never_answers_fails_within_its_bound() {
    let runtime = started_with_broker("test.delivery.hanging").await;
    let delivery = dead_lettering("hanging");
    let (message, _outcome) = Delivery::new(event_message("hanging", "h1"));
    let event = TopicEvent::of(&message.message, "p", "hanging");
    let handle = runtime.pubsub("p");
    let started = tokio::time::Instant::now();
    let sent = tokio::time::timeout(
        DEAD_LETTER_WITHIN + Duration::from_secs(1),
        delivery.dead_letter(&event, &message, &handle),
    )
    .await
    .unwrap_or_else(|_| panic!("the dead letter waited past its bound"));
    assert!(matches!(sent, DeadLetter::Failed));
    assert!(started.elapsed() >= DEAD_LETTER_WITHIN);
    runtime.shutdown().await;
}
