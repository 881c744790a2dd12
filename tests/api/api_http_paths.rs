//! Request paths are cleaned before routing, as Dapr's HTTP server cleans
//! them (`path.Clean` of the path as sent): `//` collapses, `.` goes, `..`
//! takes the segment before it, a trailing `/` goes, while `%2F` and
//! `%2E%2E` stay what they encode (one key, a key named `..`). This holds
//! for the state GET (the hot path) and for the router's routes (save,
//! delete, bulk get, metadata, health), the app token is checked on the
//! cleaned path, and a path that cleans to no route is still 404
//! `ERR_NOT_FOUND`. Requests are written byte for byte: a URL library
//! would resolve the dot segments itself.
//!
//! A `+` in a Dapr route's path parameter is a space, as daprd reads it
//! (`url.QueryUnescape`: form-encoding clients send a space as `+`), and
//! `%2B` a `+`, on the hot path and the router alike.

use std::time::Duration;

use crate::support::grpc::dapr::topic_event_response::TopicEventResponseStatus;
use crate::support::pubsub::StreamSubscriber;
use crate::support::sidecar;

use rewire::sidecar::{ApiOptions, ApiToken};
use serde_json::Value;
use sidecar::Sidecar;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

const TOKEN: &str = "paths-token-5d1e";

/// A status and body, as the sidecar sent them.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    /// Asserts the router's 404 for `target`.
    fn assert_not_found(&self, target: &str) {
        assert_eq!(self.status, 404, "{target}: {self:?}");
        let body: Value = serde_json::from_str(&self.body).unwrap_or(Value::Null);
        assert_eq!(body["errorCode"], "ERR_NOT_FOUND", "{target}: {self:?}");
    }
}

/// Sends `method target` with `body` (JSON) as written, over a connection
/// of its own, and reads the whole answer.
async fn send(
    sidecar: &Sidecar,
    method: &str,
    target: &str,
    token: Option<&str>,
    body: &str,
) -> Answer {
    let what = format!("{method} {target} answered");
    testkit::within(Duration::from_secs(30), &what, async {
        let mut stream = TcpStream::connect(sidecar.http_addr).await.unwrap();
        let token = token
            .map(|token| format!("dapr-api-token: {token}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "{method} {target} HTTP/1.1\r\nhost: sidecar\r\nconnection: close\r\n{token}\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8(answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding"),
            "{method} {target}: a chunked answer: {head}"
        );
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        Answer {
            status,
            body: body.to_string(),
        }
    })
    .await
}

async fn get(sidecar: &Sidecar, target: &str) -> Answer {
    send(sidecar, "GET", target, None, "").await
}

#[tokio::test]
async fn a_state_get_routes_its_cleaned_path() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let items = r#"[{"key": "k", "value": {"v": 1}}, {"key": "..", "value": "dots"},
        {"key": "a/b", "value": "slash"}]"#;
    let saved = send(&sidecar, "POST", "/v1.0/state/orders", None, items).await;
    assert_eq!(saved.status, 204, "{saved:?}");

    for (target, value) in [
        ("/v1.0/state/orders/k", r#"{"v": 1}"#),
        ("//v1.0/state/orders/k", r#"{"v": 1}"#),
        ("/v1.0/state/orders/k/", r#"{"v": 1}"#),
        ("/v1.0//state/orders/k", r#"{"v": 1}"#),
        ("/v1.0/state/orders/./k", r#"{"v": 1}"#),
        ("/v1.0/state/orders/x/../k", r#"{"v": 1}"#),
        ("/../v1.0/state/orders/k", r#"{"v": 1}"#),
        (
            "/v1.0/state/orders/k/?metadata.partitionKey=p",
            r#"{"v": 1}"#,
        ),
        // Encoded, a dot segment is a key and `%2F` is part of one.
        ("/v1.0/state/orders/%2E%2E", r#""dots""#),
        ("/v1.0/state/orders/a%2Fb", r#""slash""#),
        ("//v1.0/state/orders/a%2Fb/", r#""slash""#),
    ] {
        let answer = get(&sidecar, target).await;
        assert_eq!(answer.status, 200, "{target}: {answer:?}");
        let (body, expected): (Value, Value) = (
            serde_json::from_str(&answer.body).unwrap(),
            serde_json::from_str(value).unwrap(),
        );
        assert_eq!(body, expected, "{target}");
    }
    // `a%2F..%2Fk` is the key `a/../k`, which is not stored: not `k`.
    let encoded = get(&sidecar, "/v1.0/state/orders/a%2F..%2Fk").await;
    assert_eq!(encoded.status, 204, "{encoded:?}");

    for target in [
        "/v1.0/state/orders/k/..",
        "/v1.0/state/orders/a/b",
        "/v1.0/state/orders/k/x/",
        "/v1.0/state//",
    ] {
        get(&sidecar, target).await.assert_not_found(target);
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn the_routers_routes_take_the_cleaned_path_too() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let post = |target: &'static str, body: &'static str| {
        let sidecar = &sidecar;
        async move { send(sidecar, "POST", target, None, body).await }
    };
    let saved = post("//v1.0/state/orders", r#"[{"key": "p1", "value": 1}]"#).await;
    assert_eq!(saved.status, 204, "{saved:?}");
    let saved = post("/v1.0/state/orders/", r#"[{"key": "p2", "value": 2}]"#).await;
    assert_eq!(saved.status, 204, "{saved:?}");
    let bulk = post("/v1.0/state/./orders/bulk/", r#"{"keys": ["p1", "p2"]}"#).await;
    assert_eq!(bulk.status, 200, "{bulk:?}");
    let items: Value = serde_json::from_str(&bulk.body).unwrap();
    let values: Vec<&Value> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["data"])
        .collect();
    assert_eq!(values, [1, 2], "{items}");

    let deleted = send(&sidecar, "DELETE", "/v1.0//state/orders/p1/", None, "").await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let gone = get(&sidecar, "/v1.0/state/orders/p1").await;
    assert_eq!(gone.status, 204, "p1 was not deleted: {gone:?}");

    for target in ["/v1.0/metadata/", "//v1.0/metadata", "/v1.0/x/../metadata"] {
        let metadata = get(&sidecar, target).await;
        assert_eq!(metadata.status, 200, "{target}: {metadata:?}");
        assert!(metadata.body.contains("orders"), "{target}: {metadata:?}");
    }
    let health = get(&sidecar, "/v1.0/healthz/").await;
    assert_eq!(health.status, 204, "{health:?}");

    for target in ["/v1.0/metadata/a/b/", "/v1.0/nothing//", "/v1.0/healthz/.."] {
        get(&sidecar, target).await.assert_not_found(target);
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn the_app_token_is_checked_on_the_cleaned_path() {
    let options = ApiOptions {
        app_token: Some(ApiToken::new(TOKEN)),
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    // Dapr's health probes are open with a trailing or doubled `/` too.
    for target in ["/v1.0/healthz/", "//v1.0/healthz"] {
        let health = get(&sidecar, target).await;
        assert_eq!(health.status, 204, "{target}: {health:?}");
    }
    // A path through the health route to a key is a key lookup: no bypass.
    let target = "/v1.0/healthz/../state/orders/k";
    let refused = get(&sidecar, target).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    let allowed = send(&sidecar, "GET", target, Some(TOKEN), "").await;
    assert_eq!(allowed.status, 204, "{allowed:?}");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_plus_in_a_state_path_is_a_space_on_the_hot_path_and_the_router() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let items = r#"[{"key": "my key", "value": "space"}, {"key": "a+b", "value": "plus"}]"#;
    let saved = send(&sidecar, "POST", "/v1.0/state/orders", None, items).await;
    assert_eq!(saved.status, 204, "{saved:?}");

    // A path with `%` takes the router; one without, the hot path.
    for (target, value) in [
        ("/v1.0/state/orders/my+key", "space"),
        ("/v1.0/state/orders/my+key?metadata.x=1", "space"),
        ("/v1.0/state/orders/my+k%65y", "space"),
        ("/v1.0/state/orders/my+k%65y?metadata.x=1", "space"),
        ("/v1.0/state/orders/my%20key", "space"),
        ("/v1.0/state/orders/a%2Bb", "plus"),
        ("/v1.0/state/orders/a%2Bb?metadata.x=1", "plus"),
    ] {
        let answer = get(&sidecar, target).await;
        assert_eq!(answer.status, 200, "{target}: {answer:?}");
        assert_eq!(answer.body, format!("\"{value}\""), "{target}");
    }
    // `a+b` is the key `a b`, which is not stored.
    for target in ["/v1.0/state/orders/a+b", "/v1.0/state/orders/a+%62"] {
        let answer = get(&sidecar, target).await;
        assert_eq!(answer.status, 204, "{target}: {answer:?}");
    }
    // A store's name is decoded too: `ord+ers` is no `ord+ers`.
    for target in ["/v1.0/state/ord+ers/k", "/v1.0/state/ord+ers/k%31"] {
        let answer = get(&sidecar, target).await;
        assert_eq!(answer.status, 400, "{target}: {answer:?}");
        assert!(answer.body.contains("ord ers"), "{target}: {answer:?}");
    }

    let deleted = send(&sidecar, "DELETE", "/v1.0/state/orders/my+key", None, "").await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let gone = get(&sidecar, "/v1.0/state/orders/my%20key").await;
    assert_eq!(gone.status, 204, "`my key` was not deleted: {gone:?}");
    let kept = get(&sidecar, "/v1.0/state/orders/a%2Bb").await;
    assert_eq!(kept.status, 200, "{kept:?}");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_plus_in_a_publish_topic_is_a_space() {
    let config = r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let mut spaced = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "order created")
        .await
        .expect("subscribe to `order created`");
    let mut plus = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "order+created")
        .await
        .expect("subscribe to `order+created`");

    for (target, n) in [
        ("/v1.0/publish/pubsub/order+created", 1),
        ("/v1.0/publish/pubsub/order%2Bcreated", 2),
    ] {
        let body = format!(r#"{{"n": {n}}}"#);
        let published = send(&sidecar, "POST", target, None, &body).await;
        assert_eq!(published.status, 204, "{target}: {published:?}");
    }
    // Each subscriber's first event is the one published to its topic.
    for (subscriber, topic, n) in [
        (&mut spaced, "order created", 1),
        (&mut plus, "order+created", 2),
    ] {
        let event = subscriber.event().await;
        subscriber
            .answer(&event.id, TopicEventResponseStatus::Success)
            .await;
        assert_eq!(event.topic, topic);
        let data: Value = serde_json::from_slice(&event.data).expect("JSON data");
        assert_eq!(data["n"], n, "{topic}: {data}");
    }
    sidecar.stop().await;
}
