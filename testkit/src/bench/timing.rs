//! The timing loop: warm-up runs, then the median of measured runs, and
//! how much of it each mode (smoke, quick, full) does.

use std::future::Future;
use std::time::Duration;

/// How long the bench runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Invoked without `--bench` (by `cargo test --all-targets`): a pass
    /// through every measurement in a few seconds of a debug build.
    Smoke,
    /// `cargo bench` with `REWIRE_BENCH_QUICK=1`: about ten seconds.
    Quick,
    /// `cargo bench`: the numbers for docs/BENCHMARKS.md.
    Full,
}

impl Mode {
    /// The mode asked for by the command line and the environment.
    pub fn from_env() -> Self {
        let bench = std::env::args().any(|arg| arg == "--bench");
        let quick = std::env::var("REWIRE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        match (bench, quick) {
            (false, _) => Mode::Smoke,
            (true, true) => Mode::Quick,
            (true, false) => Mode::Full,
        }
    }

    /// Warm-up and measured runs of every measurement.
    pub fn plan(self) -> Plan {
        match self {
            Mode::Smoke => Plan { warmup: 0, runs: 1 },
            Mode::Quick => Plan { warmup: 1, runs: 3 },
            Mode::Full => Plan { warmup: 2, runs: 7 },
        }
    }

    /// Scales an operation count: full counts in `Full`, a tenth in
    /// `Quick`, a hundredth in `Smoke` (at least one).
    pub fn ops(self, full: u64) -> u64 {
        let scaled = match self {
            Mode::Full => full,
            Mode::Quick => full / 10,
            Mode::Smoke => full / 100,
        };
        scaled.max(1)
    }
}

/// Warm-up runs (discarded) and measured runs (median kept).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Runs made and thrown away first.
    pub warmup: u32,
    /// Runs whose median is reported.
    pub runs: u32,
}

impl Plan {
    /// Median over the measured runs of `run`, which returns the time of
    /// one run (so it can exclude its own setup and teardown).
    pub fn median(&self, mut run: impl FnMut() -> Duration) -> Duration {
        let mut samples = Vec::new();
        for i in 0..self.warmup + self.runs {
            let elapsed = run();
            if i >= self.warmup {
                samples.push(elapsed);
            }
        }
        median(samples)
    }

    /// [`Plan::median`] of an asynchronous run.
    pub async fn median_async<F, Fut>(&self, mut run: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Duration>,
    {
        let mut samples = Vec::new();
        for i in 0..self.warmup + self.runs {
            let elapsed = run().await;
            if i >= self.warmup {
                samples.push(elapsed);
            }
        }
        median(samples)
    }
}

impl Plan {
    /// Measures `variants` alternatives back to back in every run (so a
    /// change of machine load hits all of them alike); `run(v)` returns
    /// the time of one run of variant `v`.
    pub fn interleaved(
        &self,
        variants: usize,
        mut run: impl FnMut(usize) -> Duration,
    ) -> Interleaved {
        let mut samples = vec![Vec::new(); variants];
        for i in 0..self.warmup + self.runs {
            for (v, kept) in samples.iter_mut().enumerate() {
                let elapsed = run(v);
                if i >= self.warmup {
                    kept.push(elapsed);
                }
            }
        }
        Interleaved { samples }
    }
}

/// Per-run times of alternatives measured back to back.
pub struct Interleaved {
    samples: Vec<Vec<Duration>>,
}

impl Interleaved {
    /// Median time of variant `v`.
    pub fn median(&self, v: usize) -> Duration {
        median(self.samples[v].clone())
    }

    /// Median over runs of `a / b` within the same run, formatted as
    /// `1.23×`.
    pub fn ratio(&self, a: usize, b: usize) -> String {
        let mut ratios: Vec<f64> = self.samples[a]
            .iter()
            .zip(&self.samples[b])
            .filter(|(_, b)| !b.is_zero())
            .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        match ratios.get(ratios.len() / 2) {
            Some(r) => format!("{r:.2}×"),
            None => "n/a".into(),
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// `total` divided by `ops`.
pub fn per_op(total: Duration, ops: u64) -> Duration {
    let ops = u32::try_from(ops.max(1)).unwrap_or(u32::MAX);
    total / ops
}

/// A duration with a unit that keeps three significant figures.
pub fn human(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}
