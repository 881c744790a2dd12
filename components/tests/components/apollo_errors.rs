//! The `apollo` config store rides out a failing config service: 500s and
//! hung requests are retried with exponential backoff and the store
//! recovers when the server heals; malformed JSON and oversized answers
//! are logged and the last good configuration kept. At init, a failing service without backup ends
//! in an error naming the server once the readiness timeout is spent.

use crate::support::apollo_server;

use std::time::Duration;

use apollo_server::harness::{
    eventually, expect_change, logs, metadata, start, start_within, subscribe, value_of, with,
    PATIENCE,
};
use apollo_server::{ApolloServer, Fault, Route};
use rewire_components::apollo::MAX_ANSWER_BYTES;
use rewire_runtime::ConfigQuery;
use serde_json::json;

fn config_service_requests(server: &ApolloServer) -> u64 {
    server.requests(Route::Configs) + server.requests(Route::Notifications)
}

#[tokio::test]
async fn server_errors_back_off_and_recover_when_the_server_heals() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await);

    server.set_fault(Route::Configs, Some(Fault::ServerError));
    server.set_fault(Route::Notifications, Some(Fault::ServerError));
    let before = config_service_requests(&server);
    // Wakes the held poll; the fetch it calls for gets a 500, and so do
    // the retries (their schedule, 50 ms doubling up to 400 ms, is proven
    // on a paused clock by `apollo::poller::tests`).
    server.release("application", &[("k", "v2")]);
    eventually("the failing service is asked again", || {
        config_service_requests(&server) >= before + 3
    })
    .await;
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    assert!(sub.changes.try_recv().is_err());
    assert!(
        logs::any(&[
            "WARN",
            "500",
            "keeping the last good configuration",
            "retry_in_ms=50"
        ]),
        "{:#?}",
        logs::lines()
    );

    server.set_fault(Route::Configs, None);
    server.set_fault(Route::Notifications, None);
    expect_change(&mut sub, "k", "v2").await;
    eventually("recovery is logged", || logs::any(&["reachable again"])).await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn malformed_json_is_logged_and_the_last_good_configuration_kept() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await);

    server.set_fault(Route::Configs, Some(Fault::MalformedJson));
    let fetches = server.requests(Route::Configs);
    server.release("application", &[("k", "v2")]);
    // The notification is kept until its fetch succeeds, so it is retried.
    eventually("the malformed fetch is retried", || {
        server.requests(Route::Configs) >= fetches + 2
    })
    .await;
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    assert!(
        sub.changes.try_recv().is_err(),
        "a malformed answer was published"
    );
    assert!(
        logs::any(&["malformed JSON", "/configs/checkout/default/application"]),
        "{:#?}",
        logs::lines()
    );
    let backup = std::fs::read_to_string(dir.path().join("checkout+default+application.json"))
        .unwrap_or_default();
    assert!(backup.contains("v1") && !backup.contains("v2"), "{backup}");

    // A malformed long-poll answer is survived the same way.
    server.set_fault(Route::Notifications, Some(Fault::MalformedJson));
    server.set_fault(Route::Configs, None);
    let polls = server.requests(Route::Notifications);
    eventually("the malformed poll is retried", || {
        server.requests(Route::Notifications) >= polls + 2
    })
    .await;
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));

    server.set_fault(Route::Notifications, None);
    expect_change(&mut sub, "k", "v2").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn an_oversized_answer_is_not_read_and_the_last_good_configuration_kept() {
    logs::capture();
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let started = start(metadata(&server.url(), dir.path()))
        .await
        .expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;
    assert!(server.wait_for_held_poll(PATIENCE).await);

    let oversized = Fault::Oversized(MAX_ANSWER_BYTES + 1);
    server.set_fault(Route::Configs, Some(oversized));
    let fetches = server.requests(Route::Configs);
    server.release("application", &[("k", "v2")]);
    eventually("the oversized fetch is retried", || {
        server.requests(Route::Configs) >= fetches + 2
    })
    .await;
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    assert!(
        sub.changes.try_recv().is_err(),
        "an oversized answer was published"
    );
    assert!(
        logs::any(&[
            "WARN",
            &server.url(),
            "(config_server) answered more than 16 MiB on /configs/checkout/default/application; not read",
        ]),
        "{:#?}",
        logs::lines()
    );

    // An oversized long-poll answer is survived the same way.
    server.set_fault(Route::Notifications, Some(oversized));
    server.set_fault(Route::Configs, None);
    let polls = server.requests(Route::Notifications);
    eventually("the oversized poll is retried", || {
        server.requests(Route::Notifications) >= polls + 2
    })
    .await;
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    assert!(
        logs::any(&["answered more than 16 MiB on /notifications/v2"]),
        "{:#?}",
        logs::lines()
    );

    server.set_fault(Route::Notifications, None);
    expect_change(&mut sub, "k", "v2").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn a_hung_long_poll_times_out_and_is_retried() {
    let server = ApolloServer::start().await;
    server.set_hold(Duration::from_millis(100));
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    let meta = with(
        metadata(&server.url(), dir.path()),
        json!({"longPollTimeoutMs": 300}),
    );
    let started = start(meta).await.expect("start");
    let mut sub = subscribe(&started.store, ConfigQuery::default()).await;

    server.set_fault(Route::Notifications, Some(Fault::Hang));
    let polls = server.requests(Route::Notifications);
    eventually("hung polls time out and are retried", || {
        server.requests(Route::Notifications) >= polls + 3
    })
    .await;
    server.release("application", &[("k", "v2")]);
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    server.set_fault(Route::Notifications, None);
    expect_change(&mut sub, "k", "v2").await;
    started.store.close().await.unwrap();
}

#[tokio::test]
async fn init_gives_up_on_a_failing_service_after_the_readiness_timeout() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    server.set_fault(Route::Configs, Some(Fault::ServerError));
    let dir = tempfile::tempdir().unwrap();
    let err = start_within(
        metadata(&server.url(), dir.path()),
        Duration::from_millis(600),
    )
    .await
    .err()
    .unwrap_or_default();
    assert!(err.contains(&server.url()) && err.contains("500"), "{err}");
    assert!(
        err.contains("within") && err.contains("no backup cache"),
        "{err}"
    );
    assert!(server.requests(Route::Configs) >= 3, "init did not retry");

    // Healed before the readiness timeout: init succeeds.
    let healing = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.set_fault(Route::Configs, None);
    };
    let (started, ()) = tokio::join!(
        start_within(metadata(&server.url(), dir.path()), PATIENCE),
        healing
    );
    let started = started.expect("start");
    assert_eq!(value_of(&started.store, "k").await.as_deref(), Some("v1"));
    started.store.close().await.unwrap();
}

/// `refreshIntervalMs` fetches every namespace at each interval: 0 (meant,
/// perhaps, as "off") would ask the config service non-stop, so it is
/// refused naming the field, before anything is asked.
#[tokio::test]
async fn a_refresh_interval_below_a_second_is_refused_naming_the_field() {
    let server = ApolloServer::start().await;
    server.release("application", &[("k", "v1")]);
    let dir = tempfile::tempdir().unwrap();
    for below in [0, 999] {
        let declared = with(
            metadata(&server.url(), dir.path()),
            json!({"refreshIntervalMs": below}),
        );
        let err = start_within(declared, PATIENCE)
            .await
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("`refreshIntervalMs`") && err.contains(&format!("{below} is below")),
            "{err}"
        );
    }
    assert_eq!(server.requests(Route::Configs), 0, "asked before refusing");
    let declared = with(
        metadata(&server.url(), dir.path()),
        json!({"refreshIntervalMs": 1_000}),
    );
    let started = start_within(declared, PATIENCE).await.expect("start");
    started.store.close().await.unwrap();
}
