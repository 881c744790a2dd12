//! Declarative subscriptions (the configuration's `subscriptions` section)
//! delivered to an HTTP app (a small server in the test): routing rules
//! choose the path by the event's type and data, DROP and exhausted
//! retries go to the dead-letter topic, a reload that adds, removes or
//! changes a subscription starts, stops or re-routes it while an unrelated
//! one keeps delivering every acknowledged publish, and bad entries are
//! refused with the running configuration left as it was. Memory and a
//! real `redis-server`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::support::grpc::{self, dapr};
use crate::support::sidecar::Sidecar;

use axum::body::Bytes;
use axum::http::Uri;
use axum::Json;
use rewire::config::parse;
use rewire::sidecar::app::{serve_app, AppChannel, AppService};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use testkit::redis::RedisServer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

type Client = dapr::dapr_client::DaprClient<Channel>;

/// An event the app got: the path it was posted to, and the CloudEvent.
type Got = (String, Value);

/// The app: `/dapr/subscribe` lists nothing (every subscription here is
/// declared); any other path records the event and answers SUCCESS, except
/// `/drop` (DROP) and `/retry` (RETRY).
async fn start_app() -> (AppChannel, mpsc::UnboundedReceiver<Got>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(|| async { Json(json!([])) }),
        )
        .fallback(move |uri: Uri, body: Bytes| {
            let tx = tx.clone();
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let path = uri.path().to_string();
                let _ = tx.send((path.clone(), event));
                let status = match path.as_str() {
                    "/drop" => "DROP",
                    "/retry" => "RETRY",
                    _ => "SUCCESS",
                };
                Json(json!({ "status": status }))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx)
}

fn config(pubsub: &Value, subscriptions: Value) -> String {
    json!({"appId": "shop", "components": {"pubsub": {"orders": pubsub}},
           "subscriptions": subscriptions})
    .to_string()
}

fn memory() -> Value {
    json!({"type": "memory"})
}

fn redis(server: &RedisServer) -> Value {
    json!({"type": "redis", "metadata": {"redisHost": server.addr()}})
}

/// Publishes a CloudEvent of `event_type` carrying `data` to `topic`.
async fn publish(client: &mut Client, topic: &str, event_type: &str, data: Value) {
    let event = json!({"specversion": "1.0", "id": uuid_like(&data), "source": "test",
                       "type": event_type, "datacontenttype": "application/json", "data": data});
    client
        .publish_event(dapr::PublishEventRequest {
            pubsub_name: "orders".into(),
            topic: topic.into(),
            data: event.to_string().into_bytes(),
            data_content_type: "application/cloudevents+json".into(),
            metadata: Default::default(),
        })
        .await
        .expect("publish acknowledged");
}

fn uuid_like(data: &Value) -> String {
    format!("id-{data}")
}

/// The next event the app gets that is not a probe.
async fn next_event(rx: &mut mpsc::UnboundedReceiver<Got>) -> Got {
    loop {
        let got = tokio::time::timeout(grpc::PATIENCE, rx.recv())
            .await
            .expect("an event within the patience")
            .expect("app alive");
        if got.1["data"].get("probe").is_none() {
            return got;
        }
    }
}

/// Waits until the service says every one of `ids` delivers.
async fn subscribed(service: &mut AppService, ids: &[&str]) {
    tokio::time::timeout(
        grpc::PATIENCE,
        service
            .subscribed
            .wait_for(|running| ids.iter().all(|id| running.contains(*id))),
    )
    .await
    .expect("subscribed within the patience")
    .expect("service alive");
}

fn routing_subscriptions() -> Value {
    json!({
        "inventory": {"pubsubname": "orders", "topic": "inventory", "routes": {
            "rules": [
                {"match": "event.type == \"widget\"", "path": "/widgets"},
                {"match": "event.type == 'gadget' && event.data.priority > 3", "path": "/urgent"}
            ],
            "default": "/products"}},
        "risky": {"pubsubname": "orders", "topic": "risky", "deadLetterTopic": "dead", "routes": {
            "rules": [{"match": "event.type == 'retry'", "path": "/retry"}],
            "default": "/drop"}},
        "dead": {"pubsubname": "orders", "topic": "dead", "route": "/dead"}
    })
}

async fn routing_and_dead_letters(pubsub: Value) {
    let sidecar = Sidecar::start(
        &config(&pubsub, routing_subscriptions()),
        ApiOptions::default(),
    )
    .await;
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["inventory", "risky", "dead"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    // Routing: the first rule that matches, else the default.
    publish(
        &mut client,
        "inventory",
        "widget",
        json!({"n": 1, "priority": 9}),
    )
    .await;
    publish(
        &mut client,
        "inventory",
        "gadget",
        json!({"n": 2, "priority": 5}),
    )
    .await;
    publish(
        &mut client,
        "inventory",
        "gadget",
        json!({"n": 3, "priority": 1}),
    )
    .await;
    let mut paths = BTreeMap::new();
    for _ in 0..3 {
        let (path, event) = next_event(&mut rx).await;
        assert_eq!(event["topic"], "inventory");
        paths.insert(event["data"]["n"].as_u64().unwrap(), path);
    }
    assert_eq!(paths[&1], "/widgets");
    assert_eq!(paths[&2], "/urgent");
    assert_eq!(paths[&3], "/products");

    // DROP goes to the dead-letter topic at once.
    publish(&mut client, "risky", "order", json!({"n": 4})).await;
    let (path, event) = next_event(&mut rx).await;
    assert_eq!((path.as_str(), &event["data"]["n"]), ("/drop", &json!(4)));
    let (path, event) = next_event(&mut rx).await;
    assert_eq!((path.as_str(), &event["data"]["n"]), ("/dead", &json!(4)));

    // RETRY each time: after the last attempt, the dead-letter topic.
    publish(&mut client, "risky", "retry", json!({"n": 5})).await;
    let mut attempts = 0;
    let dead = loop {
        let (path, event) = next_event(&mut rx).await;
        assert_eq!(event["data"]["n"], 5);
        match path.as_str() {
            "/retry" => attempts += 1,
            "/dead" => break event,
            other => panic!("unexpected path {other}"),
        }
    };
    assert_eq!(attempts, rewire::sidecar::dapr::MAX_ATTEMPTS);
    assert_eq!(dead["type"], "retry");
    stop.cancel();
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declared_routes_and_dead_letters_on_memory() {
    routing_and_dead_letters(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declared_routes_and_dead_letters_on_redis() {
    let server = RedisServer::start().await;
    routing_and_dead_letters(redis(&server)).await;
}

/// What reached the app, by path: the `seq` of each event, in order.
#[derive(Default)]
struct Seen(Mutex<HashMap<String, Vec<u64>>>);

impl Seen {
    fn record(&self, (path, event): &Got) {
        if let Some(seq) = event["data"]["seq"].as_u64() {
            let mut seen = self.0.lock().unwrap();
            seen.entry(path.clone()).or_default().push(seq);
        }
    }

    fn on(&self, path: &str) -> Vec<u64> {
        self.0
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }
}

const STEADY_EVENTS: u64 = 600;

async fn reloads_follow_the_section(pubsub: Value, duplicates_allowed: bool) {
    let steady = json!({"pubsubname": "orders", "topic": "steady", "route": "/steady"});
    let extra = json!({"pubsubname": "orders", "topic": "extra", "route": "/extra"});
    let sidecar = Sidecar::start(
        &config(&pubsub, json!({ "steady": steady })),
        ApiOptions::default(),
    )
    .await;
    let (channel, mut rx) = start_app().await;
    let seen = Arc::new(Seen::default());
    let (count_tx, mut count) = tokio::sync::watch::channel(0usize);
    tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut total = 0;
            while let Some(got) = rx.recv().await {
                seen.record(&got);
                total += 1;
                count_tx.send_replace(total);
            }
        }
    });
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["steady"]).await;

    // The steady subscription is published to throughout the reloads.
    let publisher = tokio::spawn({
        let url = sidecar.grpc_url();
        async move {
            let mut client = grpc::dapr_client(url).await;
            for seq in 0..STEADY_EVENTS {
                publish(&mut client, "steady", "tick", json!({ "seq": seq })).await;
                // Paced, so the reloads below happen while it publishes.
                if seq % 20 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
    });
    let apply = |subscriptions: Value| {
        let runtime = sidecar.runtime.clone();
        let text = config(&pubsub, subscriptions);
        async move {
            let record = runtime
                .apply(parse(text.as_bytes()).expect("valid"))
                .await
                .expect("reload applied");
            assert!(
                record
                    .actions
                    .values()
                    .all(|a| *a == rewire::Action::Unchanged),
                "a subscriptions-only reload rebuilds nothing: {:?}",
                record.actions
            );
        }
    };
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    // Adding a subscription starts its delivery.
    apply(json!({"steady": steady, "extra": extra})).await;
    subscribed(&mut service, &["steady", "extra"]).await;
    publish(&mut client, "extra", "tick", json!({"seq": 1000})).await;
    wait_until(&mut count, || seen.on("/extra").contains(&1000)).await;

    // Removing it stops its delivery: what is published after is not sent.
    apply(json!({ "steady": steady })).await;
    tokio::time::timeout(
        grpc::PATIENCE,
        service.subscribed.wait_for(|s| !s.contains("extra")),
    )
    .await
    .expect("stopped within the patience")
    .unwrap();
    publish(&mut client, "extra", "tick", json!({"seq": 1001})).await;

    // Changing a route re-routes in place.
    let moved = json!({"pubsubname": "orders", "topic": "steady", "route": "/moved"});
    apply(json!({ "steady": moved })).await;

    publisher.await.expect("publisher");
    publish(&mut client, "steady", "tick", json!({"seq": 5000})).await;
    wait_until(&mut count, || seen.on("/moved").contains(&5000)).await;
    // Deliveries are concurrent and a retried one may land after the
    // barrier event: every acknowledged event must arrive, within the
    // patience (a lost one never does, and fails below).
    let _ = tokio::time::timeout(grpc::PATIENCE, async {
        loop {
            let arrived: std::collections::BTreeSet<u64> = seen
                .on("/steady")
                .into_iter()
                .chain(seen.on("/moved"))
                .collect();
            if (0..STEADY_EVENTS).all(|s| arrived.contains(&s)) {
                break;
            }
            if count.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    let all: Vec<u64> = seen
        .on("/steady")
        .into_iter()
        .chain(seen.on("/moved"))
        .collect();
    let distinct: std::collections::BTreeSet<u64> = all.iter().copied().collect();
    let lost: Vec<u64> = (0..STEADY_EVENTS)
        .filter(|s| !distinct.contains(s))
        .collect();
    println!(
        "declared subscriptions across 3 reloads: {STEADY_EVENTS} acknowledged, {} received, {} lost, {} duplicates",
        distinct.iter().filter(|s| **s < STEADY_EVENTS).count(),
        lost.len(),
        all.len() - distinct.len()
    );
    assert!(lost.is_empty(), "lost across the reloads: {lost:?}");
    if !duplicates_allowed {
        assert_eq!(
            all.len(),
            distinct.len(),
            "the steady subscription was not restarted"
        );
    }
    assert!(
        !seen.on("/extra").contains(&1001),
        "a removed subscription delivered"
    );

    // Bad entries: refused with every problem named, nothing changed.
    let before = sidecar.runtime.generation().sections().clone();
    let unknown =
        json!({"steady": moved, "bad": {"pubsubname": "nope", "topic": "t", "route": "/x"}});
    let err = sidecar
        .runtime
        .apply(parse(config(&pubsub, unknown).as_bytes()).expect("parses"))
        .await
        .expect_err("an unknown pub/sub is refused");
    assert!(
        err.to_string().contains(
            "subscriptions.bad: field `pubsubname`: no pub/sub `nope` (declared: orders)"
        ),
        "{err}"
    );
    let malformed = json!({"steady": moved,
        "typo": {"pubsubname": "orders", "topik": "t", "route": "/x"},
        "rule": {"pubsubname": "orders", "topic": "t", "routes": {"rules": [{"match": "size(event.data) > 1", "path": "/x"}]}}});
    let problems = parse(config(&pubsub, malformed).as_bytes())
        .expect_err("malformed entries are refused")
        .to_string();
    assert!(
        problems.contains("subscriptions.typo: unknown field `topik` (did you mean `topic`?)"),
        "{problems}"
    );
    assert!(
        problems.contains("subscriptions.rule: `routes.rules[0].match`: unknown name `size`"),
        "{problems}"
    );
    assert_eq!(*sidecar.runtime.generation().sections(), before);
    publish(&mut client, "steady", "tick", json!({"seq": 5001})).await;
    wait_until(&mut count, || seen.on("/moved").contains(&5001)).await;
    stop.cancel();
    sidecar.stop().await;
}

/// Waits (bounded) until `done` holds, re-checked at each event.
async fn wait_until(count: &mut tokio::sync::watch::Receiver<usize>, done: impl Fn() -> bool) {
    tokio::time::timeout(grpc::PATIENCE, async {
        while !done() {
            count.changed().await.expect("collector alive");
        }
    })
    .await
    .expect("the app got it within the patience");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_start_stop_and_reroute_declared_subscriptions_on_memory() {
    reloads_follow_the_section(memory(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_start_stop_and_reroute_declared_subscriptions_on_redis() {
    let server = RedisServer::start().await;
    reloads_follow_the_section(redis(&server), true).await;
}

/// A message whose CloudEvent says something that is no header value (a
/// line break in `pubsubname`, put straight in the broker: a publish
/// through the sidecar overwrites that field) still reaches the app, named
/// by the subscription's pub/sub, instead of failing every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_whose_fields_are_no_header_values_still_reaches_the_app() {
    let plain = json!({"plain": {"pubsubname": "orders", "topic": "plain", "route": "/plain"}});
    let sidecar = Sidecar::start(&config(&memory(), plain), ApiOptions::default()).await;
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["plain"]).await;
    let event = json!({"specversion": "1.0", "id": "odd", "source": "elsewhere", "type": "t",
                       "topic": "plain", "pubsubname": "a\nb", "data": {"n": 1}});
    let broker = sidecar.runtime.pubsub("orders").load().expect("the broker");
    broker
        .publish(rewire::PublishRequest {
            topic: "plain".into(),
            data: event.to_string().into_bytes(),
            content_type: Some("application/cloudevents+json".into()),
            metadata: Default::default(),
        })
        .await
        .expect("published");
    let (path, got) = next_event(&mut rx).await;
    assert_eq!((path.as_str(), &got["id"]), ("/plain", &json!("odd")));
    stop.cancel();
    sidecar.stop().await;
}

/// The `traceparent` and `tracestate` headers of an event the app got,
/// and the CloudEvent.
type TracedGot = (Option<String>, Option<String>, Value);

/// An app recording each event posted to it with its trace headers,
/// answering SUCCESS.
async fn start_traced_app() -> (AppChannel, mpsc::UnboundedReceiver<TracedGot>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(|| async { Json(json!([])) }),
        )
        .fallback(move |headers: axum::http::HeaderMap, body: Bytes| {
            let tx = tx.clone();
            async move {
                let text = |key| Some(headers.get(key)?.to_str().ok()?.to_string());
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let _ = tx.send((text("traceparent"), text("tracestate"), event));
                Json(json!({ "status": "SUCCESS" }))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx)
}

/// Trace fields another writer of the topic put in a CloudEvent (put
/// straight in the broker: a publish through the sidecar checks them)
/// reach the app's headers only when they are a trace context within
/// W3C's bounds: a malformed `traceparent` is left out with its
/// `tracestate`, a 20 KB `tracestate` is cut to 512 bytes (an app whose
/// header limit refused them would have the event retried to its dead
/// letter). The CloudEvent posted is the one published.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_or_oversized_trace_in_an_event_is_not_sent_to_the_app() {
    const VALID: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = json!({"traced": {"pubsubname": "orders", "topic": "traced", "route": "/traced"}});
    let sidecar = Sidecar::start(&config(&memory(), traced), ApiOptions::default()).await;
    let (channel, mut rx) = start_traced_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["traced"]).await;
    let huge_state = format!("big={}", "x".repeat(20_000));
    let many = (0..100).map(|n| format!("v{n}=x")).collect::<Vec<_>>();
    let broker = sidecar.runtime.pubsub("orders").load().expect("the broker");
    let events = [
        ("malformed", "not-a-trace", many.join(",")),
        ("oversized", VALID, format!("{},{huge_state}", many[0])),
        ("many", VALID, many.join(",")),
    ]
    .map(|(id, traceparent, tracestate)| {
        json!({"specversion": "1.0", "id": id, "source": "elsewhere", "type": "t",
               "topic": "traced", "pubsubname": "orders",
               "traceparent": traceparent, "tracestate": tracestate, "data": {"n": 1}})
    });
    for event in &events {
        broker
            .publish(rewire::PublishRequest {
                topic: "traced".into(),
                data: event.to_string().into_bytes(),
                content_type: Some("application/cloudevents+json".into()),
                metadata: Default::default(),
            })
            .await
            .expect("published");
    }
    let mut seen = BTreeMap::new();
    while seen.len() < events.len() {
        let (traceparent, tracestate, got) = tokio::time::timeout(grpc::PATIENCE, rx.recv())
            .await
            .expect("each event within the patience")
            .expect("app alive");
        let id = got["id"].as_str().expect("an id").to_string();
        let published = events.iter().find(|e| e["id"] == json!(id));
        assert_eq!(Some(&got), published, "the CloudEvent as published");
        seen.insert(id, (traceparent, tracestate));
    }
    // No trace goes on (one of the sidecar's own, were calls traced).
    let (traceparent, tracestate) = &seen["malformed"];
    assert!(
        traceparent
            .as_deref()
            .is_none_or(|t| t.len() == VALID.len()),
        "{traceparent:?}"
    );
    assert_eq!(tracestate, &None);
    // The valid trace goes on, its state cut to whole members within
    // 512 bytes and 32 members.
    let trace_id = VALID.split('-').nth(1).expect("a trace id");
    for (id, kept) in [
        ("oversized", many[0].clone()),
        ("many", many[..32].join(",")),
    ] {
        let (traceparent, tracestate) = &seen[id];
        let traceparent = traceparent.as_deref().expect("the valid trace goes on");
        assert!(traceparent.contains(trace_id), "{id}: {traceparent}");
        assert_eq!(tracestate.as_deref(), Some(kept.as_str()), "{id}");
    }
    stop.cancel();
    sidecar.stop().await;
}

/// A broker that never answers a subscription's subscribe (a redis
/// server whose writes are paused: `XGROUP CREATE` waits, and with
/// `readTimeout: -1` the client waits with it) does not hold the app's
/// other subscriptions: the subscribe is given up on within its bound (the
/// sidecar's 40 s), the next subscription starts, and the stuck one is
/// started again, and delivers, once its broker answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_that_never_answers_a_subscribe_holds_no_other_subscription() {
    const SUBSCRIBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(40);
    let server = RedisServer::start().await;
    let paused = json!({"type": "redis", "metadata": {"redisHost": server.addr(),
                                                      "readTimeout": "-1"}});
    // Started in the order of their names: the stuck one first.
    let subscriptions = json!({
        "a-stuck": {"pubsubname": "paused", "topic": "stuck", "route": "/stuck"},
        "b-free": {"pubsubname": "orders", "topic": "free", "route": "/free"},
    });
    let config = json!({"appId": "shop",
        "components": {"pubsub": {"paused": paused, "orders": memory()}},
        "subscriptions": subscriptions})
    .to_string();
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    server
        .query(&["CLIENT", "PAUSE", "300000", "WRITE"])
        .await
        .expect("writes paused");
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    let free = tokio::time::timeout(
        SUBSCRIBE_WITHIN * 2,
        service
            .subscribed
            .wait_for(|running| running.contains("b-free")),
    )
    .await
    .map(|running| running.is_ok());
    assert_eq!(
        free,
        Ok(true),
        "the next subscription waited on the stuck one"
    );
    assert!(!service.subscribed.borrow().contains("a-stuck"));
    server
        .query(&["CLIENT", "UNPAUSE"])
        .await
        .expect("writes go on");
    tokio::time::timeout(
        SUBSCRIBE_WITHIN * 3,
        service
            .subscribed
            .wait_for(|running| running.contains("a-stuck")),
    )
    .await
    .expect("the stuck subscription started once its broker answered")
    .expect("service alive");
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .publish_event(dapr::PublishEventRequest {
            pubsub_name: "paused".into(),
            topic: "stuck".into(),
            data: br#"{"n":1}"#.to_vec(),
            data_content_type: "application/json".into(),
            metadata: Default::default(),
        })
        .await
        .expect("published");
    let (path, got) = next_event(&mut rx).await;
    assert_eq!((path.as_str(), &got["data"]), ("/stuck", &json!({"n": 1})));
    stop.cancel();
    sidecar.stop().await;
}

/// A raw payload (`rawPayload`, `application/json`) the app DROPs reaches
/// the dead-letter topic as it was published, its content type and
/// metadata kept (as Dapr's `sendToDeadLetter`): the app gets it there as
/// the event's `data` too. Sent as `application/cloudevents+json`, the
/// payload was taken for the CloudEvent itself (`order` at the top, no
/// `data`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_raw_payload_reaches_the_dead_letter_topic_as_published() {
    let subscriptions = json!({
        "raw": {"pubsubname": "orders", "topic": "raw", "route": "/drop",
                "deadLetterTopic": "raw-dead"},
        "raw-dead": {"pubsubname": "orders", "topic": "raw-dead", "route": "/dead"}
    });
    let sidecar = Sidecar::start(&config(&memory(), subscriptions), ApiOptions::default()).await;
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["raw", "raw-dead"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .publish_event(dapr::PublishEventRequest {
            pubsub_name: "orders".into(),
            topic: "raw".into(),
            data: br#"{"order":1}"#.to_vec(),
            data_content_type: "application/json".into(),
            metadata: HashMap::from([("rawPayload".to_string(), "true".to_string())]),
        })
        .await
        .expect("publish acknowledged");
    let (path, dropped) = next_event(&mut rx).await;
    assert_eq!(
        (path.as_str(), &dropped["data"]),
        ("/drop", &json!({"order": 1}))
    );
    let (path, dead) = next_event(&mut rx).await;
    assert_eq!(path, "/dead");
    assert_eq!(dead["data"], json!({"order": 1}), "{dead}");
    assert_eq!(dead["datacontenttype"], "application/json", "{dead}");
    stop.cancel();
    sidecar.stop().await;
}

/// The app, recording as [`start_app`] does, but holding every event on
/// `/slow` whose `seq` is below `held_below` until `open` is told.
async fn start_gated_app(
    held_below: u64,
) -> (
    AppChannel,
    mpsc::UnboundedReceiver<Got>,
    tokio::sync::watch::Sender<bool>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (open, gate) = tokio::sync::watch::channel(false);
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(|| async { Json(json!([])) }),
        )
        .fallback(move |uri: Uri, body: Bytes| {
            let (tx, mut gate) = (tx.clone(), gate.clone());
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let path = uri.path().to_string();
                let held = event["data"]["seq"]
                    .as_u64()
                    .is_some_and(|s| s < held_below);
                if path == "/slow" && held {
                    let _ = gate.wait_for(|open| *open).await;
                }
                let _ = tx.send((path, event));
                Json(json!({ "status": "SUCCESS" }))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx, open)
}

/// A declared subscription's metadata changes while a slow app has a
/// backlog on it (the memory broker's queue): the new subscription takes
/// what is published from then on, and the one it replaces still delivers
/// every event it holds before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_subscription_still_delivers_the_backlog_of_the_one_it_replaces() {
    const BACKLOG: u64 = 300;
    let slow = |rev: &str| {
        json!({"slow": {"pubsubname": "orders", "topic": "backlog", "route": "/slow",
                        "metadata": {"rev": rev}}})
    };
    let sidecar = Sidecar::start(&config(&memory(), slow("1")), ApiOptions::default()).await;
    let (channel, mut rx, open) = start_gated_app(BACKLOG).await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["slow"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    // The app holds these: most wait in the broker's queue.
    for seq in 0..BACKLOG {
        publish(&mut client, "backlog", "tick", json!({ "seq": seq })).await;
    }
    sidecar
        .runtime
        .apply(parse(config(&memory(), slow("2")).as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    // Published until one arrives: the new subscription delivers.
    let mut seq = BACKLOG;
    let mut seen = std::collections::BTreeSet::new();
    let started = loop {
        publish(&mut client, "backlog", "tick", json!({ "seq": seq })).await;
        seq += 1;
        let got = tokio::time::timeout(std::time::Duration::from_millis(200), rx.recv()).await;
        if let Ok(Some((_, event))) = got {
            break event["data"]["seq"].as_u64().expect("a seq");
        }
        assert!(
            seq < BACKLOG + 100,
            "the new subscription delivered nothing"
        );
    };
    assert!(started >= BACKLOG, "the held events stay held");
    seen.insert(started);
    open.send_replace(true);
    let all: Vec<u64> = (0..seq).collect();
    let _ = tokio::time::timeout(grpc::PATIENCE, async {
        while !all.iter().all(|s| seen.contains(s)) {
            match rx.recv().await {
                Some((_, event)) => {
                    seen.insert(event["data"]["seq"].as_u64().expect("a seq"));
                }
                None => break,
            }
        }
    })
    .await;
    let lost: Vec<u64> = all.iter().copied().filter(|s| !seen.contains(s)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events lost: {lost:?}",
        lost.len()
    );
    stop.cancel();
    sidecar.stop().await;
}

/// A `resiliency` policy targeted at the pub/sub's deliveries
/// (`targets.components.orders.inbound`) replaces the default attempts:
/// its timeout cuts an app that answers too slowly, its retry sets the
/// number of attempts, and the change is live (a reload that removes the
/// policy brings the defaults back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_inbound_policy_bounds_and_counts_the_attempts_at_the_app() {
    let subscriptions = json!({
        "slow": {"pubsubname": "orders", "topic": "slow", "route": "/slow", "deadLetterTopic": "dead"},
        "dead": {"pubsubname": "orders", "topic": "dead", "route": "/dead"}
    });
    let with_policy = |inbound: Value| {
        json!({"appId": "shop", "components": {"pubsub": {"orders": memory()}},
        "subscriptions": subscriptions,
        "resiliency": {
            "policies": {
                "timeouts": {"quick": "200ms"},
                "retries": {"twice": {"policy": "constant", "duration": "10ms", "maxRetries": 2}}
            },
            "targets": {"components": {"orders": {"inbound": inbound}}}
        }})
        .to_string()
    };
    let sidecar = Sidecar::start(
        &with_policy(json!({"timeout": "quick", "retry": "twice"})),
        ApiOptions::default(),
    )
    .await;
    // The app takes 3 s over `/slow`: far past the policy's timeout, well
    // within the default's 30 s.
    let (tx, mut rx) = mpsc::unbounded_channel::<Got>();
    let app = axum::Router::new()
        .route(
            "/dapr/subscribe",
            axum::routing::get(|| async { Json(json!([])) }),
        )
        .fallback(move |uri: Uri, body: Bytes| {
            let tx = tx.clone();
            async move {
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let _ = tx.send((uri.path().to_string(), event));
                if uri.path() == "/slow" {
                    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                }
                Json(json!({ "status": "SUCCESS" }))
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["slow", "dead"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    // Three attempts (the first and two retries), each cut at 200 ms, then
    // the dead-letter topic: the default would wait the app out.
    publish(&mut client, "slow", "order", json!({"n": 1})).await;
    let mut attempts = 0;
    let dead = loop {
        let (path, event) = next_event(&mut rx).await;
        match path.as_str() {
            "/slow" => attempts += 1,
            "/dead" => break event,
            other => panic!("unexpected path {other}"),
        }
    };
    assert_eq!(attempts, 3, "the policy's retry sets the attempts");
    assert_eq!(dead["data"]["n"], 1);

    // The policy taken out by a reload: the default bound (30 s) lets the
    // slow app answer, so the event is delivered once and never dead.
    let text = with_policy(json!({}));
    sidecar
        .runtime
        .apply(parse(text.as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    publish(&mut client, "slow", "order", json!({"n": 2})).await;
    let (path, event) = next_event(&mut rx).await;
    assert_eq!((path.as_str(), &event["data"]["n"]), ("/slow", &json!(2)));
    let late = tokio::time::timeout(std::time::Duration::from_secs(4), next_event(&mut rx)).await;
    assert!(
        late.is_err(),
        "answered in 3 s: one attempt, nothing dead-lettered: {late:?}"
    );
    stop.cancel();
    sidecar.stop().await;
}

/// With retries every 10 ms until the subscription stops, an open inbound
/// circuit breaker is what keeps a failing app from being asked again: two
/// failures open it, nothing is sent while it is open, and the event is
/// neither dead-lettered nor lost (it waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_inbound_breaker_stops_deliveries_to_the_app() {
    let config = json!({
        "appId": "shop",
        "components": {"pubsub": {"orders": memory()}},
        "subscriptions": {
            "risky": {"pubsubname": "orders", "topic": "risky", "route": "/retry", "deadLetterTopic": "dead"},
            "dead": {"pubsubname": "orders", "topic": "dead", "route": "/dead"}
        },
        "resiliency": {
            "policies": {
                "retries": {"always": {"policy": "constant", "duration": "10ms", "maxRetries": -1}},
                "circuitBreakers": {"app": {"trip": "consecutiveFailures >= 2", "timeout": "60s"}}
            },
            "targets": {"components": {"orders": {"inbound": {"retry": "always", "circuitBreaker": "app"}}}}
        }
    });
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["risky", "dead"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    publish(&mut client, "risky", "order", json!({"n": 1})).await;
    for _ in 0..2 {
        let (path, event) = next_event(&mut rx).await;
        assert_eq!((path.as_str(), &event["data"]["n"]), ("/retry", &json!(1)));
    }
    // Without the breaker: an ask every 10 ms.
    let more =
        tokio::time::timeout(std::time::Duration::from_millis(800), next_event(&mut rx)).await;
    assert!(
        more.is_err(),
        "the open breaker sent nothing more: {more:?}"
    );
    let breaker = sidecar
        .runtime
        .generation()
        .policies()
        .inbound("orders")
        .and_then(|policy| policy.breaker_status());
    assert_eq!(breaker.map(|b| b.state.as_str()), Some("open"));
    // Operators see it: the status route and the metrics.
    let status: Value = testkit::http_get(format!("{}/v1.0/rewire/status", sidecar.http_url()))
        .await
        .expect("status")
        .json()
        .await
        .expect("status JSON");
    assert_eq!(
        status["components"][0]["inboundCircuitBreaker"]["state"], "open",
        "{status}"
    );
    let metrics = testkit::http_get(format!("{}/metrics", sidecar.http_url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let gauge = r#"rewire_circuit_breaker_state{component="pubsub/orders",policy="app",direction="inbound"} 2"#;
    assert!(metrics.contains(gauge), "{metrics}");
    stop.cancel();
    sidecar.stop().await;
}

/// An event already being retried under an inbound policy that retries
/// without limit follows a reload that takes the policy out: the default
/// attempts apply from its next one, and it reaches the dead-letter topic
/// instead of being asked for until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_reaches_an_event_already_being_retried() {
    let with_policy = |inbound: Value| {
        json!({"appId": "shop", "components": {"pubsub": {"orders": memory()}},
               "subscriptions": {
                   "risky": {"pubsubname": "orders", "topic": "risky", "route": "/retry", "deadLetterTopic": "dead"},
                   "dead": {"pubsubname": "orders", "topic": "dead", "route": "/dead"}
               },
               "resiliency": {
                   "policies": {"retries": {"always": {"policy": "constant", "duration": "50ms", "maxRetries": -1}}},
                   "targets": {"components": {"orders": {"inbound": inbound}}}
               }})
        .to_string()
    };
    let sidecar = Sidecar::start(
        &with_policy(json!({"retry": "always"})),
        ApiOptions::default(),
    )
    .await;
    let (channel, mut rx) = start_app().await;
    let stop = CancellationToken::new();
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    subscribed(&mut service, &["risky", "dead"]).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    publish(&mut client, "risky", "order", json!({"n": 1})).await;
    // More attempts than the default's five: the policy is in force.
    for _ in 0..8 {
        let (path, _) = next_event(&mut rx).await;
        assert_eq!(path, "/retry");
    }
    let text = with_policy(json!({}));
    sidecar
        .runtime
        .apply(parse(text.as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    let dead = loop {
        let (path, event) = next_event(&mut rx).await;
        match path.as_str() {
            "/retry" => {}
            "/dead" => break event,
            other => panic!("unexpected path {other}"),
        }
    };
    assert_eq!(dead["data"]["n"], 1);
    stop.cancel();
    sidecar.stop().await;
}
