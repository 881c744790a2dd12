//! `POST /v1.0/state/{store}/transaction` over HTTP: upserts and deletes
//! with etags applied all or none, a stale or malformed etag refusing the
//! whole transaction (500 `ERR_STATE_TRANSACTION`, as any failed `Multi`
//! in Dapr), Dapr's errors (and rich details) for unknown operations and
//! stores without transactions, and the `capabilities` each state store
//! reports in `/v1.0/metadata`.

use crate::support::sidecar;

use reqwest::{Client, Response, StatusCode};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use serde_json::{json, Value};
use sidecar::Sidecar;

/// A state store that declares no feature, so no transactions.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.api.plain_state")]
struct PlainState {}

#[async_trait]
impl Component for PlainState {}

#[async_trait]
impl StateStore for PlainState {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(None)
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

const CONFIG: &str = r#"{"appId": "shop", "components": {"state": {
    "orders": {"type": "memory"},
    "plain": {"type": "test.api.plain_state"}
}}}"#;

async fn send(request: reqwest::RequestBuilder) -> Response {
    request.send().await.expect("request failed")
}

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

/// `[(key, value, etag)]` of a bulk get.
async fn read(client: &Client, url: &str, keys: &[&str]) -> Vec<(String, Value, Value)> {
    let answer = send(
        client
            .post(format!("{url}/bulk"))
            .json(&json!({ "keys": keys })),
    )
    .await;
    let items = body_json(answer).await;
    items
        .as_array()
        .expect("not an array")
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap_or_default().to_string(),
                i["data"].clone(),
                i["etag"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn transactions_apply_all_or_nothing() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let tx = format!("{url}/transaction");

    let applied = send(client.post(&tx).json(&json!({"operations": [
        {"operation": "upsert", "request": {"key": "a", "value": {"n": 1}}},
        {"operation": "upsert", "request": {"key": "b", "value": "two"}},
        {"operation": "upsert", "request": {"key": "c", "value": 3}},
        {"operation": "delete", "request": {"key": "c"}}
    ]})))
    .await;
    assert_eq!(applied.status(), StatusCode::NO_CONTENT);
    let before = read(&client, &url, &["a", "b", "c"]).await;
    assert_eq!(before[0].1, json!({"n": 1}));
    assert_eq!(before[1].1, json!("two"));
    assert_eq!(before[2].1, Value::Null);

    // A right etag on `a`, a stale one on `b`: nothing is applied.
    let etag_a = before[0].2.as_str().expect("no etag");
    let refused = send(client.post(&tx).json(&json!({"operations": [
        {"operation": "upsert", "request": {"key": "a", "value": 10, "etag": etag_a}},
        {"operation": "delete", "request": {"key": "b", "etag": "999999"}}
    ]})))
    .await;
    assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let error = body_json(refused).await;
    assert_eq!(error["errorCode"], "ERR_STATE_TRANSACTION");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("error while executing state transaction") && message.contains("`b`"),
        "{message}"
    );
    assert_eq!(read(&client, &url, &["a", "b", "c"]).await, before);

    // PUT works too; the right etags apply.
    let etag_b = before[1].2.as_str().expect("no etag");
    let moved = send(client.put(&tx).json(&json!({"operations": [
        {"operation": "upsert", "request": {"key": "a", "value": 10, "etag": etag_a,
            "options": {"concurrency": "first-write"}}},
        {"operation": "delete", "request": {"key": "b", "etag": etag_b}}
    ], "metadata": {"partitionKey": "p"}})))
    .await;
    assert_eq!(moved.status(), StatusCode::NO_CONTENT);
    let after = read(&client, &url, &["a", "b"]).await;
    assert_eq!(
        (after[0].1.clone(), after[1].1.clone()),
        (json!(10), Value::Null)
    );

    let empty = send(client.post(&tx).json(&json!({"operations": []}))).await;
    assert_eq!(empty.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

#[tokio::test]
async fn transaction_errors_are_dapr_errors() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = format!("{}/v1.0/state", sidecar.http_url());
    let one = json!({"operations": [{"operation": "upsert", "request": {"key": "k", "value": 1}}]});
    let cases = [
        (
            "orders",
            json!({"operations": [{"operation": "merge", "request": {"key": "k"}}]}),
            StatusCode::BAD_REQUEST,
            "ERR_NOT_SUPPORTED_STATE_OPERATION",
            "operation type merge not supported",
        ),
        (
            "orders",
            json!({"operations": [{"operation": "upsert", "request": {"key": "a||b", "value": 1}}]}),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
            "can't contain `||`",
        ),
        (
            "orders",
            json!({"operations": [{"operation": "upsert", "request": {"key": "k", "etag": "x1"}}]}),
            // Dapr answers any failed transaction 500, a malformed etag
            // included (was a 400 before).
            StatusCode::INTERNAL_SERVER_ERROR,
            "ERR_STATE_TRANSACTION",
            "invalid etag",
        ),
        (
            "orders",
            json!({"operations": "nope"}),
            StatusCode::BAD_REQUEST,
            "ERR_MALFORMED_REQUEST",
            "deserializing",
        ),
        (
            "nope",
            one.clone(),
            StatusCode::BAD_REQUEST,
            "ERR_STATE_STORE_NOT_FOUND",
            "state store nope is not found",
        ),
        (
            "plain",
            one,
            StatusCode::INTERNAL_SERVER_ERROR,
            "ERR_STATE_STORE_NOT_SUPPORTED",
            "state store `plain` doesn't support transactions",
        ),
    ];
    for (store, body, status, code, message) in cases {
        let answer = send(
            client
                .post(format!("{base}/{store}/transaction"))
                .json(&body),
        )
        .await;
        assert_eq!(answer.status(), status, "{body}");
        let error = body_json(answer).await;
        assert_eq!(error["errorCode"], code, "{body}: {error}");
        let text = error["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{body}: {text}");
    }
    // As Dapr's `onPostStateTransaction`, every key is checked for `||`
    // before the store sees any: an empty key before it does not hide it
    // (it was a 400 for the empty key, `"key" is a required field`). An
    // empty key alone is left to the store: the transaction fails.
    let behind_an_empty_key = json!({"operations": [
        {"operation": "upsert", "request": {"key": "", "value": 1}},
        {"operation": "delete", "request": {"key": "a||b"}}
    ]});
    let answer = send(
        client
            .post(format!("{base}/orders/transaction"))
            .json(&behind_an_empty_key),
    )
    .await;
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    let error = body_json(answer).await;
    assert_eq!(error["errorCode"], "ERR_MALFORMED_REQUEST", "{error}");
    assert_eq!(
        error["details"][2]["reason"], "DAPR_STATE_ILLEGAL_KEY",
        "{error}"
    );
    assert_eq!(
        error["details"][0]["field_violations"][0]["field"], "a||b",
        "{error}"
    );
    let empty =
        json!({"operations": [{"operation": "upsert", "request": {"key": "", "value": 1}}]});
    let answer = send(
        client
            .post(format!("{base}/orders/transaction"))
            .json(&empty),
    )
    .await;
    assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(answer).await["errorCode"],
        "ERR_STATE_TRANSACTION"
    );
    let ops: Vec<Value> = (0..=rewire::sidecar::dapr::MAX_TRANSACTION_OPERATIONS)
        .map(|i| json!({"operation": "upsert", "request": {"key": format!("k{i}"), "value": i}}))
        .collect();
    let too_many = send(
        client
            .post(format!("{base}/orders/transaction"))
            .json(&json!({"operations": ops})),
    )
    .await;
    assert_eq!(too_many.status(), StatusCode::BAD_REQUEST);
    let too_many = body_json(too_many).await;
    assert_eq!(
        too_many["errorCode"],
        "ERR_STATE_STORE_TOO_MANY_TRANSACTIONS"
    );
    // In Dapr's order (its `build()`): ResourceInfo, then ErrorInfo.
    assert_eq!(too_many["details"][0]["resource_name"], "orders");
    let info = &too_many["details"][1];
    assert_eq!(
        info["reason"], "DAPR_STATE_TOO_MANY_TRANSACTIONS",
        "{too_many}"
    );
    let max = rewire::sidecar::dapr::MAX_TRANSACTION_OPERATIONS;
    assert_eq!(info["metadata"]["maxOpsPerTransaction"], max.to_string());
    let unsupported = send(
        client
            .post(format!("{base}/plain/transaction"))
            .json(&json!({"operations": []})),
    )
    .await;
    let unsupported = body_json(unsupported).await;
    // As Dapr's `TransactionsNotSupported`: a Help link to its list of
    // state stores, the ResourceInfo, then the ErrorInfo.
    assert_eq!(
        unsupported["details"][0]["@type"], "type.googleapis.com/google.rpc.Help",
        "{unsupported}"
    );
    assert_eq!(
        unsupported["details"][0]["links"][0]["url"],
        "https://docs.dapr.io/reference/components-reference/supported-state-stores/"
    );
    assert_eq!(unsupported["details"][1]["resource_type"], "state");
    assert_eq!(
        unsupported["details"][2]["reason"], "DAPR_STATE_TRANSACTIONS_NOT_SUPPORTED",
        "{unsupported}"
    );
    let none = send(
        client
            .post(format!("{base}/orders/bulk"))
            .json(&json!({"keys": ["k", "k0"]})),
    )
    .await;
    assert_eq!(body_json(none).await, json!([{"key": "k"}, {"key": "k0"}]));
    sidecar.stop().await;
}

#[tokio::test]
async fn transaction_is_a_route_for_post_and_a_key_for_get_and_delete() {
    // As Dapr's router: `/transaction` takes `POST` and `PUT`, and falls
    // back to `{key}` for a `GET` or `DELETE`.
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let saved = send(
        client
            .post(&url)
            .json(&json!([{"key": "transaction", "value": "secret-ish"}])),
    )
    .await;
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let got = send(client.get(format!("{url}/transaction"))).await;
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(body_json(got).await, json!("secret-ish"));
    let deleted = send(client.delete(format!("{url}/transaction"))).await;
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = read(&client, &url, &["transaction"]).await;
    assert_eq!(gone[0].1, Value::Null);
    sidecar.stop().await;
}

#[tokio::test]
async fn metadata_reports_state_capabilities() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let answer = send(Client::new().get(format!("{}/v1.0/metadata", sidecar.http_url()))).await;
    let metadata = body_json(answer).await;
    let components = metadata["components"].as_array().expect("no components");
    let capabilities = |name: &str| {
        components
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["capabilities"].clone())
    };
    assert_eq!(
        capabilities("orders"),
        Some(json!(["ETAG", "TRANSACTIONAL", "TTL"]))
    );
    assert_eq!(capabilities("plain"), Some(json!([])));
    sidecar.stop().await;
}

/// The query's `metadata.*` of a transaction reaches every operation, over
/// the operation's own keys, as Dapr's `onPostStateTransaction` copies it:
/// a `ttlInSeconds` in the query gives every upsert that TTL (the memory
/// store reports it back as `ttlExpireTime`).
#[tokio::test]
async fn a_transactions_query_metadata_reaches_every_operation_as_dapr() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!("{}/v1.0/state/orders", sidecar.http_url());
    let applied = send(
        client
            .post(format!("{url}/transaction?metadata.ttlInSeconds=3600"))
            .json(&json!({"operations": [
                {"operation": "upsert", "request": {"key": "plain", "value": 1}},
                {"operation": "upsert", "request": {"key": "own", "value": 2,
                    "metadata": {"ttlInSeconds": "-1"}}}
            ]})),
    )
    .await;
    assert_eq!(applied.status(), StatusCode::NO_CONTENT);
    let untouched = send(
        client
            .post(&url)
            .json(&json!([{"key": "none", "value": 3}])),
    )
    .await;
    assert_eq!(untouched.status(), StatusCode::NO_CONTENT);
    for (key, expires) in [("plain", true), ("own", true), ("none", false)] {
        let answer = send(client.get(format!("{url}/{key}"))).await;
        assert_eq!(answer.status(), StatusCode::OK, "{key}");
        assert_eq!(
            answer.headers().contains_key("metadata.ttlExpireTime"),
            expires,
            "{key}: {:?}",
            answer.headers()
        );
    }
    sidecar.stop().await;
}
