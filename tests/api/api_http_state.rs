//! The Dapr state routes over HTTP: save, get and delete with etags
//! (`ETag` / `If-Match`), conflicts (409), first-write, TTL from
//! `ttlInSeconds` metadata, bulk get, and Dapr's error for an unknown store.

use crate::support::sidecar;

use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

async fn sidecar() -> (Sidecar, Client, String) {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    (sidecar, Client::new(), url)
}

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

fn etag_of(response: &Response) -> String {
    response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("no ETag header")
        .to_string()
}

async fn send(request: reqwest::RequestBuilder) -> Response {
    request.send().await.expect("request failed")
}

#[tokio::test]
async fn save_get_and_delete_with_etags() {
    let (sidecar, client, url) = sidecar().await;

    let saved = send(client.post(&url).json(&json!([
        {"key": "order-1", "value": {"item": "book", "qty": 2}},
        {"key": "note", "value": "plain text"}
    ])))
    .await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);

    let got = send(client.get(format!("{url}/order-1"))).await;
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.headers()["content-type"], "application/json");
    let etag = etag_of(&got);
    assert_eq!(body_json(got).await, json!({"item": "book", "qty": 2}));
    // A string value is stored as its JSON, as Dapr does.
    let note = send(client.get(format!("{url}/note"))).await;
    assert_eq!(note.text().await.unwrap_or_default(), r#""plain text""#);

    // A stale etag is a conflict; the current one writes.
    let stale = send(
        client
            .post(&url)
            .json(&json!([{"key": "order-1", "value": 1, "etag": "999999"}])),
    )
    .await;
    assert_eq!(stale.status(), StatusCode::CONFLICT);
    assert_eq!(body_json(stale).await["errorCode"], "ERR_STATE_SAVE");
    let fresh = send(
        client
            .post(&url)
            .json(&json!([{"key": "order-1", "value": 3, "etag": etag}])),
    )
    .await;
    assert_eq!(fresh.status(), StatusCode::NO_CONTENT);
    let got = send(client.get(format!("{url}/order-1"))).await;
    let new_etag = etag_of(&got);
    assert_ne!(new_etag, etag);
    assert_eq!(body_json(got).await, json!(3));

    // Delete: the old etag conflicts, the current one deletes.
    let conflict = send(
        client
            .delete(format!("{url}/order-1"))
            .header("If-Match", &etag),
    )
    .await;
    assert_eq!(conflict.status(), StatusCode::CONFLICT);
    assert_eq!(body_json(conflict).await["errorCode"], "ERR_STATE_DELETE");
    let deleted = send(
        client
            .delete(format!("{url}/order-1"))
            .header("If-Match", &new_etag),
    )
    .await;
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);

    // A missing key is 204 with no body.
    let missing = send(client.get(format!("{url}/order-1"))).await;
    assert_eq!(missing.status(), StatusCode::NO_CONTENT);
    assert!(missing.bytes().await.unwrap_or_default().is_empty());
    sidecar.stop().await;
}

#[tokio::test]
async fn first_write_only_creates() {
    let (sidecar, client, url) = sidecar().await;
    let first_write = |value: i32| json!([{"key": "seat-7", "value": value, "options": {"concurrency": "first-write", "consistency": "strong"}}]);

    let created = send(client.post(&url).json(&first_write(1))).await;
    assert_eq!(created.status(), StatusCode::NO_CONTENT);
    let again = send(client.post(&url).json(&first_write(2))).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert_eq!(body_json(again).await["errorCode"], "ERR_STATE_SAVE");
    let got = send(client.get(format!("{url}/seat-7"))).await;
    assert_eq!(body_json(got).await, json!(1));

    let unknown = send(
        client
            .post(&url)
            .json(&json!([{"key": "k", "value": 1, "options": {"concurrency": "fastest"}}])),
    )
    .await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body_json(unknown).await["errorCode"],
        "ERR_MALFORMED_REQUEST"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn ttl_in_seconds_expires_the_key() {
    let (sidecar, client, url) = sidecar().await;
    let saved = send(client.post(&url).json(&json!([
        {"key": "session", "value": "s", "metadata": {"ttlInSeconds": "1"}},
        {"key": "kept", "value": "k", "metadata": {"ttlInSeconds": -1}}
    ])))
    .await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        send(client.get(format!("{url}/session"))).await.status(),
        StatusCode::OK
    );

    let mut expired = false;
    for _ in 0..100 {
        if send(client.get(format!("{url}/session"))).await.status() == StatusCode::NO_CONTENT {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(expired, "the key with ttlInSeconds=1 never expired");
    assert_eq!(
        send(client.get(format!("{url}/kept"))).await.status(),
        StatusCode::OK
    );

    // TTL as a query parameter, as Dapr also accepts it; one the store
    // cannot read is its error, a 500 ERR_STATE_SAVE as in Dapr.
    let by_query = send(
        client
            .post(format!("{url}?metadata.ttlInSeconds=abc"))
            .json(&json!([{"key": "q", "value": 1}])),
    )
    .await;
    assert_eq!(by_query.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body_json(by_query).await["errorCode"], "ERR_STATE_SAVE");
    sidecar.stop().await;
}

#[tokio::test]
async fn bulk_get_answers_in_order_with_etags() {
    let (sidecar, client, url) = sidecar().await;
    let saved = send(client.post(&url).json(&json!([
        {"key": "a", "value": {"n": 1}},
        {"key": "b", "value": "two"}
    ])))
    .await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);

    let bulk = send(
        client
            .post(format!("{url}/bulk"))
            .json(&json!({"keys": ["b", "missing", "a"], "parallelism": 4})),
    )
    .await;
    assert_eq!(bulk.status(), StatusCode::OK);
    let items = body_json(bulk).await;
    let items = items.as_array().expect("not an array");
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["key"], "b");
    assert_eq!(items[0]["data"], "two");
    assert!(items[0]["etag"].is_string());
    assert_eq!(items[1], json!({"key": "missing"}));
    assert_eq!(items[2]["data"], json!({"n": 1}));
    sidecar.stop().await;
}

#[tokio::test]
async fn unknown_store_and_bad_bodies_are_dapr_errors() {
    let (sidecar, client, url) = sidecar().await;
    let base = format!("{}/v1.0/state/nope", sidecar.http_url());
    // With Dapr's rich details: its ErrorInfo alone (no ResourceInfo),
    // naming the sidecar's app id, as Dapr's `StateStoreError::NotFound`.
    let expected = json!({"errorCode": "ERR_STATE_STORE_NOT_FOUND", "message": "state store nope is not found",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "DAPR_STATE_NOT_FOUND", "domain": "dapr.io", "metadata": {"appID": "shop"}}]});
    for request in [
        client.post(&base).json(&json!([{"key": "k", "value": 1}])),
        client.get(format!("{base}/k")),
        client.delete(format!("{base}/k")),
        client
            .post(format!("{base}/bulk"))
            .json(&json!({"keys": ["k"]})),
    ] {
        let response = send(request).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body_json(response).await, expected);
    }

    let not_json = send(client.post(&url).body("{not json")).await;
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body_json(not_json).await["errorCode"],
        "ERR_MALFORMED_REQUEST"
    );
    let no_key = send(client.post(&url).json(&json!([{"key": "", "value": 1}]))).await;
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);

    let nowhere = send(client.get(format!("{}/v1.0/nowhere", sidecar.http_url()))).await;
    assert_eq!(nowhere.status(), StatusCode::NOT_FOUND);
    assert_eq!(body_json(nowhere).await["errorCode"], "ERR_NOT_FOUND");
    // Another method on a served path is no route either.
    let wrong_method = send(client.put(format!("{url}/k"))).await;
    assert_eq!(wrong_method.status(), StatusCode::NOT_FOUND);
    assert_eq!(body_json(wrong_method).await["errorCode"], "ERR_NOT_FOUND");
    sidecar.stop().await;
}

/// A path segment that is no UTF-8 once decoded (`%FF`) is Dapr's JSON
/// 400 `ERR_MALFORMED_REQUEST` on every state route, not a key lookup
/// (failed before the fix: axum's plain-text "Invalid URL").
#[tokio::test]
async fn a_path_that_does_not_decode_is_dapr_malformed_request() {
    let (sidecar, client, url) = sidecar().await;
    let bad_store = format!("{}/v1.0/state/%FF", sidecar.http_url());
    for request in [
        client.get(format!("{url}/%FF")),
        client.delete(format!("{url}/%FF")),
        client.get(format!("{bad_store}/k")),
        client
            .post(&bad_store)
            .json(&json!([{"key": "k", "value": 1}])),
        client
            .post(format!("{bad_store}/bulk"))
            .json(&json!({"keys": ["k"]})),
        client
            .post(format!("{bad_store}/transaction"))
            .json(&json!({"operations": []})),
    ] {
        let response = send(request).await;
        let url = response.url().to_string();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{url}");
        let error = body_json(response).await;
        assert_eq!(error["errorCode"], "ERR_MALFORMED_REQUEST", "{url}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("failed decoding the URL path"),
            "{message}"
        );
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn values_come_back_byte_for_byte_as_sent() {
    let (sidecar, client, url) = sidecar().await;
    // Key order, number spelling and spacing as the app wrote them: the
    // sidecar never parses and re-encodes a stored value.
    let value = r#"{"zeta":1, "alpha":2.50,"big":12345678901234567890}"#;
    let body = format!(r#"[{{"key": "exact", "value": {value}}}]"#);
    let saved = send(
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(body),
    )
    .await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let got = send(client.get(format!("{url}/exact"))).await;
    assert_eq!(got.text().await.unwrap_or_default(), value);
    let bulk = send(
        client
            .post(format!("{url}/bulk"))
            .json(&json!({"keys": ["exact"]})),
    )
    .await;
    let text = bulk.text().await.unwrap_or_default();
    assert!(
        text.contains(value),
        "bulk answers the stored JSON as is: {text}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_bulk_save_writes_every_item_and_answers_the_stale_etag() {
    let (sidecar, client, url) = sidecar().await;
    let saved = send(client.post(&url).json(&json!([{"key": "k2", "value": 0}]))).await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let etag = etag_of(&send(client.get(format!("{url}/k2"))).await);
    let bulk = send(client.post(&url).json(&json!([
        {"key": "k1", "value": 1},
        {"key": "k2", "value": 2, "etag": "999999"},
        {"key": "k3", "value": 3}
    ])))
    .await;
    assert_eq!(bulk.status(), StatusCode::CONFLICT);
    assert_eq!(body_json(bulk).await["errorCode"], "ERR_STATE_SAVE");
    // Every other item is written, as Dapr writes them.
    let k3 = send(client.get(format!("{url}/k3"))).await;
    assert_eq!(body_json(k3).await, json!(3));
    let k1 = send(client.get(format!("{url}/k1"))).await;
    assert_eq!(body_json(k1).await, json!(1));
    let k2 = send(client.get(format!("{url}/k2"))).await;
    assert_eq!(etag_of(&k2), etag);
    assert_eq!(body_json(k2).await, json!(0));
    sidecar.stop().await;
}

#[tokio::test]
async fn consistency_is_read_and_an_unknown_one_refused() {
    let (sidecar, client, url) = sidecar().await;
    for consistency in ["strong", "eventual"] {
        let saved = send(client.post(&url).json(&json!([
            {"key": "k", "value": 1, "options": {"consistency": consistency}}
        ])))
        .await;
        assert_eq!(saved.status(), StatusCode::NO_CONTENT, "{consistency}");
    }
    let unknown = send(client.post(&url).json(&json!([
        {"key": "k", "value": 2, "options": {"consistency": "linearizable"}}
    ])))
    .await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
    let message = body_json(unknown).await["message"].to_string();
    assert!(message.contains("linearizable"), "{message}");
    let got = send(client.get(format!("{url}/k"))).await;
    assert_eq!(body_json(got).await, json!(1));
    let bad_delete = send(client.delete(format!("{url}/k?consistency=linearizable"))).await;
    assert_eq!(bad_delete.status(), StatusCode::BAD_REQUEST);
    let deleted = send(client.delete(format!("{url}/k?consistency=strong"))).await;
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

#[tokio::test]
async fn no_state_store_at_all_is_dapr_not_configured() {
    let config = r#"{"appId": "shop", "components": {"lock": {"locks": {"type": "memory"}}}}"#;
    let sidecar = Sidecar::start(config, ApiOptions::default()).await;
    let client = Client::new();
    let base = format!("{}/v1.0/state/orders", sidecar.http_url());
    // The sidecar's app id in the ErrorInfo, as Dapr's
    // `StateStoreError::NotConfigured`.
    let expected = json!({"errorCode": "ERR_STATE_STORE_NOT_CONFIGURED", "message": "state store orders is not configured",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "DAPR_STATE_NOT_CONFIGURED", "domain": "dapr.io", "metadata": {"appID": "shop"}}]});
    for request in [
        client.post(&base).json(&json!([{"key": "k", "value": 1}])),
        client.get(format!("{base}/k")),
        client.delete(format!("{base}/k")),
        client
            .post(format!("{base}/bulk"))
            .json(&json!({"keys": ["k"]})),
        client
            .post(format!("{base}/transaction"))
            .json(&json!({"operations": []})),
    ] {
        let response = send(request).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body_json(response).await, expected);
    }
    sidecar.stop().await;
}
