//! Pub/sub through the sidecar, memory broker: `PublishEvent` (CloudEvent
//! fields, trace context, raw payloads), bulk publish, HTTP publish, a
//! streaming subscriber's SUCCESS / RETRY / DROP, a dead-letter topic, and
//! Dapr's error codes; an app served over gRPC (`AppCallback`).

use crate::support::grpc::{self, dapr, with_header};
use crate::support::pubsub::{Next, StreamSubscriber};
use crate::support::sidecar::Sidecar;

use dapr::topic_event_response::TopicEventResponseStatus as Status;
use rewire::prelude::{
    async_trait, Component, PubSub, PubSubError, PubSubSubscription, PublishRequest,
    SubscribeRequest,
};
use rewire::sidecar::ApiOptions;
use tonic::Code;
use tonic_types::{ErrorDetail, StatusExt};

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn publish(topic: &str, data: &[u8], content_type: &str) -> dapr::PublishEventRequest {
    dapr::PublishEventRequest {
        pubsub_name: "pubsub".into(),
        topic: topic.into(),
        data: data.to_vec(),
        data_content_type: content_type.into(),
        metadata: Default::default(),
    }
}

#[tokio::test]
async fn published_events_reach_a_streaming_subscriber_as_cloud_events() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribed");

    let request = with_header(
        publish("orders", br#"{"n":1}"#, "application/json"),
        "traceparent",
        TRACEPARENT,
    );
    client.publish_event(request).await.expect("published");
    let event = sub.event().await;
    assert_eq!(event.data, br#"{"n":1}"#);
    assert_eq!(event.data_content_type, "application/json");
    assert_eq!(event.source, "shop");
    assert_eq!(event.r#type, "com.dapr.event.sent");
    assert_eq!(event.spec_version, "1.0");
    assert_eq!(
        (event.topic.as_str(), event.pubsub_name.as_str()),
        ("orders", "pubsub")
    );
    assert!(!event.id.is_empty());
    sub.answer(&event.id, Status::Success).await;

    // RETRY: the same event again; then SUCCESS ends it.
    client
        .publish_event(publish("orders", b"retry me", "text/plain"))
        .await
        .expect("published");
    let first = sub.event().await;
    sub.answer(&first.id, Status::Retry).await;
    let again = sub.event().await;
    assert_eq!(
        (again.id.as_str(), again.data.as_slice()),
        (first.id.as_str(), &b"retry me"[..])
    );
    sub.answer(&again.id, Status::Success).await;

    // A raw payload arrives as published.
    let mut raw = publish("orders", &[0xff, 0x00], "application/octet-stream");
    raw.metadata.insert("rawPayload".into(), "true".into());
    client.publish_event(raw).await.expect("published");
    let event = sub.event().await;
    assert_eq!(event.data, vec![0xff, 0x00]);
    sub.answer(&event.id, Status::Success).await;

    // Bulk: every entry, none failed.
    let entries = (0..3)
        .map(|i| dapr::BulkPublishRequestEntry {
            entry_id: i.to_string(),
            event: format!("bulk {i}").into_bytes(),
            content_type: "text/plain".into(),
            metadata: Default::default(),
        })
        .collect();
    let bulk = dapr::BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        entries,
        metadata: Default::default(),
    };
    let answer = client.bulk_publish_event_alpha1(bulk).await.expect("bulk");
    assert!(answer.into_inner().failed_entries.is_empty());
    let mut bulk_seen = Vec::new();
    for _ in 0..3 {
        let event = sub.event().await;
        bulk_seen.push(String::from_utf8_lossy(&event.data).to_string());
        sub.answer(&event.id, Status::Success).await;
    }
    bulk_seen.sort();
    assert_eq!(bulk_seen, ["bulk 0", "bulk 1", "bulk 2"]);

    // HTTP publish: 204, delivered with the body's content type.
    let http = testkit::http_client();
    let url = format!("{}/v1.0/publish/pubsub/orders", sidecar.http_url());
    let answer = http
        .post(&url)
        .header("content-type", "text/plain")
        .body("over http")
        .send()
        .await
        .expect("http publish");
    assert_eq!(answer.status(), reqwest::StatusCode::NO_CONTENT);
    let event = sub.event().await;
    assert_eq!(
        (event.data.as_slice(), event.data_content_type.as_str()),
        (&b"over http"[..], "text/plain")
    );
    sub.answer(&event.id, Status::Success).await;
    sidecar.stop().await;
}

/// A streamed subscription lives as long as its call: its requests (one
/// acknowledgement per event) are charged to the listener's request-byte
/// budget one message at a time, not for the life of the stream, which
/// once filled the budget and cut the subscription and every other call.
#[tokio::test]
async fn a_long_subscription_s_acknowledgements_do_not_use_up_the_request_budget() {
    let options = ApiOptions {
        max_request_bytes: 4096,
        max_request_bytes_in_flight: 4096,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribed");
    // The budget is at least one body read and decoded and its framing
    // (72 KiB here); 3,000 acknowledgements of about 45 bytes are nearly
    // twice that.
    for n in 0..3_000 {
        client
            .publish_event(publish("orders", n.to_string().as_bytes(), "text/plain"))
            .await
            .unwrap_or_else(|status| panic!("publish {n}: {status:?}"));
        let event = sub.event().await;
        assert_eq!(event.data, n.to_string().as_bytes());
        sub.answer(&event.id, Status::Success).await;
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_stream_ends_with_a_status_when_its_pubsub_is_removed() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribed");
    sidecar
        .runtime
        .remove_component(rewire::ComponentKey::new("pubsub", "pubsub"), None)
        .await
        .expect("removed");
    // Not a stream left open that delivers nothing: the client is told.
    match sub.next().await {
        Next::Ended(Some(status)) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(
                status
                    .message()
                    .contains("topic `orders` of pub/sub `pubsub`"),
                "{}",
                status.message()
            );
        }
        Next::Ended(None) => panic!("the stream ended without saying why"),
        Next::Event(event) => panic!("an event after the removal: {event:?}"),
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn dropped_events_go_to_the_dead_letter_topic() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut dead = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "dead")
        .await
        .expect("subscribed");
    let mut events = crate::support::pubsub::StreamSubscriber::open_with_dead_letter(
        sidecar.grpc_url(),
        "pubsub",
        "orders",
        "dead",
    )
    .await
    .expect("subscribed");
    client
        .publish_event(publish("orders", b"poison", "text/plain"))
        .await
        .expect("published");
    let event = events.event().await;
    events.answer(&event.id, Status::Drop).await;
    let buried = dead.event().await;
    assert_eq!(
        (buried.id.as_str(), buried.data.as_slice()),
        (event.id.as_str(), &b"poison"[..])
    );
    // Named as the subscription it came on, not the topic it was first
    // published to (as Dapr fills `topic` and `pubsub_name`).
    assert_eq!(
        (buried.topic.as_str(), buried.pubsub_name.as_str()),
        ("dead", "pubsub")
    );
    dead.answer(&buried.id, Status::Success).await;
    sidecar.stop().await;
}

#[tokio::test]
async fn dapr_error_codes() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut unknown = publish("orders", b"x", "");
    unknown.pubsub_name = "nope".into();
    let status = client
        .publish_event(unknown)
        .await
        .expect_err("unknown pubsub");
    // As Dapr's `validateAndGetPubsubAndTopic`: INVALID_ARGUMENT, not
    // NOT_FOUND, for a publish and a bulk publish alike.
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "pubsub nope is not found")
    );
    // With Dapr's rich details: an ErrorInfo and, as Dapr's
    // `PubSubMetadataError::NotFound`, no ResourceInfo.
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("DAPR_PUBSUB_NOT_FOUND", "dapr.io")
    );
    assert!(status.get_details_resource_info().is_none(), "{status:?}");
    let unknown_bulk = dapr::BulkPublishRequest {
        pubsub_name: "nope".into(),
        topic: "orders".into(),
        ..Default::default()
    };
    let status = client
        .bulk_publish_event_alpha1(unknown_bulk)
        .await
        .expect_err("unknown pubsub");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "pubsub nope is not found")
    );
    // A long unknown name is cut in the answer, as every echoed name is
    // (failed before the fix: the whole name, over gRPC and HTTP).
    let long = "p".repeat(4 * rewire::ECHO_LIMIT);
    let cut = format!("pubsub {}… is not found", &long[..rewire::ECHO_LIMIT]);
    let mut unknown = publish("orders", b"x", "");
    unknown.pubsub_name = long.clone();
    let status = client
        .publish_event(unknown)
        .await
        .expect_err("unknown pubsub");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, cut.as_str())
    );
    let answer = testkit::http_client()
        .post(format!("{}/v1.0/publish/{long}/orders", sidecar.http_url()))
        .body("x")
        .send()
        .await
        .expect("http publish");
    assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
    let body: serde_json::Value = answer.json().await.expect("json error");
    assert_eq!(body["message"], cut.as_str(), "{body}");
    let status = client
        .publish_event(publish("", b"x", ""))
        .await
        .expect_err("empty topic");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "topic is empty in pubsub pubsub");
    let reason = status.get_details_error_info().map(|i| i.reason);
    assert_eq!(reason.as_deref(), Some("DAPR_PUBSUB_TOPIC_NAME_EMPTY"));
    // In Dapr's order (its `build()`): ResourceInfo, then ErrorInfo.
    let details = status.get_error_details_vec();
    assert!(
        matches!(
            details.as_slice(),
            [ErrorDetail::ResourceInfo(_), ErrorDetail::ErrorInfo(_)]
        ),
        "{details:?}"
    );
    // A `rawPayload` that is no boolean: Dapr's `DeserializeError`, the
    // request's metadata in its ErrorInfo.
    let mut raw = publish("orders", b"x", "");
    raw.metadata.insert("rawPayload".into(), "maybe".into());
    let status = client.publish_event(raw).await.expect_err("no boolean");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'maybe'"
        )
    );
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "DAPR_PUBSUB_METADATA_DESERIALIZATION");
    assert_eq!(
        info.metadata.get("rawPayload").map(String::as_str),
        Some("maybe")
    );
    // As Dapr's `StartStreamerSubscription`: INVALID_ARGUMENT too.
    let Err(status) = StreamSubscriber::open(sidecar.grpc_url(), "nope", "t").await else {
        panic!("subscribing to an unknown pubsub succeeded");
    };
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "pubsub nope is not found")
    );
    // No pub/sub name or no topic: Dapr's `streamSubscribe` messages, with
    // INVALID_ARGUMENT where Dapr's plain error is UNKNOWN.
    for (pubsub, topic, message) in [
        ("", "t", "pubsubName is required"),
        ("pubsub", "", "topic is required"),
    ] {
        let Err(status) = StreamSubscriber::open(sidecar.grpc_url(), pubsub, topic).await else {
            panic!("subscribing to {pubsub:?}/{topic:?} succeeded");
        };
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message)
        );
    }

    let http = testkit::http_client();
    let answer = http
        .post(format!("{}/v1.0/publish/nope/orders", sidecar.http_url()))
        .body("x")
        .send()
        .await
        .expect("http publish");
    assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
    let body: serde_json::Value = answer.json().await.expect("json error");
    assert_eq!(body["errorCode"], "ERR_PUBSUB_NOT_FOUND");
    assert_eq!(body["message"], "pubsub nope is not found");
    assert_eq!(
        body["details"][0]["reason"], "DAPR_PUBSUB_NOT_FOUND",
        "{body}"
    );
    assert_eq!(body["details"].as_array().map(Vec::len), Some(1), "{body}");
    let answer = http
        .post(format!(
            "{}/v1.0/publish/pubsub/orders?metadata.rawPayload=maybe",
            sidecar.http_url()
        ))
        .body("x")
        .send()
        .await
        .expect("http publish");
    assert_eq!(answer.status(), reqwest::StatusCode::BAD_REQUEST);
    let body: serde_json::Value = answer.json().await.expect("json error");
    assert_eq!(body["errorCode"], "ERR_PUBSUB_REQUEST_METADATA");
    let message = "failed deserializing metadata. Error: \
                   rawPayload value must be a valid boolean: actual is 'maybe'";
    assert_eq!(body["message"], message);
    assert_eq!(
        body["details"],
        serde_json::json!([
            {"@type": "type.googleapis.com/google.rpc.ResourceInfo", "resource_type": "pubsub",
             "resource_name": "pubsub", "owner": "", "description": message},
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "DAPR_PUBSUB_METADATA_DESERIALIZATION",
             "domain": "dapr.io", "metadata": {"rawPayload": "maybe"}}
        ])
    );
    sidecar.stop().await;
}

/// A streamed subscription to an unknown pub/sub is refused with its name
/// cut, as every echoed name is (it was echoed whole: a 10 KB name came
/// back whole in `grpc-message`).
#[tokio::test]
async fn a_streamed_subscription_to_a_long_unknown_pubsub_is_refused_with_the_name_cut() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    // As long as a name may be (a longer one is refused for its length).
    let long = "p".repeat(4 * 1024);
    let cut = format!("pubsub {}… is not found", &long[..rewire::ECHO_LIMIT]);
    let refused = StreamSubscriber::open(sidecar.grpc_url(), &long, "orders").await;
    let Err(status) = refused else {
        panic!("subscribed to an unknown pub/sub");
    };
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, cut.as_str())
    );
    sidecar.stop().await;
}

/// The broker's password, known to the runtime through a `secretRef`.
const BROKER_PASSWORD: &str = "full-broker-s3cret-41";

#[derive(serde::Deserialize)]
struct FullBrokerMeta {
    password: String,
}

/// A broker that is always full, and says so quoting its password.
#[derive(rewire::Component)]
#[component(kind = "pubsub", type = "test.api.full_broker")]
struct FullBroker {
    #[metadata]
    meta: FullBrokerMeta,
}

#[async_trait]
impl Component for FullBroker {}

#[async_trait]
impl PubSub for FullBroker {
    async fn publish(&self, _: PublishRequest) -> Result<(), PubSubError> {
        Err(PubSubError::Busy(format!(
            "queue full (auth token {})",
            self.meta.password
        )))
    }

    async fn subscribe(&self, _: SubscribeRequest) -> Result<PubSubSubscription, PubSubError> {
        Err(PubSubError::Invalid("the full broker only refuses".into()))
    }
}

/// A full broker's reason reaches the caller, in Dapr's `PublishMessage`
/// wording, with every secret the runtime knows redacted, over HTTP (its
/// message and details; nothing redacts it again there: the password
/// reached both before the fix) and gRPC alike.
#[tokio::test]
async fn a_full_broker_s_reason_reaches_the_caller_with_its_secrets_redacted() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let secrets = dir.path().join("secrets.json");
    let file = serde_json::json!({"broker": {"password": BROKER_PASSWORD}});
    std::fs::write(&secrets, file.to_string()).expect("secrets written");
    let config = serde_json::json!({"appId": "shop", "components": {
        "secret_store": {"local": {"type": "local.file",
            "metadata": {"secretsFile": secrets, "multiValued": true}}},
        "pubsub": {"full": {"type": "test.api.full_broker", "secretRef": [
            {"store": "local", "name": "broker", "key": "password", "injectAs": "password"}
        ]}}
    }});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let reason = "queue full (auth token [redacted])";
    let http = testkit::http_client();
    let answer = http
        .post(format!("{}/v1.0/publish/full/orders", sidecar.http_url()))
        .body("x")
        .send()
        .await
        .expect("http publish");
    assert_eq!(answer.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    let text = answer.text().await.expect("a body");
    assert!(!text.contains(BROKER_PASSWORD), "{text}");
    let body: serde_json::Value = serde_json::from_str(&text).expect("json error");
    assert_eq!(body["errorCode"], "ERR_PUBSUB_PUBLISH_MESSAGE");
    assert_eq!(
        body["message"],
        format!("error when publishing to topic orders in pubsub full: {reason}")
    );
    assert_eq!(body["details"][0]["resource_name"], "full", "{body}");
    assert_eq!(
        body["details"][1]["reason"], "DAPR_PUBSUB_PUBLISH_MESSAGE",
        "{body}"
    );
    assert_eq!(body["details"][1]["metadata"]["error"], reason, "{body}");

    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut full = publish("orders", b"x", "");
    full.pubsub_name = "full".into();
    let status = client.publish_event(full).await.expect_err("a full broker");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        format!("error when publishing to topic orders in pubsub full: {reason}")
    );
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.metadata.get("error").map(String::as_str), Some(reason));
    sidecar.stop().await;
}

/// A bulk publish whose every entry the broker refuses answers each
/// failed entry with the broker's own reason (redacted), as Dapr's failed
/// entries carry the component's error: not the request's topic, which
/// one request could make megabytes long and have repeated per entry.
#[tokio::test]
async fn failed_bulk_entries_carry_the_brokers_reason_not_the_topic() {
    let config = serde_json::json!({"appId": "shop", "components": {
        "pubsub": {"full": {"type": "test.api.full_broker",
            "metadata": {"password": "not-a-secret-here"}}}
    }});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let topic = "t".repeat(64 * 1024);
    let entries: Vec<dapr::BulkPublishRequestEntry> = (0..200)
        .map(|i| dapr::BulkPublishRequestEntry {
            entry_id: format!("e{i}"),
            event: b"x".to_vec(),
            content_type: "text/plain".into(),
            metadata: Default::default(),
        })
        .collect();
    let bulk = dapr::BulkPublishRequest {
        pubsub_name: "full".into(),
        topic,
        entries,
        metadata: Default::default(),
    };
    let failed = client
        .bulk_publish_event_alpha1(bulk)
        .await
        .expect("answered with its failed entries")
        .into_inner()
        .failed_entries;
    assert_eq!(failed.len(), 200);
    for entry in &failed {
        assert_eq!(
            entry.error, "queue full (auth token [redacted])",
            "{}",
            entry.entry_id
        );
    }
    sidecar.stop().await;
}

const CLOUD_EVENT: &str = "application/cloudevents+json";

/// Publishes `marker` (text) and asserts it is the next event `sub` gets:
/// nothing refused before it reached the topic.
async fn next_is_marker(
    client: &mut dapr::dapr_client::DaprClient<tonic::transport::Channel>,
    sub: &mut StreamSubscriber,
    marker: &str,
) {
    client
        .publish_event(publish("orders", marker.as_bytes(), "text/plain"))
        .await
        .expect("published");
    let event = sub.event().await;
    assert_eq!(String::from_utf8_lossy(&event.data), marker);
    sub.answer(&event.id, Status::Success).await;
}

/// As Dapr's `FromCloudEvent`: a payload sent as a CloudEvent that is not
/// a JSON object (malformed, an array) is refused, INVALID_ARGUMENT over
/// gRPC, `500 ERR_PUBSUB_CLOUD_EVENTS_SER` over HTTP, both "cannot create
/// cloudevent"; in a bulk publish it refuses the whole request. It was
/// published as string data.
#[tokio::test]
async fn a_payload_sent_as_a_cloud_event_must_be_a_json_object() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribed");
    let http = testkit::http_client();
    let url = format!("{}/v1.0/publish/pubsub/orders", sidecar.http_url());
    for body in [&br#"{"missing_quote: invalid}"#[..], b"[1, 2]"] {
        let status = client
            .publish_event(publish("orders", body, CLOUD_EVENT))
            .await
            .expect_err("not a CloudEvent");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "cannot create cloudevent")
        );
        let answer = http
            .post(&url)
            .header("content-type", CLOUD_EVENT)
            .body(body.to_vec())
            .send()
            .await
            .expect("http publish");
        assert_eq!(answer.status(), reqwest::StatusCode::INTERNAL_SERVER_ERROR);
        let error: serde_json::Value = answer.json().await.expect("json error");
        assert_eq!(error["errorCode"], "ERR_PUBSUB_CLOUD_EVENTS_SER");
        assert_eq!(error["message"], "cannot create cloudevent");
    }
    next_is_marker(&mut client, &mut sub, "after the single ones").await;

    // Bulk: a good entry and a broken one, nothing published.
    let entry = |id: &str, event: &[u8], content_type: &str| dapr::BulkPublishRequestEntry {
        entry_id: id.into(),
        event: event.to_vec(),
        content_type: content_type.into(),
        metadata: Default::default(),
    };
    let bulk = dapr::BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        entries: vec![
            entry("good", b"fine", "text/plain"),
            entry("broken", b"[1]", CLOUD_EVENT),
        ],
        metadata: Default::default(),
    };
    let status = client
        .bulk_publish_event_alpha1(bulk)
        .await
        .expect_err("a broken CloudEvent");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, "cannot create cloudevent")
    );
    let answer = http
        .post(format!(
            "{}/v1.0-alpha1/publish/bulk/pubsub/orders",
            sidecar.http_url()
        ))
        .json(&serde_json::json!([
            {"entryId": "good", "event": "fine", "contentType": "text/plain"},
            {"entryId": "broken", "event": [1], "contentType": CLOUD_EVENT}
        ]))
        .send()
        .await
        .expect("http bulk publish");
    assert_eq!(answer.status(), reqwest::StatusCode::INTERNAL_SERVER_ERROR);
    let error: serde_json::Value = answer.json().await.expect("json error");
    assert_eq!(error["errorCode"], "ERR_PUBSUB_CLOUD_EVENTS_SER");
    next_is_marker(&mut client, &mut sub, "after the bulk ones").await;

    // A CloudEvent that is one is still published as it is.
    let given = br#"{"specversion":"1.0","id":"given-1","source":"s","type":"t","data":"x"}"#;
    client
        .publish_event(publish("orders", given, CLOUD_EVENT))
        .await
        .expect("published");
    let event = sub.event().await;
    // Its `datacontenttype` is JSON's (filled in), so its string `data`
    // is sent as JSON text, as daprd's gRPC envelope marshals it.
    assert_eq!(
        (event.id.as_str(), event.data.as_slice()),
        ("given-1", &br#""x""#[..])
    );
    sub.answer(&event.id, Status::Success).await;
    sidecar.stop().await;
}

/// As Dapr's `ConvertEventToBytes`, an HTTP bulk entry's `event` is read by
/// its `contentType`: a binary entry's string is base64-decoded (it
/// reached subscribers base64-encoded twice), a text one must be a
/// string, a JSON one is written as JSON, any other type is refused
/// (`400 ERR_PUBSUB_EVENTS_SER`) and nothing of the request is published.
#[tokio::test]
async fn http_bulk_entries_are_read_by_their_content_type_as_dapr() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribed");
    let http = testkit::http_client();
    let url = format!(
        "{}/v1.0-alpha1/publish/bulk/pubsub/orders",
        sidecar.http_url()
    );
    let answer = http
        .post(&url)
        .json(&serde_json::json!([
            {"entryId": "bin", "event": "aGVsbG8=", "contentType": "application/octet-stream"},
            {"entryId": "json", "event": {"n": 1}, "contentType": "application/json"},
            {"entryId": "text", "event": "plain", "contentType": "text/plain"}
        ]))
        .send()
        .await
        .expect("http bulk publish");
    assert_eq!(answer.status(), reqwest::StatusCode::NO_CONTENT);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let event = sub.event().await;
        seen.push((event.data_content_type.clone(), event.data.clone()));
        sub.answer(&event.id, Status::Success).await;
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("application/json".to_string(), br#"{"n":1}"#.to_vec()),
            ("application/octet-stream".to_string(), b"hello".to_vec()),
            ("text/plain".to_string(), b"plain".to_vec()),
        ]
    );

    let mismatch = "error when marshalling cloud event envelope for topic orders pubsub pubsub: \
                    error: mismatch between contentType and event";
    let not_base64 = "error when marshalling cloud event envelope for topic orders pubsub pubsub: \
                      error: unable to decode base64 application/octect-stream data: \
                      illegal base64 data at input byte 5";
    for (refused, message) in [
        (serde_json::json!({"n": 1}), "text/plain", mismatch),
        (serde_json::json!("x"), "", mismatch),
        (serde_json::json!("x"), "image/png", mismatch),
        (
            serde_json::json!({"n": 1}),
            "application/octet-stream",
            mismatch,
        ),
        (
            serde_json::json!("hello!"),
            "application/octet-stream",
            not_base64,
        ),
    ]
    .map(|(event, content_type, message)| {
        let entries = serde_json::json!([
            {"entryId": "good", "event": "fine", "contentType": "text/plain"},
            {"entryId": "bad", "event": event, "contentType": content_type}
        ]);
        (entries, message)
    }) {
        let answer = http.post(&url).json(&refused).send().await.expect("sent");
        assert_eq!(
            answer.status(),
            reqwest::StatusCode::BAD_REQUEST,
            "{refused}"
        );
        let error: serde_json::Value = answer.json().await.expect("json error");
        assert_eq!(error["errorCode"], "ERR_PUBSUB_EVENTS_SER", "{refused}");
        assert_eq!(error["message"], message, "{refused}");
    }
    next_is_marker(&mut client, &mut sub, "nothing refused was published").await;
    sidecar.stop().await;
}

/// An app serving Dapr's `AppCallback`: one subscription, events recorded.
struct CallbackApp {
    events: tokio::sync::mpsc::Sender<dapr::TopicEventRequest>,
    retried: std::sync::atomic::AtomicBool,
}

#[tonic::async_trait]
impl dapr::app_callback_server::AppCallback for CallbackApp {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<dapr::ListTopicSubscriptionsResponse>, tonic::Status> {
        let subscription = dapr::TopicSubscription {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            routes: Some(dapr::TopicRoutes {
                rules: vec![dapr::TopicRule {
                    r#match: "event.type == 'urgent'".into(),
                    path: "/urgent".into(),
                }],
                default: "/orders".into(),
            }),
            ..Default::default()
        };
        Ok(tonic::Response::new(dapr::ListTopicSubscriptionsResponse {
            subscriptions: vec![subscription],
        }))
    }

    async fn on_topic_event(
        &self,
        request: tonic::Request<dapr::TopicEventRequest>,
    ) -> Result<tonic::Response<dapr::TopicEventResponse>, tonic::Status> {
        // The first delivery is answered RETRY: the engine tries again.
        let first = !self.retried.swap(true, std::sync::atomic::Ordering::SeqCst);
        let status = if first {
            Status::Retry
        } else {
            Status::Success
        };
        let _ = self.events.send(request.into_inner()).await;
        Ok(tonic::Response::new(dapr::TopicEventResponse {
            status: status as i32,
        }))
    }
}

#[tokio::test]
async fn a_grpc_app_gets_events_through_app_callback() {
    use rewire::sidecar::app::{serve_app, AppChannel, AppProtocol};
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let (events, mut received) = tokio::sync::mpsc::channel(16);
    let app = CallbackApp {
        events,
        retried: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dapr::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let channel = AppChannel::local(port).with_protocol(AppProtocol::Grpc);
    serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    // Published until the app is subscribed (its first event arrives).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let first = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no event reached the app in 30 s"
        );
        client
            .publish_event(publish("orders", b"to the app", "text/plain"))
            .await
            .expect("published");
        let wait = tokio::time::timeout(std::time::Duration::from_millis(500), received.recv());
        if let Ok(Some(event)) = wait.await {
            break event;
        }
    };
    assert_eq!(
        (first.path.as_str(), first.data.as_slice()),
        ("/orders", &b"to the app"[..])
    );
    assert_eq!(first.source, "shop");
    let again = tokio::time::timeout(grpc::PATIENCE, received.recv())
        .await
        .expect("the retried event comes again")
        .expect("app alive");
    assert_eq!(again.id, first.id);
    // A routing rule's path is the one named in the request.
    let urgent = serde_json::json!({"specversion": "1.0", "id": "u1", "source": "shop",
                                    "type": "urgent", "data": "now"});
    client
        .publish_event(publish(
            "orders",
            urgent.to_string().as_bytes(),
            "application/cloudevents+json",
        ))
        .await
        .expect("published");
    let routed = loop {
        let event = tokio::time::timeout(grpc::PATIENCE, received.recv())
            .await
            .expect("the urgent event comes")
            .expect("app alive");
        if event.r#type == "urgent" {
            break event;
        }
    };
    assert_eq!(routed.path, "/urgent");
    stop.cancel();
    sidecar.stop().await;
}

/// An app serving Dapr's `AppCallback` with the subscriptions it is given:
/// every event is recorded; one on the path `/drop` is answered DROP, one
/// on `/unimplemented` with the status `UNIMPLEMENTED`, any other SUCCESS.
struct ListingApp {
    subscriptions: Vec<dapr::TopicSubscription>,
    events: tokio::sync::mpsc::UnboundedSender<dapr::TopicEventRequest>,
}

#[tonic::async_trait]
impl dapr::app_callback_server::AppCallback for ListingApp {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<dapr::ListTopicSubscriptionsResponse>, tonic::Status> {
        Ok(tonic::Response::new(dapr::ListTopicSubscriptionsResponse {
            subscriptions: self.subscriptions.clone(),
        }))
    }

    async fn on_topic_event(
        &self,
        request: tonic::Request<dapr::TopicEventRequest>,
    ) -> Result<tonic::Response<dapr::TopicEventResponse>, tonic::Status> {
        let request = request.into_inner();
        let path = request.path.clone();
        let _ = self.events.send(request);
        let status = match path.as_str() {
            "/unimplemented" => return Err(tonic::Status::unimplemented("no handler")),
            "/drop" => Status::Drop,
            _ => Status::Success,
        };
        Ok(tonic::Response::new(dapr::TopicEventResponse {
            status: status as i32,
        }))
    }
}

fn app_subscription(
    topic: &str,
    routes: Option<dapr::TopicRoutes>,
    dead_letter_topic: &str,
) -> dapr::TopicSubscription {
    dapr::TopicSubscription {
        pubsub_name: "pubsub".into(),
        topic: topic.into(),
        routes,
        dead_letter_topic: dead_letter_topic.into(),
        ..Default::default()
    }
}

fn default_route(path: &str) -> Option<dapr::TopicRoutes> {
    Some(dapr::TopicRoutes {
        rules: Vec::new(),
        default: path.into(),
    })
}

/// A sidecar on [`CONFIG`] delivering to a gRPC app listing
/// `subscriptions`, once every one of them is subscribed; the app's
/// events, and what stops the deliveries.
async fn with_grpc_app(
    subscriptions: Vec<dapr::TopicSubscription>,
) -> (
    Sidecar,
    tokio::sync::mpsc::UnboundedReceiver<dapr::TopicEventRequest>,
    tokio_util::sync::CancellationToken,
) {
    use rewire::sidecar::app::{serve_app, AppChannel, AppProtocol};
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let (events, received) = tokio::sync::mpsc::unbounded_channel();
    // A subscription asking for bulk delivery is refused (not listed).
    let count = subscriptions
        .iter()
        .filter(|s| !s.bulk_subscribe.as_ref().is_some_and(|b| b.enabled))
        .count();
    let app = ListingApp {
        subscriptions,
        events,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dapr::app_callback_server::AppCallbackServer::new(app))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let channel = AppChannel::local(port).with_protocol(AppProtocol::Grpc);
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    let ids: Vec<String> = (0..count).map(|i| format!("app#{i}")).collect();
    tokio::time::timeout(
        grpc::PATIENCE,
        service
            .subscribed
            .wait_for(|running| ids.iter().all(|id| running.contains(id))),
    )
    .await
    .expect("subscribed within the patience")
    .expect("service alive");
    (sidecar, received, stop)
}

async fn next_app_event(
    received: &mut tokio::sync::mpsc::UnboundedReceiver<dapr::TopicEventRequest>,
) -> dapr::TopicEventRequest {
    tokio::time::timeout(grpc::PATIENCE, received.recv())
        .await
        .expect("an event within the patience")
        .expect("app alive")
}

#[tokio::test]
async fn a_grpc_subscription_without_routes_delivers_to_the_default_path() {
    // What the SDKs send for a handler with no rule: `routes` absent
    // (Python's `@app.subscribe`), or present and empty (Go's).
    let (sidecar, mut received, stop) = with_grpc_app(vec![
        app_subscription("absent", None, ""),
        app_subscription("empty", Some(dapr::TopicRoutes::default()), ""),
    ])
    .await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    for topic in ["absent", "empty"] {
        client
            .publish_event(publish(topic, topic.as_bytes(), "text/plain"))
            .await
            .expect("published");
        let event = next_app_event(&mut received).await;
        assert_eq!(
            (
                event.topic.as_str(),
                event.path.as_str(),
                event.data.as_slice()
            ),
            (topic, "", topic.as_bytes())
        );
    }
    stop.cancel();
    sidecar.stop().await;
}

#[tokio::test]
async fn a_dead_lettered_event_names_the_dead_letter_topic_to_a_grpc_app() {
    let (sidecar, mut received, stop) = with_grpc_app(vec![
        app_subscription("risky", default_route("/drop"), "dead"),
        app_subscription("dead", default_route("/dead"), ""),
    ])
    .await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .publish_event(publish("risky", b"poison", "text/plain"))
        .await
        .expect("published");
    let dropped = next_app_event(&mut received).await;
    assert_eq!(
        (dropped.path.as_str(), dropped.topic.as_str()),
        ("/drop", "risky")
    );
    let buried = next_app_event(&mut received).await;
    assert_eq!(
        (
            buried.path.as_str(),
            buried.id.as_str(),
            buried.data.as_slice()
        ),
        ("/dead", dropped.id.as_str(), &b"poison"[..])
    );
    // The SDKs dispatch on these: the dead-letter handler is the one.
    assert_eq!(
        (buried.topic.as_str(), buried.pubsub_name.as_str()),
        ("dead", "pubsub")
    );
    stop.cancel();
    sidecar.stop().await;
}

/// As Dapr's publishMessageGRPC: an app answering `UNIMPLEMENTED` has the
/// event acknowledged after one call (a warning), neither retried nor
/// dead-lettered.
#[tokio::test]
async fn an_unimplemented_on_topic_event_is_acknowledged_at_once_not_dead_lettered() {
    let (sidecar, mut received, stop) = with_grpc_app(vec![
        app_subscription("orders", default_route("/unimplemented"), "dead"),
        app_subscription("dead", default_route("/dead"), ""),
    ])
    .await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    client
        .publish_event(publish("orders", b"unhandled", "text/plain"))
        .await
        .expect("published");
    let event = next_app_event(&mut received).await;
    assert_eq!(event.path, "/unimplemented");
    // Published on the dead-letter topic after the call: the first (and
    // only) event there.
    client
        .publish_event(publish("dead", b"marker", "text/plain"))
        .await
        .expect("published");
    let event = next_app_event(&mut received).await;
    assert_eq!(
        (event.path.as_str(), &event.data[..]),
        ("/dead", &b"marker"[..]),
        "retried or dead-lettered"
    );
    stop.cancel();
    sidecar.stop().await;
}

/// The call's `traceparent` and `tracestate` metadata, and the event.
type TracedEvent = (Option<String>, Option<String>, dapr::TopicEventRequest);

/// An app serving Dapr's `AppCallback` with one subscription (the topic
/// `traced`, to `/traced`): every event is recorded with the call's
/// `traceparent` and `tracestate` metadata, and acknowledged.
struct TracedApp {
    events: tokio::sync::mpsc::UnboundedSender<TracedEvent>,
}

#[tonic::async_trait]
impl dapr::app_callback_server::AppCallback for TracedApp {
    async fn list_topic_subscriptions(
        &self,
        _: tonic::Request<()>,
    ) -> Result<tonic::Response<dapr::ListTopicSubscriptionsResponse>, tonic::Status> {
        Ok(tonic::Response::new(dapr::ListTopicSubscriptionsResponse {
            subscriptions: vec![app_subscription("traced", default_route("/traced"), "")],
        }))
    }

    async fn on_topic_event(
        &self,
        request: tonic::Request<dapr::TopicEventRequest>,
    ) -> Result<tonic::Response<dapr::TopicEventResponse>, tonic::Status> {
        let text = |key| {
            let value = request.metadata().get(key)?;
            value.to_str().ok().map(str::to_string)
        };
        let (traceparent, tracestate) = (text("traceparent"), text("tracestate"));
        let _ = self
            .events
            .send((traceparent, tracestate, request.into_inner()));
        Ok(tonic::Response::new(dapr::TopicEventResponse {
            status: Status::Success as i32,
        }))
    }
}

/// The text of extension `key` of a delivered event.
fn extension(event: &dapr::TopicEventRequest, key: &str) -> Option<String> {
    use prost_types::value::Kind;
    match event.extensions.as_ref()?.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(text) => Some(text.clone()),
        _ => None,
    }
}

/// As Dapr: the publisher's trace goes on to a gRPC app in the call's
/// metadata, and to it and a streaming subscriber among the event's
/// `extensions` (the CloudEvent's fields a `TopicEventRequest` has no
/// field of its own for).
/// A [`TracedApp`] served `sidecar`'s deliveries, once subscribed: what
/// it receives, and what stops the deliveries.
async fn with_traced_app(
    sidecar: &Sidecar,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<TracedEvent>,
    tokio_util::sync::CancellationToken,
) {
    use rewire::sidecar::app::{serve_app, AppChannel, AppProtocol};
    let (events, received) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dapr::app_callback_server::AppCallbackServer::new(
                TracedApp { events },
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let channel = AppChannel::local(port).with_protocol(AppProtocol::Grpc);
    let mut service = serve_app(sidecar.runtime.clone(), channel, Vec::new(), stop.clone());
    tokio::time::timeout(
        grpc::PATIENCE,
        service
            .subscribed
            .wait_for(|running| running.contains("app#0")),
    )
    .await
    .expect("subscribed within the patience")
    .expect("service alive");
    (received, stop)
}

#[tokio::test]
async fn a_published_trace_reaches_grpc_subscribers_in_metadata_and_extensions() {
    let trace_id = TRACEPARENT.split('-').nth(1).expect("a trace id");
    let continued = format!("00-{trace_id}-");
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let (mut received, stop) = with_traced_app(&sidecar).await;
    let mut sub = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "streamed")
        .await
        .expect("subscribed");
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    for topic in ["traced", "streamed"] {
        let request = with_header(
            publish(topic, b"traced", "text/plain"),
            "traceparent",
            TRACEPARENT,
        );
        client.publish_event(request).await.expect("published");
    }

    let (metadata, _, event) = tokio::time::timeout(grpc::PATIENCE, received.recv())
        .await
        .expect("an event within the patience")
        .expect("app alive");
    let metadata = metadata.expect("the call carries a traceparent");
    assert!(metadata.starts_with(&continued), "{metadata}");
    let in_event = extension(&event, "traceparent").expect("extensions[traceparent]");
    assert!(in_event.starts_with(&continued), "{in_event}");
    // Fields the request has its own for are not repeated.
    assert_eq!(extension(&event, "id"), None);
    assert_eq!(extension(&event, "source"), None);

    let streamed = sub.event().await;
    let in_stream = extension(&streamed, "traceparent").expect("extensions[traceparent]");
    assert!(in_stream.starts_with(&continued), "{in_stream}");
    sub.answer(&streamed.id, Status::Success).await;
    stop.cancel();
    sidecar.stop().await;
}

/// Trace fields another writer of the topic put in a CloudEvent (put
/// straight in the broker) reach a gRPC app's metadata only when they are
/// a trace context within W3C's bounds: a malformed `traceparent` is left
/// out with its `tracestate`, a 20 KB `tracestate` is cut to 512 bytes (an
/// app whose metadata limit refused them would have the event retried to
/// its dead letter). The event itself is delivered as it was.
#[tokio::test]
async fn a_malformed_or_oversized_trace_in_an_event_is_not_sent_to_a_grpc_app() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let (mut received, stop) = with_traced_app(&sidecar).await;
    let huge_state = (0..2_000)
        .map(|n| format!("v{n}=x"))
        .collect::<Vec<_>>()
        .join(",");
    let broker = sidecar.runtime.pubsub("pubsub").load().expect("the broker");
    for (id, traceparent) in [("malformed", "not-a-trace"), ("valid", TRACEPARENT)] {
        let event = serde_json::json!({"specversion": "1.0", "id": id, "source": "elsewhere",
            "type": "t", "traceparent": traceparent, "tracestate": huge_state, "data": "x"});
        broker
            .publish(PublishRequest {
                topic: "traced".into(),
                data: event.to_string().into_bytes(),
                content_type: Some("application/cloudevents+json".into()),
                metadata: Default::default(),
            })
            .await
            .expect("published");
    }
    let mut seen = std::collections::BTreeMap::new();
    while seen.len() < 2 {
        let (traceparent, tracestate, event) =
            tokio::time::timeout(grpc::PATIENCE, received.recv())
                .await
                .expect("each event within the patience")
                .expect("app alive");
        // Delivered as it was.
        assert_eq!(extension(&event, "tracestate"), Some(huge_state.clone()));
        seen.insert(event.id.clone(), (traceparent, tracestate));
    }
    let (traceparent, tracestate) = &seen["malformed"];
    // No trace goes on (one of the sidecar's own, were calls traced).
    assert!(
        traceparent
            .as_deref()
            .is_none_or(|t| t.len() == TRACEPARENT.len()),
        "{traceparent:?}"
    );
    assert_eq!(tracestate, &None);
    let (traceparent, tracestate) = &seen["valid"];
    let trace_id = TRACEPARENT.split('-').nth(1).expect("a trace id");
    let traceparent = traceparent.as_deref().expect("the valid trace goes on");
    assert!(traceparent.contains(trace_id), "{traceparent}");
    let tracestate = tracestate.as_deref().expect("its first members go on");
    assert!(tracestate.len() <= 512, "{} bytes", tracestate.len());
    assert!(huge_state.starts_with(tracestate));
    stop.cancel();
    sidecar.stop().await;
}

/// A subscription asking for bulk delivery (`bulk_subscribe.enabled`) is
/// refused until bulk delivery exists: its events are not sent one at a
/// time to a handler that takes batches (which would acknowledge them
/// unread); the app's other subscriptions are delivered.
#[tokio::test]
async fn a_grpc_bulk_subscription_is_refused_and_the_others_delivered() {
    let mut bulk = app_subscription("batched", default_route("/batched"), "");
    bulk.bulk_subscribe = Some(dapr::BulkSubscribeConfig {
        enabled: true,
        max_messages_count: 100,
        max_await_duration_ms: 40,
    });
    let (sidecar, mut received, stop) = with_grpc_app(vec![
        bulk,
        app_subscription("single", default_route("/single"), ""),
    ])
    .await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    // Published first: were it delivered, it would come before the other.
    client
        .publish_event(publish("batched", b"batch", "text/plain"))
        .await
        .expect("published");
    client
        .publish_event(publish("single", b"one", "text/plain"))
        .await
        .expect("published");
    let event = next_app_event(&mut received).await;
    assert_eq!(
        (event.topic.as_str(), event.path.as_str()),
        ("single", "/single")
    );
    stop.cancel();
    sidecar.stop().await;
}

/// A bulk publish entry whose own metadata passes the request metadata's
/// bound (64 entries) is refused naming the entry, over gRPC
/// (`INVALID_ARGUMENT`) and HTTP (400 `ERR_PUBSUB_REQUEST_METADATA`),
/// nothing published. Before: any number was taken and handed on.
#[tokio::test]
async fn a_bulk_publish_entry_with_metadata_past_the_bound_is_refused_naming_it() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let metadata: std::collections::HashMap<String, String> = (0..65)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let entry = |id: &str, metadata| dapr::BulkPublishRequestEntry {
        entry_id: id.into(),
        event: b"x".to_vec(),
        content_type: "text/plain".into(),
        metadata,
    };
    let bulk = dapr::BulkPublishRequest {
        pubsub_name: "pubsub".into(),
        topic: "orders".into(),
        entries: vec![entry("a", Default::default()), entry("b", metadata.clone())],
        ..Default::default()
    };
    let status = client
        .bulk_publish_event_alpha1(bulk)
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("item 1") && status.message().contains("64"),
        "{status:?}"
    );

    let body = serde_json::json!([
        {"entryId": "a", "event": "x", "contentType": "text/plain"},
        {"entryId": "b", "event": "x", "contentType": "text/plain", "metadata": metadata},
    ]);
    let answer = reqwest::Client::new()
        .post(format!(
            "{}/v1.0-alpha1/publish/bulk/pubsub/orders",
            sidecar.http_url()
        ))
        .json(&body)
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    let answer: serde_json::Value = answer.json().await.expect("JSON");
    assert_eq!(
        answer["errorCode"], "ERR_PUBSUB_REQUEST_METADATA",
        "{answer}"
    );
    sidecar.stop().await;
}
