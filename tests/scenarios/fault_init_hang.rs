//! Fault: a reload rebuilds a component whose new `init` never answers (a
//! backend that accepts the connection and then says nothing). With an
//! init timeout of 300 ms the reload rolls back with step `InitTimeout`;
//! the old instance serves throughout — while four tasks keep calling it,
//! not one request fails — the hung init is abandoned (its future dropped,
//! its shutdown token cancelled), and later reloads apply, including one
//! queued behind the hung reload.

use crate::support::reload as reload_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reload_support::{action, apply_ok, candidate, instance, key, start_with, wait_until};
use rewire::prelude::*;
use rewire::{
    Action, FailedStep, Outcome, ReloadError, ReloadRecord, Runtime, RuntimeOptions, StartTimeouts,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The init timeout of every runtime here.
const INIT_TIMEOUT: Duration = Duration::from_millis(300);
/// Request loops.
const TASKS: usize = 4;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WorkerMeta {
    /// Names the instance in the counters (unique per test).
    tag: String,
    /// Any change of it rebuilds the component.
    rev: u64,
    /// `init` never answers.
    hang_init: bool,
}

/// Per tag: `init` calls, closes, and hung inits abandoned (future dropped).
#[derive(Default)]
struct Counters {
    inits: AtomicUsize,
    closes: AtomicUsize,
    abandoned: AtomicUsize,
}

static COUNTERS: Mutex<Option<HashMap<String, Arc<Counters>>>> = Mutex::new(None);
/// The shutdown tokens given to hung inits.
static HUNG_TOKENS: Mutex<Vec<CancellationToken>> = Mutex::new(Vec::new());

fn counters(tag: &str) -> Arc<Counters> {
    let mut guard = COUNTERS.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .get_or_insert_with(HashMap::new)
        .entry(tag.to_string())
        .or_default()
        .clone()
}

/// Counts the hung init as abandoned when its future is dropped.
struct AbandonGuard(Arc<Counters>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        self.0.abandoned.fetch_add(1, Ordering::SeqCst);
    }
}

/// A client of a remote store (shared data) that has no in-place path, so
/// every metadata change rebuilds it; it refuses calls once closed.
#[derive(rewire::Component)]
#[component(kind = "worker", type = "test.fault.hang")]
struct Worker {
    #[metadata]
    meta: WorkerMeta,
    closed: AtomicBool,
}

/// The "remote" data, shared by every instance.
static DATA: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

impl Worker {
    /// Writes `key` and reads it back; the revision of the instance that
    /// served.
    async fn round_trip(&self, key: &str, value: &str) -> Result<u64, String> {
        self.check_open()?;
        DATA.lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(key.to_string(), value.to_string());
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.check_open()?;
        let read = DATA
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|d| d.get(key).cloned());
        match read {
            Some(read) if read == value => Ok(self.meta.rev),
            other => Err(format!("{key}: read back {other:?}")),
        }
    }

    fn check_open(&self) -> Result<(), String> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(format!("instance rev {} already closed", self.meta.rev));
        }
        Ok(())
    }
}

#[async_trait]
impl Component for Worker {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let counters = counters(&self.meta.tag);
        counters.inits.fetch_add(1, Ordering::SeqCst);
        if self.meta.hang_init {
            HUNG_TOKENS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(cx.shutdown.clone());
            let _guard = AbandonGuard(counters);
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), ComponentError> {
        self.closed.store(true, Ordering::SeqCst);
        counters(&self.meta.tag)
            .closes
            .fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn config(tag: &str, rev: u64, hang_init: bool) -> String {
    format!(
        r#"{{"appId": "fault-init-hang", "components": {{
            "state": {{"cache": {{"type": "memory"}}}},
            "worker": {{"w": {{"type": "test.fault.hang",
                "metadata": {{"tag": "{tag}", "rev": {rev}, "hangInit": {hang_init}}}}}}}
        }}}}"#
    )
}

fn options() -> RuntimeOptions {
    RuntimeOptions {
        timeouts: StartTimeouts {
            init: INIT_TIMEOUT,
            ..StartTimeouts::default()
        },
        ..RuntimeOptions::default()
    }
}

/// Requests made by the loops: per task, the revisions that served and
/// the errors met.
struct Load {
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<(Vec<u64>, Vec<String>)>>,
}

/// `TASKS` loops, each round: through handles, write and read back a key
/// in the worker and in the memory state store.
fn start_load(runtime: &Runtime) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let tasks = (0..TASKS)
        .map(|task| {
            let worker = runtime.component(key("worker/w"));
            let cache = runtime.state_store("cache");
            let (stop, requests) = (stop.clone(), requests.clone());
            tokio::spawn(async move {
                let (mut served, mut errors) = (Vec::new(), Vec::new());
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (k, v) = (format!("t{task}-{}", n % 64), n.to_string());
                    let result = async {
                        let w = worker.load_as::<Worker>().map_err(|e| e.to_string())?;
                        let rev = w.round_trip(&k, &v).await?;
                        let store = cache.load().map_err(|e| e.to_string())?;
                        let set = rewire::SetRequest {
                            key: k.clone(),
                            value: v.clone().into_bytes(),
                            ..Default::default()
                        };
                        store.set(set).await.map_err(|e| e.to_string())?;
                        let get = rewire::GetRequest {
                            key: k.clone(),
                            ..Default::default()
                        };
                        match store.get(get).await.map_err(|e| e.to_string())? {
                            Some(entry) if entry.data == v.as_bytes() => Ok(rev),
                            other => Err(format!("state/cache {k}: read back {other:?}")),
                        }
                    }
                    .await;
                    requests.fetch_add(1, Ordering::SeqCst);
                    match result {
                        Ok(rev) => {
                            if served.last() != Some(&rev) {
                                served.push(rev);
                            }
                        }
                        Err(err) => errors.push(err),
                    }
                    tokio::task::yield_now().await;
                }
                (served, errors)
            })
        })
        .collect();
    Load {
        stop,
        requests,
        tasks,
    }
}

impl Load {
    /// Waits until `more` requests were made after now.
    async fn wait_for(&self, more: u64) {
        let target = self.requests.load(Ordering::SeqCst) + more;
        wait_until("the load makes progress", || {
            self.requests.load(Ordering::SeqCst) >= target
        })
        .await;
    }

    /// Stops the loops: per task, the revisions that served (in order)
    /// and the errors.
    async fn finish(self) -> Vec<(Vec<u64>, Vec<String>)> {
        self.stop.store(true, Ordering::SeqCst);
        let mut results = Vec::new();
        for task in self.tasks {
            results.push(task.await.expect("request loop"));
        }
        results
    }
}

fn rolled_back_on_timeout(result: &Result<ReloadRecord, ReloadError>) {
    let Err(ReloadError::RolledBack(failures)) = result else {
        panic!("the reload should roll back, got {result:?}");
    };
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].component, Some(key("worker/w")));
    assert_eq!(failures[0].step, FailedStep::InitTimeout);
    assert_eq!(
        failures[0].to_string(),
        format!("worker/w: init timed out: no answer within {INIT_TIMEOUT:?}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_init_in_a_reload_under_load_rolls_back_without_a_failed_request() {
    let runtime = start_with(&config("hul", 1, false), options()).await;
    let old = instance(&runtime, "worker/w");
    let old_cache = instance(&runtime, "state/cache");
    let load = start_load(&runtime);
    load.wait_for(50).await;

    let reload = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(candidate(&config("hul", 2, true))).await }
    });
    // While the new instance hangs in init, the old one serves.
    wait_until("the new instance is in init", || {
        counters("hul").inits.load(Ordering::SeqCst) == 2
    })
    .await;
    load.wait_for(50).await;
    assert_eq!(runtime.generation().number, 1);
    assert!(instance(&runtime, "worker/w").same_as(&old));
    let result = tokio::time::timeout(Duration::from_secs(10), reload)
        .await
        .expect("the reload did not end: the init timeout is not applied")
        .expect("reload task");
    rolled_back_on_timeout(&result);

    // Recorded as rolled back; nothing changed for callers.
    let history = runtime.history();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].outcome, Outcome::RolledBack);
    assert_eq!(history[0].generation, 1);
    let error = history[0].error.clone().unwrap_or_default();
    assert!(error.contains("worker/w: init timed out"), "{error}");
    assert_eq!(runtime.generation().number, 1);
    assert!(instance(&runtime, "worker/w").same_as(&old));
    assert!(instance(&runtime, "state/cache").same_as(&old_cache));
    // The hung init was abandoned: its future dropped, its shutdown token
    // cancelled, and the abandoned instance closed (close follows a failed
    // init); the serving instance was not closed.
    let counters_now = counters("hul");
    assert_eq!(
        counters_now.abandoned.load(Ordering::SeqCst),
        1,
        "the hung init is still running"
    );
    assert!(
        HUNG_TOKENS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .all(CancellationToken::is_cancelled),
        "the hung instance's shutdown token was not cancelled"
    );
    assert_eq!(
        counters_now.closes.load(Ordering::SeqCst),
        1,
        "only the abandoned instance is closed; the serving one is not"
    );

    // The old instance keeps serving; a later valid reload applies.
    load.wait_for(50).await;
    let record = apply_ok(&runtime, &config("hul", 3, false)).await;
    assert_eq!(record.generation, 2);
    assert_eq!(action(&record, "worker/w"), Action::Rebuilt);
    assert_eq!(action(&record, "state/cache"), Action::Unchanged);
    drop(old);
    wait_until("the replaced instance is closed", || {
        counters("hul").closes.load(Ordering::SeqCst) == 2
    })
    .await;
    load.wait_for(50).await;

    let results = load.finish().await;
    for (task, (served, errors)) in results.iter().enumerate() {
        assert!(
            errors.is_empty(),
            "task {task}: {} failed requests, first: {:?}",
            errors.len(),
            errors.first()
        );
        // Revision 1 until the valid reload, then revision 3; never 2.
        assert_eq!(
            served,
            &[1, 3],
            "task {task}: served by revisions {served:?}"
        );
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_queued_behind_a_hung_one_applies_after_the_timeout() {
    let runtime = start_with(&config("hq", 1, false), options()).await;
    let hung = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(candidate(&config("hq", 2, true))).await }
    });
    wait_until("the hung init started", || {
        counters("hq").inits.load(Ordering::SeqCst) == 2
    })
    .await;
    // Queued while the first reload hangs; reloads are serialised.
    let queued = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.apply(candidate(&config("hq", 3, false))).await }
    });
    let hung = tokio::time::timeout(Duration::from_secs(10), hung)
        .await
        .expect("the hung reload did not end")
        .expect("reload task");
    rolled_back_on_timeout(&hung);
    let queued = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued reload did not end")
        .expect("reload task")
        .expect("the queued reload failed");
    assert_eq!(queued.outcome, Outcome::Applied);
    assert_eq!(queued.generation, 2);
    assert_eq!(action(&queued, "worker/w"), Action::Rebuilt);
    let served = runtime
        .component(key("worker/w"))
        .load_as::<Worker>()
        .unwrap();
    assert_eq!(served.meta.rev, 3);
    drop(served);
    let outcomes: Vec<Outcome> = runtime.history().iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::RolledBack, Outcome::Applied]);
    assert_eq!(counters("hq").abandoned.load(Ordering::SeqCst), 1);
    runtime.shutdown().await;
}
