//! A declared subscription changed by a reload hands its topic over: the
//! old one retires, delivering what its broker holds for it. An event
//! the app failed there (handed back to the broker) while the new one
//! took over still reaches the app. On the memory broker it comes back
//! to the old subscription alone (its queue), so that one must not end
//! on catching up with the new one while it may: it did, and the event,
//! acknowledged to its publisher, was lost. On Redis Streams every reader
//! of the group (one consumer name) takes a pending entry over after
//! `processingTimeout`, the running subscription too.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::grpc::{self, dapr};
use crate::support::sidecar::Sidecar;

use axum::body::Bytes;
use axum::Json;
use rewire::config::parse;
use rewire::sidecar::app::{serve_app, AppChannel, AppService};
use rewire::sidecar::dapr::MAX_ATTEMPTS;
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use testkit::redis::RedisServer;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How long a wait for the app may take (each is for progress the
/// sidecar makes within a few seconds).
const WAIT: Duration = Duration::from_secs(60);
/// Events the app holds before the reload: the old subscription's
/// attempts in flight are all taken (32 with the failing one), so the
/// rest wait in its broker queue, ahead of what is published later.
const HELD: u32 = 40;

/// How long the app takes to ask for a `stubborn` event again: its
/// attempts (all of them, then handed back) outlast the hand-over.
const STUBBORN: Duration = Duration::from_millis(500);
/// How long the app takes to answer a `slow` event: it settles more than
/// the 5 s grace after the `stubborn` one was handed back.
const SLOW: Duration = Duration::from_secs(12);

/// What the app got: the event's `kind`, its `n`, and the answer.
type Got = (String, u64, &'static str);

/// The app: `failing` events are answered RETRY until `succeed` is
/// told (`stubborn` ones too, each after [`STUBBORN`]), `held` ones
/// SUCCESS once `open` is told, `slow` ones SUCCESS after [`SLOW`],
/// others SUCCESS.
async fn start_app(
    open: watch::Receiver<bool>,
    succeed: watch::Receiver<bool>,
) -> (AppChannel, mpsc::UnboundedReceiver<Got>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(|| async { Json(json!([])) }),
        )
        .fallback(move |body: Bytes| {
            let (tx, mut open, succeed) = (tx.clone(), open.clone(), succeed.clone());
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let kind = event["data"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let n = event["data"]["n"].as_u64().unwrap_or_default();
                let status = match kind.as_str() {
                    "failing" if !*succeed.borrow() => "RETRY",
                    "stubborn" if !*succeed.borrow() => {
                        tokio::time::sleep(STUBBORN).await;
                        "RETRY"
                    }
                    "slow" => {
                        tokio::time::sleep(SLOW).await;
                        "SUCCESS"
                    }
                    "held" => {
                        let _ = open.wait_for(|open| *open).await;
                        "SUCCESS"
                    }
                    _ => "SUCCESS",
                };
                let _ = tx.send((kind, n, status));
                Json(json!({ "status": status }))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx)
}

fn config(pubsub: &Value, rev: &str) -> String {
    json!({"appId": "shop", "components": {"pubsub": {"orders": pubsub}},
           "subscriptions": {"s": {"pubsubname": "orders", "topic": "handover",
               "route": "/r", "metadata": {"rev": rev}}}})
    .to_string()
}

async fn publish(
    client: &mut dapr::dapr_client::DaprClient<tonic::transport::Channel>,
    kind: &str,
    n: u64,
) {
    let event = json!({"specversion": "1.0", "id": format!("{kind}-{n}"), "source": "test",
        "type": "t", "datacontenttype": "application/json",
        "data": {"kind": kind, "n": n}});
    client
        .publish_event(dapr::PublishEventRequest {
            pubsub_name: "orders".into(),
            topic: "handover".into(),
            data: event.to_string().into_bytes(),
            data_content_type: "application/cloudevents+json".into(),
            metadata: Default::default(),
        })
        .await
        .expect("publish acknowledged");
}

/// Receives what the app got until `done` says so.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<Got>,
    what: &str,
    mut done: impl FnMut(&Got) -> bool,
) {
    let wait = async {
        loop {
            let got = rx.recv().await.expect("the app runs");
            if done(&got) {
                return;
            }
        }
    };
    if tokio::time::timeout(WAIT, wait).await.is_err() {
        panic!("{what}: not within {WAIT:?}");
    }
}

async fn subscribed(service: &mut AppService) {
    tokio::time::timeout(
        WAIT,
        service.subscribed.wait_for(|running| running.contains("s")),
    )
    .await
    .expect("subscribed in time")
    .expect("service alive");
}

/// Replaces the subscription (revision 2 of `pubsub`'s configuration),
/// then publishes probes until the new subscription delivers one.
async fn replace_and_probe(
    sidecar: &Sidecar,
    pubsub: &Value,
    client: &mut dapr::dapr_client::DaprClient<tonic::transport::Channel>,
    rx: &mut mpsc::UnboundedReceiver<Got>,
) {
    sidecar
        .runtime
        .apply(parse(config(pubsub, "2").as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    let mut probes = 0;
    let mut probed = false;
    while !probed {
        assert!(probes < 200, "the new subscription delivered nothing");
        publish(client, "probe", probes).await;
        probes += 1;
        let got = tokio::time::timeout(Duration::from_millis(200), async {
            while let Some((kind, ..)) = rx.recv().await {
                if kind == "probe" {
                    return true;
                }
            }
            false
        });
        probed = got.await.unwrap_or(false);
    }
}

/// An event the app fails (`failing`) is being retried by the old
/// subscription when a reload changes it; the app holds [`HELD`] more. Once
/// the new subscription delivers (probes published until one arrives,
/// which only it can send: the old one's attempts are all taken), the
/// app lets the held ones go: the old one catches up. The failing one is
/// still asked for after another full round of attempts (handed back and
/// given again by the broker), and reaches the app once it takes it.
async fn a_failed_event_survives_the_handover(pubsub: Value) {
    let (open, open_rx) = watch::channel(false);
    let (succeed, succeed_rx) = watch::channel(false);
    let sidecar = Sidecar::start(&config(&pubsub, "1"), ApiOptions::default()).await;
    let (channel, mut rx) = start_app(open_rx, succeed_rx).await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    publish(&mut client, "failing", 0).await;
    until(&mut rx, "the failing event sent", |(kind, ..)| {
        kind == "failing"
    })
    .await;
    for n in 0..u64::from(HELD) {
        publish(&mut client, "held", n).await;
    }
    replace_and_probe(&sidecar, &pubsub, &mut client, &mut rx).await;

    open.send_replace(true);
    let mut held: BTreeSet<u64> = BTreeSet::new();
    let mut failed_since = 0;
    // Every held one, then two more rounds of attempts at the failing one:
    // at least one of them after it was handed back once caught up.
    until(
        &mut rx,
        "the failing event asked for again",
        |(kind, n, _)| {
            match kind.as_str() {
                "held" => {
                    held.insert(*n);
                }
                "failing" if held.len() == HELD as usize => failed_since += 1,
                _ => {}
            }
            failed_since > 2 * MAX_ATTEMPTS
        },
    )
    .await;
    succeed.send_replace(true);
    until(&mut rx, "the failing event taken", |(kind, _, status)| {
        kind == "failing" && *status == "SUCCESS"
    })
    .await;
    stop.cancel();
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_event_survives_the_handover_on_memory() {
    a_failed_event_survives_the_handover(json!({"type": "memory"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_event_survives_the_handover_on_redis() {
    let server = RedisServer::start().await;
    let pubsub = json!({"type": "redis", "metadata": {"redisHost": server.addr(),
        "processingTimeout": "1s", "redeliverInterval": "1s", "concurrency": 32}});
    a_failed_event_survives_the_handover(pubsub).await;
}

/// The old subscription catches up with a `stubborn` event and a `slow`
/// one in flight, so it stops reading; the stubborn one is handed back
/// meanwhile (the memory broker queues it again for the old one alone),
/// and the slow one settles more than 5 s later. The old one reads again
/// for it, and it reaches the app (it ended once the slow one settled,
/// the event lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_handed_back_while_a_slow_one_settles_survives_the_handover_on_memory() {
    let pubsub = json!({"type": "memory"});
    let (open, open_rx) = watch::channel(false);
    let (succeed, succeed_rx) = watch::channel(false);
    let sidecar = Sidecar::start(&config(&pubsub, "1"), ApiOptions::default()).await;
    let (channel, mut rx) = start_app(open_rx, succeed_rx).await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    // The old one's slots taken: the stubborn, the slow and held ones.
    publish(&mut client, "stubborn", 0).await;
    publish(&mut client, "slow", 0).await;
    for n in 0..u64::from(HELD) {
        publish(&mut client, "held", n).await;
    }
    replace_and_probe(&sidecar, &pubsub, &mut client, &mut rx).await;
    // The old one takes the rest and meets the probes: caught up.
    open.send_replace(true);
    until(&mut rx, "the slow event answered", |(kind, ..)| {
        kind == "slow"
    })
    .await;
    succeed.send_replace(true);
    until(&mut rx, "the stubborn event taken", |(kind, _, status)| {
        kind == "stubborn" && *status == "SUCCESS"
    })
    .await;
    stop.cancel();
    sidecar.stop().await;
}
