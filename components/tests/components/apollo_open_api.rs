//! With the Open API configured, `set` and `delete` of the `apollo` config
//! store edit the namespace's items, release them as `open_api_user`, and
//! the change comes back to subscribers; a wrong token is refused without
//! showing it.

use crate::support::apollo_server;

use apollo_server::harness::{expect_change, metadata, start, subscribe, value_of, with};
use apollo_server::{ApolloServer, Route};
use rewire_runtime::{ConfigError, ConfigItem, ConfigQuery};
use serde_json::{json, Value};

const TOKEN: &str = "open-api-token-0123456789";

fn item(group: Option<&str>, key: &str, value: &str) -> ConfigItem {
    ConfigItem {
        key: key.into(),
        value: value.into(),
        group: group.map(Into::into),
        ..ConfigItem::default()
    }
}

fn writable(server: &ApolloServer, dir: &std::path::Path, token: &str) -> Value {
    with(
        metadata(&server.url(), dir),
        json!({
            "namespace_name": "application,shared",
            "open_api_address": server.url(),
            "open_api_token": token,
            "open_api_user": "alice",
        }),
    )
}

#[tokio::test]
async fn set_and_delete_are_released_and_reach_subscribers() {
    let server = ApolloServer::start().await;
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("a", "1")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let started = start(writable(&server, dir.path(), TOKEN))
        .await
        .expect("start");
    let store = &started.store;
    let mut all = subscribe(store, ConfigQuery::default()).await;
    let mut shared = subscribe(
        store,
        ConfigQuery {
            group: Some("shared".into()),
            ..ConfigQuery::default()
        },
    )
    .await;

    store
        .set(vec![
            item(None, "k", "v"),
            item(Some("shared"), "s", "1"),
            item(None, "a", "2"),
        ])
        .await
        .expect("set");
    // Read back right away, before any long poll.
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v"));
    let draft = server.draft("application");
    let k = draft
        .get("k")
        .cloned()
        .unwrap_or_else(|| panic!("k not in the draft: {draft:?}"));
    assert_eq!(
        (
            k.value.as_str(),
            k.created_by.as_str(),
            k.modified_by.as_str()
        ),
        ("v", "alice", "alice")
    );
    assert_eq!(
        draft.get("a").map(|i| i.modified_by.as_str()),
        Some("alice")
    );
    let release = server.current("application").expect("no release");
    assert_eq!(release.released_by, "alice");
    assert!(release.title.starts_with("rewire-"), "{}", release.title);
    assert_eq!(
        server.releases("application").len(),
        2,
        "one release per write, per namespace"
    );
    assert_eq!(
        server.current("shared").map(|r| r.configurations.len()),
        Some(1)
    );
    let items = expect_change(&mut all, "k", "v").await;
    assert!(
        items.iter().any(|i| i.key == "a" && i.value == "2"),
        "{items:?}"
    );
    expect_change(&mut shared, "s", "1").await;

    store
        .delete(&ConfigQuery::keys(["k", "never-there"]))
        .await
        .expect("delete");
    assert!(!server.draft("application").contains_key("k"));
    assert_eq!(server.releases("application").len(), 3);
    expect_change(&mut all, "k", "").await;
    assert_eq!(value_of(store, "k").await, None);

    let grouped = ConfigQuery {
        keys: vec!["s".into()],
        group: Some("shared".into()),
        ..ConfigQuery::default()
    };
    store.delete(&grouped).await.expect("delete");
    expect_change(&mut shared, "s", "").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_wrong_token_is_refused_without_showing_it() {
    let server = ApolloServer::start().await;
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("a", "1")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let started = start(writable(&server, dir.path(), "not-the-right-token"))
        .await
        .expect("start");
    match started.store.set(vec![item(None, "k", "v")]).await {
        Err(ConfigError::Backend(message)) => {
            assert!(
                message.contains("401") && message.contains("open_api_token"),
                "{message}"
            );
            assert!(!message.contains("not-the-right-token"), "{message}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(!server.draft("application").contains_key("k"));
    assert_eq!(
        server.requests(Route::OpenApiReleases),
        0,
        "released after a refused write"
    );
    let group = started
        .store
        .set(vec![item(Some("elsewhere"), "k", "v")])
        .await;
    assert!(matches!(group, Err(ConfigError::Invalid(m)) if m.contains("elsewhere")));
    started.store.close().await.unwrap();

    let half = with(
        metadata(&server.url(), dir.path()),
        json!({"open_api_token": TOKEN}),
    );
    let err = start(half).await.err().unwrap_or_default();
    assert!(err.contains("open_api_address"), "{err}");
    assert!(!err.contains(TOKEN), "{err}");
}

/// The draft of `namespace` as key → value.
fn draft_values(server: &ApolloServer, namespace: &str) -> Vec<(String, String)> {
    server
        .draft(namespace)
        .into_iter()
        .map(|(key, item)| (key, item.value))
        .collect()
}

#[tokio::test]
async fn a_failed_write_leaves_nothing_for_a_later_release() {
    let server = ApolloServer::start().await;
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("a", "1"), ("gone", "x")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let started = start(writable(&server, dir.path(), TOKEN))
        .await
        .expect("start");
    let store = &started.store;
    let released = draft_values(&server, "application");

    // The third edit fails: the two before it are undone (the new item
    // deleted, the changed one put back), nothing is released.
    server.fail_item(Some("boom"));
    let set = store
        .set(vec![
            item(None, "new", "v"),
            item(None, "a", "2"),
            item(None, "boom", "x"),
        ])
        .await;
    match set {
        Err(ConfigError::Backend(message)) => {
            assert!(
                message.contains("500")
                    && message.contains("2 item edit(s) made before it were undone"),
                "{message}"
            );
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(draft_values(&server, "application"), released);
    assert_eq!(server.requests(Route::OpenApiReleases), 0);

    // A delete too: the key deleted before the failure is put back.
    let delete = store.delete(&ConfigQuery::keys(["gone", "boom"])).await;
    assert!(matches!(delete, Err(ConfigError::Backend(_))), "{delete:?}");
    assert_eq!(draft_values(&server, "application"), released);

    // An item Apollo would refuse is refused before anything is written.
    server.fail_item(None);
    let edits = server.requests(Route::OpenApiItems);
    let long = "x".repeat(20_001);
    let set = store
        .set(vec![item(None, "new", "v"), item(None, "long", &long)])
        .await;
    assert!(
        matches!(&set, Err(ConfigError::Invalid(m)) if m.contains("`long`") && m.contains("20000")),
        "{set:?}"
    );
    let set = store
        .set(vec![item(None, "new", "v"), item(None, "", "v")])
        .await;
    assert!(matches!(set, Err(ConfigError::Invalid(_))), "{set:?}");
    assert_eq!(server.requests(Route::OpenApiItems), edits);
    assert_eq!(draft_values(&server, "application"), released);
    started.store.close().await.unwrap();
}
