//! Measurement 1, reaching a component: rewire's handle against the
//! lookups other runtimes use, on one and two threads.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex, RwLock};
use std::time::{Duration, Instant};

use rewire::{ComponentKey, Registry, Runtime, RuntimeOptions, StateStore};

use super::timing::{human, per_op, Mode};
use super::{print_table, valid};

/// State stores in the runtime and in the maps (the lookup is not alone).
const STORES: usize = 8;
/// The store every lookup asks for.
const TARGET: &str = "store-5";

/// Measures and prints the lookup table.
pub fn run(rt: &tokio::runtime::Runtime, mode: Mode) {
    println!("## 1. Handle load vs alternatives (lookup + Arc clone, {STORES} state stores)\n");
    let stores: serde_json::Map<String, serde_json::Value> = (0..STORES)
        .map(|i| (format!("store-{i}"), serde_json::json!({"type": "memory"})))
        .collect();
    let text = serde_json::json!({"components": {"state": stores}}).to_string();
    let registry = Registry::collected();
    let config = valid(&text, &registry);
    let runtime = rt
        .block_on(Runtime::start(config, registry, RuntimeOptions::default()))
        .expect("start failed");
    let handle = runtime.state_store(TARGET);
    let key = ComponentKey::new("state", TARGET);
    let instances: HashMap<String, Arc<dyn StateStore>> = (0..STORES)
        .map(|i| {
            let name = format!("store-{i}");
            let store = runtime
                .state_store(&name)
                .load()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, store)
        })
        .collect();
    // The floor of any lookup that hands out an `Arc`: its clone and drop
    // alone, two writes of the shared reference count (what these cost
    // differs from one CPU to another).
    let floor = Arc::clone(&instances[TARGET]);
    let rwlock = RwLock::new(instances.clone());
    let mutex = Mutex::new(instances);

    let names = [
        "`RwLock<HashMap>` get + clone (baseline)",
        "`Mutex<HashMap>` get + clone (FireFly style)",
        "rewire `StateStoreHandle::load()`",
        "rewire `StateStoreHandle::borrow()` (no clone)",
        "rewire `runtime.generation()` + get + clone",
        "floor: `Arc` clone + drop alone (no lookup)",
    ];
    let lookups: [&(dyn Fn() + Sync); 6] = [
        &|| {
            let map = rwlock.read().unwrap_or_else(|p| p.into_inner());
            black_box(map.get(black_box(TARGET)).cloned());
        },
        &|| {
            let map = mutex.lock().unwrap_or_else(|p| p.into_inner());
            black_box(map.get(black_box(TARGET)).cloned());
        },
        &|| {
            black_box(black_box(&handle).load().ok());
        },
        &|| {
            let borrowed = black_box(&handle).borrow();
            black_box(borrowed.as_deref().ok().map(|store| store as *const _));
        },
        &|| {
            let generation = runtime.generation();
            black_box(generation.get(black_box(&key)).cloned());
        },
        &|| {
            black_box(Arc::clone(black_box(&floor)));
        },
    ];
    let ops = mode.ops(2_000_000);
    let mut rows = Vec::new();
    for threads in [1, 2] {
        // All are measured back to back in every run.
        let times = mode
            .plan()
            .interleaved(lookups.len(), |v| threaded(threads, ops, lookups[v]));
        for (v, name) in names.iter().enumerate() {
            rows.push(vec![
                name.to_string(),
                threads.to_string(),
                human(times.median(v)),
                times.ratio(v, 0),
                times.ratio(v, 1),
            ]);
        }
    }
    print_table(
        &[
            "lookup",
            "threads",
            "time/op (per thread)",
            "vs RwLock",
            "vs Mutex",
        ],
        &rows,
    );
    rt.block_on(runtime.shutdown());
}

/// Time per call of `f` when `threads` threads call it `ops` times each at
/// once (the slowest thread's time per call).
fn threaded(threads: usize, ops: u64, f: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(threads);
    let slowest = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    let started = Instant::now();
                    for _ in 0..ops {
                        f();
                    }
                    started.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("bench thread panicked"))
            .max()
            .unwrap_or_default()
    });
    per_op(slowest, ops)
}
