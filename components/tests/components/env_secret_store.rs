//! The `env` secret store, built through the registry: variables as
//! secrets, with and without a prefix; an unset, reserved or not allowed
//! name answers an empty value, as Dapr's `local.env` does.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use rewire_runtime::{Instance, SecretError, SecretMap, SecretStore, SecretString};
use serde_json::json;

/// What Dapr's `local.env` answers for a variable it does not serve:
/// the name with an empty value.
fn empty(name: &str) -> Result<SecretMap, SecretError> {
    Ok(SecretMap::from([(name.to_string(), SecretString::new(""))]))
}

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
    // Unset: Dapr's `{"DB_PASSWORD": ""}`, not an error.
    assert_eq!(
        plain.get_secret("DB_PASSWORD", &none).await,
        empty("DB_PASSWORD")
    );
    assert_eq!(plain.get_secret("A=B", &none).await, empty("A=B"));

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

#[tokio::test]
async fn the_sidecar_tokens_are_never_served_whatever_the_prefix() {
    // The variable names the sidecar and `rewire apply` read their tokens
    // from; this binary starts no sidecar, so setting them is harmless.
    let tokens = [
        ("REWIRE_ADMIN_TOKEN", "it-admin-token"),
        ("REWIRE_API_TOKEN", "it-api-token"),
        ("DAPR_API_TOKEN", "it-dapr-token"),
        ("APP_API_TOKEN", "it-app-token"),
    ];
    for (name, value) in tokens {
        std::env::set_var(name, value);
    }
    let none = HashMap::new();
    for prefix in ["", "REWIRE_", "DAPR_", "APP_", "REWIRE_ADMIN_"] {
        let store = secret_store(json!({ "prefix": prefix })).await;
        for (variable, _) in tokens {
            let Some(name) = variable.strip_prefix(prefix) else {
                continue;
            };
            // Exactly the answer for an unset variable.
            assert_eq!(
                store.get_secret(name, &none).await,
                empty(name),
                "prefix `{prefix}` served {variable}"
            );
        }
        let all = store.bulk_get_secret(&none).await.unwrap();
        for (name, secret) in &all {
            for value in secret.values() {
                assert!(
                    !tokens.iter().any(|(_, t)| *t == value.expose()),
                    "prefix `{prefix}` served a token as `{name}`"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_allow_list_narrows_the_names_served() {
    std::env::set_var("REWIRE_IT_ALLOW_DB", "db");
    std::env::set_var("REWIRE_IT_ALLOW_KEY", "key");
    let none = HashMap::new();
    for allowed in [json!("DB"), json!(["DB"])] {
        let store =
            secret_store(json!({"prefix": "REWIRE_IT_ALLOW_", "allowedSecrets": allowed})).await;
        assert!(store.get_secret("DB", &none).await.is_ok());
        assert_eq!(store.get_secret("KEY", &none).await, empty("KEY"));
        let all = store.bulk_get_secret(&none).await.unwrap();
        assert_eq!(
            all.keys().map(String::as_str).collect::<Vec<_>>(),
            vec!["DB"]
        );
    }
    let aliased = secret_store(json!({"prefix": "REWIRE_IT_ALLOW_", "allowlist": "KEY"})).await;
    assert!(aliased.get_secret("KEY", &none).await.is_ok());
    assert_eq!(aliased.get_secret("DB", &none).await, empty("DB"));
}
