//! The `memory` state store, built through the registry: Dapr etag,
//! first-write and TTL semantics, bulk operations, and data that survives
//! metadata changes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::support::state_requests::write;
use rewire_runtime::{
    Concurrency, DeleteRequest, GetRequest, InPlace, Instance, StateError, StateStore,
    TransactionOperation, TransactionRequest,
};
use serde_json::json;

async fn store(metadata: serde_json::Value) -> Arc<dyn StateStore> {
    match common::start("state", "memory", metadata).await {
        Ok(Instance::State(store)) => store,
        Ok(other) => panic!("expected a state store, got {other:?}"),
        Err(e) => panic!("{e}"),
    }
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

#[tokio::test]
async fn optimistic_concurrency_with_etags() {
    let store = store(json!({})).await;
    store.set(write("order", "v1", None)).await.unwrap();
    let (_, etag1) = read(&*store, "order").await.unwrap_or_default();

    // Two writers read etag1; the first wins, the second gets a mismatch.
    store.set(write("order", "a", Some(&etag1))).await.unwrap();
    let loser = store.set(write("order", "b", Some(&etag1))).await;
    assert_eq!(loser, Err(StateError::EtagMismatch("order".into())));
    let (value, etag2) = read(&*store, "order").await.unwrap_or_default();
    assert_eq!(value, "a");
    assert_ne!(etag1, etag2);

    assert_eq!(
        store.set(write("order", "c", Some("not-a-number"))).await,
        Err(StateError::EtagInvalid("order".into()))
    );
    let stale_delete = DeleteRequest {
        key: "order".into(),
        etag: Some(etag1),
        ..DeleteRequest::default()
    };
    assert_eq!(
        store.delete(stale_delete).await,
        Err(StateError::EtagMismatch("order".into()))
    );
    let delete = DeleteRequest {
        key: "order".into(),
        etag: Some(etag2),
        ..DeleteRequest::default()
    };
    store.delete(delete).await.unwrap();
    assert_eq!(read(&*store, "order").await, None);
    let missing = DeleteRequest {
        key: "order".into(),
        ..DeleteRequest::default()
    };
    assert_eq!(store.delete(missing).await, Ok(()));
}

#[tokio::test]
async fn first_write_wins() {
    let store = store(json!({})).await;
    let mut first = write("seat", "alice", None);
    first.concurrency = Concurrency::FirstWrite;
    let mut second = write("seat", "bob", None);
    second.concurrency = Concurrency::FirstWrite;
    store.set(first).await.unwrap();
    assert_eq!(
        store.set(second).await,
        Err(StateError::EtagMismatch("seat".into()))
    );
    assert_eq!(
        read(&*store, "seat").await.map(|(v, _)| v).as_deref(),
        Some("alice")
    );
}

/// On a paused clock (the store reads tokio's): each entry is there until
/// its own TTL is up, and gone after.
#[tokio::test(start_paused = true)]
async fn entries_expire_after_their_ttl() {
    let store = store(json!({})).await;
    let mut short = write("session", "s", None);
    short.ttl = Some(Duration::from_millis(50));
    let mut by_metadata = write("token", "t", None);
    by_metadata
        .metadata
        .insert("ttlInSeconds".into(), "3600".into());
    store.bulk_set(vec![short, by_metadata]).await.unwrap();
    assert!(read(&*store, "session").await.is_some(), "`session` stored");
    tokio::time::advance(Duration::from_millis(45)).await;
    assert!(
        read(&*store, "session").await.is_some(),
        "`session` expired before its TTL"
    );
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(
        read(&*store, "session").await.is_none(),
        "`session` outlived its TTL"
    );
    tokio::time::advance(Duration::from_secs(3500)).await;
    assert!(
        read(&*store, "token").await.is_some(),
        "`token` expired early"
    );
    tokio::time::advance(Duration::from_secs(101)).await;
    assert!(
        read(&*store, "token").await.is_none(),
        "`token` outlived its `ttlInSeconds`"
    );
}

#[tokio::test]
async fn bulk_operations() {
    let store = store(json!({})).await;
    let writes = (0..5)
        .map(|i| write(&format!("k{i}"), &i.to_string(), None))
        .collect();
    store.bulk_set(writes).await.unwrap();
    let keys = vec!["k0".to_string(), "k4".to_string(), "nope".to_string()];
    let items = store.bulk_get(keys).await.unwrap();
    let found: Vec<_> = items
        .iter()
        .map(|i| (i.key.as_str(), i.entry.as_ref().map(|e| e.data.clone())))
        .collect();
    assert_eq!(
        found,
        vec![
            ("k0", Some(b"0".to_vec())),
            ("k4", Some(b"4".to_vec())),
            ("nope", None)
        ]
    );
    let deletes = (0..5)
        .map(|i| DeleteRequest {
            key: format!("k{i}"),
            ..DeleteRequest::default()
        })
        .collect();
    store.bulk_delete(deletes).await.unwrap();
    assert_eq!(read(&*store, "k2").await, None);
}

#[tokio::test]
async fn every_metadata_change_applies_in_place_and_keeps_the_data() {
    let store = store(json!({"defaultTtlInSeconds": 0})).await;
    store.set(write("kept", "v", None)).await.unwrap();
    let dynamic = store
        .as_in_place()
        .expect("memory state store is not dynamic");
    let applied = dynamic
        .update_in_place(&common::metadata(json!({"defaultTtlInSeconds": "60"})))
        .await;
    assert_eq!(applied.ok(), Some(InPlace::Applied));
    assert_eq!(
        read(&*store, "kept").await.map(|(v, _)| v).as_deref(),
        Some("v")
    );
}

/// Dapr's in-memory store checks a delete as it checks a write: first-write
/// without an etag holds only for a missing key, plain and in a transaction.
#[tokio::test]
async fn a_first_write_delete_without_an_etag_refuses_an_existing_key() {
    let store = store(json!({})).await;
    store.set(write("seat", "alice", None)).await.unwrap();
    let first_write = |etag: Option<&str>| DeleteRequest {
        key: "seat".into(),
        etag: etag.map(Into::into),
        concurrency: Concurrency::FirstWrite,
        ..DeleteRequest::default()
    };
    assert_eq!(
        store.delete(first_write(None)).await,
        Err(StateError::EtagMismatch("seat".into()))
    );
    let in_a_transaction = TransactionRequest {
        operations: vec![
            TransactionOperation::Upsert(write("other", "x", None)),
            TransactionOperation::Delete(first_write(None)),
        ],
        ..TransactionRequest::default()
    };
    assert_eq!(
        store.transact(in_a_transaction).await,
        Err(StateError::EtagMismatch("seat".into()))
    );
    assert_eq!(read(&*store, "other").await, None, "all or nothing");
    let (value, etag) = read(&*store, "seat").await.unwrap_or_default();
    assert_eq!(value, "alice");
    // With the etag it holds; on the missing key, without one, too.
    store.delete(first_write(Some(&etag))).await.unwrap();
    assert_eq!(read(&*store, "seat").await, None);
    assert_eq!(store.delete(first_write(None)).await, Ok(()));
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time to the second
/// (`2026-01-02T03:04:05Z`); `None` for any other form.
fn rfc3339_utc_seconds(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let shape = b.len() == 20
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && b[10] == b'T'
        && [13, 16].iter().all(|&i| b[i] == b':')
        && b[19] == b'Z';
    if !shape {
        return None;
    }
    let num = |from: usize, to: usize| text.get(from..to)?.parse::<i64>().ok();
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hh, mm, ss) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn unix_now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(0)
}

/// As Dapr's in-memory store: an entry with a TTL is read with metadata
/// `ttlExpireTime` (RFC 3339, UTC), by a get and by a bulk get; one
/// without a TTL has none.
#[tokio::test]
async fn reads_report_the_expiry_as_ttl_expire_time() {
    let store = store(json!({})).await;
    let before = unix_now();
    let mut by_metadata = write("token", "t", None);
    by_metadata
        .metadata
        .insert("ttlInSeconds".into(), "3600".into());
    let mut by_ttl = write("session", "s", None);
    by_ttl.ttl = Some(Duration::from_secs(60));
    store
        .bulk_set(vec![by_metadata, by_ttl, write("forever", "f", None)])
        .await
        .unwrap();
    let after = unix_now();
    let get = |key: &str| GetRequest {
        key: key.into(),
        ..GetRequest::default()
    };
    let token = store.get(get("token")).await.unwrap().unwrap();
    let expires = token.metadata.get("ttlExpireTime").cloned();
    let at = expires.as_deref().and_then(rfc3339_utc_seconds);
    assert!(
        at.is_some_and(|at| (before + 3600..=after + 3600).contains(&at)),
        "{expires:?} not an hour after {before}..={after}"
    );
    let forever = store.get(get("forever")).await.unwrap().unwrap();
    assert_eq!(forever.metadata.get("ttlExpireTime"), None);
    let items = store
        .bulk_get(vec!["session".into(), "forever".into(), "token".into()])
        .await
        .unwrap();
    let expiries: Vec<Option<String>> = items
        .iter()
        .map(|i| {
            let entry = i.entry.as_ref()?;
            entry.metadata.get("ttlExpireTime").cloned()
        })
        .collect();
    let session = expiries[0].as_deref().and_then(rfc3339_utc_seconds);
    assert!(
        session.is_some_and(|at| (before + 60..=after + 60).contains(&at)),
        "{expiries:?}"
    );
    assert_eq!(expiries[1], None);
    assert_eq!(expiries[2], expires);
}

/// A client saving unique keys in a loop meets `maxKeys`; a large value
/// meets `maxTotalSize`: the write fails with a backend error naming the
/// store and the limit, and what is held stays readable. Deletes, expiry
/// and writes that do not grow the store make or keep room.
#[tokio::test]
async fn writes_past_max_keys_or_max_total_size_fail_and_keep_the_data() {
    let store = match common::start_named(
        "state",
        "orders",
        "memory",
        json!({"maxKeys": "3", "maxTotalSize": "64"}),
    )
    .await
    {
        Ok(Instance::State(store)) => store,
        other => panic!("expected a state store, got {other:?}"),
    };
    let mut written = 0;
    let refused = loop {
        match store.set(write(&format!("k{written}"), "v", None)).await {
            Ok(()) => written += 1,
            Err(err) => break err,
        }
        assert!(written <= 3, "maxKeys not enforced");
    };
    assert_eq!(written, 3);
    let message = refused.to_string();
    assert!(
        matches!(refused, StateError::Backend(_))
            && message.contains("memory state store `state/orders`")
            && message.contains("`maxKeys` is 3")
            && message.contains("`k3`"),
        "{message}"
    );
    for i in 0..3 {
        assert!(read(&*store, &format!("k{i}")).await.is_some(), "k{i} kept");
    }
    assert_eq!(read(&*store, "k3").await, None);
    // An overwrite is no new key; a transaction adding one is refused whole.
    store.set(write("k0", "again", None)).await.unwrap();
    let transaction = TransactionRequest {
        operations: vec![
            TransactionOperation::Upsert(write("k1", "changed", None)),
            TransactionOperation::Upsert(write("k9", "new", None)),
        ],
        ..TransactionRequest::default()
    };
    let refused = store.transact(transaction).await;
    assert!(
        matches!(&refused, Err(StateError::Backend(m)) if m.contains("maxKeys")),
        "{refused:?}"
    );
    assert_eq!(
        read(&*store, "k1").await.map(|(v, _)| v).as_deref(),
        Some("v")
    );
    // A value that would take the store past 64 bytes of keys and values.
    let big = "x".repeat(60);
    let refused = store.set(write("k1", &big, None)).await;
    assert!(
        matches!(&refused, Err(StateError::Backend(m)) if m.contains("`maxTotalSize` of 64")),
        "{refused:?}"
    );
    assert_eq!(
        read(&*store, "k1").await.map(|(v, _)| v).as_deref(),
        Some("v")
    );
    // A delete makes room; so does an expiry.
    let delete = DeleteRequest {
        key: "k2".into(),
        ..DeleteRequest::default()
    };
    store.delete(delete).await.unwrap();
    let mut short = write("k3", "v", None);
    short.ttl = Some(Duration::from_millis(50));
    store.set(short).await.unwrap();
    assert!(store.set(write("k4", "v", None)).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.set(write("k4", "v", None)).await.unwrap();
}

#[tokio::test]
async fn bounds_of_zero_are_refused() {
    for field in ["maxKeys", "maxTotalSize"] {
        let err = common::start("state", "memory", json!({ field: "0" }))
            .await
            .err()
            .unwrap_or_default();
        assert!(err.contains(field), "{field}: {err}");
    }
}

/// A configuration of app `app_id` with a memory state store, lock,
/// config store (one seeded item) and file store.
fn memory_app(app_id: &str) -> rewire_runtime::config::Config {
    let text = json!({"appId": app_id, "components": {
        "state": {"cache": {"type": "memory"}},
        "lock": {"locks": {"type": "memory"}},
        "config_store": {"settings": {"type": "memory", "metadata": {"items": {"seeded": "1"}}}},
        "file": {"files": {"type": "memory"}}
    }});
    rewire_runtime::config::parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

fn minute_lock(owner: &str) -> rewire_runtime::TryLockRequest {
    rewire_runtime::TryLockRequest {
        resource_id: "invoice-42".into(),
        lock_owner: owner.into(),
        expiry: Duration::from_secs(60),
    }
}

/// A new `appId` rebuilds every component; the memory ones take over
/// their predecessors' data: keys, held locks (another owner is still
/// refused), values set through the API (subscribers hear of no
/// deletion) and files. Before, each started empty: every lock was
/// silently released.
#[tokio::test]
async fn a_new_app_id_keeps_keys_locks_config_values_and_files() {
    use rewire_runtime::{
        Action, ConfigItem, ConfigQuery, PutFileRequest, Registry, Runtime, RuntimeOptions,
        UnlockRequest, UnlockStatus,
    };
    let valid = rewire_runtime::config::validate(memory_app("a"), &Registry::collected())
        .unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let state = runtime.state_store("cache");
    let locks = runtime.lock_store("locks");
    let settings = runtime.config_store("settings");
    let files = runtime.file_store("files");
    state
        .load()
        .unwrap_or_else(|e| panic!("state: {e}"))
        .set(write("k", "v", None))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let lock = locks.load().unwrap_or_else(|e| panic!("lock: {e}"));
    assert_eq!(lock.try_lock(minute_lock("a")).await, Ok(true));
    let set = ConfigItem {
        key: "set-at-runtime".into(),
        value: "x".into(),
        ..ConfigItem::default()
    };
    let config = settings.load().unwrap_or_else(|e| panic!("config: {e}"));
    config
        .set(vec![set])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut subscription = settings
        .subscribe(ConfigQuery::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let put = PutFileRequest {
        name: "report.txt".into(),
        body: Box::pin(&b"data"[..]),
        metadata: Default::default(),
    };
    let file_store = files.load().unwrap_or_else(|e| panic!("files: {e}"));
    file_store.put(put).await.unwrap_or_else(|e| panic!("{e}"));

    let record = runtime
        .apply(memory_app("b"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for key in [
        "state/cache",
        "lock/locks",
        "config_store/settings",
        "file/files",
    ] {
        assert_eq!(
            record.actions.get(key),
            Some(&Action::Rebuilt),
            "{record:?}"
        );
    }
    // A second app id change: the data the first rebuild adopted is
    // handed over again (an app id change is no change of type).
    let record = runtime
        .apply(memory_app("c"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("state/cache"), Some(&Action::Rebuilt));
    let lock = locks.load().unwrap_or_else(|e| panic!("lock: {e}"));

    let state = state.load().unwrap_or_else(|e| panic!("state: {e}"));
    assert_eq!(
        read(state.as_ref(), "k").await.map(|(v, _)| v),
        Some("v".into())
    );
    assert_eq!(
        lock.try_lock(minute_lock("b")).await,
        Ok(false),
        "another owner took a lock held across the rebuild"
    );
    assert_eq!(
        lock.unlock(UnlockRequest {
            resource_id: "invoice-42".into(),
            lock_owner: "a".into()
        })
        .await,
        Ok(UnlockStatus::Success)
    );
    let config = settings.load().unwrap_or_else(|e| panic!("config: {e}"));
    let held = config
        .get(&ConfigQuery::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut held: Vec<(String, String)> = held.into_iter().map(|i| (i.key, i.value)).collect();
    held.sort();
    assert_eq!(
        held,
        vec![
            ("seeded".to_string(), "1".to_string()),
            ("set-at-runtime".to_string(), "x".to_string())
        ]
    );
    let heard =
        crate::support::etcd_server::items_within(&mut subscription, Duration::from_millis(500))
            .await;
    assert!(
        heard.is_empty(),
        "subscribers heard of changes that were not made: {}",
        crate::support::etcd_server::show(&heard)
    );
    let file_store = files.load().unwrap_or_else(|e| panic!("files: {e}"));
    assert_eq!(
        file_store
            .stat("report.txt")
            .await
            .ok()
            .map(|info| info.size),
        Some(4)
    );
    runtime.shutdown().await;
}

/// App `app` with a memory state store and lock (unless `removed`) and a
/// file store of `file_type` (a `local` one at `root`).
fn ended_app(
    removed: bool,
    file_type: &str,
    root: &std::path::Path,
) -> rewire_runtime::config::Config {
    let mut components = json!({
        "file": {"files": {"type": file_type, "metadata": {"root": root.display().to_string()}}}
    });
    if file_type == "memory" {
        components["file"]["files"]["metadata"] = json!({});
    }
    if !removed {
        components["state"] = json!({"cache": {"type": "memory"}});
        components["lock"] = json!({"locks": {"type": "memory"}});
    }
    let text = json!({"appId": "app", "components": components});
    rewire_runtime::config::parse(text.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"))
}

/// A removal (state store, lock) or a change of type (file store, to
/// `local`) starts the data over, even while the retired instances are
/// still held (an embedder's `load_as` or `load` `Arc`, a call in flight):
/// declared again as `memory`, the store is empty, the lock free, the
/// file gone. Before, the new instances found the old ones' tables in the
/// runtime's handover area and took them back.
#[tokio::test]
async fn a_removed_or_retyped_memory_component_declared_again_starts_empty() {
    use rewire_components::memory::state::MemoryStateStore;
    use rewire_runtime::{Action, ComponentKey, PutFileRequest, Registry, Runtime, RuntimeOptions};
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let app = |removed, file_type| ended_app(removed, file_type, root.path());
    let valid = rewire_runtime::config::validate(app(false, "memory"), &Registry::collected())
        .unwrap_or_else(|p| panic!("{p}"));
    let runtime = Runtime::start(valid, Registry::collected(), RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let held_state = runtime
        .component(ComponentKey::new("state", "cache"))
        .load_as::<MemoryStateStore>()
        .unwrap_or_else(|e| panic!("state: {e}"));
    held_state
        .set(write("k", "v", None))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let held_lock = runtime
        .lock_store("locks")
        .load()
        .unwrap_or_else(|e| panic!("lock: {e}"));
    assert_eq!(held_lock.try_lock(minute_lock("a")).await, Ok(true));
    let held_files = runtime
        .file_store("files")
        .load()
        .unwrap_or_else(|e| panic!("files: {e}"));
    let put = PutFileRequest {
        name: "report.txt".into(),
        body: Box::pin(&b"data"[..]),
        metadata: Default::default(),
    };
    held_files.put(put).await.unwrap_or_else(|e| panic!("{e}"));

    let record = runtime
        .apply(app(true, "local"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("state/cache"), Some(&Action::Removed));
    assert_eq!(record.actions.get("lock/locks"), Some(&Action::Removed));
    assert_eq!(record.actions.get("file/files"), Some(&Action::Rebuilt));
    let record = runtime
        .apply(app(false, "memory"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(record.actions.get("state/cache"), Some(&Action::Added));
    assert_eq!(record.actions.get("file/files"), Some(&Action::Rebuilt));

    let state = runtime
        .state_store("cache")
        .load()
        .unwrap_or_else(|e| panic!("state: {e}"));
    assert_eq!(
        read(state.as_ref(), "k").await,
        None,
        "a state store declared again found the removed one's data"
    );
    let lock = runtime
        .lock_store("locks")
        .load()
        .unwrap_or_else(|e| panic!("lock: {e}"));
    assert_eq!(
        lock.try_lock(minute_lock("b")).await,
        Ok(true),
        "a lock store declared again kept the removed one's lock"
    );
    let files = runtime
        .file_store("files")
        .load()
        .unwrap_or_else(|e| panic!("files: {e}"));
    assert!(
        files.stat("report.txt").await.is_err(),
        "a memory file store declared again after a type change found the old one's file"
    );
    // The retired instances still hold what they had: only the area forgot.
    assert!(read(held_state.as_ref(), "k").await.is_some());
    drop((held_state, held_lock, held_files));
    runtime.shutdown().await;
}
