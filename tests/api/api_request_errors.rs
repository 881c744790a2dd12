//! Bad input gets a clear error naming the component and the field: a bulk
//! publish entry without an `entryId`, or repeating one, is refused as Dapr
//! refuses it; body errors name the store and the item; query errors are
//! query errors; an oversized publish body is Dapr's JSON error with the
//! limit; a failed delete names its store.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::dapr::{BulkPublishRequest, BulkPublishRequestEntry};
use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;
use tonic::Code;
use tonic_types::StatusExt;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "pubsub": {"events": {"type": "memory"}}
}}"#;

/// Dapr's `MarshalEvents` message (no index: Dapr names no entry).
const ENTRY_ID: &str = "error marshaling events to bytes for topic t pubsub events. error: entryId is duplicated or not present for entry";

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

fn message(body: &Value) -> &str {
    body["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn bulk_publish_refuses_empty_and_repeated_entry_ids_as_dapr() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0-alpha1/publish/bulk/events/t", sidecar.http_url());
    for entries in [
        json!([{"entryId": "1", "event": "a", "contentType": "text/plain"},
               {"entryId": "1", "event": "b", "contentType": "text/plain"}]),
        json!([{"entryId": "1", "event": "a", "contentType": "text/plain"},
               {"event": "b", "contentType": "text/plain"}]),
        json!([{"entryId": "1", "event": "a", "contentType": "text/plain"},
               {"entryId": "", "event": "b", "contentType": "text/plain"},
               // As Dapr's loop: entries after the first bad id are not read.
               {"entryId": "3", "event": {"not": "text"}, "contentType": "text/plain"}]),
    ] {
        let refused = client.post(&url).json(&entries).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let body = body_json(refused).await;
        assert_eq!(body["errorCode"], "ERR_PUBSUB_EVENTS_SER");
        assert_eq!(message(&body), ENTRY_ID);
        // Dapr's details: ResourceInfo, then ErrorInfo MARSHAL_EVENTS with
        // the app id and the reason.
        assert_eq!(body["details"][0]["resource_name"], "events", "{body}");
        assert_eq!(
            body["details"][1]["reason"], "DAPR_PUBSUB_MARSHAL_EVENTS",
            "{body}"
        );
        assert_eq!(
            body["details"][1]["metadata"],
            json!({"appID": "shop", "error": "entryId is duplicated or not present for entry"}),
            "{body}"
        );
    }
    let mut grpc = grpc::dapr_client(sidecar.grpc_url()).await;
    let entry = |id: &str| BulkPublishRequestEntry {
        entry_id: id.into(),
        event: b"x".to_vec(),
        ..BulkPublishRequestEntry::default()
    };
    let status = grpc
        .bulk_publish_event_alpha1(BulkPublishRequest {
            pubsub_name: "events".into(),
            topic: "t".into(),
            entries: vec![entry("a"), entry("a")],
            ..BulkPublishRequest::default()
        })
        .await
        .expect_err("a repeated entryId");
    assert_eq!(
        (status.code(), status.message()),
        (Code::InvalidArgument, ENTRY_ID)
    );
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "DAPR_PUBSUB_MARSHAL_EVENTS");
    assert_eq!(info.metadata.get("appID").map(String::as_str), Some("shop"));
    sidecar.stop().await;
}

#[tokio::test]
async fn body_and_query_errors_name_the_store_the_item_and_the_field() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let bad_etag = client
        .post(&url)
        .body(r#"[{"key":"a"},{"key":"b","etag":3}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad_etag.status(), StatusCode::BAD_REQUEST);
    let body = body_json(bad_etag).await;
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
    assert!(
        message(&body).starts_with(
            "failed deserializing HTTP body for state store `orders`: item 1, field `etag`: invalid type: integer `3`, expected a string"
        ),
        "{body}"
    );

    let no_key = client
        .post(&url)
        .json(&json!([{"key": "a"}, {"key": ""}]))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        message(&body_json(no_key).await),
        r#""key" is a required field (item 1 of the request to state store `orders`)"#
    );

    // A bad query parameter is not reported as a body problem.
    let bad_query = client
        .delete(format!("{url}/k?concurrency=sometimes"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_query.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        message(&body_json(bad_query).await),
        "unknown concurrency `sometimes` (expected `first-write` or `last-write`)"
    );

    let bad_delete = client
        .delete(format!("{url}/k"))
        .header("If-Match", "not-a-number")
        .send()
        .await
        .unwrap();
    let body = body_json(bad_delete).await;
    assert!(
        message(&body).starts_with("failed deleting state with key k from state store orders: "),
        "{body}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_publish_body_over_the_limit_is_dapr_json_naming_the_limit() {
    let options = ApiOptions {
        max_request_bytes: 1024,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(CONFIG, options).await;
    let client = Client::new();
    let base = sidecar.http_url();
    for path in ["v1.0/publish/events/t", "v1.0-alpha1/publish/bulk/events/t"] {
        let big = client
            .post(format!("{base}/{path}"))
            .header("content-type", "application/json")
            .body(format!(
                r#"[{{"entryId":"1","event":"{}"}}]"#,
                "x".repeat(4096)
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE, "{path}");
        let body = body_json(big).await;
        assert_eq!(body["errorCode"], "ERR_BODY_TOO_LARGE", "{path}");
        assert_eq!(
            message(&body),
            "request body is larger than the limit of 1024 bytes"
        );
    }
    sidecar.stop().await;
}

/// A bulk publish body that is one long mistyped string is answered 400 in
/// a few KiB: serde's reason, which quotes the string, is cut. Before: the
/// whole string, each character Debug-escaped, was the message (~7 MiB).
#[tokio::test]
async fn a_bulk_publish_body_of_a_long_string_is_answered_cut() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let url = format!("{}/v1.0-alpha1/publish/bulk/events/t", sidecar.http_url());
    let long = serde_json::to_string(&"\u{80}".repeat(1 << 20)).expect("JSON");
    let answer = Client::new().post(url).body(long).send().await.unwrap();
    assert_eq!(answer.status(), 400);
    let bytes = answer.bytes().await.expect("the body");
    assert!(bytes.len() < 4096, "{} bytes", bytes.len());
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert!(message(&body).contains("invalid type: string"), "{body}");
    sidecar.stop().await;
}
