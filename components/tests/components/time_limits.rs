//! TTLs, lock expiries and timeouts out of range are errors naming the
//! field, never a panic: `ttlInSeconds=9223372036854775807` on a write (memory
//! and a real redis), a `Duration::MAX` TTL or lock expiry, a memory store's
//! `defaultTtlInSeconds` of `i64::MAX` (refused by `validate`), and redis
//! `readTimeout`/`writeTimeout`/`dialTimeout` of `1e22` (refused by
//! `validate`, by the factory and by an in-place update).

use crate::common;
use testkit::redis::RedisServer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rewire_runtime::{
    Instance, Lock, LockError, Registry, SetRequest, StateError, StateStore, TryLockRequest,
};
use serde_json::{json, Value};

const HUGE_SECONDS: &str = "9223372036854775807";

async fn state(type_name: &str, metadata: Value) -> Arc<dyn StateStore> {
    match common::start("state", type_name, metadata).await {
        Ok(Instance::State(store)) => store,
        other => panic!("{:?}", other.map(|_| ())),
    }
}

async fn lock(type_name: &str, metadata: Value) -> Arc<dyn Lock> {
    match common::start("lock", type_name, metadata).await {
        Ok(Instance::Lock(lock)) => lock,
        other => panic!("{:?}", other.map(|_| ())),
    }
}

fn write(ttl: Option<Duration>, metadata: &[(&str, &str)]) -> SetRequest {
    SetRequest {
        key: "k".into(),
        value: b"v".to_vec(),
        ttl,
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        ..SetRequest::default()
    }
}

/// Every out-of-range TTL is an invalid request naming its field.
async fn refuses_huge_ttls(store: &dyn StateStore) {
    let cases = [
        (
            write(None, &[("ttlInSeconds", HUGE_SECONDS)]),
            "ttlInSeconds",
        ),
        (write(Some(Duration::MAX), &[]), "ttl"),
        (write(Some(Duration::from_secs(u64::MAX)), &[]), "ttl"),
    ];
    for (request, field) in cases {
        let err = store.set(request).await.expect_err("past the limit");
        assert!(
            matches!(&err, StateError::Invalid(m) if m.contains(&format!("`{field}`"))),
            "{err}"
        );
    }
    // The largest accepted TTL still works.
    let max = write(None, &[("ttlInSeconds", "2147483647")]);
    store.set(max).await.unwrap();
}

async fn refuses_huge_expiries(lock: &dyn Lock) {
    let request = TryLockRequest {
        resource_id: "r".into(),
        lock_owner: "o".into(),
        expiry: Duration::MAX,
    };
    let err = lock.try_lock(request).await.expect_err("past the limit");
    assert!(
        matches!(&err, LockError::Invalid(m) if m.contains("`expiry`")),
        "{err}"
    );
}

#[tokio::test]
async fn memory_stores_refuse_huge_ttls_and_expiries() {
    refuses_huge_ttls(&*state("memory", json!({})).await).await;
    refuses_huge_expiries(&*lock("memory", json!({})).await).await;
}

#[tokio::test]
async fn redis_stores_refuse_huge_ttls_and_expiries() {
    let server = RedisServer::start().await;
    refuses_huge_ttls(&*state("redis", json!({"redisHost": server.addr()})).await).await;
    refuses_huge_expiries(&*lock("redis", json!({"redisHost": server.addr()})).await).await;
}

/// `validate` and the factory both refuse `metadata`, naming `field`.
fn refused_ahead_of_start(kind: &str, type_name: &str, metadata: Value, field: &str) {
    rewire_components::link();
    let registry = Registry::collected();
    let descriptor = registry.get(kind, type_name).unwrap();
    let map = common::metadata(metadata.clone()).into_map();
    let validated = (descriptor.validate)(&map, &[]).map_err(|e| e.to_string());
    assert!(
        matches!(&validated, Err(m) if m.contains(&format!("`{field}`"))),
        "{type_name} {metadata}: {validated:?}"
    );
    let built = common::build(kind, type_name, metadata.clone()).map(|_| ());
    assert!(
        matches!(&built, Err(m) if m.contains(&format!("`{field}`"))),
        "{type_name} {metadata}: {built:?}"
    );
}

#[tokio::test]
async fn a_huge_default_ttl_is_refused_by_validate() {
    for value in [
        json!(i64::MAX),
        json!(HUGE_SECONDS),
        json!(2_147_483_648_i64),
    ] {
        let metadata = json!({ "defaultTtlInSeconds": value });
        refused_ahead_of_start("state", "memory", metadata, "defaultTtlInSeconds");
    }
    let metadata = json!({"redisHost": "127.0.0.1:1", "ttlInSeconds": HUGE_SECONDS});
    refused_ahead_of_start("state", "redis", metadata, "ttlInSeconds");
}

#[tokio::test]
async fn huge_redis_timeouts_are_refused_ahead_of_start_and_in_place() {
    let server = RedisServer::start().await;
    let store = state("redis", json!({"redisHost": server.addr()})).await;
    for field in ["readTimeout", "writeTimeout", "dialTimeout"] {
        for value in [
            json!("1e22"),
            json!(1e22),
            json!(u64::MAX),
            json!("300000h"),
        ] {
            let metadata = json!({"redisHost": server.addr(), field: value});
            refused_ahead_of_start("state", "redis", metadata.clone(), field);
            refused_ahead_of_start("lock", "redis", metadata.clone(), field);
            let dynamic = store.as_in_place().unwrap();
            let applied = dynamic
                .update_in_place(&common::metadata(metadata))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert!(
                matches!(&applied, Err(m) if m.contains(&format!("`{field}`"))),
                "{field}={value}: {applied:?}"
            );
        }
    }
    // The store kept its connection and serves.
    store.set(write(None, &[])).await.unwrap();
}
