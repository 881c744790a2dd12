//! The `secrets` section's scopes (Dapr's `spec.secrets.scopes`) over the
//! secret APIs: every Dapr scenario over HTTP, Dapr's gRPC and Layotto's
//! gRPC (one refused: 403 `ERR_PERMISSION_DENIED` / `PERMISSION_DENIED`,
//! naming store and secret and never a value; bulk answers leave refused
//! secrets out), a reload changing a scope without a restart, and a
//! component's `secretRef` to a refused secret still resolved (scopes
//! limit the app's API, not components).

use crate::support::grpc::{self, dapr, layotto};
use crate::support::sidecar::Sidecar;

use std::collections::{BTreeSet, HashMap};

use layotto::runtime_client::RuntimeClient;
use reqwest::{Client, StatusCode};
use rewire::config::parse;
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use tonic::Code;

/// Each store's scope (Dapr's scenarios), and the secrets among `s1` and
/// `s2` it lets the app read.
fn scenarios() -> Vec<(&'static str, Value, &'static [&'static str])> {
    vec![
        ("default_deny", json!({"defaultAccess": "deny"}), &[]),
        (
            "deny_allowed",
            json!({"defaultAccess": "deny", "allowedSecrets": ["s1"]}),
            &["s1"],
        ),
        (
            "allow_denied",
            json!({"defaultAccess": "allow", "deniedSecrets": ["s1"]}),
            &["s2"],
        ),
        (
            "allow_allowed",
            json!({"defaultAccess": "allow", "allowedSecrets": ["s1"]}),
            &["s1"],
        ),
        (
            "deny_denied",
            json!({"defaultAccess": "deny", "deniedSecrets": ["s1"]}),
            &[],
        ),
        (
            "both_lists",
            json!({"allowedSecrets": ["s1"], "deniedSecrets": ["s2"]}),
            &["s1"],
        ),
        ("open", Value::Null, &["s1", "s2"]),
    ]
}

/// The configuration: one `local.file` store per scenario over the same
/// file (`s1`, `s2`), each scoped as its scenario says.
fn config(dir: &tempfile::TempDir) -> Value {
    let path = dir.path().join("secrets.json");
    std::fs::write(&path, r#"{"s1": "value-one", "s2": "value-two"}"#).unwrap();
    let mut stores = serde_json::Map::new();
    let mut scopes = Vec::new();
    for (store, mut scope, _) in scenarios() {
        stores.insert(
            store.into(),
            json!({"type": "local.file", "metadata": {"secretsFile": path}}),
        );
        if let Value::Object(fields) = &mut scope {
            fields.insert("storeName".into(), store.into());
            scopes.push(scope);
        }
    }
    json!({
        "appId": "shop",
        "components": {"secret_store": stores},
        "secrets": {"scopes": scopes}
    })
}

async fn start(dir: &tempfile::TempDir) -> Sidecar {
    Sidecar::start(&config(dir).to_string(), ApiOptions::default()).await
}

fn denied_message(store: &str, name: &str) -> String {
    format!("access denied by policy to get \"{name}\" from \"{store}\"")
}

fn value_of(name: &str) -> &'static str {
    if name == "s1" {
        "value-one"
    } else {
        "value-two"
    }
}

#[tokio::test]
async fn http_gets_follow_each_dapr_scenario_and_bulk_leaves_refused_out() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start(&dir).await;
    let client = Client::new();
    let base = format!("{}/v1.0/secrets", sidecar.http_url());
    for (store, _, readable) in scenarios() {
        for name in ["s1", "s2"] {
            let response = client
                .get(format!("{base}/{store}/{name}"))
                .send()
                .await
                .unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            if readable.contains(&name) {
                assert_eq!(status, StatusCode::OK, "{store}/{name}: {body}");
                assert_eq!(body, json!({ name: value_of(name) }), "{store}/{name}");
            } else {
                assert_eq!(status, StatusCode::FORBIDDEN, "{store}/{name}: {body}");
                assert_eq!(body["errorCode"], "ERR_PERMISSION_DENIED", "{body}");
                assert_eq!(body["message"], denied_message(store, name), "{body}");
                assert!(!body.to_string().contains("value-"), "{body}");
            }
        }
        let bulk: Value = client
            .get(format!("{base}/{store}/bulk"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let names: BTreeSet<&str> = bulk
            .as_object()
            .unwrap_or_else(|| panic!("{store}: {bulk}"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(names, readable.iter().copied().collect(), "{store} bulk");
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_gets_follow_each_dapr_scenario_and_bulk_leaves_refused_out() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start(&dir).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    for (store, _, readable) in scenarios() {
        for name in ["s1", "s2"] {
            let request = dapr::GetSecretRequest {
                store_name: store.into(),
                key: name.into(),
                metadata: HashMap::new(),
            };
            match client.get_secret(request).await {
                Ok(answer) if readable.contains(&name) => {
                    assert_eq!(answer.into_inner().data[name], value_of(name));
                }
                Err(status) if !readable.contains(&name) => {
                    assert_eq!(status.code(), Code::PermissionDenied, "{store}/{name}");
                    assert_eq!(status.message(), denied_message(store, name));
                }
                other => panic!("{store}/{name}: {other:?}"),
            }
        }
        let request = dapr::GetBulkSecretRequest {
            store_name: store.into(),
            metadata: HashMap::new(),
        };
        let bulk = client.get_bulk_secret(request).await.unwrap().into_inner();
        let names: BTreeSet<&str> = bulk.data.keys().map(String::as_str).collect();
        assert_eq!(names, readable.iter().copied().collect(), "{store} bulk");
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn layotto_gets_follow_the_same_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start(&dir).await;
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    for (store, _, readable) in scenarios() {
        for name in ["s1", "s2"] {
            let request = layotto::GetSecretRequest {
                store_name: store.into(),
                key: name.into(),
                ..Default::default()
            };
            match client.get_secret(request).await {
                Ok(answer) if readable.contains(&name) => {
                    assert_eq!(answer.into_inner().data[name], value_of(name));
                }
                Err(status) if !readable.contains(&name) => {
                    assert_eq!(status.code(), Code::PermissionDenied, "{store}/{name}");
                    assert!(!status.message().contains("value-"), "{status:?}");
                }
                other => panic!("{store}/{name}: {other:?}"),
            }
        }
        let request = layotto::GetBulkSecretRequest {
            store_name: store.into(),
            ..Default::default()
        };
        let bulk = client.get_bulk_secret(request).await.unwrap().into_inner();
        let names: BTreeSet<&str> = bulk.data.keys().map(String::as_str).collect();
        assert_eq!(names, readable.iter().copied().collect(), "{store} bulk");
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn a_reload_changing_a_scope_applies_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = start(&dir).await;
    let client = Client::new();
    let url = format!("{}/v1.0/secrets/default_deny/s1", sidecar.http_url());
    let status = || async { client.get(&url).send().await.unwrap().status() };
    assert_eq!(status().await, StatusCode::FORBIDDEN);

    let mut opened = config(&dir);
    opened["secrets"]["scopes"][0]["defaultAccess"] = json!("allow");
    let record = sidecar
        .runtime
        .apply(parse(opened.to_string().as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    assert!(
        record
            .actions
            .values()
            .all(|a| *a == rewire::Action::Unchanged),
        "a scopes-only reload rebuilds nothing: {:?}",
        record.actions
    );
    assert_eq!(status().await, StatusCode::OK, "the new scope is in force");

    let closed = config(&dir);
    sidecar
        .runtime
        .apply(parse(closed.to_string().as_bytes()).expect("valid"))
        .await
        .expect("reload applied");
    assert_eq!(status().await, StatusCode::FORBIDDEN, "and back");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_secret_ref_to_a_refused_secret_still_resolves() {
    let files = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.json");
    std::fs::write(&path, json!({ "root": files.path() }).to_string()).unwrap();
    let config = json!({
        "appId": "shop",
        "components": {
            "secret_store": {"vault": {"type": "local.file", "metadata": {"secretsFile": path}}},
            "file": {"files": {"type": "local",
                "secretRef": [{"store": "vault", "name": "root", "key": "root", "injectAs": "root"}]}}
        },
        "secrets": {"scopes": [{"storeName": "vault", "defaultAccess": "deny"}]}
    });
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let denied = Client::new()
        .get(format!("{}/v1.0/secrets/vault/root", sidecar.http_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        denied.status(),
        StatusCode::FORBIDDEN,
        "the app may not read it"
    );

    // The component read it: files land in the directory it names.
    let mut client = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    let put = layotto::PutFileRequest {
        store_name: "files".into(),
        name: "note.txt".into(),
        data: b"abc".to_vec(),
        ..Default::default()
    };
    client
        .put_file(tokio_stream::iter(vec![put]))
        .await
        .expect("put");
    assert_eq!(
        std::fs::read(files.path().join("note.txt")).unwrap(),
        b"abc"
    );
    sidecar.stop().await;
}
