//! Bulk get pacing: chunks at once within `parallelism` and the budget
//! (each key in flight counted as at least 64 KiB), the first alone (a
//! half-open breaker's trial), the chunks in flight let finish when the
//! budget ends the read but dropped when a chunk fails, chunks a
//! half-open breaker refuses started again, `parallelism` counting gets.

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
/// letter (`k`: small values, `m`: 64 KiB values, `z`: missing keys and
/// `n`: 64 KiB values).
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
static MISSING_FIRST: Counters = Counters {
    running: AtomicUsize::new(0),
    most: AtomicUsize::new(0),
    asked: AtomicUsize::new(0),
};

/// The counters of the test reading `key`.
fn counters_of(key: &str) -> &'static Counters {
    match key.chars().next() {
        Some('m') => &LARGE,
        Some('z' | 'n') => &MISSING_FIRST,
        _ => &SMALL,
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

/// Each of `keys` with its value (none for a key starting with `z`, as
/// a store answers a missing key).
fn answer(keys: Vec<String>) -> Vec<BulkGetItem> {
    keys.into_iter()
        .map(|key| BulkGetItem {
            entry: (!key.starts_with('z')).then(|| value_of(&key)),
            key,
            error: None,
        })
        .collect()
}

/// The value of `key`: its name, padded to 1 KiB (64 KiB for a key
/// starting with `m` or `n`, 1 MiB for one starting with `g`).
fn value_of(key: &str) -> StateEntry {
    let mut data = key.as_bytes().to_vec();
    let size = match key.chars().next() {
        Some('m' | 'n') => 64 * 1024,
        Some('g') => 1024 * 1024,
        _ => 1024,
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
/// order asked, a repeated key read once and answered at each place. (A
/// budget of 32 MiB has room for 16 chunks in flight, each key counted as
/// 64 KiB at least.)
#[tokio::test(start_paused = true)]
async fn bulk_get_reads_its_chunks_at_once_up_to_the_parallelism() {
    let runtime = runtime("slow", "test.dapr.slow_bulk", None).await;
    let mut asked = keys('k', 320);
    asked.reverse();
    asked.insert(5, "k300".into());
    asked.push("k000".into());
    for (parallelism, expected) in [(0, 7), (-1, 7), (3, 1), (48, 3), (1_000, 16)] {
        let (answer, most, calls) = bulk(&runtime, asked.clone(), parallelism, 32 << 20).await;
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

/// Whether the [`Flaky`] store fails now: one flag per test, picked by
/// the keys' first letter (`k`, `p`, `q`).
static FLAKY_DOWN: AtomicBool = AtomicBool::new(false);
static FLAKY_DOWN_P: AtomicBool = AtomicBool::new(false);
static FLAKY_DOWN_Q: AtomicBool = AtomicBool::new(false);
static FLAKY_DOWN_R: AtomicBool = AtomicBool::new(false);

/// The flag of the test reading `key`.
fn down_flag(key: &str) -> &'static AtomicBool {
    match key.chars().next() {
        Some('p') => &FLAKY_DOWN_P,
        Some('q') => &FLAKY_DOWN_Q,
        Some('r') => &FLAKY_DOWN_R,
        _ => &FLAKY_DOWN,
    }
}

/// A state store answering every read (bulk or single) after 10 ms,
/// failing while its keys' flag ([`down_flag`]) is set.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.flaky_bulk")]
struct Flaky {}

#[async_trait]
impl Component for Flaky {}

#[async_trait]
impl StateStore for Flaky {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        match down_flag(&req.key).load(Ordering::SeqCst) {
            true => Err(StateError::Backend("down".into())),
            false => Ok(Some(value_of(&req.key))),
        }
    }

    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }

    async fn bulk_get(&self, keys: Vec<String>) -> Result<Vec<BulkGetItem>, StateError> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let down = down_flag(keys.first().map_or("", String::as_str));
        match down.load(Ordering::SeqCst) {
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
/// but 5.5 s for a chunk of keys starting with `g`, whose values are of
/// 1 MiB (1 KiB for the others).
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
        let large = keys.first().is_some_and(|key| key.starts_with('g'));
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
    // The first chunk small (about 16 KiB, so 7 more, each key counted as
    // 64 KiB, are read at once within 8 MiB), the second of 1 MiB values
    // (16 MiB), then small.
    let mut asked = keys('k', 16);
    asked.extend(keys('g', 16));
    asked.extend((16..304).map(|i| format!("k{i:03}")));
    assert_eq!(asked.len(), 320);
    let answer = bulk_of(&runtime, "paced", asked, &HashMap::new(), 0, 8 << 20).await;
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
/// chunks of 16 gets, so `parallelism: 1` ran 16 gets at once). (A budget
/// of 16 MiB has room for 64 gets, each counted as 64 KiB at least.)
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
            16 << 20,
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

/// A first chunk of missing keys does not open the full parallelism for
/// the large values after it: each key in flight is counted as the largest
/// item so far, at least 64 KiB, so 64 KiB values in a budget of 4 MiB are
/// read a few chunks at once (failed before: the first chunk's total,
/// about 100 bytes, was the estimate, and 15 chunks started at once; with
/// values of 8 MiB, 1.9 GiB read for a 4 MiB answer).
#[tokio::test(start_paused = true)]
async fn a_first_chunk_of_missing_keys_does_not_open_the_full_parallelism() {
    let runtime = runtime("slow", "test.dapr.slow_bulk", None).await;
    let mut asked = keys('z', 16);
    asked.extend((16..320).map(|i| format!("n{i:03}")));
    let (answer, most, calls) = bulk(&runtime, asked, 1_000, 4 << 20).await;
    assert!(
        matches!(answer, Err(StateOpError::BulkTooLarge { .. })),
        "{answer:?}"
    );
    assert!(most <= 3, "{most} chunks of 1 MiB read at once");
    assert!(
        calls <= 5,
        "{calls} chunks read for a limit of 4 MiB (the first of missing keys)"
    );
    runtime.shutdown().await;
}

/// Whether the hanging chunk of a [`FailingBulk`] started, and finished.
static HANG_STARTED: AtomicBool = AtomicBool::new(false);
static HANG_FINISHED: AtomicBool = AtomicBool::new(false);

/// A state store whose bulk read of keys starting with `e` fails after
/// 10 ms, of keys starting with `h` answers after 60 s (a master failing
/// over), of the others at once.
#[derive(rewire_runtime::Component, Default)]
#[component(kind = "state", type = "test.dapr.failing_bulk")]
struct FailingBulk {}

#[async_trait]
impl Component for FailingBulk {}

#[async_trait]
impl StateStore for FailingBulk {
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
        match keys.first().and_then(|key| key.chars().next()) {
            Some('e') => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(StateError::Backend("node refused".into()))
            }
            Some('h') => {
                HANG_STARTED.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(60)).await;
                HANG_FINISHED.store(true, Ordering::SeqCst);
                Ok(answer(keys))
            }
            _ => Ok(answer(keys)),
        }
    }
}

/// A chunk failing as a whole answers the bulk's error at once, the
/// chunks in flight dropped (failed since de2a42e: the bulk waited for a
/// chunk hanging 60 s before answering, past the request's timeout, so
/// the store's error became a 504 / `DEADLINE_EXCEEDED`).
#[tokio::test(start_paused = true)]
async fn a_failed_chunk_answers_at_once_without_waiting_for_those_in_flight() {
    let runtime = runtime("failing", "test.dapr.failing_bulk", None).await;
    let mut asked = keys('a', 16);
    asked.extend((16..32).map(|i| format!("h{i:03}")));
    asked.extend((32..48).map(|i| format!("e{i:03}")));
    let none = HashMap::new();
    let read = bulk_of(&runtime, "failing", asked, &none, 0, 4 << 20);
    let answer = tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .unwrap_or_else(|_| panic!("the bulk did not answer within 120 s"));
    assert!(
        matches!(answer, Err(StateOpError::BulkGet { .. })),
        "{answer:?}"
    );
    assert!(HANG_STARTED.load(Ordering::SeqCst), "the hanging chunk ran");
    assert!(
        !HANG_FINISHED.load(Ordering::SeqCst),
        "the bulk waited for the hanging chunk before answering"
    );
    runtime.shutdown().await;
}

/// A breaker with `maxRequests: 3`, open at once on a failure.
fn breaker_of_three_trials() -> serde_json::Value {
    serde_json::json!({
        "trip": "consecutiveFailures >= 1", "timeout": "1s", "maxRequests": 3
    })
}

/// With its breaker half-open and `maxRequests: 3`, a bulk of 5 chunks
/// from a store that is up again answers and closes the breaker: the
/// chunks refused for the trial places their siblings hold are started
/// again once one of those finishes (failed before: the 4th and 5th chunks
/// were refused and failed the bulk on a healthy store).
#[tokio::test(start_paused = true)]
async fn a_bulk_on_a_half_open_breaker_of_several_trials_answers_and_closes_it() {
    let runtime = runtime(
        "flaky",
        "test.dapr.flaky_bulk",
        Some(breaker_of_three_trials()),
    )
    .await;
    let none = HashMap::new();
    FLAKY_DOWN_P.store(true, Ordering::SeqCst);
    let failed = bulk_of(&runtime, "flaky", keys('p', 1), &none, 0, 16 << 20).await;
    assert!(
        matches!(failed, Err(StateOpError::BulkGet { .. })),
        "{failed:?}"
    );
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::HalfOpen);

    FLAKY_DOWN_P.store(false, Ordering::SeqCst);
    for round in 0..2 {
        let answer = bulk_of(&runtime, "flaky", keys('p', 80), &none, 0, 16 << 20).await;
        let answer = answer.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(answer.len(), 80);
        assert!(answer.iter().all(|item| item.entry.is_some()));
        assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Closed);
    }
    runtime.shutdown().await;
}

/// The same with request metadata (each key its own get): the gets
/// refused for the trial places are started again, not answered as
/// "circuit breaker open" errors of their keys (failed before: 77 of 80
/// keys were).
#[tokio::test(start_paused = true)]
async fn gets_of_a_bulk_on_a_half_open_breaker_of_several_trials_are_not_refused() {
    let runtime = runtime(
        "flaky",
        "test.dapr.flaky_bulk",
        Some(breaker_of_three_trials()),
    )
    .await;
    let metadata = HashMap::from([("a".to_owned(), "b".to_owned())]);
    FLAKY_DOWN_Q.store(true, Ordering::SeqCst);
    let failed = bulk_of(&runtime, "flaky", keys('q', 1), &metadata, 0, 16 << 20).await;
    let failed = failed.unwrap_or_else(|e| panic!("{e}"));
    assert!(failed[0].error.is_some(), "{failed:?}");
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::HalfOpen);

    FLAKY_DOWN_Q.store(false, Ordering::SeqCst);
    let answer = bulk_of(&runtime, "flaky", keys('q', 80), &metadata, 0, 16 << 20).await;
    let answer = answer.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.len(), 80);
    let refused: Vec<&BulkGetItem> = answer.iter().filter(|i| i.entry.is_none()).collect();
    assert!(
        refused.is_empty(),
        "{} keys refused: {refused:?}",
        refused.len()
    );
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Closed);
    runtime.shutdown().await;
}

/// With the breaker open, a bulk with request metadata (a get per key)
/// starts each get twice at most: refused while others are in flight, a
/// get is put back once, then its refusal is its key's error. Failed
/// before: refused gets were put back every round, each round settling
/// one key without ever awaiting (about 64 starts per key, the worker
/// held throughout).
#[tokio::test(start_paused = true)]
async fn an_open_breaker_refuses_each_get_of_a_bulk_at_most_twice() {
    let runtime = runtime(
        "flaky",
        "test.dapr.flaky_bulk",
        Some(breaker_of_three_trials()),
    )
    .await;
    let metadata = HashMap::from([("a".to_owned(), "b".to_owned())]);
    FLAKY_DOWN_R.store(true, Ordering::SeqCst);
    let failed = bulk_of(&runtime, "flaky", keys('r', 1), &metadata, 0, 16 << 20).await;
    assert!(failed.unwrap_or_else(|e| panic!("{e}"))[0].error.is_some());
    assert_eq!(breaker_of(&runtime, "flaky").state, BreakerState::Open);

    super::CHUNKS_STARTED.with(|started| started.set(0));
    let answer = bulk_of(&runtime, "flaky", keys('r', 500), &metadata, 0, 16 << 20).await;
    let answer = answer.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.len(), 500);
    assert!(answer.iter().all(|item| item.error.is_some()));
    let started = super::CHUNKS_STARTED.with(std::cell::Cell::get);
    assert!(started <= 2 * 500, "{started} gets started for 500 keys");
    runtime.shutdown().await;
}
