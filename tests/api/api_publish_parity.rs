//! Publishing over HTTP on every path and method Dapr serves: `POST` and
//! `PUT` `/v1.0/publish/{pubsub}/{topic}`, and bulk publishing under
//! `/v1.0-alpha1` and `/v1.0` (`POST` and `PUT`). `/v1.0/publish/bulk/…`
//! is a bulk publish, never a publish to a pub/sub named `bulk`.

use crate::support::pubsub::StreamSubscriber;
use crate::support::sidecar;

use reqwest::{Client, Method, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

use crate::support::grpc::dapr::topic_event_response::TopicEventResponseStatus;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"pubsub": {"pubsub": {"type": "memory"}}}}"#;

/// The next event's data, as JSON, answered `SUCCESS`.
async fn next_data(subscriber: &mut StreamSubscriber) -> Value {
    let event = subscriber.event().await;
    subscriber
        .answer(&event.id, TopicEventResponseStatus::Success)
        .await;
    serde_json::from_slice(&event.data).expect("JSON data")
}

#[tokio::test]
async fn every_dapr_publish_path_and_method_publishes() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribe");
    let client = Client::new();
    let base = sidecar.http_url();

    for method in [Method::POST, Method::PUT] {
        let response = client
            .request(method.clone(), format!("{base}/v1.0/publish/pubsub/orders"))
            .json(&json!({"one": method.as_str()}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{method}");
        assert_eq!(
            next_data(&mut subscriber).await,
            json!({"one": method.as_str()})
        );
    }

    for version in ["v1.0-alpha1", "v1.0"] {
        for method in [Method::POST, Method::PUT] {
            let tag = format!("{method} {version}");
            let entries = json!([
                {"entryId": "1", "event": {"bulk": tag, "n": 1}, "contentType": "application/json"},
                {"entryId": "2", "event": {"bulk": tag, "n": 2}, "contentType": "application/json"}
            ]);
            let url = format!("{base}/{version}/publish/bulk/pubsub/orders");
            let response = client
                .request(method.clone(), url)
                .json(&entries)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body = response.text().await.unwrap();
            assert_eq!(status, StatusCode::NO_CONTENT, "{tag}: {body}");
            let mut seen = vec![
                next_data(&mut subscriber).await,
                next_data(&mut subscriber).await,
            ];
            seen.sort_by_key(|data| data["n"].as_i64());
            assert_eq!(
                seen,
                vec![json!({"bulk": tag, "n": 1}), json!({"bulk": tag, "n": 2})]
            );
        }
    }
    sidecar.stop().await;
}

/// A CloudEvent-shaped JSON body with id `id`: published raw, the broker
/// holds it as sent and it is delivered with that id; wrapped, it is the
/// data of a new CloudEvent with an id of the sidecar's.
fn shaped(id: &str) -> Value {
    json!({"specversion": "1.0", "id": id, "source": "s", "type": "t",
           "datacontenttype": "application/json", "data": {"n": 1}})
}

#[tokio::test]
async fn raw_payload_is_read_as_a_go_boolean() {
    use crate::support::grpc;
    use tonic::Code;

    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribe");
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let client = Client::new();
    let base = sidecar.http_url();

    let spellings = [
        ("1", true),
        ("t", true),
        ("T", true),
        ("TRUE", true),
        ("true", true),
        ("True", true),
        ("0", false),
        ("f", false),
        ("F", false),
        ("FALSE", false),
        ("false", false),
        ("False", false),
        ("", false),
    ];
    for (value, raw) in spellings {
        let id = format!("mine-{value}");
        let response = client
            .post(format!(
                "{base}/v1.0/publish/pubsub/orders?metadata.rawPayload={value}"
            ))
            .json(&shaped(&id))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{value:?}");
        let event = subscriber.event().await;
        subscriber
            .answer(&event.id, TopicEventResponseStatus::Success)
            .await;
        assert_eq!(event.id == id, raw, "rawPayload={value:?}: {event:?}");
    }

    for value in ["yes", "tRuE", "2", " true"] {
        let response = client
            .post(format!("{base}/v1.0/publish/pubsub/orders"))
            .query(&[("metadata.rawPayload", value)])
            .json(&shaped("refused"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{value:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["errorCode"], "ERR_PUBSUB_REQUEST_METADATA", "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("rawPayload value must be a valid boolean")),
            "{body}"
        );

        let request = grpc::dapr::PublishEventRequest {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            data: b"{}".to_vec(),
            data_content_type: "application/json".into(),
            metadata: [("rawPayload".to_string(), value.to_string())].into(),
        };
        let status = dapr
            .publish_event(request)
            .await
            .expect_err("a rawPayload that is not a boolean");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{value:?}: {status:?}"
        );

        let bulk = grpc::dapr::BulkPublishRequest {
            pubsub_name: "pubsub".into(),
            topic: "orders".into(),
            entries: vec![grpc::dapr::BulkPublishRequestEntry {
                entry_id: "1".into(),
                event: b"{}".to_vec(),
                content_type: "application/json".into(),
                metadata: Default::default(),
            }],
            metadata: [("rawPayload".to_string(), value.to_string())].into(),
        };
        let status = dapr
            .bulk_publish_event(bulk)
            .await
            .expect_err("a bulk rawPayload that is not a boolean");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "bulk {value:?}: {status:?}"
        );
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn cloudevent_metadata_overrides_the_envelope() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribe");
    let response = Client::new()
        .post(format!("{}/v1.0/publish/pubsub/orders", sidecar.http_url()))
        .query(&[
            ("metadata.cloudevent.id", "order-7"),
            ("metadata.cloudevent.source", "billing"),
            ("metadata.cloudevent.type", "order.paid"),
            ("metadata.ttlInSeconds", "60"),
        ])
        .header("content-type", "application/x-www-form-urlencoded")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let event = subscriber.event().await;
    subscriber
        .answer(&event.id, TopicEventResponseStatus::Success)
        .await;
    assert_eq!(
        (
            event.id.as_str(),
            event.source.as_str(),
            event.r#type.as_str()
        ),
        ("order-7", "billing", "order.paid")
    );
    assert_eq!(event.data, b"hello");
    assert_eq!(event.data_content_type, "application/x-www-form-urlencoded");
    sidecar.stop().await;
}

/// An event past its `expiration` (a CloudEvent published as it is, or
/// one whose `ttlInSeconds` ran out in the broker) is acknowledged without
/// delivery, as Dapr does; one still within it is delivered.
#[tokio::test]
async fn an_event_past_its_expiration_is_not_delivered() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut subscriber = StreamSubscriber::open(sidecar.grpc_url(), "pubsub", "orders")
        .await
        .expect("subscribe");
    let client = Client::new();
    for (id, expiration) in [
        ("expired", "2001-01-01T00:00:00Z"),
        ("current", "2999-01-01T00:00:00+02:00"),
    ] {
        let event = json!({
            "specversion": "1.0", "id": id, "source": "test", "type": "t",
            "datacontenttype": "application/json", "data": {"id": id},
            "expiration": expiration,
        });
        let response = client
            .post(format!("{}/v1.0/publish/pubsub/orders", sidecar.http_url()))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }
    // The memory broker delivers in order: the first event seen is the
    // one still current.
    assert_eq!(next_data(&mut subscriber).await, json!({"id": "current"}));
    sidecar.stop().await;
}

/// How long the [`SlowBroker`] takes each publish.
const SLOW_PUBLISH: std::time::Duration = std::time::Duration::from_secs(1);

/// A broker taking each publish in [`SLOW_PUBLISH`], any number at once
/// (a slow link).
#[derive(rewire::Component, Default)]
#[component(kind = "pubsub", type = "test.api.slow_broker")]
struct SlowBroker {}

#[rewire::prelude::async_trait]
impl rewire::prelude::Component for SlowBroker {}

#[rewire::prelude::async_trait]
impl rewire::prelude::PubSub for SlowBroker {
    async fn publish(
        &self,
        _: rewire::prelude::PublishRequest,
    ) -> Result<(), rewire::prelude::PubSubError> {
        tokio::time::sleep(SLOW_PUBLISH).await;
        Ok(())
    }

    async fn subscribe(
        &self,
        _: rewire::prelude::SubscribeRequest,
    ) -> Result<rewire::prelude::PubSubSubscription, rewire::prelude::PubSubError> {
        Err(rewire::prelude::PubSubError::Invalid(
            "the slow broker only takes publishes".into(),
        ))
    }
}

/// A bulk publish of 10 entries to a broker taking 1 s per publish, under
/// a 5 s `request_timeout`, over gRPC and HTTP: every entry published
/// (`OK` with no failed entry, 204), its entries published side by side.
/// Before, one after another, the call was cut whole at 5 s
/// (`DEADLINE_EXCEEDED`, 504), with no word of the entries taken.
#[tokio::test]
async fn a_bulk_publish_to_a_slow_broker_publishes_its_entries_side_by_side() {
    use crate::support::grpc;

    let config = r#"{"appId": "shop", "components": {"pubsub": {"slow": {"type": "test.api.slow_broker"}}}}"#;
    let options = ApiOptions {
        request_timeout: 5 * SLOW_PUBLISH,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(config, options).await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let entries = (0..10)
        .map(|i| grpc::dapr::BulkPublishRequestEntry {
            entry_id: format!("e{i}"),
            event: b"x".to_vec(),
            content_type: "text/plain".into(),
            metadata: Default::default(),
        })
        .collect();
    let bulk = grpc::dapr::BulkPublishRequest {
        pubsub_name: "slow".into(),
        topic: "orders".into(),
        entries,
        metadata: Default::default(),
    };
    let failed = dapr
        .bulk_publish_event_alpha1(bulk)
        .await
        .expect("answered within request_timeout")
        .into_inner()
        .failed_entries;
    assert!(failed.is_empty(), "{failed:?}");

    let entries: Vec<Value> = (0..10)
        .map(|i| json!({"entryId": format!("e{i}"), "event": "x", "contentType": "text/plain"}))
        .collect();
    let response = Client::new()
        .post(format!(
            "{}/v1.0-alpha1/publish/bulk/slow/orders",
            sidecar.http_url()
        ))
        .json(&entries)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    sidecar.stop().await;
}
