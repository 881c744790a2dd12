//! With the Open API configured, `set` and `delete` of the `apollo` config
//! store edit the namespace's items, release them as `open_api_user`, and
//! the change comes back to subscribers; a wrong token is refused without
//! showing it.

use crate::support::apollo_server;

use apollo_server::harness::{expect_change, metadata, start, subscribe, value_of, with, Started};
use apollo_server::{ApolloServer, Fault, Route, Stall};
use rewire_runtime::{
    ComponentKey, ConfigError, ConfigItem, ConfigQuery, Handover, InitContext, Instance, Metadata,
    Registry,
};
use serde_json::{json, Value};
use std::time::Duration;

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

/// An empty key names no item (as a get or a subscription finds none): a
/// delete naming it deletes the other keys, and one naming only it
/// deletes nothing and releases nothing — not an invalid request.
#[tokio::test]
async fn a_delete_of_an_empty_key_deletes_nothing() {
    let server = ApolloServer::start().await;
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("a", "1"), ("b", "2")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let started = start(writable(&server, dir.path(), TOKEN))
        .await
        .expect("start");
    let store = &started.store;
    let got = store.get(&ConfigQuery::keys(["", "a"])).await.expect("get");
    assert_eq!(
        got.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    let releases = server.releases("application").len();
    store
        .delete(&ConfigQuery::keys([""]))
        .await
        .expect("a delete of only an empty key");
    assert_eq!(
        server.releases("application").len(),
        releases,
        "nothing released"
    );
    store
        .delete(&ConfigQuery::keys(["", "a"]))
        .await
        .expect("a delete of an empty key and `a`");
    assert!(!server.draft("application").contains_key("a"));
    assert!(server.draft("application").contains_key("b"));
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

    // An empty key is refused before anything is written (a value too
    // long is the portal's to refuse: a refused edit, as above).
    server.fail_item(None);
    let edits = server.requests(Route::OpenApiItems);
    let set = store
        .set(vec![item(None, "new", "v"), item(None, "", "v")])
        .await;
    assert!(matches!(set, Err(ConfigError::Invalid(_))), "{set:?}");
    assert_eq!(server.requests(Route::OpenApiItems), edits);
    assert_eq!(draft_values(&server, "application"), released);
    started.store.close().await.unwrap();
}

/// A writable store on `server` whose Open API requests time out after
/// `timeout_ms`, the draft of `application` released with `k1 = old`.
async fn racing_store(
    server: &ApolloServer,
    dir: &std::path::Path,
    timeout_ms: u64,
) -> apollo_server::harness::Started {
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("k1", "old")]);
    server.create_namespace("shared");
    let metadata = with(
        writable(server, dir, TOKEN),
        json!({"requestTimeoutMs": timeout_ms}),
    );
    start(metadata).await.expect("start")
}

/// Waits (up to 5 s) until a request of the Open API is stalled.
async fn until_stalled(server: &ApolloServer) {
    for _ in 0..500 {
        if server.stalled() > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no Open API request stalled within 5 s");
}

#[tokio::test]
async fn a_failed_write_cannot_undo_a_write_made_meanwhile() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 5000).await;
    let store = &started.store;

    // A sets k1 and k2; its edit of k2 waits at the portal, then fails.
    server.fail_item(Some("k2"));
    server.stall(Some(Stall::ItemBefore("k2".into())));
    let first = store.clone();
    let a = tokio::spawn(async move {
        first
            .set(vec![item(None, "k1", "a"), item(None, "k2", "x")])
            .await
    });
    until_stalled(&server).await;
    // B sets k1 meanwhile: it waits for A (before, it edited, released
    // and answered at once, and A's undo then put `old` back in the draft).
    let second = store.clone();
    let mut b = tokio::spawn(async move { second.set(vec![item(None, "k1", "b")]).await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut b).await;
    server.stall(None);
    let b = match early {
        Ok(done) => done,
        Err(_) => b.await,
    };
    let a = a.await.unwrap();
    assert!(
        matches!(&a, Err(ConfigError::Backend(m)) if m.contains("undone")),
        "{a:?}"
    );
    b.unwrap().expect("B's set");
    // What B was told was written is what is released, and what the next
    // release publishes.
    let release = server.current("application").expect("a release");
    assert_eq!(
        release.configurations.get("k1").map(String::as_str),
        Some("b")
    );
    assert_eq!(
        draft_values(&server, "application"),
        vec![("k1".to_string(), "b".to_string())]
    );
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_release_without_answer_is_not_undone() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 500).await;
    let store = &started.store;

    // The portal releases, then its answer never comes.
    server.stall(Some(Stall::ReleaseAfter));
    let set = store.set(vec![item(None, "k1", "new")]).await;
    server.stall(None);
    match set {
        Err(ConfigError::Backend(message)) => assert!(
            message.contains("unknown") && message.contains("`k1`") && !message.contains("undone"),
            "{message}"
        ),
        other => panic!("expected a backend error, got {other:?}"),
    }
    // Not reverted in the draft (the next release would have published
    // `old` over a write that went through), and read back.
    assert_eq!(
        draft_values(&server, "application"),
        vec![("k1".to_string(), "new".to_string())]
    );
    assert_eq!(value_of(store, "k1").await.as_deref(), Some("new"));
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn an_edit_without_answer_is_not_said_to_be_undone() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 500).await;
    let store = &started.store;

    // k2's edit is made, then its answer never comes: k1 (made and
    // answered) is undone, k2's outcome is unknown and said so.
    server.stall(Some(Stall::ItemAfter("k2".into())));
    let set = store
        .set(vec![item(None, "k1", "a"), item(None, "k2", "x")])
        .await;
    server.stall(None);
    match set {
        Err(ConfigError::Backend(message)) => assert!(
            message.contains("whether this edit of `k2` was made is unknown")
                && message.contains("the 1 item edit(s) made before it were undone"),
            "{message}"
        ),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(
        server.requests(Route::OpenApiReleases),
        0,
        "released after a failed edit"
    );
    let draft = draft_values(&server, "application");
    assert!(
        draft.contains(&("k1".to_string(), "old".to_string())),
        "{draft:?}"
    );
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_caller_giving_up_does_not_split_a_write() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 5000).await;
    let store = &started.store;

    // The caller stops waiting while k2's edit is at the portal (its
    // deadline): the write still ends, undoing k1 when k2 is refused.
    server.fail_item(Some("k2"));
    server.stall(Some(Stall::ItemBefore("k2".into())));
    let set = store.set(vec![item(None, "k1", "a"), item(None, "k2", "x")]);
    let given_up = tokio::time::timeout(Duration::from_millis(200), set).await;
    assert!(given_up.is_err(), "{given_up:?}");
    until_stalled(&server).await;
    server.stall(None);
    // The next write waits for it, so it does not release `k1 = a`.
    store.set(vec![item(None, "k3", "c")]).await.expect("set");
    let release = server.current("application").expect("a release");
    assert_eq!(
        release.configurations.get("k1").map(String::as_str),
        Some("old")
    );
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_release_answered_with_a_server_error_is_not_undone() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 2000).await;
    let store = &started.store;

    // A proxy answers 502 after the portal released.
    server.answer_releases_with(Some(502));
    let set = store.set(vec![item(None, "k1", "new")]).await;
    server.answer_releases_with(None);
    match set {
        Err(ConfigError::Backend(message)) => assert!(
            message.contains("502")
                && message.contains("whether namespace `application` was released is unknown")
                && !message.contains("undone"),
            "{message}"
        ),
        other => panic!("expected a backend error, got {other:?}"),
    }
    // Not reverted in the draft (the next release would publish `old`
    // over the release that went through), and read back.
    assert_eq!(
        draft_values(&server, "application"),
        vec![("k1".to_string(), "new".to_string())]
    );
    assert_eq!(value_of(store, "k1").await.as_deref(), Some("new"));
    started.store.close().await.unwrap();
}

/// Builds and initialises the `apollo` store from `metadata` as the
/// runtime would, in the handover area `handover` (a runtime's: the
/// instance a metadata change builds shares it with the old one).
async fn start_in(metadata: Value, handover: &Handover) -> Started {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry.get("config_store", "apollo").expect("registered");
    let metadata = Metadata::from(metadata.as_object().cloned().unwrap_or_default());
    let mut built = (descriptor.build)(&metadata).expect("build");
    let mut cx = InitContext::new(
        ComponentKey::new("config_store", "apollo"),
        "runtime-app",
        metadata,
    );
    cx.handover = handover.clone();
    cx.ready_timeout = Duration::from_secs(5);
    let shutdown = cx.shutdown.clone();
    built.init(&cx).await.expect("init");
    match built.into_instance() {
        Instance::ConfigStore(store) => Started { store, shutdown },
        other => panic!("expected a config store, got {other:?}"),
    }
}

#[tokio::test]
async fn a_rebuilt_store_waits_for_the_write_of_the_one_it_replaces() {
    let server = ApolloServer::start().await;
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("k1", "old")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let handover = Handover::new();
    let settings = with(
        writable(&server, dir.path(), TOKEN),
        json!({"requestTimeoutMs": 5000}),
    );
    let old = start_in(settings.clone(), &handover).await;

    // The old instance's release is made, its answer late.
    server.stall(Some(Stall::ReleaseAfter));
    let first = old.store.clone();
    let a = tokio::spawn(async move { first.set(vec![item(None, "k1", "a")]).await });
    until_stalled(&server).await;
    // A metadata change rebuilds the store meanwhile: the new instance's
    // write waits for the old one's (before, it edited at once, its edit
    // in the draft while the old write could still undo or release).
    let rebuilt = start_in(with(settings, json!({"open_api_user": "bob"})), &handover).await;
    let second = rebuilt.store.clone();
    let mut b = tokio::spawn(async move { second.set(vec![item(None, "k2", "b")]).await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut b).await;
    let draft = draft_values(&server, "application");
    server.stall(None);
    assert!(early.is_err(), "{early:?}");
    assert!(
        !draft.iter().any(|(key, _)| key == "k2"),
        "edited while the old instance's write ran: {draft:?}"
    );
    a.await.unwrap().expect("the old instance's set");
    b.await.unwrap().expect("the new instance's set");
    old.store.close().await.unwrap();
    rebuilt.store.close().await.unwrap();
}

#[tokio::test]
async fn close_waits_for_the_write_in_flight() {
    let server = ApolloServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let started = racing_store(&server, dir.path(), 5000).await;

    server.stall(Some(Stall::ReleaseAfter));
    let store = started.store.clone();
    let set = tokio::spawn(async move { store.set(vec![item(None, "k1", "a")]).await });
    until_stalled(&server).await;
    // Shutting down: close waits for the write (before, it returned at
    // once and the process ended with the write cut short).
    let closing = started.store.clone();
    let mut close = tokio::spawn(async move { closing.close().await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut close).await;
    server.stall(None);
    assert!(early.is_err(), "closed with a write in flight: {early:?}");
    let closed = tokio::time::timeout(Duration::from_secs(5), close).await;
    assert!(matches!(closed, Ok(Ok(Ok(())))), "{closed:?}");
    set.await.unwrap().expect("set");
}

#[tokio::test]
async fn reading_back_is_bounded_by_one_request_timeout_in_all() {
    let server = ApolloServer::start().await;
    let replicas = [server.replica().await, server.replica().await];
    server.accept_open_api_token(TOKEN);
    server.release("application", &[("k1", "old")]);
    server.create_namespace("shared");
    let dir = tempfile::tempdir().unwrap();
    let servers: Vec<String> = std::iter::once(server.url())
        .chain(replicas.iter().map(ApolloServer::url))
        .collect();
    let settings = with(
        writable(&server, dir.path(), TOKEN),
        json!({"config_server": servers.join(","), "requestTimeoutMs": 500}),
    );
    let started = start(settings).await.expect("start");

    // Every config service hangs: the read-back gives up after 500 ms in
    // all (before, 500 ms per instance, in the write's turn).
    server.set_fault(Route::Configs, Some(Fault::Hang));
    let began = tokio::time::Instant::now();
    let set = started.store.set(vec![item(None, "k1", "new")]).await;
    let took = began.elapsed();
    server.set_fault(Route::Configs, None);
    set.expect("set");
    assert!(took < Duration::from_millis(1_200), "{took:?}");
    assert_eq!(
        draft_values(&server, "application"),
        vec![("k1".to_string(), "new".to_string())]
    );
    started.store.close().await.unwrap();
}
