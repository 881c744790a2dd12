//! A `redis` state key holding a plain Redis string (`SET key value`, by an
//! older app or by hand) read through the sidecar, as Dapr answers it:
//! the bytes with no `ETag` header over HTTP (the hot path and the
//! router), no `etag` in HTTP bulk-get items, an empty etag over gRPC;
//! a write without an etag replaces it, one with an etag is refused (409).

use crate::support::grpc;
use crate::support::sidecar;

use grpc::dapr::{GetBulkStateRequest, GetStateRequest};
use reqwest::StatusCode;
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;
use testkit::redis::RedisServer;

/// The plain value, JSON as an app would have stored it.
const PLAIN: &str = r#"{"v":1}"#;

#[tokio::test]
async fn a_plain_redis_string_is_answered_without_an_etag() {
    let redis = RedisServer::start().await;
    redis
        .query(&["SET", "plain||legacy-1", PLAIN])
        .await
        .unwrap();
    let config = json!({
        "appId": "plain",
        "components": {"state": {
            "redis": {"type": "redis", "metadata": {"redisHost": redis.addr()}}
        }}
    })
    .to_string();
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let http = testkit::http_client();
    let url = format!("{}/v1.0/state/redis", sidecar.http_url());

    // `legacy-1` takes the hot path; `legacy%2D1` (the same key) the router.
    for path in ["legacy-1", "legacy%2D1"] {
        let got = http.get(format!("{url}/{path}")).send().await.unwrap();
        assert_eq!(got.status(), StatusCode::OK, "{path}");
        assert_eq!(got.headers().get("etag"), None, "{path}");
        assert_eq!(got.bytes().await.unwrap(), PLAIN.as_bytes(), "{path}");
    }

    let saved = http
        .post(&url)
        .json(&json!([{"key": "hashed", "value": "h"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let bulk: Value = http
        .post(format!("{url}/bulk"))
        .json(&json!({"keys": ["legacy-1", "hashed"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        bulk,
        json!([
            {"key": "legacy-1", "data": {"v": 1}},
            {"key": "hashed", "data": "h", "etag": "1"}
        ])
    );

    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let reply = dapr
        .get_state(GetStateRequest {
            store_name: "redis".into(),
            key: "legacy-1".into(),
            ..GetStateRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (reply.data.as_slice(), reply.etag.as_str()),
        (PLAIN.as_bytes(), "")
    );
    let items = dapr
        .get_bulk_state(GetBulkStateRequest {
            store_name: "redis".into(),
            keys: vec!["legacy-1".into()],
            ..GetBulkStateRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(items.len(), 1);
    assert_eq!(
        (items[0].data.as_slice(), items[0].etag.as_str()),
        (PLAIN.as_bytes(), "")
    );
    assert_eq!(items[0].error, "");

    // A write with an etag is refused; one without replaces the value.
    let refused = http
        .post(&url)
        .json(&json!([{"key": "legacy-1", "value": "x", "etag": "1"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let saved = http
        .post(&url)
        .json(&json!([{"key": "legacy-1", "value": "new"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let got = http.get(format!("{url}/legacy-1")).send().await.unwrap();
    assert_eq!(
        got.headers().get("etag").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert_eq!(got.bytes().await.unwrap(), r#""new""#.as_bytes());
    sidecar.stop().await;
}
