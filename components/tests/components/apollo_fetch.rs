//! The `apollo` config store serves several namespaces: without a group the
//! first namespace that has a key wins, with a group the namespace is read
//! alone; an unreleased namespace (404) is served empty.

use crate::support::apollo_server;

use apollo_server::harness::{eventually, metadata, start, value_of, with};
use apollo_server::{ApolloServer, Route};
use rewire_runtime::{ConfigError, ConfigQuery, Readiness, Registry};
use serde_json::{json, Value};

fn grouped(group: &str, keys: &[&str]) -> ConfigQuery {
    ConfigQuery {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        group: Some(group.into()),
        ..ConfigQuery::default()
    }
}

#[tokio::test]
async fn keys_come_from_two_namespaces_in_order_and_an_unreleased_one_is_empty() {
    let server = ApolloServer::start().await;
    let app_key = server.release("application", &[("a", "1"), ("shared", "from-application")]);
    let common_key = server.release("common", &[("b", "2"), ("shared", "from-common")]);
    server.create_namespace("unreleased");
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"namespace_name": "application, common, unreleased"}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    assert_eq!(store.readiness().await, Readiness::Ready);

    let items = store
        .get(&ConfigQuery::keys(["a", "b", "shared", "absent"]))
        .await
        .expect("get");
    let found: Vec<_> = items
        .iter()
        .map(|i| (i.key.as_str(), i.value.as_str(), i.version.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            ("a", "1", app_key.as_str()),
            ("b", "2", common_key.as_str()),
            ("shared", "from-application", app_key.as_str()),
        ]
    );
    assert!(items.iter().all(|i| i.group.is_none()));
    assert_eq!(
        items[1].metadata.get("namespace").map(String::as_str),
        Some("common")
    );

    let all = store.get(&ConfigQuery::default()).await.unwrap_or_default();
    assert_eq!(all.len(), 3, "{all:?}");

    let common = store
        .get(&grouped("common", &["shared"]))
        .await
        .unwrap_or_default();
    assert_eq!(common.len(), 1);
    assert_eq!(common[0].value, "from-common");
    assert_eq!(common[0].group.as_deref(), Some("common"));
    let whole_common = store.get(&grouped("common", &[])).await.unwrap_or_default();
    assert_eq!(whole_common.len(), 2);

    let unreleased = store.get(&grouped("unreleased", &[])).await;
    assert_eq!(unreleased, Ok(Vec::new()));
    // Backups are written off the fetches, by the store's writer task.
    let unreleased_file = dir.path().join("checkout+default+unreleased.json");
    eventually("an unreleased namespace is backed up (empty) too", || {
        unreleased_file.exists()
    })
    .await;
    assert!(server.requests(Route::Configs) >= 3);
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn unknown_groups_and_labels_are_invalid_and_writes_need_the_open_api() {
    let server = ApolloServer::start().await;
    server.release("application", &[("a", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let store = &started.store;
    match store.get(&grouped("payments", &["a"])).await {
        Err(ConfigError::Invalid(message)) => {
            assert!(
                message.contains("payments") && message.contains("application"),
                "{message}"
            )
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let labelled = ConfigQuery {
        label: Some("prod".into()),
        ..ConfigQuery::default()
    };
    assert!(
        matches!(store.subscribe(labelled).await, Err(ConfigError::Invalid(m)) if m.contains("prod"))
    );
    let set = store.set(vec![Default::default()]).await;
    assert!(
        matches!(&set, Err(ConfigError::Unsupported(m)) if m.contains("open_api_address")),
        "{set:?}"
    );
    let delete = store.delete(&ConfigQuery::keys(["a"])).await;
    assert!(
        matches!(delete, Err(ConfigError::Unsupported(_))),
        "{delete:?}"
    );
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn layotto_metadata_spellings_and_the_runtime_app_id() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v")]);
    let dir = tempfile::tempdir().unwrap();
    // Layotto's `address`, string scalars, the default namespace.
    let layotto = json!({
        "address": server.url(),
        "app_id": "checkout",
        "cluster": "default",
        "is_backup_config": "false",
        "backup_config_path": dir.path().display().to_string(),
    });
    let started = start(layotto).await.expect("start");
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v"));
    assert!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "is_backup_config=false wrote a backup"
    );
    started.store.close().await.unwrap();

    // Without app_id the runtime's appId is used: an app the server does
    // not know, whose namespaces are all unreleased.
    let anonymous = json!({"config_server": server.url(), "is_backup_config": false});
    let started = start(anonymous).await.expect("start");
    assert_eq!(value_of(&started.store, "k").await, None);
    started.store.close().await.unwrap();

    // A misspelt field is refused before init, with a suggestion.
    let typo = json!({"config_server": server.url(), "namespace": "application"});
    let err = start(typo).await.err().unwrap_or_default();
    assert!(err.contains("namespace_name"), "{err}");
}

#[test]
fn it_is_registered_with_a_description_and_a_valid_example() {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry
        .get("config_store", "apollo")
        .expect("config_store/apollo is not registered");
    assert!(!descriptor.description.is_empty());
    let example: Value =
        serde_json::from_str(descriptor.example_metadata).expect("example is not JSON");
    let example = example.as_object().cloned().unwrap_or_default();
    (descriptor.validate)(&example, &[]).unwrap();
    // The secret and the server may come from secretRef / configurationRef.
    let bare = json!({"app_id": "checkout"})
        .as_object()
        .cloned()
        .unwrap_or_default();
    (descriptor.validate)(&bare, &["config_server".into(), "secret".into()]).unwrap();
}
