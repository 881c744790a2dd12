//! Bulk get pacing: chunks at once within `parallelism` and the budget,
//! the first alone (a half-open breaker's trial), the chunks in flight
//! let finish when the read ends early, `parallelism` counting gets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rewire_runtime::config::{parse, validate};
use rewire_runtime::prelude::async_trait;
use rewire_runtime::resilience::{BreakerState, BreakerStatus};
use rewire_runtime::{
    BulkGetItem, Component, ComponentKey, DeleteRequest, GetRequest, Kind, Registry, Runtime,
    RuntimeOptions, SetRequest, StateEntry, StateError, StateStore,
};

use super::{pace, Pace};
use crate::dapr::budget::ResponseBudget;
use crate::dapr::{Call, StateOpError, StoreLabel};

/// Bulk reads of a [`SlowBulk`] running now, the most at once, and how
/// many were asked for: one set per test, picked by the keys' first
/// letter (`k`: small values, `m`: 64 KiB values).
struct Counters {
    running: AtomicUsize,
    most: AtomicUsize,
    asked: AtomicUsize,
}

static SMALL: Counters = Counters {
    running: AtomicUsize::new(0),
    most: AtomicUsize::new(0),
    asked: AtomicUsize::new(0),
};
static LARGE: Counters = Counters {
    running: AtomicUsize::new(0),
    most: AtomicUsize::new(0),
    asked: AtomicUsize::new(0),
};

/// The counters of the test reading `key`.
fn counters_of(key: &str) -> &'static Counters {
    match key.starts_with('m') {
        true => &LARGE,
        false => &SMALL,
    }
}

/// A state store whose bulk read takes a second (less for later keys, so
/// chunks come back out of order), answering each key with its value
/// ([`value_of`]). It counts its bulk reads, and the most running at
/// once. It reports transactions (never applying one): the request checks
/// of `http::state` and `grpc::dapr_state` use it as their store.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.slow_bulk")]
struct SlowBulk {}

#[async_trait]
impl Component for SlowBulk {}

#[async_trait]
impl StateStore for SlowBulk {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(Some(value_of(&req.key)))
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }

    fn features(&self) -> Vec<rewire_runtime::StateFeature> {
        vec![rewire_runtime::StateFeature::Transactional]
    }

    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        let counters = counters_of(keys.first().map_or("", String::as_str));
        counters.asked.fetch_add(1, Ordering::SeqCst);
        let running = counters.running.fetch_add(1, Ordering::SeqCst) + 1;
        counters.most.fetch_max(running, Ordering::SeqCst);
        let first: u64 = keys.first().and_then(|k| k[1..].parse().ok()).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(1_000 - first)).await;
        counters.running.fetch_sub(1, Ordering::SeqCst);
        Ok(answer(keys))
    }
}

/// Each of `keys` with its value.
fn answer(keys: Vec<String>) -> Vec<BulkGetItem> {
    keys.into_iter()
        .map(|key| BulkGetItem {
            entry: Some(value_of(&key)),
            key,
            error: None,
        })
        .collect()
}

/// The value of `key`: its name, padded to 1 KiB (64 KiB for a key
/// starting with `m` or `b`).
fn value_of(key: &str) -> StateEntry {
    let mut data = key.as_bytes().to_vec();
    let size = match key.starts_with('m') || key.starts_with('b') {
        true => 64 * 1024,
        false => 1024,
    };
    data.resize(size, b' ');
    StateEntry {
        data,
        etag: "1".into(),
        metadata: HashMap::new(),
    }
}

/// A runtime serving `config` (JSON).
async fn runtime_of(config: serde_json::Value) -> Runtime {
    let file = parse(config.to_string().as_bytes()).unwrap_or_else(|p| panic!("{p}"));
    let registry = Registry::collected();
    let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
    Runtime::start(config, registry, RuntimeOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A runtime with the state store `store` of `type_name`, behind the
/// circuit breaker `breaker` (a Dapr policy) when given.
async fn runtime(store: &str, type_name: &str, breaker: Option<serde_json::Value>) -> Runtime {
    let mut config = serde_json::json!({
        "components": {"state": {store: {"type": type_name}}}
    });
    if let Some(breaker) = breaker {
        config["resiliency"] = serde_json::json!({
            "policies": {"circuitBreakers": {"cb": breaker}},
            "targets": {"components": {store: {"outbound": {"circuitBreaker": "cb"}}}}
        });
    }
    runtime_of(config).await
}

/// `letter000`… for `n` keys.
fn keys(letter: char, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{letter}{i:03}")).collect()
}

/// A bulk get of `keys` from `store` with `metadata` and `parallelism`
/// within `limit` bytes.
async fn bulk_of(
    runtime: &Runtime,
    store: &str,
    keys: Vec<String>,
    metadata: &HashMap<String, String>,
    parallelism: i64,
    limit: usize,
) -> Result<Vec<BulkGetItem>, StateOpError> {
    let call = Call::new(runtime, StoreLabel::default());
    let store = call.state_store(store).unwrap_or_else(|e| panic!("{e}"));
    store
        .bulk_get(keys, metadata, parallelism, ResponseBudget::new(limit))
        .await
}

/// A bulk get of `keys` from the slow store `slow` with `parallelism`
/// within `limit` bytes; the most bulk reads that ran at once, and how
/// many were asked for (the counters of the keys' letter).
async fn bulk(
    runtime: &Runtime,
    keys: Vec<String>,
    parallelism: i64,
    limit: usize,
) -> (Result<Vec<BulkGetItem>, StateOpError>, usize, usize) {
    let counters = counters_of(keys.first().map_or("", String::as_str));
    counters.most.store(0, Ordering::SeqCst);
    counters.asked.store(0, Ordering::SeqCst);
    let answer = bulk_of(runtime, "slow", keys, &HashMap::new(), parallelism, limit).await;
    let most = counters.most.load(Ordering::SeqCst);
    (answer, most, counters.asked.load(Ordering::SeqCst))
}

/// The breaker of `runtime`'s state store `store`.
fn breaker_of(runtime: &Runtime, store: &str) -> BreakerStatus {
    let key = ComponentKey::new(Kind::State, store);
    let generation = runtime.generation();
    let status = generation
        .policies()
        .get(&key)
        .and_then(|applied| applied.breaker_status());
    status.unwrap_or_else(|| panic!("`{store}` has a breaker"))
}

/// Dapr's `parallelism` counts gets: with request metadata that many
/// gets at once, else `ceil(parallelism / 16)` chunks of 16 (zero or
/// less: daprd's default of 100; at most 256 gets).
#[test]
fn parallelism_counts_gets() {
    let chunks = |most_in_flight| Pace {
        keys_per_chunk: 16,
        most_in_flight,
    };
    let gets = |most_in_flight| Pace {
        keys_per_chunk: 1,
        most_in_flight,
    };
    for (parallelism, native, with_metadata) in [
        (0, chunks(7), gets(100)),
        (-5, chunks(7), gets(100)),
        (1, chunks(1), gets(1)),
        (16, chunks(1), gets(16)),
        (17, chunks(2), gets(17)),
        (1_000, chunks(16), gets(256)),
    ] {
        assert_eq!(pace(parallelism, false), native, "{parallelism}");
        assert_eq!(pace(parallelism, true), with_metadata, "{parallelism}");
    }
}

/// A bulk get's chunks are read at once, the first alone, then up to
/// `ceil(parallelism / 16)` (zero or less: 7, daprd's 100 gets; at most
/// 16), not one after another (failed before ffb7abd: one chunk at a
/// time, so 1,000 keys on a backend taking 1 s a call took 63 s, past the
/// request timeout); chunks coming back out of order still answer in the
/// order asked, a repeated key read once and answered at each place.
#[tokio::test(start_paused = true)]
async fn bulk_get_reads_its_chunks_at_once_up_to_the_parallelism() {
    let runtime = runtime("slow", "test.dapr.slow_bulk", None).await;
    let mut asked = keys('k', 320);
    asked.reverse();
    asked.insert(5, "k300".into());
    asked.push("k000".into());
    for (parallelism, expected) in [(0, 7), (-1, 7), (3, 1), (48, 3), (1_000, 16)] {
        let (answer, most, calls) = bulk(&runtime, asked.clone(), parallelism, 1 << 20).await;
        assert_eq!((most, calls), (expected, 20), "parallelism {parallelism}");
        let answer = answer.unwrap_or_else(|e| panic!("{e}"));
        let answered: Vec<&str> = answer.iter().map(|item| item.key.as_str()).collect();
        assert_eq!(answered, asked, "parallelism {parallelism}");
        for item in &answer {
            let data = item.entry.as_ref().map(|e| e.data.clone());
            assert_eq!(data, Some(value_of(&item.key).data), "{}", item.key);
        }
    }

    // Over the response budget (40 KiB: chunks of about 16 KiB), a chunk
    // starts only while the answer held and the chunks in flight fit:
    // one at a time here, and the read stops at the third, past it.
    let (answer, most, calls) = bulk(&runtime, keys('k', 320), 0, 40 * 1024).await;
    assert!(
        matches!(answer, Err(StateOpError::BulkTooLarge { .. })),
        "{answer:?}"
    );
    assert_eq!((most, calls), (1, 3));
    runtime.shutdown().await;
}

/// A bulk of large values reads only as many chunks at once as the
/// budget has room for, each counted as large as the largest answered:
/// 64 KiB values (chunks of 1 MiB) in a budget of 4 MiB read at most 2
/// chunks at once, 4 in all, whatever the `parallelism` (failed before:
/// 16 chunks, 16 MiB, read at once past a limit of 4 MiB; with values of
/// 8 MiB, 2 GiB held by one request).
#[tokio::test(start_paused = true)]
async fn a_bulk_of_large_values_reads_within_what_the_budget_has_room_for() {
    let runtime = runtime("slow", "test.dapr.slow_bulk", None).await;
    let limit = 4 << 20;
    let (answer, most, calls) = bulk(&runtime, keys('m', 320), 1_000, limit).await;
    assert!(
        matches!(answer, Err(StateOpError::BulkTooLarge { .. })),
        "{answer:?}"
    );
    assert!(most <= 2, "{most} chunks of 1 MiB read at once");
    assert!(
        calls <= 5,
        "{calls} chunks of 1 MiB read for a limit of 4 MiB"
    );
    runtime.shutdown().await;
}

/// Whether the [`Flaky`] store fails now.
static FLAKY_DOWN: AtomicBool = AtomicBool::new(false);

/// A state store answering every bulk read after 10 ms, failing while
/// [`FLAKY_DOWN`] is set.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.flaky_bulk")]
struct Flaky {}

#[async_trait]
impl Component for Flaky {}

#[async_trait]
impl StateStore for Flaky {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(Some(value_of(&req.key)))
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        match FLAKY_DOWN.load(Ordering::SeqCst) {
            true => Err(StateError::Backend("down".into())),
            false => Ok(answer(keys)),
        }
    }
}

/// With its breaker half-open (Dapr's default `maxRequests: 1`), a bulk of
/// several chunks from a store that is up again answers, its first chunk
/// read alone as the trial, which closes the breaker (failed before: the
/// chunks read at once, the second was refused for the trial place the
/// first held, failing the whole bulk and dropping the trial unjudged, so
/// bulk traffic never closed the breaker).
#[tokio::test(start_paused = true)]
async fn a_bulk_on_a_half_open_breaker_answers_and_closes_it() {
    let breaker = serde_json::json!({
        "trip": "consecutiveFailures >= 1", "timeout": "1s", "maxRequests": 1
    });
    let runtime = runtime("flaky", "test.dapr.flaky_bulk", Some(breaker)).await;
    let none = HashMap::new();
    FLAKY_DOWN.store(true, Ordering::SeqCst);
    let failed = bulk_of(&runtime, "flaky", keys('k', 1), &none, 0, 1 << 20).await;
    assert!(
        matches!(failed, Err(StateOpError::BulkGet { .. })),
        "{failed:?}"
    );
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::HalfOpen);

    FLAKY_DOWN.store(false, Ordering::SeqCst);
    for round in 0..2 {
        let answer = bulk_of(&runtime, "flaky", keys('k', 40), &none, 0, 1 << 20).await;
        let answer = answer.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(answer.len(), 40);
        assert!(answer.iter().all(|item| item.entry.is_some()));
        assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Closed);
    }
    runtime.shutdown().await;
}

/// A state store whose bulk read takes 6 s (a slow but healthy backend),
/// but 5.5 s for a chunk of keys starting with `b`, whose values are of
/// 64 KiB (1 KiB for the others).
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.paced_bulk")]
struct Paced {}

#[async_trait]
impl Component for Paced {}

#[async_trait]
impl StateStore for Paced {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        Ok(Some(value_of(&req.key)))
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        let large = keys.first().is_some_and(|key| key.starts_with('b'));
        let took = match large {
            true => Duration::from_millis(5_500),
            false => Duration::from_secs(6),
        };
        tokio::time::sleep(took).await;
        Ok(answer(keys))
    }
}

/// A bulk refused for its size on a slow but healthy store lets the
/// chunks still in flight finish (their answers dropped) instead of
/// dropping them: its breaker stays closed, no failure counted (failed
/// before: the 6 sibling chunks, in flight for 5.5 s, past the 5 s a
/// dropped call is blamed after, were dropped as the store's failures and
/// opened the breaker, for a client's oversize request).
#[tokio::test(start_paused = true)]
async fn a_bulk_refused_for_its_size_leaves_a_healthy_stores_breaker_closed() {
    let breaker = serde_json::json!({
        "trip": "consecutiveFailures >= 3", "timeout": "30s"
    });
    let runtime = runtime("paced", "test.dapr.paced_bulk", Some(breaker)).await;
    // The first chunk small (about 16 KiB, so 7 more are read at once
    // within 200 KiB), the second of 64 KiB values (1 MiB), then small.
    let mut asked = keys('k', 16);
    asked.extend(keys('b', 16));
    asked.extend((16..304).map(|i| format!("k{i:03}")));
    assert_eq!(asked.len(), 320);
    let answer = bulk_of(&runtime, "paced", asked, &HashMap::new(), 0, 200 * 1024).await;
    assert!(
        matches!(answer, Err(StateOpError::BulkTooLarge { .. })),
        "{answer:?}"
    );
    let status = breaker_of(&runtime, "paced");
    assert_eq!(
        (status.state, status.consecutive_failures),
        (BreakerState::Closed, 0)
    );
    runtime.shutdown().await;
}

/// Gets of a [`CountingGets`] running now, and the most at once.
static GETS_RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST_GETS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// A state store whose get takes 10 ms, counting the gets running at
/// once.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.counting_gets")]
struct CountingGets {}

#[async_trait]
impl Component for CountingGets {}

#[async_trait]
impl StateStore for CountingGets {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let running = GETS_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
        MOST_GETS_RUNNING.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
        GETS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        Ok(Some(value_of(&req.key)))
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

/// With request metadata (each key its own get), `parallelism` bounds the
/// gets at once, as daprd's limiter does (failed before: counted in
/// chunks of 16 gets, so `parallelism: 1` ran 16 gets at once).
#[tokio::test(start_paused = true)]
async fn parallelism_bounds_the_gets_at_once_with_request_metadata() {
    let runtime = runtime("counting", "test.dapr.counting_gets", None).await;
    let metadata = HashMap::from([("a".to_owned(), "b".to_owned())]);
    for (parallelism, expected) in [(1, 1), (5, 5), (0, 64)] {
        MOST_GETS_RUNNING.store(0, Ordering::SeqCst);
        let answer = bulk_of(
            &runtime,
            "counting",
            keys('k', 64),
            &metadata,
            parallelism,
            1 << 20,
        )
        .await;
        let answer = answer.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer.len(), 64);
        let most = MOST_GETS_RUNNING.load(Ordering::SeqCst);
        // The first key is read alone, then up to `parallelism` (64 keys:
        // at most 63 after the first).
        assert_eq!(most, expected.min(63), "parallelism {parallelism}");
    }
    runtime.shutdown().await;
}
