//! A subscription with `rawPayload` true: each message is the payload as
//! published, wrapped as Dapr's `FromRawPayload` wraps it, also when it
//! reads as a CloudEvent.

use std::sync::Mutex;

use super::*;

/// A subscriber that keeps each event it is sent and acknowledges it.
#[derive(Default)]
struct Keeps {
    events: Mutex<Vec<TopicEvent>>,
}

#[tonic::async_trait]
impl EventSink for Keeps {
    async fn send(&self, event: &TopicEvent, _: Duration) -> DeliveryOutcome {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
        DeliveryOutcome::Success
    }

    async fn closed(&self) {
        std::future::pending().await
    }
}

/// Delivers `topic` of `p` to `sink` with the subscription `metadata`.
async fn subscribed_with(
    runtime: &Runtime,
    topic: &str,
    metadata: &[(&str, &str)],
    sink: Arc<Keeps>,
) -> tokio::task::JoinHandle<()> {
    let delivery = TopicDelivery {
        pubsub_name: "p".into(),
        topic: topic.into(),
        dead_letter_topic: watch::channel(None).1,
        retire: Retire::never(),
        delivered: Default::default(),
    };
    let metadata = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    delivery
        .start(runtime, sink, metadata, CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_raw_payload_subscription_wraps_every_message_as_dapr_does() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let raw = Arc::new(Keeps::default());
    let _task = subscribed_with(&runtime, "raw-sub", &[("rawPayload", "true")], raw.clone()).await;
    // A message that reads as a CloudEvent is still the raw payload.
    let message = event_message("raw-sub", "ce-1");
    let published = message.data.clone();
    let outcome = feed_of("raw-sub")
        .deliver(message)
        .await
        .expect("subscribed");
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    let event = raw.events.lock().expect("events")[0].clone();
    assert_ne!(event.id, "ce-1", "a new id, as FromRawPayload");
    assert_eq!(event.data_content_type, "application/octet-stream");
    assert_eq!(event.data, published);
    assert_eq!(event.field("source"), "Dapr");
    assert_eq!(event.field("type"), crate::dapr::pubsub_event::EVENT_TYPE);
    assert_eq!(event.field("pubsubname"), "p");
    assert!(event.cloud_event.contains_key("data_base64"));
    assert!(!event.cloud_event.contains_key("data"));

    // Without the flag (or with a false one), the CloudEvent is read.
    let plain = Arc::new(Keeps::default());
    let _task = subscribed_with(
        &runtime,
        "plain-sub",
        &[("rawPayload", "false")],
        plain.clone(),
    )
    .await;
    let outcome = feed_event("plain-sub", "ce-2").await;
    assert_eq!(settled(outcome).await, DeliveryOutcome::Success);
    let event = plain.events.lock().expect("events")[0].clone();
    assert_eq!(
        (event.id.as_str(), event.data.as_slice()),
        ("ce-2", &b"x"[..])
    );
    runtime.shutdown().await;
}
