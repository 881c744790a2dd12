//! The Dapr secret RPCs over gRPC against a `local.file` secret store read
//! from a temporary file: one secret, every secret, and Dapr's errors for a
//! missing secret (`INTERNAL`, naming the key, never a value) and an
//! unknown store.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use grpc::dapr::{GetBulkSecretRequest, GetSecretRequest};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::Code;

async fn sidecar(dir: &tempfile::TempDir) -> Sidecar {
    let path = dir.path().join("secrets.json");
    std::fs::write(
        &path,
        r#"{"redis": {"password": "pa55-word"}, "apiKey": "k-123456"}"#,
    )
    .expect("cannot write secrets");
    let config = serde_json::json!({
        "appId": "shop",
        "components": {"secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": path}}}}
    });
    Sidecar::start(&config.to_string(), ApiOptions::default()).await
}

fn get(key: &str) -> GetSecretRequest {
    GetSecretRequest {
        store_name: "local".into(),
        key: key.into(),
        metadata: HashMap::new(),
    }
}

#[tokio::test]
async fn get_one_secret_and_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    let nested = client.get_secret(get("redis:password")).await.unwrap();
    assert_eq!(
        nested.into_inner().data,
        HashMap::from([("redis:password".to_string(), "pa55-word".to_string())]),
        "nested keys are flattened with `:`"
    );

    let request = GetBulkSecretRequest {
        store_name: "local".into(),
        metadata: HashMap::new(),
    };
    let all = client
        .get_bulk_secret(request)
        .await
        .unwrap()
        .into_inner()
        .data;
    let mut names: Vec<&str> = all.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["apiKey", "redis:password"]);
    assert_eq!(all["apiKey"].secrets["apiKey"], "k-123456");
    sidecar.stop().await;
}

#[tokio::test]
async fn missing_secrets_and_stores_are_errors_without_values() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(&dir).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;

    let missing = client
        .get_secret(get("nope"))
        .await
        .expect_err("no such secret");
    assert_eq!(
        missing.code(),
        Code::Internal,
        "Dapr answers INTERNAL: {missing:?}"
    );
    assert!(
        missing.message().contains("`nope`") && missing.message().contains("`local`"),
        "{}",
        missing.message()
    );
    assert!(!missing.message().contains("pa55-word"));

    let mut request = get("apiKey");
    request.store_name = "vault".into();
    let unknown = client.get_secret(request).await.expect_err("no such store");
    // Dapr's `SecretStore(name).NotFound()`, as over HTTP (was: "secret
    // store `vault` is not found").
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert_eq!(
        unknown.message(),
        "failed finding secret store with key vault"
    );
    sidecar.stop().await;
}
