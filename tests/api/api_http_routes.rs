//! Dapr's HTTP route list (from Dapr's API reference: health, state,
//! secrets, configuration, locks, metadata, pub/sub, bindings, invocation,
//! actors, workflows, crypto, jobs, conversation, shutdown), walked against
//! the sidecar: every route rewire implements is served, and every other
//! route — or a served path with another method — answers 404
//! `ERR_NOT_FOUND`, never a key lookup or a 405. A `GET` or `DELETE` of
//! `/v1.0/state/{store}/bulk` (or `/transaction`) is the key's, as Dapr's
//! router falls back to `{key}` for a method those routes do not take.

use crate::support::sidecar;

use reqwest::{Client, Method, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "lock": {"locks": {"type": "memory"}},
    "config_store": {"config": {"type": "memory"}},
    "pubsub": {"pubsub": {"type": "memory"}},
    "secret_store": {"vault": {"type": "env", "metadata": {"prefix": "REWIRE_ROUTES_TEST_NONE_"}}}
}}"#;

/// Routes rewire serves, with a body they accept.
fn served() -> Vec<(Method, &'static str, Option<Value>)> {
    let get = |path| (Method::GET, path, None);
    let tx = json!({"operations": [{"operation": "upsert", "request": {"key": "k", "value": 1}}]});
    vec![
        get("/v1.0/healthz"),
        get("/v1.0/healthz/outbound"),
        (
            Method::POST,
            "/v1.0/state/orders",
            Some(json!([{"key": "k", "value": 1}])),
        ),
        (
            Method::PUT,
            "/v1.0/state/orders",
            Some(json!([{"key": "k", "value": 1}])),
        ),
        get("/v1.0/state/orders/k"),
        (Method::DELETE, "/v1.0/state/orders/k", None),
        (
            Method::POST,
            "/v1.0/state/orders/bulk",
            Some(json!({"keys": ["k"]})),
        ),
        (
            Method::PUT,
            "/v1.0/state/orders/bulk",
            Some(json!({"keys": ["k"]})),
        ),
        (
            Method::POST,
            "/v1.0/state/orders/transaction",
            Some(tx.clone()),
        ),
        (Method::PUT, "/v1.0/state/orders/transaction", Some(tx)),
        (
            Method::POST,
            "/v1.0/publish/pubsub/orders",
            Some(json!({"order": 1})),
        ),
        (
            Method::POST,
            "/v1.0-alpha1/publish/bulk/pubsub/orders",
            Some(
                json!([{"entryId": "1", "event": {"order": 1}, "contentType": "application/json"}]),
            ),
        ),
        get("/v1.0/secrets/vault/bulk"),
        get("/v1.0/configuration/config?key=a"),
        get("/v1.0-alpha1/configuration/config?key=a"),
        (
            Method::POST,
            "/v1.0-alpha1/lock/locks",
            Some(json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 5})),
        ),
        (
            Method::POST,
            "/v1.0-alpha1/unlock/locks",
            Some(json!({"resourceId": "r", "lockOwner": "o"})),
        ),
        get("/v1.0/metadata"),
    ]
}

/// The rest of Dapr's routes, and served paths with methods Dapr does not
/// route: served (by a later rewire) or 404 `ERR_NOT_FOUND`.
fn others() -> Vec<(Method, &'static str)> {
    use Method as M;
    vec![
        (M::PUT, "/v1.0/state/orders/k"),
        (M::DELETE, "/v1.0/state/orders"),
        (M::POST, "/v1.0-alpha1/state/orders/query"),
        (M::POST, "/v1.0-beta1/state/orders/query"),
        (M::POST, "/v1.0/secrets/vault/bulk"),
        (M::GET, "/v1.0/configuration/config/subscribe"),
        (M::GET, "/v1.0/configuration/config/sub-1/unsubscribe"),
        (M::GET, "/v1.0-alpha1/lock/locks"),
        (M::PUT, "/v1.0-alpha1/unlock/locks"),
        (M::PUT, "/v1.0/metadata/attribute"),
        (M::DELETE, "/v1.0/metadata"),
        (M::GET, "/v1.0/publish/pubsub/orders"),
        (M::POST, "/v1.0/bindings/queue"),
        (M::GET, "/v1.0/invoke/other-app/method/orders"),
        (M::POST, "/v1.0/invoke/other-app/method/orders/1"),
        (M::POST, "/v1.0/actors/cart/1/method/add"),
        (M::GET, "/v1.0/actors/cart/1/state/items"),
        (M::POST, "/v1.0/actors/cart/1/state"),
        (M::POST, "/v1.0/actors/cart/1/reminders/tick"),
        (M::DELETE, "/v1.0/actors/cart/1/timers/tick"),
        (M::POST, "/v1.0-beta1/workflows/dapr/checkout/start"),
        (M::GET, "/v1.0-beta1/workflows/dapr/instance-1"),
        (M::POST, "/v1.0/workflows/dapr/instance-1/terminate"),
        (M::PUT, "/v1.0-alpha1/crypto/keys/encrypt"),
        (M::PUT, "/v1.0-alpha1/crypto/keys/decrypt"),
        (M::POST, "/v1.0-alpha1/jobs/nightly"),
        (M::POST, "/v1.0-alpha1/conversation/llm/converse"),
        (M::POST, "/v1.0-alpha2/conversation/llm/converse"),
        (M::GET, "/v2.0/state/orders/k"),
        (M::GET, "/"),
        // Last: a sidecar that serves it stops.
        (M::POST, "/v1.0/shutdown"),
    ]
}

#[tokio::test]
async fn every_dapr_route_is_served_or_not_found() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    // Keys named like the routes: no other route may read them.
    let keys = json!([{"key": "bulk", "value": "b"}, {"key": "transaction", "value": "t"}]);
    let saved = client
        .post(format!("{base}/v1.0/state/orders"))
        .json(&keys)
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);

    for (method, path, body) in served() {
        let mut request = client.request(method.clone(), format!("{base}{path}"));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
    }
    for (method, path) in others() {
        let answer = client
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        if status == StatusCode::NOT_FOUND {
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            assert_eq!(
                body["errorCode"], "ERR_NOT_FOUND",
                "{method} {path}: {body}"
            );
            let message = body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(path.split('?').next().unwrap_or(path)),
                "{message}"
            );
        } else {
            // Served by a later version: then it is not a key lookup.
            let text = answer.text().await.unwrap_or_default();
            assert!(
                !text.contains("\"b\"") && !text.contains("\"t\""),
                "{method} {path}: {text}"
            );
        }
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn keys_named_like_state_routes_are_read_and_deleted_as_keys() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let keys = json!([{"key": "bulk", "value": "b"}, {"key": "transaction", "value": "t"}]);
    let saved = client
        .post(format!("{base}/v1.0/state/orders"))
        .json(&keys)
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let request = |method: Method, path: &str| client.request(method, format!("{base}{path}"));

    // `%6Frders` (`orders`) takes the router, `orders` the hot path.
    for store in ["orders", "%6Frders"] {
        for (key, value) in [("bulk", "b"), ("transaction", "t")] {
            let path = format!("/v1.0/state/{store}/{key}");
            let answer = request(Method::GET, &path).send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK, "GET {path}");
            assert_eq!(
                answer.json::<Value>().await.unwrap(),
                json!(value),
                "{path}"
            );
        }
    }
    // The routes still are the routes for `POST` and `PUT`.
    let bulk = request(Method::POST, "/v1.0/state/orders/bulk")
        .json(&json!({"keys": ["bulk", "transaction"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bulk.status(), StatusCode::OK);
    let items: Value = bulk.json().await.unwrap();
    assert_eq!(items[0]["data"], "b", "{items}");
    assert_eq!(items[1]["data"], "t", "{items}");

    for path in [
        "/v1.0/state/orders/bulk",
        "/v1.0/state/%6Frders/transaction",
    ] {
        let deleted = request(Method::DELETE, path).send().await.unwrap();
        assert_eq!(deleted.status(), StatusCode::NO_CONTENT, "DELETE {path}");
    }
    for key in ["bulk", "transaction"] {
        let path = format!("/v1.0/state/orders/{key}");
        let gone = request(Method::GET, &path).send().await.unwrap();
        assert_eq!(
            gone.status(),
            StatusCode::NO_CONTENT,
            "{key} was not deleted"
        );
    }
    sidecar.stop().await;
}
