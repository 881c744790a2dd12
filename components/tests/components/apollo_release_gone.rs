//! A namespace whose release is gone from the config service (deleted in
//! the portal, or an instance that lost it) answers 404: the `apollo`
//! store keeps serving its last release, as Apollo's Java client does, and
//! keeps its backup; the long poll goes on for the other namespaces; a
//! later release is taken as usual. (A namespace that never had a release
//! is served empty: `apollo_fetch`.)

use crate::support::apollo_server;

use std::time::Duration;

use apollo_server::harness::{
    eventually, expect_change, logs, metadata, start, subscribe, value_of, with, PATIENCE,
};
use apollo_server::{ApolloServer, Route};
use rewire_runtime::{ConfigQuery, Readiness};
use serde_json::json;

/// The warning a 404 for a namespace with a release is logged with.
const GONE_WARNING: &str = "HTTP 404 though it had a release";

fn warnings_for(server: &str) -> usize {
    logs::lines()
        .iter()
        .filter(|line| line.contains(server) && line.contains(GONE_WARNING))
        .count()
}

#[tokio::test]
async fn a_404_after_a_release_keeps_it_and_its_backup_and_the_other_namespaces_are_followed() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    server.release("common", &[("c", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        // A stalled poll would show: its backoff grows to 30 s.
        json!({"namespace_name": "application,common", "maxRetryIntervalMs": 30_000, "refreshIntervalMs": 1_000}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    let file = dir.path().join("checkout+default+application.json");
    eventually("the release backed up", || file.is_file()).await;
    let backed_up = std::fs::read_to_string(&file).unwrap();
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");
    let mut all = subscribe(store, ConfigQuery::default()).await;

    let asked = server.config_requests("application").len();
    server.delete_namespace("application");
    eventually("the deleted namespace is fetched (404)", || {
        server.config_requests("application").len() > asked
    })
    .await;
    eventually("the 404 is warned about", || {
        warnings_for(&server.url()) > 0
    })
    .await;
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    assert!(
        all.changes.try_recv().is_err(),
        "a removal was published for the kept release"
    );
    match store.readiness().await {
        Readiness::Degraded(reason) => {
            assert!(reason.contains("`application`"), "{reason}");
            assert!(reason.contains("HTTP 404"), "{reason}");
        }
        other => panic!("the missing release is not reported: {other:?}"),
    }

    // The deletion's notification id was taken: the next poll is held, not
    // answered at once again and again.
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");
    let polls = server.requests(Route::Notifications);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let more = server.requests(Route::Notifications) - polls;
    assert!(more <= 1, "{more} polls in 1 s: the poll spins");

    // The other namespace is followed at once.
    server.release("common", &[("c", "2")]);
    expect_change(&mut all, "c", "2").await;

    // The periodic refresh meets the 404 again: no second warning, the
    // backup not written over.
    let asked = server.config_requests("application").len();
    eventually("the periodic refresh asks again", || {
        server.config_requests("application").len() >= asked + 2
    })
    .await;
    assert_eq!(warnings_for(&server.url()), 1, "warned once per namespace");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), backed_up);
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));

    // Released again: taken as usual, and ready again.
    server.release("application", &[("k", "v2")]);
    expect_change(&mut all, "k", "v2").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while store.readiness().await != Readiness::Ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready again once the namespace has a release"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.store.close().await.unwrap();
}

/// A store that starts from its backup (the service unreachable) and then
/// meets a 404 for a namespace whose backup holds a release keeps serving
/// that release and its file, and says why in its readiness (no longer
/// "config service unreachable").
#[tokio::test]
async fn a_404_after_starting_from_the_backup_keeps_the_backed_up_release() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = metadata(&server.url(), dir.path());
    let first = start(meta.clone()).await.expect("start");
    first.store.close().await.unwrap();
    let file = dir.path().join("checkout+default+application.json");
    let backed_up = std::fs::read_to_string(&file).unwrap();

    let stopped = server.stop().await;
    let second = start(meta).await.expect("start from the backup");
    let store = &second.store;
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    stopped.delete_namespace("application");
    let server = stopped.restart().await;
    eventually("the namespace is asked for again", || {
        !server.config_requests("application").is_empty()
    })
    .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match store.readiness().await {
            Readiness::Degraded(reason) if reason.contains("HTTP 404") => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "the 404 is not reported: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), backed_up);
    second.store.close().await.unwrap();
}

/// A store started (or rebuilt by a metadata change) while a namespace
/// answers 404 holds no release of it yet: it serves the backup's release
/// (as the Java client falls back to its local file), says why in its
/// readiness, and leaves the file as it is — before, it served the
/// namespace empty and wrote the empty answer over the backup.
#[tokio::test]
async fn a_store_started_during_a_404_serves_the_backed_up_release_and_keeps_the_file() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = metadata(&server.url(), dir.path());
    let first = start(meta.clone()).await.expect("start");
    let file = dir.path().join("checkout+default+application.json");
    eventually("the release backed up", || file.is_file()).await;
    first.store.close().await.unwrap();
    let backed_up = std::fs::read(&file).unwrap();

    server.delete_namespace("application");
    let second = start(meta).await.expect("start during the 404");
    let store = &second.store;
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v1"));
    match store.readiness().await {
        Readiness::Degraded(reason) => {
            assert!(reason.contains("`application`"), "{reason}");
            assert!(reason.contains("HTTP 404"), "{reason}");
        }
        other => panic!("the missing release is not reported: {other:?}"),
    }
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");
    second.store.close().await.unwrap();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        backed_up,
        "backup written over"
    );
    let warned = logs::lines()
        .iter()
        .filter(|line| line.contains(&server.url()) && line.contains("HTTP 404 before any release"))
        .count();
    assert_eq!(warned, 1, "warned once");
}
