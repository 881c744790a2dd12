//! Stored values pass through untouched, over both APIs and both kinds of
//! store (memory, and `redis` on a real `redis-server`): a JSON value saved
//! over HTTP comes back byte for byte (key order, number spelling, spacing)
//! over HTTP (as `application/json`) and over gRPC; bytes saved over gRPC
//! come back byte for byte over gRPC, and over HTTP as the same bytes.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::StateItem;
use grpc::dapr::{GetStateRequest, SaveStateRequest};
use reqwest::StatusCode;
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use testkit::redis::RedisServer;

/// Key order, a trailing zero, a number past `u64`, and spacing: all
/// things a parse and re-encode would change.
const JSON_VALUE: &str =
    r#"{"zeta":1,"alpha":2.50, "big":12345678901234567890,"nested":{"b":[1.0,2e3]}}"#;
/// Bytes that are not JSON (nor UTF-8).
const RAW_VALUE: &[u8] = b"\x00\xffnot json\r\n";

#[tokio::test]
async fn values_pass_through_untouched_over_both_apis_and_both_stores() {
    let redis = RedisServer::start().await;
    let config = serde_json::json!({
        "appId": "bytes",
        "components": {"state": {
            "memory": {"type": "memory"},
            "redis": {"type": "redis", "metadata": {"redisHost": redis.addr()}}
        }}
    })
    .to_string();
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let http = testkit::http_client();
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    for store in ["memory", "redis"] {
        let url = format!("{}/v1.0/state/{store}", sidecar.http_url());
        // Saved over HTTP, as the JSON text sent.
        let body = format!(r#"[{{"key": "json", "value": {JSON_VALUE}}}]"#);
        let saved = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(saved.status(), StatusCode::NO_CONTENT, "{store}");
        let got = http.get(format!("{url}/json")).send().await.unwrap();
        assert_eq!(got.status(), StatusCode::OK, "{store}");
        assert_eq!(got.headers()["content-type"], "application/json", "{store}");
        assert_eq!(
            got.bytes().await.unwrap(),
            JSON_VALUE.as_bytes(),
            "{store}: HTTP"
        );
        let reply = dapr
            .get_state(GetStateRequest {
                store_name: store.into(),
                key: "json".into(),
                ..GetStateRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.data, JSON_VALUE.as_bytes(), "{store}: gRPC");

        // Saved over gRPC, as bytes.
        dapr.save_state(SaveStateRequest {
            store_name: store.into(),
            states: vec![StateItem {
                key: "raw".into(),
                value: RAW_VALUE.to_vec(),
                ..StateItem::default()
            }],
        })
        .await
        .unwrap();
        let reply = dapr
            .get_state(GetStateRequest {
                store_name: store.into(),
                key: "raw".into(),
                ..GetStateRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.data, RAW_VALUE, "{store}: gRPC");
        let got = http.get(format!("{url}/raw")).send().await.unwrap();
        assert_eq!(got.status(), StatusCode::OK, "{store}");
        assert_eq!(got.bytes().await.unwrap(), RAW_VALUE, "{store}: HTTP");
    }
    sidecar.stop().await;
}
