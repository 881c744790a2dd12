//! A bulk publish holds a bounded number of merged copies of its
//! request's metadata: every entry is checked in place, then merged,
//! enveloped and published when its publish starts (at most
//! `BULK_CONCURRENCY`, 16, at once). Measured as the process's resident
//! memory (Linux `/proc/self/status`) when the broker takes the first
//! entry: merging every entry first held one copy of the metadata per
//! entry.

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
