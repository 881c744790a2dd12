//! Measurement 4, failed requests while a state store is reloaded under
//! load: rewire (build, swap, drain, then close) against close-then-init
//! (Dapr's strategy), the latter implemented here only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rewire::{Action, GetRequest, Registry, Runtime, RuntimeOptions, StateStore, StateStoreHandle};

use super::components::{SlowStore, SlowStoreMetadata};
use super::timing::{human, Mode};
use super::{on_worker, parsed, print_table, valid};

/// How long the store's init (its backend connection) takes.
const INIT_MS: u64 = 5;
/// How long a request spends at the backend.
const IO_MS: u64 = 1;
/// Pause between two reloads.
const PAUSE: Duration = Duration::from_millis(5);

fn config(meta: SlowStoreMetadata) -> String {
    serde_json::json!({"components": {"state": {"orders": {"type": "bench.slow", "metadata": {
        "initMs": meta.init_ms, "ioMs": meta.io_ms, "epoch": meta.epoch, "shape": meta.shape
    }}}}})
    .to_string()
}

/// The metadata of reload `i`: even reloads change `epoch` (in place),
/// odd ones `shape` (a rebuild).
fn metadata_of(i: u64) -> SlowStoreMetadata {
    SlowStoreMetadata {
        init_ms: INIT_MS,
        io_ms: IO_MS,
        epoch: i.div_ceil(2),
        shape: i / 2,
    }
}

/// Requests made and requests failed.
#[derive(Default)]
struct Tally {
    total: AtomicU64,
    failed: AtomicU64,
}

impl Tally {
    fn count(&self, ok: bool) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn read(&self) -> (u64, u64) {
        (
            self.failed.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// Where a strategy's requests go.
#[derive(Clone)]
enum Target {
    Rewire(StateStoreHandle),
    CloseThenInit(Arc<RwLock<Option<Arc<SlowStore>>>>),
}

impl Target {
    async fn request(&self) -> bool {
        let store: Option<Arc<dyn StateStore>> = match self {
            Target::Rewire(handle) => handle.load().ok(),
            Target::CloseThenInit(slot) => slot
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .map(|s| s as Arc<dyn StateStore>),
        };
        match store {
            Some(store) => store.get(GetRequest::default()).await.is_ok(),
            None => false,
        }
    }
}

/// Runs `tasks` request loops against `target` until `stop`.
fn load(
    target: &Target,
    tasks: usize,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (target, tally, stop) = (target.clone(), tally.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    tally.count(target.request().await);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect()
}

/// One strategy's result.
struct Run {
    failed: u64,
    total: u64,
    window: Duration,
}

/// Measures and prints the failed-request table.
pub fn run(rt: &tokio::runtime::Runtime, mode: Mode) {
    let (reloads, tasks) = match mode {
        Mode::Smoke => (10, 4),
        Mode::Quick | Mode::Full => (100, 16),
    };
    println!(
        "## 4. Failed requests during {reloads} reloads under load ({tasks} request loops; init {INIT_MS} ms, \
         request {IO_MS} ms, {} ms between reloads)\n",
        PAUSE.as_millis()
    );
    let (rewire, in_place, rebuilt) = rt.block_on(on_worker(rewire_run(reloads, tasks)));
    let dapr = rt.block_on(on_worker(close_then_init_run(reloads, tasks)));
    let rate = |r: &Run| r.failed as f64 / r.total.max(1) as f64;
    let rows = vec![
        vec![
            format!("rewire (`Runtime::apply`: {in_place} in place, {rebuilt} rebuilt)"),
            format!("{} / {}", rewire.failed, rewire.total),
            format!("{:.2}%", 100.0 * rate(&rewire)),
            human(rewire.window),
        ],
        vec![
            format!("close-then-init (Dapr style: {reloads} close + init)"),
            format!("{} / {}", dapr.failed, dapr.total),
            format!("{:.2}%", 100.0 * rate(&dapr)),
            human(dapr.window),
        ],
    ];
    print_table(
        &[
            "strategy",
            "failed / total",
            "failure rate",
            "reload window",
        ],
        &rows,
    );
    if rewire.failed == 0 {
        println!("Failure-rate ratio close-then-init / rewire: ∞ (rewire failed none).\n");
    } else {
        println!(
            "Failure-rate ratio close-then-init / rewire: {:.1}×.\n",
            rate(&dapr) / rate(&rewire)
        );
    }
}

/// rewire: the handle serves the old instance until the new one is ready;
/// the old one is closed once its in-flight requests are done.
async fn rewire_run(reloads: u64, tasks: usize) -> (Run, usize, usize) {
    let registry = Registry::collected();
    let initial = valid(&config(metadata_of(0)), &registry);
    let runtime = Runtime::start(initial, registry, RuntimeOptions::default())
        .await
        .expect("start failed");
    let target = Target::Rewire(runtime.state_store("orders"));
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let workers = load(&target, tasks, &tally, &stop);
    let (mut in_place, mut rebuilt) = (0, 0);
    let started = Instant::now();
    for i in 1..=reloads {
        let record = runtime
            .apply(parsed(&config(metadata_of(i))))
            .await
            .expect("reload failed");
        match record.actions.get("state/orders") {
            Some(Action::UpdatedInPlace) => in_place += 1,
            Some(Action::Rebuilt) => rebuilt += 1,
            other => panic!("unexpected reload action: {other:?}"),
        }
        tokio::time::sleep(PAUSE).await;
    }
    let window = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    runtime.shutdown().await;
    let (failed, total) = tally.read();
    (
        Run {
            failed,
            total,
            window,
        },
        in_place,
        rebuilt,
    )
}

/// Close-then-init: every reload takes the store out, closes it, inits the
/// new one and puts it back; requests in between find no store, and
/// requests in flight at the close fail.
async fn close_then_init_run(reloads: u64, tasks: usize) -> Run {
    let slot = Arc::new(RwLock::new(Some(Arc::new(
        SlowStore::open(metadata_of(0)).await,
    ))));
    let target = Target::CloseThenInit(slot.clone());
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let workers = load(&target, tasks, &tally, &stop);
    let started = Instant::now();
    for i in 1..=reloads {
        let old = slot.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(old) = old {
            let _ = rewire::Component::close(old.as_ref()).await;
        }
        let new = Arc::new(SlowStore::open(metadata_of(i)).await);
        *slot.write().unwrap_or_else(|p| p.into_inner()) = Some(new);
        tokio::time::sleep(PAUSE).await;
    }
    let window = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    let (failed, total) = tally.read();
    Run {
        failed,
        total,
        window,
    }
}
