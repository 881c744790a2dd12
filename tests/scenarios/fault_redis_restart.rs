//! Fault: the Redis server behind a `redis` state store is killed under
//! load and started again on the same port. Four tasks keep writing and
//! reading back keys through `runtime.state_store(..)` handles. During the
//! outage every request fails with an error that names the Redis server —
//! no panic; a call made while it is down is cut by the store's own bound
//! on its configured timeouts, and says so. Once
//! the server is back, requests succeed again on the very same instance:
//! no rewire restart, no reload (the history stays empty, generation 1).

use crate::support;
use testkit::redis as redis_server;

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
/// How long the loops get to finish a call started before recovery: every
/// configured timeout in a row (a reconnection, then a command sent and
/// answered), plus scheduling slack for a loaded machine.
const CALL_LIMIT: Duration = Duration::from_millis(1500 + 1000);
/// A call that takes longer than this is a hang (keeps a broken build from
/// hanging the suite).
const HANG_GUARD: Duration = Duration::from_secs(15);

/// Phases of the scenario. A request records the phase it started in and
/// the one it ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// The server is up.
    Before = 0,
    /// The server is being killed (a request may still get through).
    Killing = 1,
    /// The server is dead.
    Down = 2,
    /// The server is starting again on the same port.
    Restarting = 3,
    /// Requests were served again, and every loop has finished the request
    /// it had started before.
    Recovered = 4,
}

impl Phase {
    fn from_u8(n: u8) -> Self {
        match n {
            0 => Phase::Before,
            1 => Phase::Killing,
            2 => Phase::Down,
            3 => Phase::Restarting,
            _ => Phase::Recovered,
        }
    }
}

/// The phase of the scenario, shared with the loops.
#[derive(Clone, Default)]
struct PhaseCell(Arc<AtomicU8>);

impl PhaseCell {
    fn get(&self) -> Phase {
        Phase::from_u8(self.0.load(Ordering::SeqCst))
    }

    fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::SeqCst);
    }
}

/// One request as a loop saw it.
#[derive(Debug, Clone)]
struct Request {
    started: Phase,
    ended: Phase,
    /// The longer of its two calls (set, get).
    longest: Duration,
    error: Option<String>,
}

impl Request {
    /// Started and ended in `phase`.
    fn within(&self, phase: Phase) -> bool {
        self.started == phase && self.ended == phase
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Request>>>,
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

fn start_load(runtime: &Runtime, phase: &PhaseCell) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..TASKS)
        .map(|task| {
            let handle = runtime.state_store("orders");
            let (stop, phase) = (stop.clone(), phase.clone());
            tokio::spawn(async move {
                let mut requests = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let started = phase.get();
                    let key = format!("t{task}-{}", n % 100);
                    let value = n.to_string().into_bytes();
                    let mut longest = Duration::ZERO;
                    let result = request(&handle, key, value, &mut longest).await;
                    let failed = result.is_err();
                    requests.push(Request {
                        started,
                        ended: phase.get(),
                        longest,
                        error: result.err(),
                    });
                    if failed {
                        // A failing client backs off a little, as real
                        // ones do.
                        sleep(Duration::from_millis(10)).await;
                    }
                    sleep(Duration::from_millis(1)).await;
                }
                requests
            })
        })
        .collect();
    Load { stop, tasks }
}

impl Load {
    /// Stops the loops: per task, every request it made.
    async fn finish(self) -> Vec<Vec<Request>> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        for task in self.tasks {
            // A panic in a request would surface here.
            all.push(task.await.expect("request loop panicked"));
        }
        all
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

/// What the loops saw, and the server's address.
struct Observed {
    tasks: Vec<Vec<Request>>,
    host: String,
}

impl Observed {
    fn all(&self) -> impl Iterator<Item = &Request> {
        self.tasks.iter().flatten()
    }

    /// (succeeded, failed) among the requests that pass `pick`.
    fn count(&self, pick: impl Fn(&Request) -> bool) -> (usize, usize) {
        let picked: Vec<&Request> = self.all().filter(|r| pick(r)).collect();
        let failed = picked.iter().filter(|r| r.error.is_some()).count();
        (picked.len() - failed, failed)
    }

    /// A summary for assertion messages: per phase pair, counts, the
    /// longest call and the first errors.
    fn report(&self) -> String {
        let mut lines = Vec::new();
        for started in 0..=4 {
            for ended in started..=4 {
                let (started, ended) = (Phase::from_u8(started), Phase::from_u8(ended));
                let of = |r: &&Request| r.started == started && r.ended == ended;
                let picked: Vec<&Request> = self.all().filter(of).collect();
                if picked.is_empty() {
                    continue;
                }
                let failed: Vec<&String> = picked.iter().filter_map(|r| r.error.as_ref()).collect();
                let longest = picked.iter().map(|r| r.longest).max().unwrap_or_default();
                lines.push(format!(
                    "{started:?} -> {ended:?}: {} ok, {} failed, longest call {longest:?}, first errors {:?}",
                    picked.len() - failed.len(),
                    failed.len(),
                    failed.iter().take(3).collect::<Vec<_>>()
                ));
            }
        }
        lines.join("\n")
    }
}

/// Starts Redis and a runtime with a `redis` state store on it, runs the
/// load, kills the server for `outage`, restarts it on the same port, and
/// waits until requests are served again. Checks what must hold whatever
/// the outage: traffic before it, recovery after it with no failed
/// request, on the same instance, without a reload; no call hung, every
/// error names the server.
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
        .expect("start failed");
    let orders = ComponentKey::new("state", "orders");
    let instance = runtime
        .generation()
        .get(&orders)
        .cloned()
        .expect("state/orders is not running");

    let phase = PhaseCell::default();
    let load = start_load(&runtime, &phase);
    sleep(Duration::from_millis(300)).await;

    // The outage.
    phase.set(Phase::Killing);
    server.stop();
    phase.set(Phase::Down);
    sleep(outage).await;

    // Back on the same port, empty (no persistence).
    phase.set(Phase::Restarting);
    server.restart().await;
    assert_eq!(server.addr(), host);
    wait_until_served(&runtime).await;
    // Let every loop finish the request it had started before recovery.
    sleep(CALL_LIMIT).await;
    phase.set(Phase::Recovered);
    sleep(Duration::from_millis(500)).await;
    let observed = Observed {
        tasks: load.finish().await,
        host,
    };
    let report = observed.report();

    // Before the outage: all good.
    let (ok, failed) = observed.count(|r| r.within(Phase::Before));
    assert!(ok > 0, "no traffic before the outage:\n{report}");
    assert_eq!(failed, 0, "{report}");
    // No call hung; every error names the Redis server.
    for err in observed.all().filter_map(|r| r.error.as_ref()) {
        assert!(!err.contains("HUNG"), "a call hung: {err}");
        assert!(
            err.contains(&format!("redis at {}", observed.host)),
            "the error does not name the Redis server: {err}"
        );
    }
    // A request made while the server was dead cannot succeed.
    let (ok, _) = observed.count(|r| r.within(Phase::Down));
    assert_eq!(ok, 0, "a request succeeded with the server down:\n{report}");
    // After the restart: every request succeeds again.
    let (ok, failed) = observed.count(|r| r.within(Phase::Recovered));
    assert!(ok >= TASKS, "no traffic after recovery:\n{report}");
    assert_eq!(
        failed, 0,
        "requests still fail after the restart:\n{report}"
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
    observed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_load_recovers_without_a_reload() {
    let observed = kill_and_restart_under_load(Duration::from_secs(3)).await;
    // Requests met the outage and failed, each with an error that names
    // the server (checked for every error above).
    let (_, failed) = observed.count(|r| r.started >= Phase::Killing && r.ended <= Phase::Down);
    assert!(
        failed >= 1,
        "no request failed while the server was down:\n{}",
        observed.report()
    );
}

/// A call made while the server is down does not wait for it: it is cut
/// by the store's own bound — `dialTimeout` + `readTimeout` +
/// `writeTimeout` on a command (`components/src/redis/bounded.rs`),
/// `dialTimeout` on a reconnection — and fails with that bound's error
/// (or fails at once on the dropped connection). (The redis client alone
/// would wait out its whole reconnection sequence, about 5 s here: the
/// store bounds every command itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_during_a_redis_outage_fail_within_the_configured_timeouts() {
    let observed = kill_and_restart_under_load(Duration::from_secs(4)).await;
    let report = observed.report();
    let command_cut = format!(
        "no answer within {:?} (dialTimeout + readTimeout + writeTimeout)",
        DIAL + READ + WRITE
    );
    let dial_cut = format!("no verified connection within {DIAL:?} (`dialTimeout`)");
    // Four seconds down, a call cut at 1.5 s: every loop sees the call it
    // has out when the server dies (or the next) cut by the bound, and the
    // next one too, both before the restart (about 3 s). (The first call
    // on the dropped connection may fail at once instead, with the
    // socket's own error: failing, not waiting, all the same.)
    for (task, requests) in observed.tasks.iter().enumerate() {
        let errors: Vec<&String> = requests
            .iter()
            .filter(|r| (Phase::Killing..=Phase::Down).contains(&r.ended))
            .filter_map(|r| r.error.as_ref())
            .collect();
        let cut = errors
            .iter()
            .filter(|err| err.contains(&command_cut) || err.contains(&dial_cut))
            .count();
        assert!(
            cut >= 2,
            "task {task}: {cut} of its calls that ended while the server was down were \
             cut by the store's bound ({command_cut:?} or {dial_cut:?}), not two; its errors: \
             {errors:?}\n{report}"
        );
    }
}
