//! The `local.file` secret store, built through the registry: nested
//! secrets flattened with the separator, multi-valued secrets, not-found.

use crate::common;
use crate::support::apollo_server::harness::eventually;
use crate::support::logs;

use std::collections::HashMap;
use std::sync::Arc;

use rewire_runtime::{Instance, SecretError, SecretMap, SecretStore};
use serde_json::json;

const FILE: &str = r#"{
    "redis": {"password": "r3d1s", "port": 6379},
    "apollo": {"access_key": "ak", "tls": {"enabled": true}},
    "token": "t0k"
}"#;

async fn secret_store(metadata: serde_json::Value) -> Arc<dyn SecretStore> {
    match common::start("secret_store", "local.file", metadata).await {
        Ok(Instance::SecretStore(store)) => store,
        Ok(other) => panic!("expected a secret store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn exposed(map: &SecretMap) -> Vec<(&str, &str)> {
    map.iter().map(|(k, v)| (k.as_str(), v.expose())).collect()
}

fn secrets_file(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("secrets.json");
    std::fs::write(&path, FILE).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn nested_secrets_are_flattened_with_the_separator() {
    let dir = tempfile::tempdir().unwrap();
    let store = secret_store(json!({"secretsFile": secrets_file(&dir)})).await;
    let none = HashMap::new();
    let secret = store.get_secret("redis:password", &none).await.unwrap();
    assert_eq!(exposed(&secret), vec![("redis:password", "r3d1s")]);
    let port = store.get_secret("redis:port", &none).await.unwrap();
    assert_eq!(exposed(&port), vec![("redis:port", "6379")]);
    assert_eq!(
        store.get_secret("redis", &none).await,
        Err(SecretError::NotFound("redis".into()))
    );
    let all = store.bulk_get_secret(&none).await.unwrap();
    let names: Vec<_> = all.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        vec![
            "apollo:access_key",
            "apollo:tls:enabled",
            "redis:password",
            "redis:port",
            "token"
        ]
    );
}

#[tokio::test]
async fn multi_valued_secrets_hold_their_nested_keys() {
    let dir = tempfile::tempdir().unwrap();
    let metadata =
        json!({"secretsFile": secrets_file(&dir), "multiValued": "true", "nestedSeparator": "."});
    let store = secret_store(metadata).await;
    let none = HashMap::new();
    let apollo = store.get_secret("apollo", &none).await.unwrap();
    assert_eq!(
        exposed(&apollo),
        vec![("access_key", "ak"), ("tls.enabled", "true")]
    );
    let token = store.get_secret("token", &none).await.unwrap();
    assert_eq!(exposed(&token), vec![("token", "t0k")]);
    assert_eq!(
        store.get_secret("apollo.access_key", &none).await,
        Err(SecretError::NotFound("apollo.access_key".into()))
    );
    assert_eq!(
        store.bulk_get_secret(&none).await.map(|all| all.len()),
        Ok(3)
    );
}

#[tokio::test]
async fn a_bad_file_fails_init_without_revealing_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.json");
    std::fs::write(&path, "{\n  \"db\": \"sup3rsecret\n}").unwrap();
    let err = common::start(
        "secret_store",
        "local.file",
        json!({"secretsFile": path.display().to_string()}),
    )
    .await
    .map(|_| ())
    .expect_err("expected an error");
    assert!(
        err.contains("secrets.json") && err.contains("line"),
        "{err}"
    );
    assert!(!err.contains("sup3rsecret"), "{err}");
    let missing = dir.path().join("absent.json").display().to_string();
    let err = common::start(
        "secret_store",
        "local.file",
        json!({"secretsFile": missing.clone()}),
    )
    .await
    .map(|_| ())
    .expect_err("expected an error");
    assert!(err.contains(&missing), "{err}");
}

/// Reads `name`/`key` until it equals `expected` (bounded).
async fn eventually_equals(
    store: &Arc<dyn SecretStore>,
    name: &str,
    key: &str,
    expected: &str,
) -> bool {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let value = store
            .get_secret(name, &HashMap::new())
            .await
            .ok()
            .and_then(|s| s.get(key).map(|v| v.expose().to_string()));
        if value.as_deref() == Some(expected) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_is_served_without_a_restart_and_a_bad_file_keeps_the_last_good_one() {
    logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let path = secrets_file(&dir);
    let store = secret_store(json!({"secretsFile": path, "multiValued": true})).await;
    assert!(eventually_equals(&store, "redis", "password", "r3d1s").await);
    // A rotation written the safe way: temp file, then rename over.
    let temp = dir.path().join("secrets.json.tmp");
    std::fs::write(&temp, r#"{"redis": {"password": "rotated-9f8e7d"}}"#).unwrap();
    std::fs::rename(&temp, &path).unwrap();
    assert!(
        eventually_equals(&store, "redis", "password", "rotated-9f8e7d").await,
        "rotation not picked up"
    );
    // A broken write keeps the last good secrets.
    std::fs::write(&path, r#"{"redis": {"password": "#).unwrap();
    eventually("the broken write is read and refused", || {
        logs::any(&["keeping the last good secrets", &path])
    })
    .await;
    assert!(eventually_equals(&store, "redis", "password", "rotated-9f8e7d").await);
}

#[tokio::test]
async fn two_entries_flattening_to_one_name_fail_init_naming_it_not_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.json");
    std::fs::write(
        &path,
        r#"{"db:password": "v4lue-one", "db": {"password": "v4lue-two"}}"#,
    )
    .unwrap();
    let err = common::start(
        "secret_store",
        "local.file",
        json!({"secretsFile": path.display().to_string()}),
    )
    .await
    .map(|_| ())
    .expect_err("two values for `db:password`: refused, as Dapr does");
    assert!(
        err.contains("secrets.json") && err.contains("`db:password`"),
        "{err}"
    );
    assert!(!err.contains("v4lue"), "{err}");
}
