//! Dapr's lock routes over HTTP (`/v1.0-alpha1/lock/{store}`,
//! `/v1.0-alpha1/unlock/{store}`): the bodies and answers of Dapr's
//! distributed lock API, sharing the gRPC implementation (a lock taken over
//! HTTP is held for gRPC callers too), and Dapr's error codes.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::dapr::TryLockRequest;
use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const CONFIG: &str = r#"{"appId": "shop", "components": {"lock": {"locks": {"type": "memory"}}}}"#;

async fn post(client: &Client, url: String, body: Value) -> (StatusCode, Value) {
    let answer: Response = client
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("request failed");
    let status = answer.status();
    (status, answer.json().await.expect("not JSON"))
}

#[tokio::test]
async fn lock_and_unlock_over_http() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let lock = format!("{}/v1.0-alpha1/lock/locks", sidecar.http_url());
    let unlock = format!("{}/v1.0-alpha1/unlock/locks", sidecar.http_url());
    let take =
        |owner: &str| json!({"resourceId": "order-1", "lockOwner": owner, "expiryInSeconds": 60});
    let release = |owner: &str| json!({"resourceId": "order-1", "lockOwner": owner});

    assert_eq!(
        post(&client, lock.clone(), take("alice")).await,
        (StatusCode::OK, json!({"success": true}))
    );
    assert_eq!(
        post(&client, lock.clone(), take("bob")).await,
        (StatusCode::OK, json!({"success": false}))
    );
    // The gRPC API sees the same lock.
    let mut grpc_client = grpc::dapr_client(sidecar.grpc_url()).await;
    let over_grpc = grpc_client
        .try_lock_alpha1(TryLockRequest {
            store_name: "locks".into(),
            resource_id: "order-1".into(),
            lock_owner: "carol".into(),
            expiry_in_seconds: 60,
        })
        .await
        .expect("try lock")
        .into_inner();
    assert!(!over_grpc.success);

    // Dapr's numbers: 2 belongs to others, 0 success, 1 does not exist.
    for (owner, status) in [("bob", 2), ("alice", 0), ("alice", 1)] {
        assert_eq!(
            post(&client, unlock.clone(), release(owner)).await,
            (StatusCode::OK, json!({ "status": status })),
            "{owner}"
        );
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn lock_errors_are_dapr_errors() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = sidecar.http_url();
    let cases = [
        (
            "lock/nope",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 5}),
            "ERR_LOCK_STORE_NOT_FOUND",
            "lock store nope not found",
        ),
        (
            "unlock/nope",
            json!({"resourceId": "r", "lockOwner": "o"}),
            "ERR_LOCK_STORE_NOT_FOUND",
            "lock store nope not found",
        ),
        // Dapr's order: the expiry, the resource and the owner are checked
        // before the store is looked up; `||` after it.
        (
            "lock/nope",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 0}),
            "ERR_MALFORMED_REQUEST",
            "ExpiryInSeconds is not positive in lock store nope",
        ),
        (
            "lock/nope",
            json!({"lockOwner": "o", "expiryInSeconds": 5}),
            "ERR_MALFORMED_REQUEST",
            "ResourceId is empty in lock store nope",
        ),
        (
            "unlock/nope",
            json!({"resourceId": "r"}),
            "ERR_MALFORMED_REQUEST",
            "LockOwner is empty in lock store nope",
        ),
        (
            "unlock/nope",
            json!({"resourceId": "a||b", "lockOwner": "o"}),
            "ERR_LOCK_STORE_NOT_FOUND",
            "lock store nope not found",
        ),
        // The body is read before anything else, as Dapr's.
        (
            "lock/nope",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": "soon"}),
            "ERR_MALFORMED_REQUEST",
            "failed deserializing HTTP body",
        ),
        (
            "lock/locks",
            json!({"lockOwner": "o", "expiryInSeconds": 5}),
            "ERR_MALFORMED_REQUEST",
            "ResourceId is empty",
        ),
        (
            "lock/locks",
            json!({"resourceId": "r", "expiryInSeconds": 5}),
            "ERR_MALFORMED_REQUEST",
            "LockOwner is empty",
        ),
        (
            "lock/locks",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 0}),
            "ERR_MALFORMED_REQUEST",
            "ExpiryInSeconds is not positive",
        ),
        (
            // rewire's refusal (Dapr's is a 500 when building the key),
            // saying why.
            "unlock/locks",
            json!({"resourceId": "sequencer|||x", "lockOwner": "o"}),
            "ERR_MALFORMED_REQUEST",
            "ResourceId cannot contain `||` in lock store locks: `||` separates a lock key's parts",
        ),
        (
            // Past the store's maximum expiry (Dapr's int32 seconds): the
            // store's invalid request is a 400, as gRPC's INVALID_ARGUMENT.
            "lock/locks",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 3_000_000_000_i64}),
            "ERR_MALFORMED_REQUEST",
            "expiry",
        ),
        (
            "lock/locks",
            json!({"resourceId": "r".repeat(1025), "lockOwner": "o", "expiryInSeconds": 5}),
            "ERR_MALFORMED_REQUEST",
            "limit of 1024 bytes",
        ),
        (
            "unlock/locks",
            json!({"resourceId": "r"}),
            "ERR_MALFORMED_REQUEST",
            "LockOwner is empty",
        ),
        (
            "lock/locks",
            json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": "soon"}),
            "ERR_MALFORMED_REQUEST",
            "failed deserializing HTTP body",
        ),
    ];
    for (path, body, code, message) in cases {
        let (status, error) =
            post(&client, format!("{base}/v1.0-alpha1/{path}"), body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}");
        assert_eq!(error["errorCode"], code, "{path} {body}: {error}");
        let text = error["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{path} {body}: {text}");
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn no_lock_store_and_long_values_in_errors_are_dapr_answers() {
    // No lock store at all: Dapr's 500 ERR_LOCK_STORE_NOT_CONFIGURED, once
    // the expiry is found positive.
    let bare = Sidecar::start(
        r#"{"appId": "shop", "components": {"state": {"s": {"type": "memory"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let client = Client::new();
    let (status, error) = post(
        &client,
        format!("{}/v1.0-alpha1/lock/locks", bare.http_url()),
        json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{error}");
    assert_eq!(
        error["errorCode"], "ERR_LOCK_STORE_NOT_CONFIGURED",
        "{error}"
    );
    // Dapr's message names no store.
    assert_eq!(error["message"], "lock store is not configured", "{error}");
    let (status, error) = post(
        &client,
        format!("{}/v1.0-alpha1/lock/locks", bare.http_url()),
        json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["errorCode"], "ERR_MALFORMED_REQUEST", "{error}");
    assert_eq!(
        error["message"], "ExpiryInSeconds is not positive in lock store locks",
        "{error}"
    );
    let mut grpc_client = grpc::dapr_client(bare.grpc_url()).await;
    let refused = grpc_client
        .try_lock_alpha1(TryLockRequest {
            store_name: "locks".into(),
            resource_id: "r".into(),
            lock_owner: "o".into(),
            expiry_in_seconds: 5,
        })
        .await
        .expect_err("no lock store");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(refused.message(), "lock store is not configured");
    // gRPC checks in the same order.
    let refused = grpc_client
        .try_lock_alpha1(TryLockRequest {
            store_name: "locks".into(),
            resource_id: String::new(),
            lock_owner: "o".into(),
            expiry_in_seconds: 0,
        })
        .await
        .expect_err("no expiry");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        refused.message(),
        "ExpiryInSeconds is not positive in lock store locks"
    );
    bare.stop().await;

    // Errors quote a long store name or resource id cut to 200 characters.
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let long_store = "s".repeat(10_000);
    let (status, error) = post(
        &client,
        format!("{}/v1.0-alpha1/lock/{long_store}", sidecar.http_url()),
        json!({"resourceId": "r", "lockOwner": "o", "expiryInSeconds": 5}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let text = error["message"].as_str().unwrap_or_default();
    assert!(text.len() < 400 && text.contains('…'), "{text}");
    let resource = "r".repeat(1024);
    let (status, error) = post(
        &client,
        format!("{}/v1.0-alpha1/lock/locks", sidecar.http_url()),
        json!({"resourceId": resource, "lockOwner": "o", "expiryInSeconds": 3_000_000_000_i64}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let text = error["message"].as_str().unwrap_or_default();
    assert!(text.len() < 800 && text.contains('…'), "{text}");
    sidecar.stop().await;
}
