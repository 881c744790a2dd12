//! The `etcd` config store against an etcd with authentication on: the
//! right user and password read, write and watch; a wrong password or none
//! fails init with an error that names the fields to check and never holds
//! the password.

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, values_of, EtcdServer};
use rewire_runtime::{ConfigItem, ConfigQuery, Instance};
use serde_json::json;
use tokio::time::timeout;

const ROOT_PASSWORD: &str = "s3cret-root-pw";
const PATIENCE: Duration = Duration::from_secs(10);

async fn server_with_auth() -> EtcdServer {
    let mut server = EtcdServer::start().await;
    server.enable_auth(ROOT_PASSWORD).await;
    server
}

#[tokio::test]
async fn the_right_password_reads_writes_and_watches() {
    let server = server_with_auth().await;
    server.put("/auth/k", "1").await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/auth/",
        "username": "root", "password": ROOT_PASSWORD, "dialTimeout": "2s"
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let items = store.get(&ConfigQuery::keys(["k"])).await.expect("get");
    assert_eq!(values_of(&items, "k"), vec!["1"]);
    let mut sub = store
        .subscribe(ConfigQuery::default())
        .await
        .expect("subscribe");
    store
        .set(vec![ConfigItem {
            key: "k".into(),
            value: "2".into(),
            ..ConfigItem::default()
        }])
        .await
        .expect("set");
    let items = items_until(&mut sub, "k=2", PATIENCE, |items| !items.is_empty()).await;
    assert_eq!(values_of(&items, "k"), vec!["2"]);
    assert_eq!(server.value("/auth/k").await.as_deref(), Some("2"));
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_wrong_or_missing_password_fails_init_without_revealing_it() {
    let server = server_with_auth().await;
    let wrong = "wrong-pw-123";
    let start = |metadata| async move {
        timeout(PATIENCE, common::start("config_store", "etcd", metadata))
            .await
            .expect("init hung")
            .map(drop)
            .expect_err("expected init to fail")
    };
    let err = start(json!({
        "endpoints": server.endpoint(), "username": "root", "password": wrong, "dialTimeout": "2s"
    }))
    .await;
    assert!(err.contains(&server.endpoint()), "{err}");
    assert!(err.contains("`username` and `password`"), "{err}");
    assert!(!err.contains(wrong), "{err}");

    let err = start(json!({"endpoints": server.endpoint(), "dialTimeout": "2s"})).await;
    assert!(err.contains(&server.endpoint()), "{err}");
    assert!(err.contains("requires authentication"), "{err}");
}

/// etcd's simple tokens live in the member's memory: after a restart the
/// watch is re-created with a token the server no longer knows, and etcd
/// cancels it in the stream ("invalid auth token"; "permission denied" in
/// older versions) instead of failing the call. The client logs in again
/// (without sending the dead token, which would fail the login too) and the
/// change made after the restart arrives.
#[tokio::test]
async fn the_watch_logs_in_again_after_etcd_restarts() {
    let mut server = server_with_auth().await;
    server.put("/relogin/k", "1").await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/relogin/",
        "username": "root", "password": ROOT_PASSWORD,
        "dialTimeout": "1s", "watchRetryMs": 100
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .expect("subscribe");
    server.put("/relogin/k", "2").await;
    let items = items_until(&mut sub, "k=2", PATIENCE, |items| !items.is_empty()).await;
    assert_eq!(values_of(&items, "k"), vec!["2"]);

    server.restart_gracefully().await;
    server.put("/relogin/k", "3").await;
    let items = items_until(&mut sub, "k=3 after the restart", PATIENCE, |items| {
        values_of(items, "k").contains(&"3".to_string())
    })
    .await;
    assert_eq!(values_of(&items, "k"), vec!["3"]);
    // Reads made with the store's client log in again too.
    let items = store.get(&ConfigQuery::keys(["k"])).await.expect("get");
    assert_eq!(values_of(&items, "k"), vec!["3"]);
    store.close().await.expect("close");
}
