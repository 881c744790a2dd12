//! The `apollo` store's periodic refresh sends the release messages the
//! long poll last brought, as every fetch does (as Apollo's Java client
//! does): a config service whose release cache lags reloads it instead of
//! answering the release before the one served. A release the refresh
//! finds just before the poll announces it is no sign of a service whose
//! notification ids are below ours, and is not warned about as one.

use crate::support::apollo_server;

use std::time::Duration;

use apollo_server::harness::{
    eventually, expect_change, logs, metadata, start, subscribe, value_of, with, PATIENCE,
};
use apollo_server::{ApolloServer, Fault, Route};
use rewire_runtime::ConfigQuery;
use serde_json::{json, Value};

/// The notification id a fetch's `messages` name for `application`.
fn announced_id(messages: Option<&str>) -> Option<i64> {
    let messages: Value = serde_json::from_str(messages?).ok()?;
    messages
        .get("details")?
        .get(format!("{}+default+application", apollo_server::APP_ID))?
        .as_i64()
}

#[tokio::test]
async fn the_periodic_refresh_sends_the_last_messages_so_a_lagging_cache_cannot_roll_back() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"refreshIntervalMs": 1_000}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    let mut all = subscribe(store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");

    // The config service's release cache lags one release behind from now
    // on: it answers the latest only to a request whose messages name it.
    server.set_stale_release_cache(true);
    let latest = server.release("application", &[("k", "v2")]);
    expect_change(&mut all, "k", "v2").await;
    let latest_id = server.current("application").unwrap().notification_id;

    let asked = server.config_requests("application").len();
    eventually("two periodic fetches", || {
        server.config_requests("application").len() >= asked + 2
    })
    .await;
    for request in &server.config_requests("application")[asked..] {
        assert_eq!(request.release_key.as_deref(), Some(latest.as_str()));
        assert_eq!(
            announced_id(request.messages.as_deref()),
            Some(latest_id),
            "a periodic fetch without the last messages: {request:?}"
        );
    }
    assert!(
        all.changes.try_recv().is_err(),
        "the periodic refresh rolled the release back"
    );
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v2"));
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_release_the_periodic_refresh_finds_before_the_poll_announces_it_is_not_warned_about() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.set_hold(Duration::from_millis(300));
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"refreshIntervalMs": 1_000}),
    );
    let started = start(meta).await.expect("start");
    let store = &started.store;
    let mut all = subscribe(store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await, "no poll held");

    // The next poll is kept waiting (a slow instance or proxy) while the
    // periodic refresh finds the release.
    server.set_fault(Route::Notifications, Some(Fault::Hang));
    let polls = server.requests(Route::Notifications);
    eventually("a poll kept waiting", || {
        server.requests(Route::Notifications) > polls
    })
    .await;
    server.release("application", &[("k", "v2")]);
    expect_change(&mut all, "k", "v2").await;

    // The poll comes back announcing it, at an id above the one held.
    let polls = server.requests(Route::Notifications);
    server.set_fault(Route::Notifications, None);
    eventually("polls held again", || {
        server.requests(Route::Notifications) > polls + 1 && server.outstanding_polls() > 0
    })
    .await;
    let wrong = logs::lines()
        .into_iter()
        .filter(|line| line.contains(&server.url()) && line.contains("never announced"))
        .collect::<Vec<_>>();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(value_of(store, "k").await.as_deref(), Some("v2"));

    // Releases are followed by the poll as before.
    server.release("application", &[("k", "v3")]);
    expect_change(&mut all, "k", "v3").await;
    started.store.close().await.unwrap();
}
