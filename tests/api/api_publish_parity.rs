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
