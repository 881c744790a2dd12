//! Fault: the Redis server behind a `redis` state store is killed under
//! load and started again on the same port. Four tasks keep writing and
//! reading back keys through `runtime.state_store(..)` handles. During the
//! outage every request fails with an error that names the Redis server —
//! no panic, and no call outlives the store's configured timeouts. Once
//! the server is back, requests succeed again on the very same instance:
//! no rewire restart, no reload (the history stays empty, generation 1).

#[path = "../components/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use rewire::{ComponentKey, GetRequest, Runtime, SetRequest, StateStoreHandle};
use tokio::time::{sleep, timeout, Instant};

/// Request loops.
const TASKS: usize = 4;
/// The store's `dialTimeout`, `readTimeout` and `writeTimeout`.
const DIAL: Duration = Duration::from_millis(500);
const READ: Duration = Duration::from_millis(500);
const WRITE: Duration = Duration::from_millis(500);
/// Longest one call may take: every configured timeout in a row (a
/// reconnection, then a command sent and answered), plus scheduling
/// slack for a loaded machine.
const CALL_LIMIT: Duration = Duration::from_millis(1500 + 1000);
/// A call that takes longer than this is a hang (keeps a broken build from
/// hanging the suite).
const HANG_GUARD: Duration = Duration::from_secs(15);

/// Phases of the scenario; each request is counted in the phase it
/// started in.
const BEFORE: u8 = 0;
const OUTAGE_PHASE: u8 = 1;
const RESTARTED: u8 = 2;
const RECOVERED: u8 = 3;
const PHASES: usize = 4;
/// How a call of each phase is described.
const PHASE_NAMES: [&str; PHASES] = [
    "before the outage",
    "made while the server was down",
    "that ended while the server restarted",
    "after recovery",
];

/// What one task saw in each phase.
#[derive(Debug, Default, Clone)]
struct Seen {
    ok: [u64; PHASES],
    failed: [u64; PHASES],
    /// Longest call (a set or a get) per phase.
    longest: [Duration; PHASES],
    /// Errors met, per phase (first few).
    errors: [Vec<String>; PHASES],
}

struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Seen>>,
}

/// One call, timed and bounded by [`HANG_GUARD`].
async fn call<T>(
    longest: &mut Duration,
    what: &str,
    future: impl std::future::Future<Output = Result<T, rewire::StateError>>,
) -> Result<T, String> {
    let started = Instant::now();
    let result = timeout(HANG_GUARD, future).await;
    *longest = (*longest).max(started.elapsed());
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(format!("{what}: {err}")),
        Err(_) => Err(format!("{what}: HUNG for {HANG_GUARD:?}")),
    }
}

/// One request: write a key, read it back, on one loaded instance.
async fn request(
    handle: &StateStoreHandle,
    key: String,
    value: Vec<u8>,
    longest: &mut Duration,
) -> Result<(), String> {
    let store = handle.load().map_err(|e| format!("load: {e}"))?;
    let set = SetRequest {
        key: key.clone(),
        value: value.clone(),
        ..SetRequest::default()
    };
    call(longest, "set", store.set(set)).await?;
    let get = GetRequest {
        key: key.clone(),
        ..GetRequest::default()
    };
    match call(longest, "get", store.get(get)).await? {
        Some(entry) if entry.data == value => Ok(()),
        other => Err(format!("get {key}: read back {other:?}")),
    }
}

fn start_load(runtime: &Runtime, phase: &Arc<AtomicU8>) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..TASKS)
        .map(|task| {
            let handle = runtime.state_store("orders");
            let (stop, phase) = (stop.clone(), phase.clone());
            tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let started_in = phase.load(Ordering::SeqCst);
                    let key = format!("t{task}-{}", n % 100);
                    let value = n.to_string().into_bytes();
                    let mut longest = Duration::ZERO;
                    let result = request(&handle, key, value, &mut longest).await;
                    // A request belongs to the latest phase it saw: one in
                    // flight when the server dies is an outage request.
                    let p = usize::from(started_in.max(phase.load(Ordering::SeqCst)));
                    seen.longest[p] = seen.longest[p].max(longest);
                    match result {
                        Ok(()) => seen.ok[p] += 1,
                        Err(err) => {
                            seen.failed[p] += 1;
                            if seen.errors[p].len() < 3 {
                                seen.errors[p].push(err);
                            }
                            // A failing client backs off a little, as
                            // real ones do.
                            sleep(Duration::from_millis(10)).await;
                        }
                    }
                    sleep(Duration::from_millis(1)).await;
                }
                seen
            })
        })
        .collect();
    Load { stop, tasks }
}

impl Load {
    async fn finish(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        let mut seen = Vec::new();
        for task in self.tasks {
            // A panic in a request would surface here.
            seen.push(
                task.await
                    .unwrap_or_else(|e| panic!("request loop panicked: {e}")),
            );
        }
        seen
    }
}

/// Waits (up to 20 s) until a request through a fresh handle succeeds.
async fn wait_until_served(runtime: &Runtime) {
    let handle = runtime.state_store("orders");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut longest = Duration::ZERO;
        match request(&handle, "probe".into(), b"1".to_vec(), &mut longest).await {
            Ok(()) => return,
            Err(err) => last = err,
        }
        sleep(Duration::from_millis(50)).await;
    }
    panic!("requests did not succeed again after the restart; last error: {last}");
}

fn total(seen: &[Seen], pick: impl Fn(&Seen) -> u64) -> u64 {
    seen.iter().map(pick).sum()
}

/// What the scenario saw, and the server's address.
struct Observed {
    seen: Vec<Seen>,
    host: String,
    report: String,
}

/// Starts Redis and a runtime with a `redis` state store on it, runs the
/// load, kills the server for `outage`, restarts it on the same port, and
/// waits until requests are served again. Checks what must hold whatever
/// the outage: traffic before it, recovery after it with no failed
/// request, on the same instance, without a reload; no call hung.
async fn kill_and_restart_under_load(outage: Duration) -> Observed {
    let mut server = RedisServer::start().await;
    let host = server.addr();
    let config = serde_json::json!({
        "appId": "fault-redis-restart",
        "components": {"state": {"orders": {"type": "redis", "metadata": {
            "redisHost": host,
            "dialTimeout": format!("{}ms", DIAL.as_millis()),
            "readTimeout": format!("{}ms", READ.as_millis()),
            "writeTimeout": format!("{}ms", WRITE.as_millis())
        }}}}
    });
    let runtime = support::start(&config.to_string())
        .await
        .unwrap_or_else(|e| panic!("start failed: {e}"));
    let orders = ComponentKey::new("state", "orders");
    let instance = runtime
        .generation()
        .get(&orders)
        .cloned()
        .unwrap_or_else(|| panic!("state/orders is not running"));

    let phase = Arc::new(AtomicU8::new(BEFORE));
    let load = start_load(&runtime, &phase);
    sleep(Duration::from_millis(300)).await;

    // The outage.
    phase.store(OUTAGE_PHASE, Ordering::SeqCst);
    server.stop();
    sleep(outage).await;

    // Back on the same port, empty (no persistence).
    phase.store(RESTARTED, Ordering::SeqCst);
    server.restart().await;
    assert_eq!(server.addr(), host);
    wait_until_served(&runtime).await;
    // Let every loop finish the request it had started before recovery.
    sleep(CALL_LIMIT).await;
    phase.store(RECOVERED, Ordering::SeqCst);
    sleep(Duration::from_millis(500)).await;
    let seen = load.finish().await;
    let report = format!("{seen:#?}");

    // Before the outage: all good.
    assert!(
        total(&seen, |s| s.ok[0]) > 0,
        "no traffic before the outage: {report}"
    );
    assert_eq!(total(&seen, |s| s.failed[0]), 0, "{report}");
    // No call hung; every error names the Redis server.
    for s in &seen {
        for err in s.errors.iter().flatten() {
            assert!(!err.contains("HUNG"), "a call hung: {err}");
            assert!(
                err.contains(&format!("redis at {host}")),
                "the error does not name the Redis server: {err}"
            );
        }
    }
    // After the restart: every request succeeds again.
    assert!(
        total(&seen, |s| s.ok[3]) >= TASKS as u64,
        "no traffic after recovery: {report}"
    );
    assert_eq!(
        total(&seen, |s| s.failed[3]),
        0,
        "requests still fail after the restart: {report}"
    );

    // Same instance, no reload, no restart.
    assert!(runtime.history().is_empty(), "{:?}", runtime.history());
    assert_eq!(runtime.generation().number, 1);
    let now = runtime.generation().get(&orders).cloned();
    assert!(
        now.is_some_and(|now| now.same_as(&instance)),
        "state/orders was replaced"
    );
    drop(instance);
    runtime.shutdown().await;
    Observed { seen, host, report }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_load_recovers_without_a_reload() {
    let Observed { seen, host, report } = kill_and_restart_under_load(Duration::from_secs(3)).await;
    // Requests in flight when the server died failed, with an error that
    // names it (checked for every error above).
    assert!(
        total(&seen, |s| s.failed[1]) >= 1,
        "no request failed while the server was down: {report}"
    );
    assert!(
        seen.iter()
            .flat_map(|s| &s.errors[1])
            .any(|e| e.contains(&format!("redis at {host}"))),
        "{report}"
    );
}

/// Every call made while the server is down fails within the store's own
/// timeouts (a reconnection attempt bounded by `dialTimeout`, a command by
/// `readTimeout` + `writeTimeout`), rather than waiting for the server.
/// (The redis client alone would wait out its whole reconnection sequence,
/// about 5 s here: the store bounds every command itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_during_a_redis_outage_fail_within_the_configured_timeouts() {
    let Observed { seen, report, .. } = kill_and_restart_under_load(Duration::from_secs(4)).await;
    for p in [OUTAGE_PHASE, RESTARTED] {
        let longest = seen
            .iter()
            .map(|s| s.longest[usize::from(p)])
            .max()
            .unwrap_or_default();
        assert!(
            longest <= CALL_LIMIT,
            "a call {} took {longest:?}, beyond the configured timeouts \
             (dial {DIAL:?} + read {READ:?} + write {WRITE:?}, {CALL_LIMIT:?} with slack): {report}",
            PHASE_NAMES[usize::from(p)]
        );
    }
    // Four seconds down: every loop met the outage, and no request
    // started while the server was down succeeded.
    for (task, s) in seen.iter().enumerate() {
        assert!(
            s.failed[1] >= 2,
            "task {task} did not see the outage: {report}"
        );
    }
    assert_eq!(
        total(&seen, |s| s.ok[1]),
        0,
        "a request succeeded with the server down: {report}"
    );
}
