//! The `redis` state store and keys holding a plain Redis string (`SET
//! key value`, by an older app or by hand), against a real
//! `redis-server`: read as Dapr's `directGet` reads them (the value, no
//! etag) alone and in a bulk get, replaced by a write without an etag,
//! and a conditional write or delete of one refused. A key of another
//! type is an error naming it.

use crate::common;
use testkit::redis::RedisServer;

use std::sync::Arc;

use crate::support::state_requests::{delete, write};
use rewire_runtime::{
    GetRequest, Instance, StateEntry, StateError, StateStore, TransactionOperation,
    TransactionRequest,
};
use serde_json::json;

/// A server, and a store on it for app `test` (keys stored as `test||key`).
async fn started() -> (RedisServer, Arc<dyn StateStore>) {
    let server = RedisServer::start().await;
    match common::start("state", "redis", json!({"redisHost": server.addr()})).await {
        Ok(Instance::State(store)) => (server, store),
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `args` on the server, the reply left aside.
async fn raw(server: &RedisServer, args: &[&str]) {
    server
        .query(args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

async fn get(store: &dyn StateStore, key: &str) -> Result<Option<StateEntry>, StateError> {
    let req = GetRequest {
        key: key.into(),
        ..GetRequest::default()
    };
    store.get(req).await
}

/// The data and etag read at `key`.
async fn read(store: &dyn StateStore, key: &str) -> Option<(Vec<u8>, String)> {
    get(store, key)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
        .map(|entry| (entry.data, entry.etag))
}

/// How many times the server ran `command` (`INFO commandstats`).
async fn calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.query(&["INFO", "commandstats"]).await.unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.iter()
        .flat_map(|text| text.lines())
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_plain_string_is_read_with_no_etag_and_a_hash_costs_no_extra_command() {
    let (server, store) = started().await;
    raw(&server, &["SET", "test||legacy", "old \u{e9}"]).await;
    store.set(write("hashed", "h", None)).await.unwrap();
    assert_eq!(
        read(&*store, "legacy").await,
        Some(("old \u{e9}".as_bytes().to_vec(), String::new()))
    );
    assert_eq!(calls(&server, "get").await, 1, "one GET for the plain key");
    // A hash is read with its `HMGET` alone, no `GET` after it.
    for _ in 0..3 {
        assert_eq!(
            read(&*store, "hashed").await,
            Some((b"h".to_vec(), "1".into()))
        );
    }
    assert_eq!(read(&*store, "missing").await, None);
    assert_eq!(
        calls(&server, "get").await,
        1,
        "a hash or missing key sent a GET"
    );
    // Another type is an error naming the key.
    raw(&server, &["RPUSH", "test||listed", "a"]).await;
    let err = get(&*store, "listed").await;
    assert!(
        matches!(&err, Err(StateError::Backend(m)) if m.contains("`listed`") && m.contains("neither a state hash nor a string")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_bulk_get_reads_plain_strings_with_no_etag_beside_hashes() {
    let (server, store) = started().await;
    store.set(write("a", "A", None)).await.unwrap();
    raw(&server, &["SET", "test||b", "B"]).await;
    raw(&server, &["SADD", "test||c", "x"]).await;
    let keys = ["a", "b", "missing", "c"].map(String::from).to_vec();
    let items = store.bulk_get(keys).await.unwrap();
    let keys: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "missing", "c"]);
    let entry = |i: usize| {
        items[i]
            .entry
            .as_ref()
            .map(|e| (e.data.clone(), e.etag.clone()))
    };
    assert_eq!(entry(0), Some((b"A".to_vec(), "1".into())));
    assert_eq!(items[0].error, None);
    assert_eq!(entry(1), Some((b"B".to_vec(), String::new())));
    assert_eq!(items[1].error, None);
    assert_eq!((entry(2), &items[2].error), (None, &None));
    assert_eq!(entry(3), None);
    let error = items[3].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("`c`") && error.contains("neither a state hash nor a string"),
        "{error}"
    );
    // Only the plain and the set key were read again.
    assert_eq!(calls(&server, "get").await, 2);
}

#[tokio::test]
async fn a_plain_string_is_replaced_by_writes_without_an_etag_and_guards_etag_writes() {
    let (server, store) = started().await;
    raw(&server, &["SET", "test||one", "old"]).await;
    raw(&server, &["SET", "test||two", "old"]).await;
    raw(&server, &["SET", "test||three", "old"]).await;
    // With an etag: a mismatch (the value has no version), alone or in a
    // transaction, and the value stays.
    assert_eq!(
        store.set(write("one", "x", Some("1"))).await,
        Err(StateError::EtagMismatch("one".into()))
    );
    assert_eq!(
        store.delete(delete("one", Some("1"))).await,
        Err(StateError::EtagMismatch("one".into()))
    );
    let guarded = TransactionRequest {
        operations: vec![
            TransactionOperation::Upsert(write("two", "y", None)),
            TransactionOperation::Upsert(write("one", "x", Some("1"))),
        ],
        ..TransactionRequest::default()
    };
    assert_eq!(
        store.transact(guarded).await,
        Err(StateError::EtagMismatch("one".into()))
    );
    for key in ["one", "two"] {
        assert_eq!(
            read(&*store, key).await,
            Some((b"old".to_vec(), String::new()))
        );
    }
    // Without an etag: replaced by a hash at version 1, alone or in a
    // transaction; deleted.
    store.set(write("one", "new", None)).await.unwrap();
    assert_eq!(
        read(&*store, "one").await,
        Some((b"new".to_vec(), "1".into()))
    );
    let unguarded = TransactionRequest {
        operations: vec![TransactionOperation::Upsert(write("two", "new", None))],
        ..TransactionRequest::default()
    };
    store.transact(unguarded).await.unwrap();
    assert_eq!(
        read(&*store, "two").await,
        Some((b"new".to_vec(), "1".into()))
    );
    store.delete(delete("three", None)).await.unwrap();
    assert_eq!(read(&*store, "three").await, None);
}
