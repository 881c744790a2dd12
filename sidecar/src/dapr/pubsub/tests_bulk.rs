//! A bulk publish publishes its entries side by side (at most
//! [`BULK_CONCURRENCY`] at once) and answers a little before its call's
//! `request_timeout`, every entry not settled by then failed, instead of
//! being cut whole by the transport with no word of the entries taken.
//! Timed on tokio's paused clock: the probes' sleeps cost no real time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rewire_runtime::config::{parse, validate};
use rewire_runtime::prelude::async_trait;
use rewire_runtime::{
    Component, PubSub, PubSubError, PubSubSubscription, PublishRequest, Registry, Runtime,
    RuntimeOptions, SubscribeRequest,
};
use tokio::time::Instant;

use super::bulk::{BULK_CONCURRENCY, NOT_CONFIRMED, NOT_TRIED};
use super::{PubSubOps, PublishEvent};
use crate::dapr::{Call, StoreLabel};

/// How long each probe takes a publish.
const PUBLISH_TIME: Duration = Duration::from_secs(1);

/// Publishes under way in the [`SideBySideProbe`].
static SIDE_BY_SIDE_UNDER_WAY: AtomicUsize = AtomicUsize::new(0);
/// The most publishes under way at once in the [`SideBySideProbe`].
static SIDE_BY_SIDE_MOST: AtomicUsize = AtomicUsize::new(0);

/// A broker taking each publish in [`PUBLISH_TIME`], any number at once
/// (a slow link); it counts the most under way at once.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.dapr.side_by_side_probe")]
struct SideBySideProbe {}

#[async_trait]
impl Component for SideBySideProbe {}

#[async_trait]
impl PubSub for SideBySideProbe {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        let now = SIDE_BY_SIDE_UNDER_WAY.fetch_add(1, Ordering::SeqCst) + 1;
        SIDE_BY_SIDE_MOST.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(PUBLISH_TIME).await;
        SIDE_BY_SIDE_UNDER_WAY.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Err(PubSubError::Invalid(
            "the probe only takes publishes".into(),
        ))
    }
}

/// The one publish the [`OneAtATimeProbe`] takes at a time.
static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// A broker taking one publish at a time, each in [`PUBLISH_TIME`] (a
/// full queue draining slowly): the others wait their turn.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "pubsub", type = "test.dapr.one_at_a_time_probe")]
struct OneAtATimeProbe {}

#[async_trait]
impl Component for OneAtATimeProbe {}

#[async_trait]
impl PubSub for OneAtATimeProbe {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        let _turn = ONE_AT_A_TIME
            .acquire()
            .await
            .map_err(|_| PubSubError::Backend("the probe's turn closed".into()))?;
        tokio::time::sleep(PUBLISH_TIME).await;
        Ok(())
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Err(PubSubError::Invalid(
            "the probe only takes publishes".into(),
        ))
    }
}

/// A runtime serving one pub/sub `probe` of type `type_name`, and its
/// publish operations.
async fn probe_ops(type_name: &str) -> (Runtime, PubSubOps) {
    let json = format!(
        r#"{{"appId": "shop", "components": {{"pubsub": {{"probe": {{"type": "{type_name}"}}}}}}}}"#
    );
    let file = parse(json.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ops = Call::new(&runtime, StoreLabel::default())
        .pubsub("probe")
        .unwrap_or_else(|e| panic!("{e}"));
    (runtime, ops)
}

/// `count` entries `e0`, `e1`, ... of plain text.
fn entries(count: usize) -> Vec<(String, PublishEvent)> {
    (0..count)
        .map(|i| {
            let event = PublishEvent {
                data: b"x".to_vec(),
                content_type: Some("text/plain".into()),
                ..PublishEvent::default()
            };
            (format!("e{i}"), event)
        })
        .collect()
}

/// A broker taking each publish in 1 s: 10 entries published in 1 s (not
/// 10 s, past a 3 s `request_timeout`), 40 in three rounds of at most 16.
#[tokio::test]
async fn a_bulk_publish_publishes_its_entries_side_by_side_at_most_sixteen_at_once() {
    let (runtime, ops) = probe_ops("test.dapr.side_by_side_probe").await;
    tokio::time::pause();
    let request_timeout = Duration::from_secs(3);

    let started = Instant::now();
    let failed = ops
        .bulk_publish_within("orders", &HashMap::new(), entries(10), request_timeout)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        took < 2 * PUBLISH_TIME,
        "10 entries of {PUBLISH_TIME:?} each took {took:?}: not side by side"
    );

    // 40 entries: three rounds of at most 16, every one published.
    SIDE_BY_SIDE_MOST.store(0, Ordering::SeqCst);
    let started = Instant::now();
    let failed = ops
        .bulk_publish_within(
            "orders",
            &HashMap::new(),
            entries(40),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(SIDE_BY_SIDE_MOST.load(Ordering::SeqCst), BULK_CONCURRENCY);
    assert!(took < 4 * PUBLISH_TIME, "40 entries took {took:?}");
    runtime.shutdown().await;
}

/// A broker taking one publish a second, 20 entries, `request_timeout`
/// 3 s: answered at 2 s (not cut whole at 3 s), the entries taken by then
/// published, the ones under way not confirmed, the rest not tried.
/// Before, the entries were published one after another to the end.
#[tokio::test]
async fn a_bulk_publish_answers_before_request_timeout_with_its_unsettled_entries_failed() {
    let (runtime, ops) = probe_ops("test.dapr.one_at_a_time_probe").await;
    tokio::time::pause();
    let request_timeout = Duration::from_secs(3);
    let count = BULK_CONCURRENCY + 4;

    let started = Instant::now();
    let failed = ops
        .bulk_publish_within("orders", &HashMap::new(), entries(count), request_timeout)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();

    assert!(
        took < request_timeout,
        "answered after {took:?}, past request_timeout"
    );
    let failed: HashMap<String, String> = failed.into_iter().collect();
    let published = count - failed.len();
    assert!(
        published >= 1,
        "a publish taken within the deadline is reported: {failed:?}"
    );
    // The probe takes its publishes in turn: the first ones published,
    // the next ones (started as slots freed) under way, the rest untried.
    let tried = (published + BULK_CONCURRENCY).min(count);
    assert!(tried < count, "some entries are never tried: {failed:?}");
    for i in 0..count {
        let id = format!("e{i}");
        let expected = match i {
            i if i < published => None,
            i if i < tried => Some(NOT_CONFIRMED),
            _ => Some(NOT_TRIED),
        };
        assert_eq!(failed.get(&id).map(String::as_str), expected, "{id}");
    }
    runtime.shutdown().await;
}
