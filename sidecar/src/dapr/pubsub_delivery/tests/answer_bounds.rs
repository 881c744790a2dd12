//! The bound each attempt is given: an inbound policy's `timeout` when one
//! is set, else the sink's own default ([`ANSWER_WITHIN`] for an app's
//! callback; none for a stream, which bounds its client's progress).

use std::sync::Mutex;
use std::time::Duration;

use super::*;

/// A subscriber that records the bound of each attempt and acknowledges.
struct RecordsBound {
    default_within: Option<Duration>,
    given: Mutex<Vec<Duration>>,
}

impl RecordsBound {
    fn new(default_within: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            default_within,
            given: Mutex::new(Vec::new()),
        })
    }

    fn given(&self) -> Vec<Duration> {
        self.given.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[tonic::async_trait]
impl EventSink for RecordsBound {
    async fn send(&self, _: &TopicEvent, within: Duration) -> DeliveryOutcome {
        self.given
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(within);
        DeliveryOutcome::Success
    }

    async fn closed(&self) {
        std::future::pending().await
    }

    fn default_within(&self) -> Option<Duration> {
        self.default_within
    }
}

#[tokio::test]
async fn without_a_policy_each_sink_gets_its_own_default_bound() {
    let runtime = runtime_with(serde_json::json!({})).await;
    let callback = RecordsBound::new(Some(ANSWER_WITHIN));
    let (_task, _retire) = deliver_to(&runtime, "bound-callback", callback.clone()).await;
    assert_eq!(
        settled(feed_event("bound-callback", "b1").await).await,
        DeliveryOutcome::Success
    );
    assert_eq!(callback.given(), [ANSWER_WITHIN]);

    let stream = RecordsBound::new(None);
    let (_task, _retire) = deliver_to(&runtime, "bound-stream", stream.clone()).await;
    assert_eq!(
        settled(feed_event("bound-stream", "b2").await).await,
        DeliveryOutcome::Success
    );
    assert_eq!(stream.given(), [Duration::MAX], "no bound per event");
    runtime.shutdown().await;
}

#[tokio::test]
async fn an_inbound_policy_timeout_bounds_every_sink() {
    let runtime = runtime_with(serde_json::json!({
        "policies": {"timeouts": {"short": "5s"}},
        "targets": {"components": {"p": {"inbound": {"timeout": "short"}}}}
    }))
    .await;
    let stream = RecordsBound::new(None);
    let (_task, _retire) = deliver_to(&runtime, "bound-policy", stream.clone()).await;
    assert_eq!(
        settled(feed_event("bound-policy", "b3").await).await,
        DeliveryOutcome::Success
    );
    assert_eq!(stream.given(), [Duration::from_secs(5)]);
    runtime.shutdown().await;
}
