//! The `env` secret store, built through the registry: variables as
//! secrets, with and without a prefix.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use rewire_runtime::{Instance, SecretError, SecretStore};
use serde_json::json;

async fn secret_store(metadata: serde_json::Value) -> Arc<dyn SecretStore> {
    match common::start("secret_store", "env", metadata).await {
        Ok(Instance::SecretStore(store)) => store,
        Ok(other) => panic!("expected a secret store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn variables_are_secrets_and_the_prefix_scopes_them() {
    // Set before any store reads the environment; names are unique to this
    // test binary. A safe fn on edition 2021.
    std::env::set_var("REWIRE_IT_ENV_DB_PASSWORD", "pw");
    std::env::set_var("REWIRE_IT_ENV_API_KEY", "key");
    let none = HashMap::new();

    let plain = secret_store(json!({})).await;
    let secret = plain
        .get_secret("REWIRE_IT_ENV_DB_PASSWORD", &none)
        .await
        .unwrap();
    assert_eq!(
        secret.get("REWIRE_IT_ENV_DB_PASSWORD").map(|v| v.expose()),
        Some("pw")
    );
    assert_eq!(
        plain.get_secret("DB_PASSWORD", &none).await,
        Err(SecretError::NotFound("DB_PASSWORD".into()))
    );

    let scoped = secret_store(json!({"prefix": "REWIRE_IT_ENV_"})).await;
    let secret = scoped.get_secret("DB_PASSWORD", &none).await.unwrap();
    assert_eq!(secret.get("DB_PASSWORD").map(|v| v.expose()), Some("pw"));
    let all = scoped.bulk_get_secret(&none).await.unwrap();
    assert_eq!(
        all.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["API_KEY", "DB_PASSWORD"]
    );
    assert_eq!(
        all["API_KEY"].get("API_KEY").map(|v| v.expose()),
        Some("key")
    );
}
