//! The `etcd` config store's reads and writes against a real etcd: the key
//! mapping `{keyPrefix}[{group}/]{key}[@{label}]` both ways, listings by
//! prefix, versions (`mod_revision`), put and delete (each call one
//! transaction: all or nothing), rejected keys; plus
//! registration, init errors and readiness.

use crate::common;
use crate::support::etcd_server;

use std::sync::Arc;
use std::time::Duration;

use etcd_server::{free_port, EtcdServer};
use rewire_runtime::{
    ConfigError, ConfigItem, ConfigQuery, ConfigStore, Instance, Readiness, Registry,
};
use serde_json::json;
use tokio::time::{sleep, timeout, Instant};

/// Bound on anything that could hang if the store misbehaves.
const HANG_GUARD: Duration = Duration::from_secs(15);

async fn store(server: &EtcdServer, prefix: &str) -> Arc<dyn ConfigStore> {
    let metadata =
        json!({"endpoints": server.endpoint(), "keyPrefix": prefix, "dialTimeout": "2s"});
    match common::start("config_store", "etcd", metadata).await {
        Ok(Instance::ConfigStore(store)) => store,
        Ok(other) => panic!("expected a config store, got {other:?}"),
        Err(err) => panic!("start: {err}"),
    }
}

fn query(group: Option<&str>, keys: &[&str], label: Option<&str>) -> ConfigQuery {
    ConfigQuery {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        group: group.map(Into::into),
        label: label.map(Into::into),
        ..ConfigQuery::default()
    }
}

fn item(group: Option<&str>, key: &str, label: Option<&str>, value: &str) -> ConfigItem {
    ConfigItem {
        key: key.into(),
        value: value.into(),
        group: group.map(Into::into),
        label: label.map(Into::into),
        ..ConfigItem::default()
    }
}

/// `(group, key, label, value)` of each item, sorted.
fn names(items: &[ConfigItem]) -> Vec<(Option<String>, String, Option<String>, String)> {
    let mut names: Vec<_> = items
        .iter()
        .map(|i| {
            (
                i.group.clone(),
                i.key.clone(),
                i.label.clone(),
                i.value.clone(),
            )
        })
        .collect();
    names.sort();
    names
}

fn name(
    group: Option<&str>,
    key: &str,
    label: Option<&str>,
    value: &str,
) -> (Option<String>, String, Option<String>, String) {
    (
        group.map(Into::into),
        key.into(),
        label.map(Into::into),
        value.into(),
    )
}

async fn get(store: &dyn ConfigStore, q: ConfigQuery) -> Vec<ConfigItem> {
    store
        .get(&q)
        .await
        .unwrap_or_else(|e| panic!("get {q:?}: {e}"))
}

#[test]
fn registered_with_a_valid_example() {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry
        .get("config_store", "etcd")
        .expect("config_store/etcd is not registered");
    assert!(descriptor
        .description
        .contains("{keyPrefix}[{group}/]{key}[@{label}]"));
    let example: serde_json::Value =
        serde_json::from_str(descriptor.example_metadata).expect("example");
    common::build("config_store", "etcd", example).expect("build");
}

#[tokio::test]
async fn reads_keys_groups_labels_and_listings_with_mod_revisions() {
    let server = EtcdServer::start().await;
    let rev_a = server.put("/app/a", "1").await;
    server.put("/app/db/host", "h").await;
    let rev_host_prod = server.put("/app/db/host@prod", "hp").await;
    server.put("/app/b@prod", "bp").await;
    server.put("/app/db/x/y", "deep").await;
    server.put("/app/g/", "not an item").await;
    server.put("/other/a", "outside").await;
    server.put("top/x", "t").await;
    let store = store(&server, "/app/").await;

    let items = get(&*store, query(None, &["a", "missing"], None)).await;
    assert_eq!(names(&items), vec![name(None, "a", None, "1")]);
    assert_eq!(items[0].version, rev_a.to_string());

    let items = get(&*store, query(Some("db"), &["host"], Some("prod"))).await;
    assert_eq!(
        names(&items),
        vec![name(Some("db"), "host", Some("prod"), "hp")]
    );
    assert_eq!(items[0].version, rev_host_prod.to_string());
    let items = get(&*store, query(Some("db"), &["host", "x/y"], None)).await;
    assert_eq!(
        names(&items),
        vec![
            name(Some("db"), "host", None, "h"),
            name(Some("db"), "x/y", None, "deep")
        ]
    );

    let everything = get(&*store, query(None, &[], None)).await;
    assert_eq!(
        names(&everything),
        vec![
            name(None, "a", None, "1"),
            name(None, "b", Some("prod"), "bp"),
            name(Some("db"), "host", None, "h"),
            name(Some("db"), "host", Some("prod"), "hp"),
            name(Some("db"), "x/y", None, "deep"),
        ]
    );
    let group = get(&*store, query(Some("db"), &[], None)).await;
    assert_eq!(group.len(), 3, "{group:?}");
    let labelled = get(&*store, query(None, &[], Some("prod"))).await;
    assert_eq!(
        names(&labelled),
        vec![
            name(None, "b", Some("prod"), "bp"),
            name(Some("db"), "host", Some("prod"), "hp")
        ]
    );
    // An empty group or label is no group or label.
    let items = get(&*store, query(Some(""), &["a"], Some(""))).await;
    assert_eq!(names(&items), vec![name(None, "a", None, "1")]);

    // Without a prefix, every key of the server is in reach (those with a
    // leading `/` have an empty group, so they are not items).
    let whole = self::store(&server, "").await;
    let items = get(&*whole, query(None, &[], None)).await;
    assert_eq!(names(&items), vec![name(Some("top"), "x", None, "t")]);
    whole.close().await.expect("close");
    store.close().await.expect("close");
}

#[tokio::test]
async fn writes_and_deletes_at_the_mapped_paths() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/w/").await;
    store
        .set(vec![
            item(None, "plain", None, "1"),
            item(Some("grp"), "k", None, "2"),
            item(Some("grp"), "k", Some("dev"), "3"),
            item(None, "solo", Some("dev"), "4"),
        ])
        .await
        .expect("set");
    assert_eq!(server.value("/w/plain").await.as_deref(), Some("1"));
    assert_eq!(server.value("/w/grp/k").await.as_deref(), Some("2"));
    assert_eq!(server.value("/w/grp/k@dev").await.as_deref(), Some("3"));
    assert_eq!(server.value("/w/solo@dev").await.as_deref(), Some("4"));

    let before = get(&*store, query(None, &["plain"], None)).await;
    store
        .set(vec![item(None, "plain", None, "5")])
        .await
        .expect("set");
    let after = get(&*store, query(None, &["plain"], None)).await;
    let version = |items: &[ConfigItem]| items[0].version.parse::<i64>().unwrap_or_default();
    assert!(
        version(&after) > version(&before),
        "{before:?} then {after:?}"
    );
    assert_eq!(after[0].value, "5");

    store
        .delete(&query(Some("grp"), &["k"], Some("dev")))
        .await
        .expect("delete");
    assert_eq!(server.value("/w/grp/k@dev").await, None);
    assert_eq!(server.value("/w/grp/k").await.as_deref(), Some("2"));
    store
        .delete(&query(None, &["plain", "never-there"], None))
        .await
        .expect("delete");
    assert_eq!(server.value("/w/plain").await, None);
    assert!(get(&*store, query(None, &["plain"], None)).await.is_empty());
    store.close().await.expect("close");
}

/// A `set` is one transaction: when etcd refuses one value (over its
/// 1.5 MiB request limit), the other items are neither written nor
/// published, and the caller gets the error.
#[tokio::test]
async fn a_set_etcd_refuses_in_part_writes_and_publishes_nothing() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/atomic/").await;
    let mut changes = store
        .subscribe(query(None, &[], None))
        .await
        .expect("subscribe");
    let too_large = "x".repeat(2 << 20);
    let refused = store
        .set(vec![
            item(None, "a", None, "1"),
            item(None, "b", None, &too_large),
        ])
        .await;
    assert!(
        matches!(&refused, Err(ConfigError::Invalid(why)) if why.contains("1.5 MiB")),
        "{refused:?}"
    );
    assert!(get(&*store, query(None, &["a"], None)).await.is_empty());
    assert_eq!(server.value("/atomic/a").await, None);

    // A later write is the first change published.
    store
        .set(vec![item(None, "fence", None, "f")])
        .await
        .expect("set");
    let change = timeout(HANG_GUARD, changes.changes.recv())
        .await
        .expect("no change published")
        .expect("subscription open");
    assert_eq!(
        names(&change.items),
        vec![name(None, "fence", None, "f")],
        "published before the fence"
    );
    store.close().await.expect("close");
}

/// A set of two 1 MiB values, each under etcd's 1.5 MiB request limit
/// but over it together (one transaction), is an invalid request naming
/// the bytes and the limit, to split — not a backend failure.
#[tokio::test]
async fn a_set_over_etcds_request_limit_is_invalid_naming_the_limit() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/big/").await;
    let mebibyte = "x".repeat(1 << 20);
    let refused = store
        .set(vec![
            item(None, "a", None, &mebibyte),
            item(None, "b", None, &mebibyte),
        ])
        .await;
    match refused {
        Err(ConfigError::Invalid(message)) => {
            for part in [
                "2097164 bytes",
                "--max-request-bytes",
                "1.5 MiB",
                "split it",
            ] {
                assert!(message.contains(part), "{part}: {message}");
            }
        }
        other => panic!("expected an invalid request naming the limit, got {other:?}"),
    }
    assert_eq!(server.value("/big/a").await, None);
    // Item by item, each fits.
    for key in ["a", "b"] {
        store
            .set(vec![item(None, key, None, &mebibyte)])
            .await
            .expect("set of one 1 MiB value");
    }
    store.close().await.expect("close");
}

/// More keys than etcd takes in one transaction are refused, naming the
/// limit, and nothing is written or deleted.
#[tokio::test]
async fn writes_of_more_keys_than_one_transaction_takes_are_refused_whole() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/many/").await;
    store
        .set(vec![item(None, "k0", None, "kept")])
        .await
        .expect("set");
    let keys: Vec<String> = (0..129).map(|i| format!("k{i}")).collect();
    let items = keys.iter().map(|k| item(None, k, None, "new")).collect();
    let invalid = |result: Result<(), ConfigError>| match result {
        Err(ConfigError::Invalid(message)) => {
            assert!(
                message.contains("129") && message.contains("128"),
                "{message}"
            )
        }
        other => panic!("expected a refusal naming the limit, got {other:?}"),
    };
    invalid(store.set(items).await);
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    invalid(store.delete(&query(None, &key_refs, None)).await);
    assert_eq!(server.value("/many/k0").await.as_deref(), Some("kept"));
    assert_eq!(server.value("/many/k1").await, None);
    store.close().await.expect("close");
}

#[tokio::test]
async fn keys_that_cannot_read_back_are_rejected() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/r/").await;
    let invalid = |result: Result<(), ConfigError>, what: &str| match result {
        Err(ConfigError::Invalid(message)) => assert!(message.contains(what), "{message}"),
        other => panic!("expected an invalid request about `{what}`, got {other:?}"),
    };
    invalid(
        store.set(vec![item(None, "a/b", None, "x")]).await,
        "pass the part before the first `/` as `group`",
    );
    invalid(store.set(vec![item(None, "a@b", None, "x")]).await, "label");
    invalid(
        store.set(vec![item(Some("g/h"), "k", None, "x")]).await,
        "group `g/h`",
    );
    invalid(
        store.get(&query(None, &[], Some("x/y"))).await.map(drop),
        "label `x/y`",
    );
    invalid(
        store.delete(&query(None, &[], None)).await,
        "delete needs keys",
    );
    invalid(
        store.subscribe(query(None, &["k@x"], None)).await.map(drop),
        "`@`",
    );
    assert_eq!(server.value("/r/a/b").await, None);
    store.close().await.expect("close");
}

/// An empty key names no item (as in Dapr: a key the store does not
/// find): `?key=&key=a` reads `a`, `?key=` reads nothing (not every
/// item), a subscription to it hears nothing, a delete of it deletes
/// nothing.
#[tokio::test]
async fn an_empty_key_matches_nothing() {
    let server = EtcdServer::start().await;
    let store = store(&server, "/empty/").await;
    store
        .set(vec![item(None, "a", None, "1")])
        .await
        .expect("set");
    let items = get(&*store, query(None, &["", "a"], None)).await;
    assert_eq!(names(&items), vec![name(None, "a", None, "1")]);
    assert!(get(&*store, query(None, &[""], None)).await.is_empty());
    assert!(get(&*store, query(Some("g"), &[""], Some("l")))
        .await
        .is_empty());
    store
        .delete(&query(None, &[""], None))
        .await
        .expect("delete of an empty key");
    let mut empty = store
        .subscribe(query(None, &[""], None))
        .await
        .expect("subscribe to an empty key");
    let mut fence = store
        .subscribe(query(None, &["fence"], None))
        .await
        .expect("subscribe");
    store
        .set(vec![
            item(None, "b", None, "2"),
            item(None, "fence", None, "f"),
        ])
        .await
        .expect("set");
    timeout(HANG_GUARD, fence.changes.recv())
        .await
        .expect("no change published")
        .expect("subscription open");
    // Published to every subscriber together: `empty` heard nothing.
    let heard = empty.changes.try_recv();
    assert!(heard.is_err(), "an empty key heard {heard:?}");
    assert_eq!(server.value("/empty/a").await.as_deref(), Some("1"));
    store.close().await.expect("close");
}

/// Init against an endpoint that refuses connections fails on the refusal
/// (not cut by a time limit); against one that takes connections and
/// never answers, it is cut by `dialTimeout`, which it names. Both
/// errors name the endpoints and never the password.
#[tokio::test]
async fn init_fails_naming_the_endpoints_when_nobody_answers() {
    let init = async |endpoint: &str| {
        let result = timeout(
            HANG_GUARD,
            common::start(
                "config_store",
                "etcd",
                json!({"endpoints": endpoint, "dialTimeout": "300ms", "username": "u", "password": "hunter2"}),
            ),
        )
        .await
        .expect("init hung");
        let err = result.map(drop).expect_err("expected init to fail");
        assert!(err.contains(endpoint), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        err
    };
    let refused = format!("127.0.0.1:{}", free_port());
    let err = init(&refused).await;
    assert!(!err.contains("no answer within"), "{err}");

    // Accepts connections (the kernel does) but never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent = listener.local_addr().expect("address").to_string();
    let err = init(&silent).await;
    assert!(
        err.contains("no answer within 300ms (`dialTimeout`)"),
        "{err}"
    );

    let err = common::build("config_store", "etcd", json!({"endpoints": "h:nope"}))
        .map(drop)
        .expect_err("expected a metadata error");
    assert!(err.contains("endpoints"), "{err}");
}

#[tokio::test]
async fn readiness_is_degraded_while_the_server_is_down() {
    let mut server = EtcdServer::start().await;
    let store = store(&server, "/ready/").await;
    assert_eq!(store.readiness().await, Readiness::Ready);
    server.stop();
    let readiness = timeout(HANG_GUARD, store.readiness())
        .await
        .expect("readiness hung");
    match &readiness {
        Readiness::Degraded(reason) => {
            assert!(
                reason.contains(&format!("etcd at {}", server.endpoint()))
                    && reason.contains("last values"),
                "{reason}"
            )
        }
        other => panic!("{other:?} with the server down"),
    }
    server.start_again().await;
    let deadline = Instant::now() + HANG_GUARD;
    while store.readiness().await != Readiness::Ready {
        assert!(
            Instant::now() < deadline,
            "not ready again after the restart"
        );
        sleep(Duration::from_millis(100)).await;
    }
    store.close().await.expect("close");
}
