//! The `etcd` config store against an etcd with authentication on: the
//! right user and password read, write and watch; a wrong password or none
//! fails init with an error that names the fields to check and never holds
//! the password.

use crate::common;
use crate::support::etcd_server;

use std::time::Duration;

use etcd_server::{items_until, values_of, EtcdServer};
use rewire_runtime::{ConfigItem, ConfigQuery, Instance, Readiness};
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

/// The `Authenticate` requests etcd has answered, whatever the outcome.
async fn logins(server: &EtcdServer) -> u64 {
    let text = etcd_server::metrics(server).await;
    text.lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total{")
                && line.contains("grpc_method=\"Authenticate\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Runs 64 reads on clones of `client` at once; all must succeed.
async fn read_concurrently(client: &rewire_etcd::Client) {
    let mut reads = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let client = client.clone();
        reads.spawn(async move { client.get("/herd/k").await.map(drop) });
    }
    while let Some(read) = reads.join_next().await {
        read.expect("read task").expect("read");
    }
}

/// Once authentication is turned off and on again etcd no longer knows the
/// tokens it issued (as after a restart): the calls refused together for
/// theirs ("invalid auth token") log in once, not once each (a bcrypt check
/// and a raft proposal per login: a herd of them could slow the member past
/// the time limit, and the calls fail over).
#[tokio::test]
async fn calls_refused_together_for_their_token_log_in_once() {
    let server = server_with_auth().await;
    let options = rewire_etcd::ConnectOptions {
        user: Some(("root".into(), ROOT_PASSWORD.into())),
        ..rewire_etcd::ConnectOptions::default()
    };
    let client = rewire_etcd::Client::connect(&[server.url()], options)
        .await
        .expect("connect");
    read_concurrently(&client).await;
    server
        .client()
        .await
        .auth_disable()
        .await
        .expect("auth disable");
    // Without a token: etcd refuses one while authentication is off.
    let anonymous = rewire_etcd::ConnectOptions::default();
    rewire_etcd::Client::connect(&[server.url()], anonymous)
        .await
        .expect("connect")
        .auth_enable()
        .await
        .expect("auth enable");
    let before = logins(&server).await;
    read_concurrently(&client).await;
    let made = logins(&server).await - before;
    assert!(
        (1..=2).contains(&made),
        "64 calls refused together made {made} logins"
    );
}

/// The options of a client logging in as root.
fn as_root() -> rewire_etcd::ConnectOptions {
    rewire_etcd::ConnectOptions {
        user: Some(("root".into(), ROOT_PASSWORD.into())),
        ..rewire_etcd::ConnectOptions::default()
    }
}

/// A user configured for an etcd with authentication off (etcd refuses
/// the login: "authentication is not enabled") is no error: the client
/// carries on without a token, as etcd's Go client does.
#[tokio::test]
async fn a_user_against_etcd_without_auth_connects_and_reads() {
    let server = EtcdServer::start().await;
    server.put("/k", "1").await;
    let client = rewire_etcd::Client::connect(&[server.url()], as_root())
        .await
        .expect("connect");
    let read = client.get("/k").await.expect("get");
    assert_eq!(read.kvs[0].value, b"1");
}

/// Authentication turned off under a logged-in client: etcd 3.4 refuses
/// its old token ("invalid auth token") and its login; the call runs again
/// without a token. Turned on again, the call refused for having no token
/// ("user name is empty") logs in.
#[tokio::test]
async fn calls_go_on_when_authentication_is_turned_off_and_on() {
    let server = server_with_auth().await;
    server.put("/k", "1").await;
    let client = rewire_etcd::Client::connect(&[server.url()], as_root())
        .await
        .expect("connect");
    client.get("/k").await.expect("get with auth on");
    server
        .client()
        .await
        .auth_disable()
        .await
        .expect("auth disable");
    let read = client.get("/k").await.expect("get with auth off");
    assert_eq!(read.kvs[0].value, b"1");
    client.put("/k", "2").await.expect("put with auth off");
    let anonymous = rewire_etcd::ConnectOptions::default();
    rewire_etcd::Client::connect(&[server.url()], anonymous)
        .await
        .expect("connect")
        .auth_enable()
        .await
        .expect("auth enable");
    let read = client.get("/k").await.expect("get with auth on again");
    assert_eq!(read.kvs[0].value, b"2");
}

/// The Watch streams etcd has opened since it started.
async fn watches(server: &EtcdServer) -> u64 {
    let text = etcd_server::metrics(server).await;
    text.lines()
        .filter(|line| {
            line.starts_with("grpc_server_started_total{") && line.contains("grpc_method=\"Watch\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

const LIMITED_PASSWORD: &str = "limited-pw-42";

/// The store's user loses the role covering its `keyPrefix`; etcd
/// restarts (forgetting its tokens), so the watch is made again: etcd
/// cancels it for the token ("invalid auth token") and the client logs in,
/// then cancels each retry with "permission denied" — what older etcd
/// releases say for a token they no longer know as well. Refused with the
/// token it just logged in for, the client logs in no more: a login is a
/// bcrypt check and a raft proposal in etcd, and the watch is retried for
/// as long as the store runs. Readiness names the refusal, never the
/// password.
#[tokio::test]
async fn a_watch_its_roles_refuse_logs_in_once_not_at_every_retry() {
    let mut server = server_with_auth().await;
    let root = server.client().await;
    root.role_add("denied-reader").await.expect("role add");
    root.role_grant_prefix("denied-reader", "/denied/")
        .await
        .expect("grant");
    root.user_add("limited", LIMITED_PASSWORD)
        .await
        .expect("user add");
    root.user_grant_role("limited", "denied-reader")
        .await
        .expect("grant role");
    server.put("/denied/k", "1").await;
    let metadata = json!({
        "endpoints": server.endpoint(), "keyPrefix": "/denied/",
        "username": "limited", "password": LIMITED_PASSWORD,
        "dialTimeout": "1s", "watchRetryMs": 10
    });
    let store = match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        other => panic!("start: {other:?}"),
    };
    let mut sub = store
        .subscribe(ConfigQuery::keys(["k"]))
        .await
        .expect("subscribe");
    server.put("/denied/k", "2").await;
    items_until(&mut sub, "k=2", PATIENCE, |items| !items.is_empty()).await;

    root.user_revoke_role("limited", "denied-reader")
        .await
        .expect("revoke role");
    // The watch is made again, first with a token etcd no longer knows.
    server.restart_gracefully().await;
    let (logins_before, watches_before) = (logins(&server).await, watches(&server).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while watches(&server).await < watches_before + 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch was not retried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let made = logins(&server).await - logins_before;
    assert!(made <= 1, "4 refused watches made {made} logins");
    // Reads of the prefix need the same permission: not ready, saying why.
    match store.readiness().await {
        Readiness::NotReady(reason) | Readiness::Degraded(reason) => {
            assert!(reason.contains("permission denied"), "{reason}");
            assert!(!reason.contains(LIMITED_PASSWORD), "{reason}");
        }
        Readiness::Ready => panic!("ready while every watch is refused"),
    }
    store.close().await.expect("close");
}
