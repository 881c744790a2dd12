//! The `file` config store follows its file however it is replaced: plain
//! writes, editors' rename-writes, Kubernetes ConfigMap symlink swaps; it
//! keeps the last good content through invalid writes, and stops watching
//! when closed.

use std::path::Path;
use std::time::Duration;

use rewire_components::file_config::{FileConfigMetadata, FileConfigStore};
use rewire_runtime::{
    Component, ComponentKey, ConfigError, ConfigItem, ConfigQuery, ConfigStore, ConfigSubscription,
    InitContext, Metadata,
};
use tokio_util::sync::CancellationToken;

/// How long a change may take to arrive before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

fn context(shutdown: CancellationToken) -> InitContext {
    let mut cx = InitContext::new(
        ComponentKey::new("config_store", "file"),
        "test",
        Metadata::default(),
    );
    cx.shutdown = shutdown;
    cx.ready_timeout = Duration::from_secs(5);
    cx
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A store on `path` relying on change events only (no periodic re-read),
/// so these tests prove the watcher sees each kind of replacement.
async fn started(path: &Path) -> FileConfigStore {
    let mut settings = FileConfigMetadata::new(path);
    settings.poll_interval_ms = 0;
    let mut store = FileConfigStore::new(settings);
    store
        .init(&context(CancellationToken::new()))
        .await
        .expect("init");
    store
}

async fn subscribe_all(store: &FileConfigStore) -> ConfigSubscription {
    store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe")
}

/// Waits (bounded) for a published change that sets `key` to `value`.
async fn expect_change(sub: &mut ConfigSubscription, key: &str, value: &str) -> Vec<ConfigItem> {
    let wait = async {
        while let Some(change) = sub.changes.recv().await {
            if change
                .items
                .iter()
                .any(|i| i.key == key && i.value == value)
            {
                return change.items;
            }
        }
        panic!("subscription closed before `{key}` became `{value}`");
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no change setting `{key}` to `{value}` within {PATIENCE:?}"))
}

async fn value_of(store: &FileConfigStore, key: &str) -> Option<String> {
    let items = store.get(&ConfigQuery::keys([key])).await.expect("get");
    items.into_iter().next().map(|i| i.value)
}

#[tokio::test]
async fn a_plain_write_is_published_with_removed_keys_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"greeting": "hello", "old": "x", "n": 1}"#);
    let store = started(&path).await;
    assert_eq!(value_of(&store, "n").await.as_deref(), Some("1"));
    let mut sub = subscribe_all(&store).await;

    write(&path, r#"{"greeting": "bonjour", "n": 1}"#);
    let items = expect_change(&mut sub, "greeting", "bonjour").await;
    let removed: Vec<_> = items
        .iter()
        .filter(|i| i.key == "old")
        .map(|i| i.value.as_str())
        .collect();
    assert_eq!(removed, vec![""]);
    assert!(
        items.iter().all(|i| i.key != "n"),
        "unchanged key published: {items:?}"
    );
    assert_eq!(value_of(&store, "old").await, None);
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_rename_write_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"k": "1"}"#);
    let store = started(&path).await;
    let mut sub = subscribe_all(&store).await;
    for version in 2..=3 {
        let temp = dir.path().join(".config.json.tmp");
        write(&temp, &format!(r#"{{"k": "{version}"}}"#));
        std::fs::rename(&temp, &path).expect("rename");
        expect_change(&mut sub, "k", &version.to_string()).await;
    }
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("3"));
}

#[cfg(unix)]
#[tokio::test]
async fn a_kubernetes_configmap_symlink_swap_is_picked_up() {
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let publish = |version: &str, value: &str| {
        let data_dir = root.join(version);
        std::fs::create_dir(&data_dir).expect("mkdir");
        write(
            &data_dir.join("config.json"),
            &format!(r#"{{"k": "{value}"}}"#),
        );
        let temp_link = root.join("..data_tmp");
        symlink(version, &temp_link).expect("symlink");
        std::fs::rename(&temp_link, root.join("..data")).expect("swap ..data");
    };
    publish("..2026_v1", "1");
    symlink("..data/config.json", root.join("config.json")).expect("symlink");
    let store = started(&root.join("config.json")).await;
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("1"));
    let mut sub = subscribe_all(&store).await;

    publish("..2026_v2", "2");
    std::fs::remove_dir_all(root.join("..2026_v1")).unwrap();
    expect_change(&mut sub, "k", "2").await;

    publish("..2026_v3", "3");
    expect_change(&mut sub, "k", "3").await;
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("3"));
}

#[tokio::test]
async fn an_invalid_write_keeps_the_last_good_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"k": "good"}"#);
    let store = started(&path).await;
    let mut sub = subscribe_all(&store).await;
    write(&path, r#"{"k": "half-writ"#);
    write(&dir.path().join("config.json.marker"), "");
    // The broken content is never served; the next good one is.
    write(&path, r#"{"k": "better"}"#);
    let items = expect_change(&mut sub, "k", "better").await;
    assert_eq!(items.len(), 1);
    assert!(
        sub.changes.try_recv().is_err(),
        "the broken content was published"
    );
}

#[tokio::test]
async fn init_errors_name_the_file_and_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.json");
    let mut store = FileConfigStore::new(FileConfigMetadata::new(&missing));
    let err = store
        .init(&context(CancellationToken::new()))
        .await
        .map(|_| ())
        .expect_err("expected an error");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    let malformed = dir.path().join("bad.json");
    write(&malformed, "{\n  \"a\": 1,,\n}");
    let mut store = FileConfigStore::new(FileConfigMetadata::new(&malformed));
    let err = store
        .init(&context(CancellationToken::new()))
        .await
        .map(|_| ())
        .expect_err("expected an error");
    let text = err.to_string();
    assert!(
        text.contains("bad.json") && text.contains("line 2, column"),
        "{text}"
    );
}

#[tokio::test]
async fn it_is_read_only_and_has_no_groups_or_labels() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"k": "v"}"#);
    let store = started(&path).await;
    let set = store.set(vec![ConfigItem::default()]).await;
    assert!(matches!(set, Err(ConfigError::Unsupported(_))), "{set:?}");
    let delete = store.delete(&ConfigQuery::keys(["k"])).await;
    assert!(
        matches!(delete, Err(ConfigError::Unsupported(_))),
        "{delete:?}"
    );
    let grouped = ConfigQuery {
        group: Some("payments".into()),
        ..ConfigQuery::default()
    };
    match store.get(&grouped).await {
        Err(ConfigError::Invalid(message)) => assert!(message.contains("payments"), "{message}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    let labelled = ConfigQuery {
        label: Some("prod".into()),
        ..ConfigQuery::default()
    };
    assert!(
        matches!(store.subscribe(labelled).await, Err(ConfigError::Invalid(m)) if m.contains("prod"))
    );
}

#[tokio::test]
async fn periodic_resync_and_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"k": "1"}"#);
    let mut settings = FileConfigMetadata::new(&path);
    settings.poll_interval_ms = 50;
    let mut store = FileConfigStore::new(settings);
    let shutdown = CancellationToken::new();
    store.init(&context(shutdown.clone())).await.unwrap();
    let mut sub = subscribe_all(&store).await;
    write(&path, r#"{"k": "2"}"#);
    expect_change(&mut sub, "k", "2").await;

    // Once the runtime's shutdown token fires, nothing is re-read (the
    // 50 ms re-read would otherwise see the change within the wait).
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    write(&path, r#"{"k": "3"}"#);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sub.changes.try_recv().is_err());
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("2"));
    store.close().await.unwrap();
}

#[tokio::test]
async fn close_stops_the_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, r#"{"k": "1"}"#);
    let store = started(&path).await;
    let mut sub = subscribe_all(&store).await;
    store.close().await.unwrap();
    write(&path, r#"{"k": "2"}"#);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sub.changes.try_recv().is_err());
    assert_eq!(value_of(&store, "k").await.as_deref(), Some("1"));
}
