//! State transactions on the `memory` store and on `redis` against a real
//! `redis-server`: operations apply in order, all or none; a stale etag
//! refuses the whole transaction; and writers moving amounts between two
//! keys concurrently, with etags, never let a bulk reader see a broken sum.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use rewire_runtime::{
    Concurrency, DeleteRequest, Instance, SetRequest, StateError, StateFeature, StateStore,
    TransactionOperation, TransactionRequest,
};
use serde_json::{json, Value};
use testkit::redis::RedisServer;

use crate::common;

async fn store(type_name: &str, metadata: Value) -> Arc<dyn StateStore> {
    match common::start("state", type_name, metadata).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
}

fn upsert(key: &str, value: &str, etag: Option<&str>) -> TransactionOperation {
    TransactionOperation::Upsert(SetRequest {
        key: key.into(),
        value: value.as_bytes().to_vec(),
        etag: etag.map(Into::into),
        ..SetRequest::default()
    })
}

fn delete(key: &str, etag: Option<&str>) -> TransactionOperation {
    TransactionOperation::Delete(DeleteRequest {
        key: key.into(),
        etag: etag.map(Into::into),
        ..DeleteRequest::default()
    })
}

async fn transact(
    store: &dyn StateStore,
    operations: Vec<TransactionOperation>,
) -> Result<(), StateError> {
    store
        .transact(TransactionRequest {
            operations,
            ..TransactionRequest::default()
        })
        .await
}

/// `(value, etag)` of each key, read in one bulk get.
async fn read(store: &dyn StateStore, keys: &[&str]) -> Vec<Option<(String, String)>> {
    let items = store
        .bulk_get(keys.iter().map(|k| k.to_string()).collect())
        .await
        .unwrap_or_else(|e| panic!("bulk get: {e}"));
    items
        .into_iter()
        .map(|item| {
            assert_eq!(item.error, None, "{}", item.key);
            item.entry
                .map(|e| (String::from_utf8_lossy(&e.data).into_owned(), e.etag))
        })
        .collect()
}

fn value(entry: &Option<(String, String)>) -> Option<&str> {
    entry.as_ref().map(|(v, _)| v.as_str())
}

fn etag(entry: &Option<(String, String)>) -> &str {
    entry.as_ref().map_or("", |(_, e)| e.as_str())
}

/// `missing_delete_holds`: whether a delete at an etag of a missing key
/// holds (Dapr's redis store: deleted already) or is a mismatch (Dapr's
/// in-memory store).
async fn all_or_nothing(store: &dyn StateStore, missing_delete_holds: bool) {
    assert!(store.features().contains(&StateFeature::Transactional));
    transact(store, vec![upsert("a", "1", None), upsert("b", "2", None)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let before = read(store, &["a", "b"]).await;
    assert_eq!(
        (value(&before[0]), value(&before[1])),
        (Some("1"), Some("2"))
    );

    // A right etag on `a`, a stale one on `b`: nothing changes.
    let stale = transact(
        store,
        vec![
            upsert("a", "10", Some(etag(&before[0]))),
            upsert("c", "new", None),
            upsert("b", "20", Some("999999")),
        ],
    )
    .await;
    assert_eq!(stale, Err(StateError::EtagMismatch("b".into())));
    assert_eq!(read(store, &["a", "b", "c"]).await[..2], before[..]);
    assert_eq!(read(store, &["c"]).await, vec![None]);

    // First-write on an existing key refuses the whole transaction too.
    let mut first = SetRequest {
        key: "a".into(),
        value: b"x".to_vec(),
        ..SetRequest::default()
    };
    first.concurrency = Concurrency::FirstWrite;
    let refused = transact(
        store,
        vec![delete("b", None), TransactionOperation::Upsert(first)],
    )
    .await;
    assert_eq!(refused, Err(StateError::EtagMismatch("a".into())));
    assert_eq!(read(store, &["a", "b"]).await, before);
    let gone = transact(store, vec![delete("gone", Some("1"))]).await;
    if missing_delete_holds {
        assert_eq!(gone, Ok(()));
    } else {
        assert_eq!(gone, Err(StateError::EtagMismatch("gone".into())));
    }
    assert_eq!(read(store, &["a", "b"]).await, before);
    assert_eq!(
        transact(store, vec![upsert("a", "x", Some("not-a-number"))]).await,
        Err(StateError::EtagInvalid("a".into()))
    );

    // Operations see the ones before them: delete then re-create, and a
    // write at the etag the transaction's own delete left (none).
    transact(
        store,
        vec![
            delete("a", Some(etag(&before[0]))),
            upsert("a", "fresh", None),
            delete("b", None),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let after = read(store, &["a", "b"]).await;
    assert_eq!((value(&after[0]), value(&after[1])), (Some("fresh"), None));
    // The new version's etag guards the next write.
    transact(store, vec![upsert("a", "next", Some(etag(&after[0])))])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    transact(store, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

const TOTAL: i64 = 1_000;
const WRITERS: usize = 4;
const TRANSFERS: usize = 60;
const READERS: usize = 2;

/// Writers move amounts between `from` and `to` in transactions at the
/// etags they read; readers bulk-read both keys until the writers are done
/// and check the sum every time. At the end, the balance is exactly what
/// the accepted transactions moved: a refused one moved nothing.
async fn concurrent_transfers(store: Arc<dyn StateStore>) {
    transact(
        store.as_ref(),
        vec![
            upsert("from", &TOTAL.to_string(), None),
            upsert("to", "0", None),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let moved = Arc::new(AtomicI64::new(0));
    let conflicts = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (store, done) = (store.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0usize;
            loop {
                let finished = done.load(Ordering::SeqCst);
                let both = read(store.as_ref(), &["from", "to"]).await;
                let sum: i64 = both
                    .iter()
                    .map(|e| value(e).and_then(|v| v.parse::<i64>().ok()).unwrap_or(-1))
                    .sum();
                assert_eq!(sum, TOTAL, "a reader saw part of a transaction: {both:?}");
                reads += 1;
                if finished {
                    return reads;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (store, moved, conflicts) = (store.clone(), moved.clone(), conflicts.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..TRANSFERS {
                let both = read(store.as_ref(), &["from", "to"]).await;
                let balance = |i: usize| value(&both[i]).and_then(|v| v.parse::<i64>().ok());
                let (Some(from), Some(to)) = (balance(0), balance(1)) else {
                    panic!("a key is missing: {both:?}");
                };
                // Back and forth, so neither side runs dry.
                let amount = ((writer + n) % 5 + 1) as i64 * if n % 2 == 0 { 1 } else { -1 };
                let outcome = transact(
                    store.as_ref(),
                    vec![
                        upsert("from", &(from - amount).to_string(), Some(etag(&both[0]))),
                        upsert("to", &(to + amount).to_string(), Some(etag(&both[1]))),
                    ],
                )
                .await;
                match outcome {
                    Ok(()) => {
                        moved.fetch_add(amount, Ordering::SeqCst);
                    }
                    Err(StateError::EtagMismatch(_)) => {
                        conflicts.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("transfer failed: {other}"),
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap_or_else(|e| panic!("writer: {e}"));
    }
    done.store(true, Ordering::SeqCst);
    let mut reads = 0;
    for reader in readers {
        reads += reader.await.unwrap_or_else(|e| panic!("reader: {e}"));
    }
    let last = read(store.as_ref(), &["from", "to"]).await;
    let moved = moved.load(Ordering::SeqCst);
    assert_eq!(value(&last[0]), Some((TOTAL - moved).to_string().as_str()));
    assert_eq!(value(&last[1]), Some(moved.to_string().as_str()));
    println!(
        "{WRITERS} writers x {TRANSFERS} transfers: {} conflicts refused whole, {reads} consistent bulk reads",
        conflicts.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_transactions_are_all_or_nothing() {
    all_or_nothing(store("memory", json!({})).await.as_ref(), false).await;
    concurrent_transfers(store("memory", json!({})).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_transactions_are_all_or_nothing() {
    let server = RedisServer::start().await;
    let metadata = json!({"redisHost": server.addr()});
    all_or_nothing(store("redis", metadata.clone()).await.as_ref(), true).await;
    concurrent_transfers(store("redis", metadata).await).await;
}

#[tokio::test]
async fn redis_transactions_keep_dapr_layout_and_ttl() {
    let server = RedisServer::start().await;
    let store = store(
        "redis",
        json!({"redisHost": server.addr(), "keyPrefix": "app"}),
    )
    .await;
    let mut with_ttl = SetRequest {
        key: "session".into(),
        value: b"s".to_vec(),
        ..SetRequest::default()
    };
    with_ttl
        .metadata
        .insert("ttlInSeconds".into(), "100".into());
    transact(
        store.as_ref(),
        vec![
            TransactionOperation::Upsert(with_ttl),
            upsert("plain", "p", None),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut conn = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut keys = keys;
    keys.sort();
    assert_eq!(
        keys,
        vec!["app||plain".to_string(), "app||session".to_string()]
    );
    let (data, version): (String, String) = redis::cmd("HMGET")
        .arg("app||session")
        .arg("data")
        .arg("version")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((data.as_str(), version.as_str()), ("s", "1"));
    let ttl: i64 = redis::cmd("TTL")
        .arg("app||session")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((1..=100).contains(&ttl), "ttl {ttl}");
    let ttl: i64 = redis::cmd("TTL")
        .arg("app||plain")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ttl, -1);
}
