//! What one small request can make the sidecar hold is bounded: request
//! metadata (HTTP `metadata.*` query parameters, a gRPC request's map) is
//! refused past its bound naming the limit and the store or pub/sub; bulk
//! requests are refused by their item count; a bulk state answer counts
//! each item's framing (a bulk of missing keys included) and refuses keys
//! with `||` (an empty key is answered, as daprd answers it); lifecycle calls naming unknown components do
//! not become metric labels.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use grpc::common::StateItem;
use grpc::dapr::{
    BulkPublishRequest, BulkPublishRequestEntry, GetBulkStateRequest, PublishEventRequest,
    SaveStateRequest,
};
use grpc::lifecycle::RemoveComponentRequest;
use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;
use tonic::Code;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "pubsub": {"events": {"type": "memory"}}
}}"#;

/// A response limit small enough for a test to cross.
const LIMIT: usize = 64 * 1024;

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

/// `count` metadata entries with distinct names and empty values.
fn metadata(count: usize) -> HashMap<String, String> {
    (0..count)
        .map(|i| (format!("k{i:04}"), String::new()))
        .collect()
}

fn metadata_query(count: usize) -> String {
    (0..count)
        .map(|i| format!("metadata.k{i:04}="))
        .collect::<Vec<_>>()
        .join("&")
}

#[tokio::test]
async fn http_request_metadata_past_its_bound_is_refused_naming_the_store() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let query = metadata_query(1_000);
    let items: Vec<Value> = (0..10).map(|i| json!({"key": format!("k{i}")})).collect();
    let save = client
        .post(format!("{base}/v1.0/state/orders?{query}"))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(save.status(), StatusCode::BAD_REQUEST);
    let body = body_json(save).await;
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
    assert_eq!(
        body["message"],
        "the request metadata for state store `orders` has more than 64 entries, the sidecar's limit"
    );

    let publish = client
        .post(format!("{base}/v1.0-alpha1/publish/bulk/events/t?{query}"))
        .json(&json!([{"entryId": "1", "event": "x"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(publish.status(), StatusCode::BAD_REQUEST);
    let body = body_json(publish).await;
    assert_eq!(body["errorCode"], "ERR_PUBSUB_REQUEST_METADATA");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("pubsub `events`"), "{message}");

    // Within the bounds, the query's metadata still reaches every item.
    let saved = client
        .post(format!("{base}/v1.0/state/orders?{}", metadata_query(3)))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

#[tokio::test]
async fn http_bulk_requests_past_the_item_bound_are_refused_by_count() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let items: Vec<Value> = (0..10_001)
        .map(|i| json!({"key": format!("{i}")}))
        .collect();
    let save = client
        .post(format!("{base}/v1.0/state/orders"))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(save.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body_json(save).await["message"],
        "the request for state store `orders` holds 10001 items, more than the sidecar's limit of 10000"
    );
    // The query's metadata copied into every item must fit the request
    // limit, as it would had each item carried it.
    let items: Vec<Value> = (0..2_000).map(|i| json!({"key": format!("{i}")})).collect();
    let copied = client
        .post(format!("{base}/v1.0/state/orders?{}", metadata_query(64)))
        .json(&items)
        .send()
        .await
        .unwrap();
    assert_eq!(copied.status(), StatusCode::BAD_REQUEST);
    let message = body_json(copied).await["message"].to_string();
    assert!(message.contains("max_request_bytes"), "{message}");
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_request_metadata_and_bulk_counts_past_their_bounds_are_invalid_arguments() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let entries = (0..100)
        .map(|i| BulkPublishRequestEntry {
            entry_id: i.to_string(),
            ..BulkPublishRequestEntry::default()
        })
        .collect();
    let status = client
        .bulk_publish_event_alpha1(BulkPublishRequest {
            pubsub_name: "events".into(),
            topic: "t".into(),
            entries,
            metadata: metadata(1_000),
        })
        .await
        .expect_err("too much metadata");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "the request metadata for pubsub `events` has more than 64 entries, the sidecar's limit"
    );
    let status = client
        .publish_event(PublishEventRequest {
            pubsub_name: "events".into(),
            topic: "t".into(),
            metadata: metadata(1_000),
            ..PublishEventRequest::default()
        })
        .await
        .expect_err("too much metadata");
    assert_eq!(status.code(), Code::InvalidArgument);

    let states = (0..10_001)
        .map(|i| StateItem {
            key: i.to_string(),
            ..StateItem::default()
        })
        .collect();
    let status = client
        .save_state(SaveStateRequest {
            store_name: "orders".into(),
            states,
        })
        .await
        .expect_err("too many items");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("10000"), "{}", status.message());
    let status = client
        .get_bulk_state(GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["k".into()],
            metadata: metadata(1_000),
            ..GetBulkStateRequest::default()
        })
        .await
        .expect_err("too much metadata");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("state store `orders`"),
        "{}",
        status.message()
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_bulk_get_counts_each_items_framing_and_refuses_keys_dapr_refuses() {
    let options = ApiOptions {
        max_response_bytes: LIMIT,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders/bulk", sidecar.http_url());
    // 5,000 missing keys of 5 bytes: 25 KB of keys, but an answer of
    // about 80 KB once each item's JSON is counted.
    let keys: Vec<String> = (0..5_000).map(|i| format!("k{i:04}")).collect();
    let bulk = client
        .post(&url)
        .json(&json!({ "keys": keys }))
        .send()
        .await
        .unwrap();
    assert_eq!(bulk.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body_json(bulk).await["errorCode"], "ERR_RESPONSE_TOO_LARGE");

    let refused = client
        .post(&url)
        .json(&json!({ "keys": ["a", "b||c"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body = body_json(refused).await;
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
    assert_eq!(
        body["message"],
        "input key `b||c` can't contain `||` (item 1 of the request to state store `orders`)"
    );
    // An empty key is asked of the store, as daprd's HTTP bulk asks it
    // (it refuses only `||`): a missing key's item.
    let empty = client
        .post(&url)
        .json(&json!({ "keys": ["a", ""] }))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), StatusCode::OK);
    assert_eq!(body_json(empty).await, json!([{"key": "a"}, {"key": ""}]));
    let mut grpc = grpc::dapr_client(sidecar.grpc_url()).await;
    let status = grpc
        .get_bulk_state(GetBulkStateRequest {
            store_name: "orders".into(),
            keys: vec!["x||y".into()],
            ..GetBulkStateRequest::default()
        })
        .await
        .expect_err("a key with `||`");
    assert_eq!(status.code(), Code::InvalidArgument);
    sidecar.stop().await;
}

#[tokio::test]
async fn lifecycle_calls_naming_unknown_components_do_not_become_labels() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut lifecycle = grpc::lifecycle_client(sidecar.grpc_url()).await;
    for i in 0..100 {
        let answer = lifecycle
            .remove_component(RemoveComponentRequest {
                kind: "state".into(),
                name: format!("made-up-{i}"),
                ..RemoveComponentRequest::default()
            })
            .await;
        assert!(answer.is_ok(), "{answer:?}");
    }
    let metrics = Client::new()
        .get(format!("{}/metrics", sidecar.http_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains(r#"method="RemoveComponent""#), "{metrics}");
    assert!(!metrics.contains("made-up-"), "{metrics}");
    sidecar.stop().await;
}
