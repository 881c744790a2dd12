//! The user stories rewire started from, end to end with real servers:
//!
//! 1. An operator releases a new Redis host (the disaster-recovery server)
//!    in Apollo; the Redis state store moves its traffic there, in place,
//!    while requests keep flowing: none fails, and every acknowledged write
//!    is on a server.
//! 2. A weak Redis password is rotated in the secret store; the component
//!    picks it up without a restart and without a failed request. A wrong
//!    new password is refused and the old connection keeps serving.
//!
//! The same story with etcd as the config store:
//! `components/tests/components/story_etcd_failover.rs`.

use crate::support::story_load;
use crate::support::triggers;
use testkit::apollo as apollo_server;
use testkit::redis as redis_server;

use std::time::Duration;

use apollo_server::ApolloServer;
use redis_server::RedisServer;
use rewire::config::{parse, validate};
use rewire::{
    Action, ComponentKey, Outcome, Registry, Runtime, RuntimeOptions, SetRequest, Trigger,
};
use story_load::{lost_writes, start_load};
use triggers::{applied_after, eventually, records_of};

const OLD_PASSWORD: &str = "weak-pass-1";
const NEW_PASSWORD: &str = "strong-pass-7f3a9c";

fn write_secret(dir: &std::path::Path, password: &str) {
    let temp = dir.join("secrets.json.tmp");
    std::fs::write(
        &temp,
        format!(r#"{{"redis": {{"password": "{password}"}}}}"#),
    )
    .unwrap();
    std::fs::rename(&temp, dir.join("secrets.json")).unwrap();
}

async fn keys_on(server: &RedisServer) -> usize {
    let mut connection = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("checkout||t*")
        .query_async(&mut connection)
        .await
        .unwrap_or_default();
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dr_switch_in_apollo_and_password_rotation_without_a_failed_request() {
    let primary = RedisServer::start_with_password(OLD_PASSWORD).await;
    let dr = RedisServer::start_with_password(OLD_PASSWORD).await;
    let apollo = ApolloServer::start().await;
    apollo.release(
        "application",
        &[("orders.redisHost", primary.addr().as_str())],
    );
    let dir = tempfile::tempdir().unwrap();
    write_secret(dir.path(), OLD_PASSWORD);
    let config = serde_json::json!({
        "appId": "checkout",
        "components": {
            "secret_store": {"local": {"type": "local.file", "metadata": {"secretsFile": dir.path().join("secrets.json"), "multiValued": true}}},
            "config_store": {"apollo": {"type": "apollo", "metadata": {
                "config_server": apollo.url(), "app_id": "checkout", "namespace_name": "application",
                "is_backup_config": false, "retryIntervalMs": 100}}},
            "state": {"orders": {"type": "redis", "metadata": {"dialTimeout": "1s"},
                "configurationRef": [{"store": "apollo", "key": "orders.redisHost", "injectAs": "redisHost", "watch": true}],
                "secretRef": [{"store": "local", "name": "redis", "key": "password", "injectAs": "redisPassword", "watch": true}]}}
        }
    });
    let valid = validate(
        parse(config.to_string().as_bytes()).unwrap(),
        &Registry::collected(),
    )
    .unwrap();
    let options = RuntimeOptions {
        secret_poll_interval: Duration::from_millis(100),
        ..RuntimeOptions::default()
    };
    let runtime = Runtime::start(valid, Registry::collected(), options)
        .await
        .unwrap();
    let orders = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();

    // Story 1: the DR switch, released in Apollo.
    let load = start_load(runtime.state_store("orders"), 4, "t");
    tokio::time::sleep(Duration::from_millis(300)).await;
    apollo.release("application", &[("orders.redisHost", dr.addr().as_str())]);
    let switch = applied_after(&runtime, Trigger::WatchedRef, 0).await;
    assert_eq!(
        switch.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{switch:?}"
    );
    let before = keys_on(&dr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        keys_on(&dr).await > before,
        "writes did not move to the DR server"
    );

    // Story 2: rotate the password: the server learns the new one (its
    // open connections stay authenticated), then the secret store.
    let mut admin = dr.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(NEW_PASSWORD)
        .query_async(&mut admin)
        .await
        .unwrap();
    write_secret(dir.path(), NEW_PASSWORD);
    let rotation = applied_after(&runtime, Trigger::WatchedRef, 1).await;
    assert_eq!(
        rotation.actions.get("state/orders"),
        Some(&Action::UpdatedInPlace),
        "{rotation:?}"
    );

    // A wrong new password: refused, the reload rolls back, traffic goes on.
    write_secret(dir.path(), "not-the-password-0000");
    let refused = eventually(Duration::from_secs(10), || {
        records_of(&runtime, Trigger::WatchedRef)
            .into_iter()
            .find(|r| r.outcome == Outcome::RolledBack)
    })
    .await
    .unwrap_or_else(|| panic!("a wrong password was not refused: {:#?}", runtime.history()));
    assert!(
        refused
            .error
            .as_deref()
            .is_some_and(|e| e.contains("state/orders")),
        "{refused:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = load.finish().await;
    assert!(
        seen.acked.len() > 100,
        "too little traffic to prove anything: {}",
        seen.acked.len()
    );
    assert!(
        seen.failed.is_empty(),
        "failed requests during the switch and the rotations: {:?}",
        seen.failed
    );
    assert!(
        seen.missed <= 4,
        "{} read-backs missed: more than one per task at the switch",
        seen.missed
    );
    // Stored as Dapr's `{appId}||{key}`.
    let stored: Vec<(String, String)> = seen
        .acked
        .iter()
        .map(|(key, value)| (format!("checkout||{key}"), value.clone()))
        .collect();
    let lost = lost_writes(
        &stored,
        &[primary.client(), dr.client_with_password(NEW_PASSWORD)],
    )
    .await;
    assert!(
        lost.is_empty(),
        "acknowledged writes on neither server: {lost:?}"
    );
    assert_eq!(
        runtime.generation().number,
        3,
        "the refused password left the generation as it was"
    );

    // The component reconnects with the new password: drop every client
    // connection on the server; the next request re-authenticates.
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    let store = runtime.state_store("orders");
    let mut reconnected = false;
    for _ in 0..50 {
        let set = SetRequest {
            key: "after-rotation".into(),
            value: b"1".to_vec(),
            ..SetRequest::default()
        };
        let current = store.load().unwrap();
        if current.set(set).await.is_ok() {
            reconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reconnected,
        "no request succeeded with the rotated password"
    );

    // The same instance served throughout: every change was in place.
    let now = runtime
        .generation()
        .get(&ComponentKey::new("state", "orders"))
        .cloned();
    assert!(matches!((orders, now), (Some(a), Some(b)) if a.same_as(&b)));
    let status = serde_json::to_string(&runtime.status().await).unwrap_or_default();
    assert!(
        !status.contains(OLD_PASSWORD) && !status.contains(NEW_PASSWORD),
        "a password reached the status"
    );
    runtime.shutdown().await;
}
