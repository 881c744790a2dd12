//! The `apollo` config store backs every namespace up to disk; a new
//! instance that cannot reach the config service starts from that backup,
//! reports Degraded while it does (it serves, so the runtime starts), and becomes Ready with the server's
//! current release when the server is back on the same address. Without a
//! backup, init fails naming the config server. The backup files are the
//! process user's alone, and a folder other users may write is not served.

use crate::support::apollo_server;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use apollo_server::harness::{
    eventually, expect_change, logs, metadata, start, start_within, subscribe, value_of, with,
    PATIENCE,
};
use apollo_server::ApolloServer;
use rewire_runtime::{ConfigQuery, ConfigStore, Readiness};
use serde_json::{json, Value};

fn backup(dir: &Path, namespace: &str) -> Value {
    let path = dir.join(format!("checkout+default+{namespace}.json"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

async fn wait_ready(store: &Arc<dyn ConfigStore>) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match store.readiness().await {
            Readiness::Ready => return,
            Readiness::NotReady(reason) | Readiness::Degraded(reason) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still not ready: {reason}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_new_instance_starts_from_the_backup_and_recovers_when_the_server_returns() {
    let server = ApolloServer::start().await;
    let first_key = server.release("application", &[("k", "v1")]);
    server.release("common", &[("c", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"namespace_name": "application,common"}),
    );

    let first = start(meta.clone()).await.expect("start");
    first.store.close().await.unwrap();
    let written = backup(dir.path(), "application");
    assert_eq!(written["releaseKey"], json!(first_key));
    assert_eq!(written["configurations"], json!({"k": "v1"}));
    assert_eq!(written["namespaceName"], json!("application"));
    let files = std::fs::read_dir(dir.path())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(files, 2, "one file per namespace, no temporary file left");

    let stopped = server.stop().await;
    let second = start(meta).await.expect("start from backup");
    let store = &second.store;
    match store.readiness().await {
        Readiness::Degraded(reason) => assert!(reason.contains("backup"), "{reason}"),
        other => panic!("serving the backup must be degraded, got {other:?}"),
    }
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    assert_eq!(value_of(store, "c").await.as_deref(), Some("1"));
    let mut sub = subscribe(store, ConfigQuery::default()).await;

    // Released while this client could not see the server.
    let second_key = stopped.release("application", &[("k", "v2")]);
    let server = stopped.restart().await;
    expect_change(&mut sub, "k", "v2").await;
    wait_ready(store).await;
    // Written by the store's backup writer, off the fetch.
    eventually("the new release backed up", || {
        backup(dir.path(), "application")["releaseKey"] == json!(second_key)
    })
    .await;

    // And it follows releases again.
    assert!(server.wait_for_held_poll(PATIENCE).await);
    server.release("application", &[("k", "v3")]);
    expect_change(&mut sub, "k", "v3").await;
    second.store.close().await.unwrap();
}

#[cfg(unix)]
#[tokio::test]
async fn a_backup_folder_other_users_may_write_is_not_served() {
    use std::os::unix::fs::PermissionsExt;
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("password", "hunter2")]);
    let dir = tempfile::tempdir().unwrap();
    let cached = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    cached.store.close().await.unwrap();
    let file = dir.path().join("checkout+default+application.json");
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode(&file),
        0o600,
        "the backup is readable by its user only"
    );
    let stopped = server.stop().await;

    // The folder is shared (as `/tmp` is): anyone could have planted the
    // file. It is not served.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = start_within(
        metadata(&stopped.url(), dir.path()),
        Duration::from_millis(500),
    )
    .await
    .err()
    .unwrap_or_default();
    assert!(
        err.contains("backup not served") && err.contains("writable by other users"),
        "{err}"
    );
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    assert!(
        logs::any(&[
            "WARN",
            "Apollo backup cache unusable",
            "writable by other users"
        ]),
        "{:#?}",
        logs::lines()
    );

    // The user's own again: served.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let second = start(metadata(&stopped.url(), dir.path()))
        .await
        .expect("start from backup");
    assert_eq!(
        value_of(&second.store, "password").await.as_deref(),
        Some("hunter2")
    );
    second.store.close().await.unwrap();
}

#[tokio::test]
async fn without_a_backup_init_fails_naming_the_config_server() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let cached = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    cached.store.close().await.unwrap();
    let stopped = server.stop().await;

    let empty = tempfile::tempdir().unwrap();
    let err = start_within(
        metadata(&stopped.url(), empty.path()),
        Duration::from_millis(500),
    )
    .await
    .err()
    .unwrap_or_default();
    assert!(
        err.contains(&stopped.url()) && err.contains("config_server"),
        "{err}"
    );
    assert!(err.contains("no backup cache"), "{err}");

    // A backup exists, but the store is told not to use one.
    let off = with(
        metadata(&stopped.url(), dir.path()),
        json!({"is_backup_config": false}),
    );
    let err = start_within(off, Duration::from_millis(500))
        .await
        .err()
        .unwrap_or_default();
    assert!(
        err.contains(&stopped.url()) && err.contains("is_backup_config"),
        "{err}"
    );
}

#[tokio::test]
async fn a_service_that_never_answers_starts_many_namespaces_from_the_backup_in_time() {
    use apollo_server::{Fault, Route};
    let server = ApolloServer::start().await;
    let namespaces: Vec<String> = (0..7).map(|n| format!("ns{n}")).collect();
    for (n, namespace) in namespaces.iter().enumerate() {
        server.release(namespace, &[("k", &format!("v{n}"))]);
    }
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"namespace_name": namespaces.join(",")}),
    );
    let first = start(meta.clone()).await.expect("start");
    first.store.close().await.unwrap();

    // Connections accepted, never answered; the request timeout as
    // shipped (5 s per namespace and instance).
    server.set_fault(Route::Configs, Some(Fault::Hang));
    let meta = with(meta, json!({"requestTimeoutMs": 5_000}));
    let ready_timeout = Duration::from_secs(10);
    let began = tokio::time::Instant::now();
    let second = start_within(meta, ready_timeout)
        .await
        .expect("start from backup");
    let took = began.elapsed();
    assert!(
        took < ready_timeout + Duration::from_secs(1),
        "started in {took:?}: the first load outlasted the readiness timeout"
    );
    match second.store.readiness().await {
        Readiness::Degraded(reason) => assert!(reason.contains("backup"), "{reason}"),
        other => panic!("serving the backup must be degraded, got {other:?}"),
    }
    assert_eq!(value_of(&second.store, "k").await.as_deref(), Some("v0"));
    second.store.close().await.unwrap();
    server.set_fault(Route::Configs, None);
}

/// A backup write that fails once (the file's name taken by a directory:
/// the rename fails, even as root) is not left stale: the store reports
/// the backup behind, and once the name is free again the file is written
/// with the release served, without a new release.
#[tokio::test]
async fn a_failed_backup_write_is_written_again_once_the_folder_recovers() {
    let server = ApolloServer::start().await;
    server.set_hold(Duration::from_millis(300));
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let store = &started.store;
    let file = dir.path().join("checkout+default+application.json");
    eventually("the first release backed up", || file.is_file()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await);

    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let mut sub = subscribe(store, ConfigQuery::default()).await;
    let second_key = server.release("application", &[("k", "v2")]);
    expect_change(&mut sub, "k", "v2").await;
    let mut reason = String::new();
    for _ in 0..500 {
        if let Readiness::Degraded(why) = store.readiness().await {
            reason = why;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reason.starts_with("backup cache behind"), "{reason:?}");
    assert!(reason.contains("cannot replace"), "{reason}");

    std::fs::remove_dir(&file).unwrap();
    eventually("the served release backed up", || {
        std::fs::read_to_string(&file).is_ok_and(|text| text.contains(&second_key))
    })
    .await;
    assert_eq!(
        backup(dir.path(), "application")["configurations"],
        json!({"k": "v2"})
    );
    wait_ready(store).await;
    started.store.close().await.unwrap();
}
