//! The `soak` benchmark: hours-long behaviour in minutes. Request loops
//! write and read back keys in a memory state store (through a
//! `StateStoreHandle`) and in a custom component whose init takes ~10 ms
//! (through a `ComponentHandle`) while a reload is applied every 100 ms:
//! in-place metadata changes alternating with rebuilds of the custom
//! component, plus now and then an invalid candidate (must be rejected) and
//! one whose init fails (must roll back). It reports requests and failures,
//! reload outcomes and latency percentiles, and the resident set size
//! against the warm-up baseline measured in the same run. See
//! docs/BENCHMARKS.md, section "Soak".
//!
//! `REWIRE_SOAK_SECS=600 cargo bench --bench soak` soaks for ten minutes
//! (default 60 s; `REWIRE_SOAK_TASKS` sets the number of request loops,
//! default 8; `REWIRE_SOAK_RELOAD_MS` the time between reloads, default
//! 100, 0 for the load alone). Invoked without `--bench` (as `cargo test --all-targets`
//! does) it runs for about two seconds. It exits non-zero if any request
//! failed, a reload ended otherwise than it must, or a replaced instance
//! was never freed. Nothing here asserts on time.

mod soak_backend;
mod soak_histogram;
mod soak_load;
mod soak_reloads;
mod soak_report;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rewire::config::{parse, validate};
use rewire::{Registry, Runtime, RuntimeOptions};

use soak_histogram::Histogram;
use soak_load::{Load, Tally};
use soak_reloads::{Kind, Reloads};
use soak_report::{human, load_average, mib, print_table, rss_kib, RssTrend};

/// How long and how hard the soak runs.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Invoked with `--bench`.
    bench: bool,
    /// Load and reloads run this long.
    duration: Duration,
    /// The RSS baseline is taken after this.
    warmup: Duration,
    /// Request loops.
    tasks: usize,
    /// Time between two reloads (`None`: no reloads, load alone).
    reload_every: Option<Duration>,
    /// RSS is sampled this often after the warm-up.
    sample_every: Duration,
    /// A progress line is printed this often (`None`: never).
    progress_every: Option<Duration>,
}

impl Plan {
    fn from_env() -> Self {
        let bench = std::env::args().any(|arg| arg == "--bench");
        if !bench {
            return Self {
                bench,
                duration: Duration::from_secs(2),
                warmup: Duration::from_millis(500),
                tasks: 4,
                reload_every: Some(soak_reloads::PERIOD),
                sample_every: Duration::from_millis(250),
                progress_every: None,
            };
        }
        let number = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let duration = Duration::from_secs(number("REWIRE_SOAK_SECS").unwrap_or(60));
        Self {
            bench,
            duration,
            warmup: (duration / 10).clamp(Duration::from_secs(1), Duration::from_secs(60)),
            tasks: number("REWIRE_SOAK_TASKS").map_or(8, |n| n as usize),
            reload_every: match std::env::var("REWIRE_SOAK_RELOAD_MS") {
                Ok(v) if v.trim() == "0" => None,
                _ => Some(
                    number("REWIRE_SOAK_RELOAD_MS")
                        .map_or(soak_reloads::PERIOD, Duration::from_millis),
                ),
            },
            sample_every: Duration::from_secs(5),
            progress_every: Some(
                (duration / 10).clamp(Duration::from_secs(5), Duration::from_secs(60)),
            ),
        }
    }
}

/// What the run measured.
struct Measured {
    tally: Arc<Tally>,
    reloads: Reloads,
    rss_start: Option<u64>,
    rss_warm: Option<u64>,
    rss_end: Option<u64>,
    trend: RssTrend,
    /// Time from the warm-up baseline to the end sample.
    after_warmup: Duration,
    /// Backend instances alive once replaced ones were drained.
    alive_after_drain: usize,
    /// Backend instances alive after shutdown.
    alive_after_shutdown: usize,
}

/// The `rewire` binary's allocator, so what is measured is what ships.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: rewire::MiMalloc = rewire::MiMalloc;

fn main() -> ExitCode {
    rewire::components::link();
    let plan = Plan::from_env();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "# rewire soak ({} mode: {} of load, {} request loops, {}; {cores} cores, {cores} tokio workers)\n",
        if plan.bench { "bench" } else { "smoke" },
        human(plan.duration),
        plan.tasks,
        plan.reload_every
            .map_or("no reloads".into(), |every| format!("a reload every {}", human(every)))
    );
    println!("Load average before: {}\n", load_average());
    let started = Instant::now();
    let measured =
        rt.block_on(async move { tokio::spawn(soak(plan)).await.expect("soak task failed") });
    let healthy = report(&plan, measured);
    println!(
        "Soak finished in {}; load average after: {}.",
        human(started.elapsed()),
        load_average()
    );
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn soak(plan: Plan) -> Measured {
    let rss_start = rss_kib();
    let registry = Registry::collected();
    let initial =
        parse(soak_reloads::initial_text().as_bytes()).expect("soak config does not parse");
    let initial = validate(initial, &registry).expect("soak config is invalid");
    let runtime = Runtime::start(initial, registry, RuntimeOptions::default())
        .await
        .expect("start failed");

    let tally = Arc::new(Tally::default());
    let load = Load::start(&runtime, plan.tasks, &tally);
    let stop_reloads = Arc::new(AtomicBool::new(false));
    let reloader = plan.reload_every.map(|every| {
        tokio::spawn(soak_reloads::run(
            runtime.clone(),
            every,
            stop_reloads.clone(),
        ))
    });

    let started = Instant::now();
    tokio::time::sleep(plan.warmup).await;
    let rss_warm = rss_kib();
    let warm_at = Instant::now();
    let mut trend = RssTrend::default();
    if let Some(kib) = rss_warm {
        trend.push(0.0, kib);
    }
    let mut next_progress = plan.progress_every.map(|every| started + every);
    let end = started + plan.duration;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep(plan.sample_every.min(end - now)).await;
        if let Some(kib) = rss_kib() {
            trend.push(warm_at.elapsed().as_secs_f64(), kib);
        }
        if let (Some(at), Some(every)) = (next_progress, plan.progress_every) {
            if Instant::now() >= at {
                println!(
                    "[{:>5} s] requests {} failed {} generation {} RSS {} load {}",
                    started.elapsed().as_secs(),
                    tally.requests(),
                    tally.failed(),
                    runtime.generation().number,
                    rss_kib().map_or("?".into(), mib),
                    load_average()
                );
                next_progress = Some(at + every);
            }
        }
    }
    let rss_end = rss_kib();
    let after_warmup = warm_at.elapsed();
    stop_reloads.store(true, Ordering::Relaxed);
    let reloads = match reloader {
        Some(reloader) => reloader.await.expect("reload loop failed"),
        None => Reloads::default(),
    };
    load.stop().await;

    // Replaced instances are closed once their users let go (or after the
    // drain grace, 10 s): give them that long to be freed.
    let deadline = Instant::now() + runtime.options().drain_grace + Duration::from_secs(5);
    while soak_backend::alive() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let alive_after_drain = soak_backend::alive();
    runtime.shutdown().await;
    drop(runtime);
    let alive_after_shutdown = soak_backend::alive();
    Measured {
        tally,
        reloads,
        rss_start,
        rss_warm,
        rss_end,
        trend,
        after_warmup,
        alive_after_drain,
        alive_after_shutdown,
    }
}

/// Prints the report; whether the run was healthy.
fn report(plan: &Plan, m: Measured) -> bool {
    println!();
    let failed = report_requests(&m.tally);
    let anomalies = report_reloads(plan, &m.reloads);
    report_memory(plan, &m);

    println!("## Instances of soak/backend\n");
    println!(
        "init called {} times (failed attempts included), close {} times; alive once replaced ones were drained: {} \
         (expected 1); after shutdown: {} (expected 0).\n",
        soak_backend::inits(),
        soak_backend::closes(),
        m.alive_after_drain,
        m.alive_after_shutdown
    );
    let leaked = m.alive_after_drain > 1 || m.alive_after_shutdown > 0;

    let healthy = failed == 0 && anomalies == 0 && !leaked;
    if healthy {
        println!(
            "Verdict: no request failed, every reload ended as it must, no instance leaked.\n"
        );
    } else {
        println!(
            "Verdict: FAILED ({failed} failed requests, {anomalies} unexpected reload outcomes, leaked instances: {leaked}).\n"
        );
    }
    healthy
}

/// Prints the request table; the number of failed requests.
fn report_requests(tally: &Tally) -> u64 {
    println!("## Requests (each: set a key, read it back)\n");
    let row = |target: &str, requests: u64, failed: u64| {
        vec![
            target.to_string(),
            requests.to_string(),
            failed.to_string(),
            format!("{:.4}%", 100.0 * failed as f64 / requests.max(1) as f64),
        ]
    };
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    print_table(
        &["target", "requests", "failed", "failure rate"],
        &[
            row(
                "state/cache (memory, `StateStoreHandle`)",
                load(&tally.cache_requests),
                load(&tally.cache_failed),
            ),
            row(
                "soak/backend (custom, `ComponentHandle`)",
                load(&tally.backend_requests),
                load(&tally.backend_failed),
            ),
            row("total", tally.requests(), tally.failed()),
        ],
    );
    for err in tally.first_errors() {
        println!("* failed: {err}");
    }
    tally.failed()
}

/// Prints the reload tables; the number of unexpected outcomes.
fn report_reloads(plan: &Plan, reloads: &Reloads) -> usize {
    let Some(every) = plan.reload_every else {
        println!("## Reloads\n\nNone (`REWIRE_SOAK_RELOAD_MS=0`): the load alone.\n");
        return 0;
    };
    println!(
        "## Reloads (one every {}; latency = parse + `Runtime::apply`, percentiles to within 1%)\n",
        human(every)
    );
    println!(
        "{} reloads: {} applied, {} rejected, {} rolled back; {} ended otherwise than they must.\n",
        reloads.total(),
        reloads.applied,
        reloads.rejected,
        reloads.rolled_back,
        reloads.anomalies.len()
    );
    let mut rows = Vec::new();
    let mut p50s = Vec::new();
    let mut row = |label: &str, samples: &Histogram| {
        let p50 = samples.percentile(50.0);
        p50s.push(p50);
        rows.push(vec![
            label.to_string(),
            samples.len().to_string(),
            human(p50),
            human(samples.percentile(90.0)),
            human(samples.percentile(99.0)),
            human(samples.max()),
        ]);
    };
    for (slot, kind) in Kind::ALL.iter().enumerate() {
        row(kind.label(), &reloads.latencies[slot]);
    }
    row("all", &reloads.all_latencies());
    print_table(&["reload", "count", "p50", "p90", "p99", "max"], &rows);
    if let (Some(in_place), Some(rebuild)) = (p50s.first(), p50s.get(1)) {
        if !in_place.is_zero() {
            println!(
                "Rebuild p50 / in-place p50: {:.1}× (the rebuild waits for the backend's {} ms init).\n",
                rebuild.as_secs_f64() / in_place.as_secs_f64(),
                soak_reloads::INIT_MS
            );
        }
    }
    for anomaly in &reloads.anomalies {
        println!("* unexpected: {anomaly}");
    }
    reloads.anomalies.len()
}

fn report_memory(plan: &Plan, m: &Measured) {
    println!("## Memory (VmRSS)\n");
    let Some(warm) = m.rss_warm.filter(|w| *w > 0) else {
        println!("VmRSS is not available on this system.\n");
        return;
    };
    let ratio =
        |kib: Option<u64>| kib.map_or("?".into(), |k| format!("{:.3}×", k as f64 / warm as f64));
    let cell = |kib: Option<u64>| kib.map_or("?".into(), mib);
    print_table(
        &["point", "RSS", "vs warm-up"],
        &[
            vec![
                "start (before the runtime)".into(),
                cell(m.rss_start),
                ratio(m.rss_start),
            ],
            vec![
                format!("after warm-up ({})", human(plan.warmup)),
                cell(Some(warm)),
                "1.000×".into(),
            ],
            vec![
                "peak after warm-up".into(),
                cell(m.trend.peak()),
                ratio(m.trend.peak()),
            ],
            vec![
                format!("end ({} after warm-up)", human(m.after_warmup)),
                cell(m.rss_end),
                ratio(m.rss_end),
            ],
        ],
    );
    let minutes = m.after_warmup.as_secs_f64() / 60.0;
    if let (Some(end), true) = (m.rss_end, minutes > 0.0) {
        let per_min = (end as f64 - warm as f64) / minutes;
        println!(
            "Growth, end against warm-up: {per_min:+.1} KiB/min = {:+.3}% of the warm-up RSS per minute.",
            100.0 * per_min / warm as f64
        );
    }
    if let Some(slope) = m.trend.slope_kib_per_min() {
        println!(
            "Growth, least-squares slope over {} samples: {slope:+.1} KiB/min = {:+.3}% of the warm-up RSS per minute.",
            m.trend.len(),
            100.0 * slope / warm as f64
        );
    }
    println!();
}
