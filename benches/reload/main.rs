//! The `reload` benchmark: how fast rewire reaches a component, reloads,
//! scales, and how many requests fail while it reloads — each against a
//! baseline measured in the same run. See docs/BENCHMARKS.md.
//!
//! `cargo bench --bench reload` runs it in full (about two minutes on two
//! cores); `REWIRE_BENCH_QUICK=1` makes it a ten-second pass. Invoked
//! without `--bench` (as `cargo test --all-targets` does) it makes a
//! smoke pass of a few seconds, so the test suite stays fast. Nothing here
//! asserts on time.

mod support;

use support::timing::Mode;

/// The `rewire` binary's allocator, so what is measured is what ships.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() {
    rewire::components::link();
    let mode = Mode::from_env();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let plan = mode.plan();
    println!(
        "# rewire reload bench ({mode:?} mode: {} warm-up + median of {} runs; {cores} cores, {cores} tokio workers)\n",
        plan.warmup, plan.runs
    );
    println!("Load average before: {}\n", load_average());
    let started = std::time::Instant::now();
    // `REWIRE_BENCH_ONLY=handle_load,scaling` runs those sections alone.
    let only = std::env::var("REWIRE_BENCH_ONLY").unwrap_or_default();
    let wanted = |section: &str| only.is_empty() || only.split(',').any(|s| s.trim() == section);
    if wanted("handle_load") {
        support::handle_load::run(&rt, mode);
    }
    if wanted("reload_latency") {
        support::reload_latency::run(&rt, mode);
    }
    if wanted("scaling") {
        support::scaling::run(&rt, mode);
    }
    if wanted("failed_requests") {
        support::failed_requests::run(&rt, mode);
    }
    if wanted("fleet") {
        support::fleet::run(&rt, mode);
    }
    println!(
        "Bench finished in {}; load average after: {}.",
        support::timing::human(started.elapsed()),
        load_average()
    );
}

/// The 1, 5 and 15 minute load averages (other work on the machine skews
/// the numbers), where the system tells them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}
