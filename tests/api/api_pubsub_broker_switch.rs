//! The lossless broker switch: a subscriber reads while publishers send
//! thousands of events and the pub/sub's `redisHost` moves to a second
//! real `redis-server` mid-stream (a rebuild). Every publish acknowledged
//! to its publisher is delivered at least once, no publish fails, the
//! subscription stays open; duplicates are counted and printed. Once with
//! a streaming subscriber (`SubscribeTopicEventsAlpha1`), once with an
//! app subscribed over HTTP (`--app-port`: `GET /dapr/subscribe`, a `POST`
//! per event).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::grpc::{self, dapr};
use crate::support::pubsub::{Next, StreamSubscriber};
use crate::support::sidecar::Sidecar;

use axum::routing::{get, post};
use axum::Json;
use dapr::topic_event_response::TopicEventResponseStatus as Status;
use rewire::config::parse;
use rewire::sidecar::app::{serve_app, AppChannel};
use rewire::sidecar::ApiOptions;
use rewire::{Action, ComponentKey};
use testkit::redis::RedisServer;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Events published in all.
const EVENTS: usize = 3000;
/// Publishers sending at once.
const PUBLISHERS: usize = 4;
/// The switch happens once this many publishes were acknowledged.
const SWITCH_AFTER: usize = 1000;
/// How long the last deliveries may take once publishing is over.
const SETTLE: Duration = Duration::from_secs(30);

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

/// What the subscriber got; `count` is told every new sequence number.
struct Received {
    seen: Mutex<(HashSet<usize>, usize)>,
    count: watch::Sender<usize>,
    probed: watch::Sender<bool>,
}

impl Received {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            seen: Mutex::new((HashSet::new(), 0)),
            count: watch::channel(0).0,
            probed: watch::channel(false).0,
        })
    }

    /// Records the event carrying `data` (`{"seq": n}`).
    fn record(&self, data: &[u8]) {
        let body: serde_json::Value = serde_json::from_slice(data).expect("json data");
        if body["probe"] == true {
            self.probed.send_replace(true);
            return;
        }
        let seq = body["seq"].as_u64().expect("seq") as usize;
        let mut seen = self.seen.lock().unwrap();
        if seen.0.insert(seq) {
            self.count.send_replace(seen.0.len());
        } else {
            seen.1 += 1;
        }
    }
}

/// Publishes [`EVENTS`] events while switching the pub/sub to `second`
/// after [`SWITCH_AFTER`]; waits until `received` has every acknowledged
/// one (or [`SETTLE`] passes) and checks the guarantee.
async fn publish_through_a_switch(sidecar: &Sidecar, second: &RedisServer, received: &Received) {
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
    tokio::time::timeout(
        Duration::from_secs(60),
        acked.wait_for(|n| *n >= SWITCH_AFTER),
    )
    .await
    .expect("publishes acknowledged within a minute")
    .expect("publishers alive");
    let candidate = parse(config(&second.addr()).as_bytes()).unwrap();
    let record = sidecar
        .runtime
        .apply(candidate)
        .await
        .expect("switch applied");
    assert_eq!(
        record
            .actions
            .get(&ComponentKey::new("pubsub", "orders").to_string()),
        Some(&Action::Rebuilt),
        "a new redisHost rebuilds the pub/sub"
    );
    for publisher in publishers {
        tokio::time::timeout(Duration::from_secs(60), publisher)
            .await
            .expect("a publisher still ran a minute after the switch")
            .expect("publisher panicked");
    }
    let published = std::mem::take(&mut *published.lock().unwrap());
    let everything = published.acknowledged.len();
    let _ = tokio::time::timeout(
        SETTLE,
        received.count.subscribe().wait_for(|n| *n >= everything),
    )
    .await;
    let (seen, duplicates) = received.seen.lock().unwrap().clone();
    let mut lost: Vec<usize> = published.acknowledged.difference(&seen).copied().collect();
    lost.sort_unstable();
    let on_second: u64 = second
        .query(&["XLEN", "orders"])
        .await
        .ok()
        .and_then(|v| v.first().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    println!(
        "broker switch: {everything} acknowledged, {} failed, {} received, {} lost, {duplicates} duplicates, {on_second} published to the second server",
        published.failures.len(),
        seen.len(),
        lost.len()
    );
    assert!(
        published.failures.is_empty(),
        "publishes failed: {:?}",
        published.failures
    );
    assert_eq!(everything, EVENTS);
    assert!(
        lost.is_empty(),
        "acknowledged publishes not delivered: {:?}",
        &lost[..lost.len().min(20)]
    );
    assert!(
        on_second > 0,
        "publishes after the switch go to the second server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_host_switch_mid_stream_loses_nothing_for_a_streaming_subscriber() {
    let (first, second) = (RedisServer::start().await, RedisServer::start().await);
    let sidecar = Sidecar::start(&config(&first.addr()), ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "orders", "orders")
        .await
        .expect("subscribed");
    let received = Received::new();
    let reading = CancellationToken::new();
    let reader = tokio::spawn({
        let (received, reading) = (received.clone(), reading.clone());
        async move {
            loop {
                let next = tokio::select! {
                    () = reading.cancelled() => return,
                    next = subscriber.next() => next,
                };
                match next {
                    Next::Event(event) => {
                        received.record(&event.data);
                        subscriber.answer(&event.id, Status::Success).await;
                    }
                    Next::Ended(status) => panic!("the stream closed: {status:?}"),
                }
            }
        }
    });
    publish_through_a_switch(&sidecar, &second, &received).await;
    reading.cancel();
    reader.await.expect("the stream stayed open");
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_host_switch_mid_stream_loses_nothing_for_an_http_app() {
    let (first, second) = (RedisServer::start().await, RedisServer::start().await);
    let sidecar = Sidecar::start(&config(&first.addr()), ApiOptions::default()).await;
    let received = Received::new();
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            get(|| async {
                Json(serde_json::json!([{"pubsubname": "orders", "topic": "orders", "route": "/events"}]))
            }),
        )
        .route(
            "/events",
            post({
                let received = received.clone();
                move |Json(event): Json<serde_json::Value>| async move {
                    assert_eq!(event["source"], "shop");
                    received.record(event["data"].to_string().as_bytes());
                    Json(serde_json::json!({"status": "SUCCESS"}))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let stop_app = CancellationToken::new();
    serve_app(
        sidecar.runtime.clone(),
        channel,
        Vec::new(),
        stop_app.clone(),
    );
    // Subscribed once the first event arrives.
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut probed = received.probed.subscribe();
    let probe = dapr::PublishEventRequest {
        pubsub_name: "orders".into(),
        topic: "orders".into(),
        data: br#"{"probe": true}"#.to_vec(),
        data_content_type: "application/json".into(),
        metadata: Default::default(),
    };
    client.publish_event(probe).await.expect("probe published");
    tokio::time::timeout(grpc::PATIENCE, probed.wait_for(|p| *p))
        .await
        .expect("the app got the probe")
        .unwrap();
    publish_through_a_switch(&sidecar, &second, &received).await;
    stop_app.cancel();
    sidecar.stop().await;
}
