//! The `redis` state store against a real `redis-server`, built through the
//! registry: Dapr's data layout, etags, first-write, TTL, bulk operations
//! and deletes.

use crate::common;
use testkit::redis as redis_server;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::state_requests::{delete, write};
use redis_server::RedisServer;
use rewire_runtime::{
    Concurrency, GetRequest, Instance, SetRequest, StateError, StateStore, TransactionOperation,
    TransactionRequest,
};
use serde_json::{json, Value};

async fn store(metadata: Value) -> Arc<dyn StateStore> {
    match common::start("state", "redis", metadata).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

async fn started() -> (RedisServer, Arc<dyn StateStore>) {
    let server = RedisServer::start().await;
    let store = store(json!({"redisHost": server.addr()})).await;
    (server, store)
}

async fn read(store: &dyn StateStore, key: &str) -> Option<(String, String)> {
    let req = GetRequest {
        key: key.into(),
        ..GetRequest::default()
    };
    let entry = store
        .get(req)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))?;
    Some((
        String::from_utf8_lossy(&entry.data).into_owned(),
        entry.etag,
    ))
}

async fn put(store: &dyn StateStore, req: SetRequest) {
    let key = req.key.clone();
    store
        .set(req)
        .await
        .unwrap_or_else(|e| panic!("set {key}: {e}"));
}

#[tokio::test]
async fn set_get_and_the_dapr_layout() {
    let (server, store) = started().await;
    assert_eq!(read(&*store, "order").await, None);
    put(&*store, write("order", "v1", None)).await;
    assert_eq!(
        read(&*store, "order").await,
        Some(("v1".into(), "1".into()))
    );
    put(&*store, write("order", "v2", None)).await;
    assert_eq!(
        read(&*store, "order").await,
        Some(("v2".into(), "2".into()))
    );
    // The key is a hash with `data` and `version`, as Dapr writes it,
    // under Dapr's `{appId}||{key}` (the test app is `test`).
    let mut raw = server.connection().await;
    let hash: HashMap<String, String> = redis::cmd("HGETALL")
        .arg("test||order")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        hash,
        HashMap::from([
            ("data".to_string(), "v2".to_string()),
            ("version".to_string(), "2".to_string())
        ])
    );
    assert!(
        matches!(
            store.set(write("", "v", None)).await,
            Err(StateError::Invalid(_))
        ),
        "an empty key is invalid"
    );
}

#[tokio::test]
async fn etags_guard_writes() {
    let (_server, store) = started().await;
    put(&*store, write("order", "v1", None)).await;
    let (_, etag1) = read(&*store, "order").await.unwrap_or_default();
    put(&*store, write("order", "a", Some(&etag1))).await;
    assert_eq!(
        store.set(write("order", "b", Some(&etag1))).await,
        Err(StateError::EtagMismatch("order".into()))
    );
    let (value, etag2) = read(&*store, "order").await.unwrap_or_default();
    assert_eq!(value, "a");
    assert_ne!(etag1, etag2);
    assert_eq!(
        store.set(write("order", "c", Some("not-a-number"))).await,
        Err(StateError::EtagInvalid("order".into()))
    );
    // An etag on a missing key cannot match.
    assert_eq!(
        store.set(write("missing", "x", Some("1"))).await,
        Err(StateError::EtagMismatch("missing".into()))
    );
    // Last-write without an etag always wins.
    put(&*store, write("order", "last", None)).await;
    assert_eq!(
        read(&*store, "order").await.map(|(v, _)| v).as_deref(),
        Some("last")
    );
}

#[tokio::test]
async fn first_write_wins() {
    let (_server, store) = started().await;
    let mut first = write("seat", "alice", None);
    first.concurrency = Concurrency::FirstWrite;
    let mut second = write("seat", "bob", None);
    second.concurrency = Concurrency::FirstWrite;
    put(&*store, first).await;
    assert_eq!(
        store.set(second).await,
        Err(StateError::EtagMismatch("seat".into()))
    );
    let (value, etag) = read(&*store, "seat").await.unwrap_or_default();
    assert_eq!(value, "alice");
    // First-write with the current etag is an update.
    let mut update = write("seat", "carol", Some(&etag));
    update.concurrency = Concurrency::FirstWrite;
    put(&*store, update).await;
    assert_eq!(
        read(&*store, "seat").await.map(|(v, _)| v).as_deref(),
        Some("carol")
    );
}

#[tokio::test]
async fn entries_expire_after_their_ttl() {
    let (server, store) = started().await;
    let mut short = write("session", "s", None);
    short.ttl = Some(Duration::from_secs(1));
    put(&*store, short).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while read(&*store, "session").await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "`session` never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // ttlInSeconds = -1 removes an earlier TTL.
    let mut expiring = write("token", "t", None);
    expiring
        .metadata
        .insert("ttlInSeconds".into(), "3600".into());
    put(&*store, expiring).await;
    let mut raw = server.connection().await;
    let ttl: i64 = redis::cmd("TTL")
        .arg("test||token")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(ttl > 3500, "TTL {ttl}");
    let mut persist = write("token", "t2", None);
    persist.metadata.insert("ttlInSeconds".into(), "-1".into());
    put(&*store, persist).await;
    let ttl: i64 = redis::cmd("TTL")
        .arg("test||token")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "the TTL was not removed");
    assert_eq!(
        read(&*store, "token").await.map(|(v, _)| v).as_deref(),
        Some("t2")
    );
    let mut bad = write("token", "t3", None);
    bad.metadata.insert("ttlInSeconds".into(), "soon".into());
    assert!(matches!(store.set(bad).await, Err(StateError::Invalid(_))));
}

#[tokio::test]
async fn store_wide_ttl_and_key_prefix() {
    let server = RedisServer::start().await;
    let store = store(json!({
        "redisHost": server.addr(), "keyPrefix": "app", "ttlInSeconds": "60"
    }))
    .await;
    put(&*store, write("k", "v", None)).await;
    let mut raw = server.connection().await;
    let ttl: i64 = redis::cmd("TTL")
        .arg("app||k")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!((1..=60).contains(&ttl), "TTL {ttl}");
    assert_eq!(
        read(&*store, "k").await.map(|(v, _)| v).as_deref(),
        Some("v")
    );
}

#[tokio::test]
async fn bulk_get_and_set() {
    let (_server, store) = started().await;
    let writes = (0..5)
        .map(|i| write(&format!("k{i}"), &i.to_string(), None))
        .collect();
    store.bulk_set(writes).await.unwrap();
    let keys = vec!["k0".to_string(), "k4".to_string(), "nope".to_string()];
    let items = store.bulk_get(keys).await.unwrap();
    let found: Vec<_> = items
        .iter()
        .map(|i| {
            (
                i.key.as_str(),
                i.entry.as_ref().map(|e| (e.data.clone(), e.etag.clone())),
                i.error.clone(),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            ("k0", Some((b"0".to_vec(), "1".to_string())), None),
            ("k4", Some((b"4".to_vec(), "1".to_string())), None),
            ("nope", None, None)
        ]
    );
    // Bulk writes keep per-key semantics, and a stale etag does not stop
    // the rest (as Dapr's bulk write): the batch answers the mismatch.
    let batch = vec![
        write("k0", "new", Some("1")),
        write("k1", "stale", Some("9")),
        write("k2", "after", None),
    ];
    assert_eq!(
        store.bulk_set(batch).await,
        Err(StateError::EtagMismatch("k1".into()))
    );
    assert_eq!(
        read(&*store, "k0").await.map(|(v, _)| v).as_deref(),
        Some("new")
    );
    assert_eq!(
        read(&*store, "k1").await.map(|(v, _)| v).as_deref(),
        Some("1")
    );
    assert_eq!(
        read(&*store, "k2").await.map(|(v, _)| v).as_deref(),
        Some("after")
    );
    assert!(store.bulk_get(Vec::new()).await.is_ok_and(|i| i.is_empty()));
}

#[tokio::test]
async fn deletes_check_the_etag() {
    let (_server, store) = started().await;
    put(&*store, write("order", "v", None)).await;
    let (_, etag) = read(&*store, "order").await.unwrap_or_default();
    assert_eq!(
        store.delete(delete("order", Some("999"))).await,
        Err(StateError::EtagMismatch("order".into()))
    );
    assert_eq!(
        store.delete(delete("order", Some("x"))).await,
        Err(StateError::EtagInvalid("order".into()))
    );
    assert!(read(&*store, "order").await.is_some());
    assert_eq!(store.delete(delete("order", Some(&etag))).await, Ok(()));
    assert_eq!(read(&*store, "order").await, None);
    // A missing key: fine with or without an etag (deleted already).
    assert_eq!(store.delete(delete("order", None)).await, Ok(()));
    assert_eq!(store.delete(delete("order", Some(&etag))).await, Ok(()));
    // Without an etag, any existing key goes.
    put(&*store, write("other", "v", None)).await;
    assert_eq!(store.delete(delete("other", None)).await, Ok(()));
    assert_eq!(read(&*store, "other").await, None);
}

#[tokio::test]
async fn a_plain_value_under_the_key_is_replaced_by_a_write() {
    let (server, store) = started().await;
    let mut raw = server.connection().await;
    let _: () = redis::cmd("SET")
        .arg("test||legacy")
        .arg("old")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        store.set(write("legacy", "x", Some("1"))).await,
        Err(StateError::EtagMismatch("legacy".into()))
    );
    put(&*store, write("legacy", "new", None)).await;
    assert_eq!(
        read(&*store, "legacy").await,
        Some(("new".into(), "1".into()))
    );
}

/// A redis state store named `store`, started for app `app_id`.
async fn store_of_app(
    app_id: &str,
    store: &str,
    metadata: Value,
) -> Result<Arc<dyn StateStore>, String> {
    let mut cx = common::named_context("state", store, &common::metadata(metadata.clone()));
    cx.app_id = app_id.into();
    let mut built = common::build("state", "redis", metadata)?;
    built.init(&cx).await.map_err(|e| e.to_string())?;
    match built.into_instance() {
        Instance::State(store) => Ok(store),
        other => Err(format!("expected a state store, got {other:?}")),
    }
}

/// The `data` and `version` of the hash at `key`, read raw.
async fn raw_fields(server: &RedisServer, key: &str) -> (Option<String>, Option<String>) {
    let mut raw = server.connection().await;
    redis::cmd("HMGET")
        .arg(key)
        .arg("data")
        .arg("version")
        .query_async(&mut raw)
        .await
        .unwrap_or_else(|e| panic!("HMGET {key}: {e}"))
}

#[tokio::test]
async fn state_keys_follow_daprs_key_prefix_strategies() {
    let server = RedisServer::start().await;
    // (keyPrefix, app id, the key Dapr stores `k` under)
    let cases = [
        (None, "checkout", "checkout||k"),
        (Some(""), "checkout", "checkout||k"),
        (Some("AppId"), "checkout", "checkout||k"),
        (None, "", "k"),
        (Some("name"), "checkout", "orders-by-name||k"),
        (Some("none"), "checkout", "k"),
        (Some("Shared"), "checkout", "shared||k"),
    ];
    for (i, (prefix, app_id, stored)) in cases.into_iter().enumerate() {
        let mut metadata = json!({"redisHost": server.addr()});
        if let Some(prefix) = prefix {
            metadata["keyPrefix"] = json!(prefix);
        }
        let name = if prefix == Some("name") {
            "orders-by-name".to_string()
        } else {
            format!("orders-{i}")
        };
        let store = store_of_app(app_id, &name, metadata)
            .await
            .unwrap_or_else(|e| panic!("{prefix:?}: {e}"));
        let value = format!("v{i}");
        put(&*store, write("k", &value, None)).await;
        let (data, version) = raw_fields(&server, stored).await;
        assert_eq!(
            data.as_deref(),
            Some(value.as_str()),
            "keyPrefix {prefix:?}, app `{app_id}`: `k` not at `{stored}`"
        );
        // Callers keep their own keys.
        let (read_value, etag) = read(&*store, "k").await.unwrap_or_default();
        assert_eq!(read_value, value);
        assert_eq!(Some(etag), version);
        let items = store.bulk_get(vec!["k".to_string()]).await.unwrap();
        assert_eq!(items[0].key, "k");
        assert_eq!(
            items[0].entry.as_ref().map(|e| e.data.clone()),
            Some(value.into_bytes())
        );
        store.delete(delete("k", None)).await.unwrap();
        assert_eq!(raw_fields(&server, stored).await, (None, None));
    }
    // Two apps on one Redis do not share keys by default.
    let a = store_of_app("app-a", "s", json!({"redisHost": server.addr()}))
        .await
        .unwrap();
    let b = store_of_app("app-b", "s", json!({"redisHost": server.addr()}))
        .await
        .unwrap();
    put(&*a, write("shared", "from-a", None)).await;
    assert_eq!(read(&*b, "shared").await, None);
    // A `keyPrefix` holding `||` is refused, as Dapr does.
    let refused = store_of_app(
        "checkout",
        "bad",
        json!({"redisHost": server.addr(), "keyPrefix": "a||b"}),
    )
    .await;
    assert!(
        matches!(&refused, Err(m) if m.contains("keyPrefix") && m.contains("||")),
        "{:?}",
        refused.err()
    );
}

#[tokio::test]
async fn a_value_dapr_wrote_is_read_with_its_etag_and_written_back_in_place() {
    let server = RedisServer::start().await;
    let mut raw = server.connection().await;
    // As Dapr's state.redis writes `order-1` for app `checkout`.
    let _: () = redis::cmd("HSET")
        .arg("checkout||order-1")
        .arg("data")
        .arg(r#"{"id":1}"#)
        .arg("version")
        .arg(1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let store = store_of_app(
        "checkout",
        "statestore",
        json!({"redisHost": server.addr()}),
    )
    .await
    .unwrap();
    assert_eq!(
        read(&*store, "order-1").await,
        Some((r#"{"id":1}"#.into(), "1".into()))
    );
    put(&*store, write("order-1", r#"{"id":2}"#, Some("1"))).await;
    assert_eq!(
        raw_fields(&server, "checkout||order-1").await,
        (Some(r#"{"id":2}"#.into()), Some("2".into()))
    );
    // A transaction writes the same keys.
    let req = TransactionRequest {
        operations: vec![
            TransactionOperation::Upsert(write("order-1", "t", Some("2"))),
            TransactionOperation::Upsert(write("order-2", "u", None)),
        ],
        ..TransactionRequest::default()
    };
    store.transact(req).await.unwrap();
    assert_eq!(
        raw_fields(&server, "checkout||order-1").await,
        (Some("t".into()), Some("3".into()))
    );
    assert_eq!(
        raw_fields(&server, "checkout||order-2").await.0.as_deref(),
        Some("u")
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        keys.iter().all(|k| k.starts_with("checkout||")),
        "bare keys written: {keys:?}"
    );
}

#[tokio::test]
async fn a_delete_with_an_etag_of_a_missing_key_succeeds() {
    let (server, store) = started().await;
    assert_eq!(store.delete(delete("missing", Some("1"))).await, Ok(()));
    // In a transaction too, and the other operations apply.
    let req = TransactionRequest {
        operations: vec![
            TransactionOperation::Delete(delete("missing", Some("1"))),
            TransactionOperation::Upsert(write("other", "v", None)),
        ],
        ..TransactionRequest::default()
    };
    assert_eq!(store.transact(req).await, Ok(()));
    assert_eq!(read(&*store, "other").await, Some(("v".into(), "1".into())));
    // A key that exists with another version is still a conflict.
    assert_eq!(
        store.delete(delete("other", Some("7"))).await,
        Err(StateError::EtagMismatch("other".into()))
    );
    let req = TransactionRequest {
        operations: vec![TransactionOperation::Delete(delete("other", Some("7")))],
        ..TransactionRequest::default()
    };
    assert_eq!(
        store.transact(req).await,
        Err(StateError::EtagMismatch("other".into()))
    );
    // A key that is not a hash (no version) is not taken as missing.
    let mut raw = server.connection().await;
    let _: () = redis::cmd("SET")
        .arg("test||plain")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        store.delete(delete("plain", Some("1"))).await,
        Err(StateError::EtagMismatch("plain".into()))
    );
}

/// A stored `version` that is not a whole number the store can increment
/// (`abc`, `1.5`, a leading zero, empty, past 2^53 - 1): a transaction
/// writing that key, or a single write of it, fails before anything is
/// written, with an error that names the key and not the stored value.
/// Before: the scripts read it as 0, wrote the keys before it (and its
/// `data`), then failed at its `HINCRBY`, and Redis kept those writes.
#[tokio::test]
async fn a_stored_version_that_is_not_a_whole_number_fails_the_write_before_any_change() {
    let server = RedisServer::start().await;
    let store = store(json!({"redisHost": server.addr(), "keyPrefix": "none"})).await;
    let mut raw = server.connection().await;
    let hset = |key: &'static str, version: &'static str| {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key)
            .arg("data")
            .arg("kept")
            .arg("version")
            .arg(version);
        cmd
    };
    let _: i64 = hset("b", "abc").query_async(&mut raw).await.unwrap();
    let req = TransactionRequest {
        operations: vec![
            TransactionOperation::Upsert(write("a", "new", None)),
            TransactionOperation::Upsert(write("b", "new", None)),
        ],
        ..TransactionRequest::default()
    };
    let failed = store.transact(req).await;
    assert!(
        matches!(&failed, Err(StateError::Backend(m)) if m.contains("`version` of state key b ") && !m.contains("abc")),
        "{failed:?}"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg("a")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the transaction wrote `a`");
    assert_eq!(
        raw_fields(&server, "b").await,
        (Some("kept".into()), Some("abc".into()))
    );

    for version in [
        "1.5",
        "007",
        "",
        "-1",
        "9007199254740991",
        "99999999999999999999",
    ] {
        let _: i64 = hset("c", version).query_async(&mut raw).await.unwrap();
        let failed = store.set(write("c", "new", None)).await;
        assert!(
            matches!(&failed, Err(StateError::Backend(m)) if m.contains("`version`")),
            "{version}: {failed:?}"
        );
        assert_eq!(
            raw_fields(&server, "c").await,
            (Some("kept".into()), Some(version.into())),
            "{version}"
        );
    }
    // The largest version counted exactly is still written over.
    let _: i64 = hset("c", "9007199254740990")
        .query_async(&mut raw)
        .await
        .unwrap();
    put(&*store, write("c", "new", None)).await;
    assert_eq!(
        raw_fields(&server, "c").await,
        (Some("new".into()), Some("9007199254740991".into()))
    );
}
