//! A bulk publish holds a bounded number of merged copies of its
//! request's metadata: every entry is checked in place, then merged,
//! enveloped and published when its publish starts (at most
//! `BULK_CONCURRENCY`, 16, at once). Measured as the process's resident
//! memory (Linux `/proc/self/status`) when the broker takes the first
//! entry: merging every entry first held one copy of the metadata per
//! entry.
//!
//! A publish to a topic the broker never takes is refused before its
//! guarded call, so it gives the circuit breaker no verdict.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rewire_runtime::config::{parse, validate};
use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry, Runtime,
    RuntimeOptions, SubscribeRequest,
};

use super::PublishEvent;
use crate::dapr::{Call, StoreLabel};

/// Entries of the bulk publish.
const ENTRIES: usize = 4_000;
/// The request's metadata value (within the 16 KiB request bound): one
/// merged copy per entry held at once was `ENTRIES` × this, about 60 MB.
const PADDING: usize = 15_000;
/// What the process may grow by before the first entry is published.
const GROWTH_BOUND_KB: u64 = 16 * 1024;

/// Resident memory when the probe took its first publish.
static FIRST_PUBLISH_RESIDENT_KB: AtomicU64 = AtomicU64::new(0);
/// Publishes taken.
static PUBLISHED: AtomicUsize = AtomicUsize::new(0);
/// Publishes whose metadata is the request's under the entry's own.
static MERGED: AtomicUsize = AtomicUsize::new(0);

/// A broker that keeps nothing: it notes the resident memory at its first
/// publish and counts the merged ones.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.dapr.resident_probe")]
struct ResidentProbe {}

#[async_trait]
impl Component for ResidentProbe {}

#[async_trait]
impl PubSub for ResidentProbe {
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
        if PUBLISHED.fetch_add(1, Ordering::SeqCst) == 0 {
            FIRST_PUBLISH_RESIDENT_KB.store(resident_kb(), Ordering::SeqCst);
        }
        let padded = req.metadata.get("padding").map(String::len) == Some(PADDING);
        if padded && req.metadata.contains_key("own") {
            MERGED.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Err(PubSubError::Invalid(
            "the probe only takes publishes".into(),
        ))
    }
}

/// The process's resident memory (`VmRSS`), in kB; 0 if unreadable.
fn resident_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_bulk_publish_holds_one_merged_copy_of_its_metadata_at_a_time() {
    let file = parse(
        br#"{"appId": "shop", "components": {"pubsub": {"probe": {"type": "test.dapr.resident_probe"}}}}"#,
    )
    .unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ops = Call::new(&runtime, StoreLabel::default())
        .pubsub("probe")
        .unwrap_or_else(|e| panic!("{e}"));
    let request_metadata = HashMap::from([("padding".to_string(), "p".repeat(PADDING))]);
    let entries: Vec<(String, PublishEvent)> = (0..ENTRIES)
        .map(|i| {
            let event = PublishEvent {
                data: b"x".to_vec(),
                content_type: Some("text/plain".into()),
                metadata: HashMap::from([("own".to_string(), i.to_string())]),
                ..PublishEvent::default()
            };
            (format!("e{i}"), event)
        })
        .collect();
    let before = resident_kb();
    assert!(before > 0, "/proc/self/status gives VmRSS");

    let failed = ops
        .bulk_publish("orders", &request_metadata, entries)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(PUBLISHED.load(Ordering::SeqCst), ENTRIES);
    assert_eq!(MERGED.load(Ordering::SeqCst), ENTRIES);
    let grown = FIRST_PUBLISH_RESIDENT_KB
        .load(Ordering::SeqCst)
        .saturating_sub(before);
    assert!(
        grown < GROWTH_BOUND_KB,
        "the process grew by {grown} kB before the first entry was published"
    );
    runtime.shutdown().await;
}

/// Publishes [`DownBroker`] was asked, by topic holding `||` or not.
static DOWN_PUBLISHES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A broker whose backend is down, refusing a topic holding `||` as the
/// redis pub/sub does: in `publish` (before any contact with its server)
/// and in `check_topic`.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.dapr.down_refusing_separator")]
struct DownBroker {}

#[async_trait]
impl Component for DownBroker {}

#[async_trait]
impl PubSub for DownBroker {
    async fn publish(&self, req: PublishRequest) -> Result<(), PubSubError> {
        self.check_topic(&req.topic)?;
        let mut asked = DOWN_PUBLISHES.lock().unwrap_or_else(|p| p.into_inner());
        asked.push(req.topic);
        Err(PubSubError::Backend("connection refused".into()))
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Err(PubSubError::Backend("connection refused".into()))
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

/// The state of the outbound breaker of `runtime`'s pub/sub `bus`.
fn breaker_state(runtime: &Runtime) -> rewire_runtime::resilience::BreakerState {
    let key = rewire_runtime::ComponentKey::new(rewire_runtime::Kind::PubSub, "bus");
    let generation = runtime.generation();
    let status = generation
        .policies()
        .get(&key)
        .and_then(|applied| applied.breaker_status())
        .unwrap_or_else(|| panic!("`bus` has a breaker"));
    status.state
}

/// A publish to a topic the broker never takes (the redis pub/sub's
/// holding `||`) is refused before the guarded call: with the backend
/// down and the breaker half-open, it does not close the breaker (before,
/// the broker's local `Invalid` counted as a success and closed it, and
/// real publishes went on to the dead backend), nor spend its trial.
#[tokio::test(start_paused = true)]
async fn a_publish_to_a_topic_the_broker_never_takes_leaves_a_half_open_breaker_half_open() {
    use rewire_runtime::resilience::BreakerState;
    let config = serde_json::json!({
        "appId": "shop",
        "components": {"pubsub": {"bus": {"type": "test.dapr.down_refusing_separator"}}},
        "resiliency": {
            "policies": {"circuitBreakers": {"cb": {
                "trip": "consecutiveFailures >= 1", "timeout": "10s", "maxRequests": 1}}},
            "targets": {"components": {"bus": {"outbound": {"circuitBreaker": "cb"}}}}
        }
    });
    let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ops = Call::new(&runtime, StoreLabel::default())
        .pubsub("bus")
        .unwrap_or_else(|e| panic!("{e}"));
    let event = || PublishEvent {
        data: b"x".to_vec(),
        content_type: Some("text/plain".into()),
        ..PublishEvent::default()
    };
    let failed = ops.publish("orders", event()).await;
    assert!(
        matches!(
            failed,
            Err(super::PubSubOpError::Publish {
                source: PubSubError::Backend(_),
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(breaker_state(&runtime), BreakerState::Open);
    tokio::time::advance(std::time::Duration::from_secs(11)).await;
    assert_eq!(breaker_state(&runtime), BreakerState::HalfOpen);

    let refused = ops.publish("a||b", event()).await;
    assert!(
        matches!(
            refused,
            Err(super::PubSubOpError::Publish {
                source: PubSubError::Invalid(_),
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        breaker_state(&runtime),
        BreakerState::HalfOpen,
        "a refusal decided without the backend is no verdict on it"
    );
    // A bulk publish to it is refused whole, as the single publish (before:
    // 500 with every entry failed).
    let entries = vec![("1".to_string(), event()), ("2".to_string(), event())];
    let refused = ops
        .bulk_publish_within(
            "a||b",
            &Default::default(),
            entries,
            std::time::Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(super::PubSubOpError::Publish {
                source: PubSubError::Invalid(_),
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(breaker_state(&runtime), BreakerState::HalfOpen);
    // The trial is still there for a real publish, which reaches the
    // (down) backend and opens the breaker again.
    let trial = ops.publish("orders", event()).await;
    assert!(
        matches!(
            trial,
            Err(super::PubSubOpError::Publish {
                source: PubSubError::Backend(_),
                ..
            })
        ),
        "{trial:?}"
    );
    assert_eq!(breaker_state(&runtime), BreakerState::Open);
    let asked = DOWN_PUBLISHES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(asked, ["orders", "orders"]);
    runtime.shutdown().await;
}
