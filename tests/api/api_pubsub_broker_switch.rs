//! The lossless broker switch: a streaming subscriber reads while
//! publishers send thousands of events and the pub/sub's `redisHost` moves
//! to a second real `redis-server` mid-stream (a rebuild). Every publish
//! acknowledged to its publisher is delivered at least once, no publish
//! fails, the stream stays open; duplicates are counted and printed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::support::grpc::{self, dapr};
use crate::support::pubsub::{Next, StreamSubscriber};
use crate::support::sidecar::Sidecar;

use dapr::topic_event_response::TopicEventResponseStatus as Status;
use rewire::config::parse;
use rewire::sidecar::ApiOptions;
use rewire::{Action, ComponentKey};
use testkit::redis::RedisServer;
use tokio::sync::watch;

/// Events published in all.
const EVENTS: usize = 3000;
/// Publishers sending at once.
const PUBLISHERS: usize = 4;
/// The switch happens once this many publishes were acknowledged.
const SWITCH_AFTER: usize = 1000;

fn config(redis_host: &str) -> String {
    serde_json::json!({"appId": "shop", "components": {"pubsub": {"orders": {
        "type": "redis", "metadata": {"redisHost": redis_host}}}}})
    .to_string()
}

/// What the publishers saw.
#[derive(Default)]
struct Published {
    acknowledged: HashSet<usize>,
    failures: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_host_switch_mid_stream_loses_no_acknowledged_publish() {
    let (first, second) = (RedisServer::start().await, RedisServer::start().await);
    let sidecar = Sidecar::start(&config(&first.addr()), ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "orders", "orders")
        .await
        .expect("subscribed");

    let published = Arc::new(Mutex::new(Published::default()));
    let (acked_tx, mut acked) = watch::channel(0usize);
    let acked_tx = Arc::new(acked_tx);
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (url, published, acked_tx) = (sidecar.grpc_url(), published.clone(), acked_tx.clone());
        publishers.push(tokio::spawn(async move {
            let mut client = grpc::dapr_client(url).await;
            for seq in (p..EVENTS).step_by(PUBLISHERS) {
                let request = dapr::PublishEventRequest {
                    pubsub_name: "orders".into(),
                    topic: "orders".into(),
                    data: serde_json::json!({"seq": seq}).to_string().into_bytes(),
                    data_content_type: "application/json".into(),
                    metadata: Default::default(),
                };
                let outcome = client.publish_event(request).await;
                let mut published = published.lock().unwrap();
                match outcome {
                    Ok(_) => {
                        published.acknowledged.insert(seq);
                        acked_tx.send_replace(published.acknowledged.len());
                    }
                    Err(status) => published.failures.push(format!("{seq}: {status:?}")),
                }
            }
        }));
    }

    // Reads (and acknowledges) everything until told how much to expect.
    let (done_tx, mut done_rx) = watch::channel(None::<HashSet<usize>>);
    let reader = tokio::spawn(async move {
        let (mut received, mut duplicates) = (HashSet::new(), 0usize);
        loop {
            if let Some(expected) = done_rx.borrow().as_ref() {
                if expected.is_subset(&received) {
                    return (received, duplicates);
                }
            }
            let next = tokio::time::timeout(std::time::Duration::from_secs(8), subscriber.next());
            let next = tokio::select! {
                _ = done_rx.changed() => continue,
                next = next => next,
            };
            let event = match next {
                Ok(Next::Event(event)) => event,
                Ok(Next::Ended(status)) => panic!("the stream closed: {status:?}"),
                Err(_) => {
                    let expected = done_rx.borrow().clone().unwrap_or_default();
                    let mut missing: Vec<_> = expected.difference(&received).copied().collect();
                    missing.sort_unstable();
                    panic!(
                        "nothing delivered for 8 s: {} received, {duplicates} duplicates, {} missing: {:?}",
                        received.len(),
                        missing.len(),
                        &missing[..missing.len().min(20)]
                    );
                }
            };
            let body: serde_json::Value = serde_json::from_slice(&event.data).expect("json data");
            let seq = body["seq"].as_u64().expect("seq") as usize;
            if !received.insert(seq) {
                duplicates += 1;
            }
            subscriber.answer(&event.id, Status::Success).await;
        }
    });

    acked
        .wait_for(|n| *n >= SWITCH_AFTER)
        .await
        .expect("publishers alive");
    let candidate = parse(config(&second.addr()).as_bytes()).unwrap();
    let record = sidecar.runtime.apply(candidate).await.expect("switch applied");
    assert_eq!(
        record.actions.get(&ComponentKey::new("pubsub", "orders").to_string()),
        Some(&Action::Rebuilt),
        "a new redisHost rebuilds the pub/sub"
    );
    for publisher in publishers {
        publisher.await.expect("publisher panicked");
    }
    let published = std::mem::take(&mut *published.lock().unwrap());
    done_tx.send_replace(Some(published.acknowledged.clone()));
    let (received, duplicates) = reader.await.expect("reader panicked");
    let lost = published.acknowledged.difference(&received).count();
    let on_second: u64 = second
        .query(&["XLEN", "orders"])
        .await
        .ok()
        .and_then(|v| v.first().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    println!(
        "broker switch: {} acknowledged, {} failed, {} received, {lost} lost, {duplicates} duplicates, {on_second} published to the second server",
        published.acknowledged.len(),
        published.failures.len(),
        received.len()
    );
    assert!(published.failures.is_empty(), "publishes failed: {:?}", published.failures);
    assert_eq!(published.acknowledged.len(), EVENTS);
    assert_eq!(lost, 0, "acknowledged publishes were not delivered");
    assert!(on_second > 0, "publishes after the switch go to the second server");
    sidecar.stop().await;
}
