//! The Dapr secret routes over HTTP, against a `local.file` secret store:
//! one secret, every secret, a missing secret and an unknown store; no
//! secret store at all (HTTP and gRPC); the `env` store's empty answer for
//! an unset variable.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

async fn get(client: &Client, url: String) -> Response {
    client.get(url).send().await.expect("request failed")
}

/// A sidecar with `local` (multi-valued: one secret per top-level key) and
/// `flat` (single-valued: every leaf its own secret) over the same file.
async fn sidecar(dir: &tempfile::TempDir) -> Sidecar {
    let path = dir.path().join("secrets.json");
    let secrets = json!({
        "db": {"user": "app", "password": "s3cr3t-db"},
        "api": {"key": "s3cr3t-api"}
    });
    std::fs::write(&path, secrets.to_string()).unwrap();
    let config = json!({
        "appId": "shop",
        "components": {"secret_store": {
            "local": {"type": "local.file", "metadata": {"secretsFile": path, "multiValued": true}},
            "flat": {"type": "local.file", "metadata": {"secretsFile": path}}
        }}
    });
    Sidecar::start(&config.to_string(), ApiOptions::default()).await
}

#[tokio::test]
async fn get_one_secret_and_every_secret() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir).await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets", sidecar.http_url());

    let db = get(&client, format!("{base}/local/db")).await;
    assert_eq!(db.status(), StatusCode::OK);
    assert_eq!(
        body_json(db).await,
        json!({"user": "app", "password": "s3cr3t-db"})
    );

    let flat = get(&client, format!("{base}/flat/db:password")).await;
    assert_eq!(body_json(flat).await, json!({"db:password": "s3cr3t-db"}));

    let bulk = get(&client, format!("{base}/local/bulk")).await;
    assert_eq!(bulk.status(), StatusCode::OK);
    assert_eq!(
        body_json(bulk).await,
        json!({"db": {"user": "app", "password": "s3cr3t-db"}, "api": {"key": "s3cr3t-api"}})
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn missing_secret_and_unknown_store_are_dapr_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir).await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets", sidecar.http_url());

    let missing = get(&client, format!("{base}/local/nope")).await;
    assert_eq!(missing.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let error = body_json(missing).await;
    assert_eq!(error["errorCode"], "ERR_SECRET_GET");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("nope") && message.contains("local"),
        "{message}"
    );
    assert!(!message.contains("s3cr3t"), "{message}");

    for url in [format!("{base}/vault/db"), format!("{base}/vault/bulk")] {
        let unknown = get(&client, url).await;
        // Dapr's `ErrSecretStoreNotFound` is a 401 (failed before the
        // fix: 400).
        assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            body_json(unknown).await,
            json!({"errorCode": "ERR_SECRET_STORE_NOT_FOUND", "message": "failed finding secret store with key vault"})
        );
    }
    sidecar.stop().await;
}

/// A path segment that is no UTF-8 once decoded (`%FF`) is Dapr's JSON
/// 400 `ERR_MALFORMED_REQUEST` on every secret route (failed before the
/// fix: axum's plain-text "Invalid URL").
#[tokio::test]
async fn a_path_that_does_not_decode_is_dapr_malformed_request() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir).await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets", sidecar.http_url());
    for url in [
        format!("{base}/local/%FF"),
        format!("{base}/%FF/db"),
        format!("{base}/%FF/bulk"),
    ] {
        let refused = get(&client, url.clone()).await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{url}");
        let error = body_json(refused).await;
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
async fn no_secret_store_at_all_is_dapr_not_configured() {
    let bare = Sidecar::start(
        r#"{"appId": "shop", "components": {"state": {"s": {"type": "memory"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets", bare.http_url());
    for url in [format!("{base}/vault/db"), format!("{base}/vault/bulk")] {
        let refused = get(&client, url.clone()).await;
        assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR, "{url}");
        assert_eq!(
            body_json(refused).await,
            json!({"errorCode": "ERR_SECRET_STORES_NOT_CONFIGURED", "message": "secret store is not configured"}),
            "{url}"
        );
    }

    let mut dapr = grpc::dapr_client(bare.grpc_url()).await;
    let refused = dapr
        .get_secret(grpc::dapr::GetSecretRequest {
            store_name: "vault".into(),
            key: "db".into(),
            metadata: HashMap::new(),
        })
        .await
        .expect_err("no secret store");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert_eq!(refused.message(), "secret store is not configured");
    let refused = dapr
        .get_bulk_secret(grpc::dapr::GetBulkSecretRequest {
            store_name: "vault".into(),
            metadata: HashMap::new(),
        })
        .await
        .expect_err("no secret store");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    bare.stop().await;
}

#[tokio::test]
async fn env_store_answers_an_unset_or_reserved_variable_empty() {
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {"secret_store": {"env": {"type": "env"}}}}"#,
        ApiOptions::default(),
    )
    .await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets/env", sidecar.http_url());
    // Dapr's local.env: 200 with the name and an empty value, also for a
    // name it refuses to serve.
    for name in ["REWIRE_API_IT_NEVER_SET", "DAPR_API_TOKEN"] {
        let answer = get(&client, format!("{base}/{name}")).await;
        assert_eq!(answer.status(), StatusCode::OK, "{name}");
        assert_eq!(body_json(answer).await, json!({ name: "" }), "{name}");
    }
    sidecar.stop().await;
}

/// The API answers an unset variable empty, but a `secretRef` to it fails
/// its component naming the ref: a misspelt ref never injects an empty
/// credential.
#[tokio::test]
async fn a_secret_ref_to_an_unset_env_variable_fails_its_component() {
    let started = crate::support::start(
        r#"{"appId": "shop", "components": {
            "secret_store": {"env": {"type": "env"}},
            "state": {"orders": {"type": "redis",
                "metadata": {"redisHost": "127.0.0.1:1", "dialTimeout": "200ms"},
                "secretRef": [{"store": "env", "name": "REWIRE_API_REF_NEVER_SET",
                    "key": "REWIRE_API_REF_NEVER_SET", "injectAs": "redisPassword"}]}}
        }}"#,
    )
    .await;
    let Err(err) = started else {
        panic!("a component started with a ref to an unset variable");
    };
    let message = err.to_string();
    assert!(
        message.contains("state/orders") && message.contains("REWIRE_API_REF_NEVER_SET"),
        "{message}"
    );
}
