//! The soak's reloads: one every 100 ms, alternating an in-place metadata
//! change and a rebuild of the backend (whose init takes ~10 ms), with an
//! invalid candidate (must be rejected) and a candidate whose init fails
//! (must roll back) now and then. Each reload's latency and outcome are
//! recorded; any other outcome is an anomaly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rewire::config::parse;
use rewire::{Action, FailedStep, Outcome, ReloadError, Runtime};

use super::soak_histogram::Histogram;

/// Time between two reloads, unless `REWIRE_SOAK_RELOAD_MS` says
/// otherwise.
pub const PERIOD: Duration = Duration::from_millis(100);
/// The backend's init delay.
pub const INIT_MS: u64 = 10;
/// Time a backend read spends at the backend.
pub const IO_MS: u64 = 1;
/// Every this many reloads: one invalid candidate and one whose init fails.
const CYCLE: u64 = 20;

/// What a reload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Metadata of both components, taken in place.
    InPlace,
    /// A new backend `shape`: the backend is rebuilt (init ~10 ms).
    Rebuild,
    /// An invalid candidate: must be rejected, nothing touched.
    Invalid,
    /// A rebuild whose init fails: must roll back.
    InitFails,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 4] = [Kind::InPlace, Kind::Rebuild, Kind::Invalid, Kind::InitFails];

    /// The kind of reload number `i` (from 1).
    fn of(i: u64) -> Kind {
        match i % CYCLE {
            10 => Kind::Invalid,
            0 => Kind::InitFails,
            n if n % 2 == 1 => Kind::InPlace,
            _ => Kind::Rebuild,
        }
    }

    /// The label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Kind::InPlace => "in place (cache TTL + backend epoch)",
            Kind::Rebuild => "rebuild (backend init ~10 ms)",
            Kind::Invalid => "invalid candidate (rejected)",
            Kind::InitFails => "init fails (rolled back)",
        }
    }
}

/// What the running configuration says; reloads that apply move it on.
#[derive(Debug, Clone, Copy, Default)]
struct Declared {
    ttl: i64,
    epoch: u64,
    shape: u64,
}

/// The configuration text for `declared`, with the backend's init failing
/// if `fail_init`.
pub fn config_text(ttl: i64, epoch: u64, shape: u64, fail_init: bool) -> String {
    serde_json::json!({
        "appId": "soak",
        "components": {
            "state": {"cache": {"type": "memory", "metadata": {"defaultTtlInSeconds": ttl}}},
            "soak": {"backend": {"type": "soak.backend", "metadata": {
                "initMs": INIT_MS, "ioMs": IO_MS, "epoch": epoch, "shape": shape, "failInit": fail_init
            }}}
        }
    })
    .to_string()
}

/// The starting configuration.
pub fn initial_text() -> String {
    let d = Declared::default();
    config_text(d.ttl, d.epoch, d.shape, false)
}

/// The latencies and outcomes of the reloads made.
#[derive(Debug, Default)]
pub struct Reloads {
    /// Per kind (index in [`Kind::ALL`]): the latencies of the reloads.
    pub latencies: [Histogram; 4],
    /// Reloads that applied (a new generation).
    pub applied: u64,
    /// Reloads rejected (invalid candidate).
    pub rejected: u64,
    /// Reloads rolled back.
    pub rolled_back: u64,
    /// Reloads whose outcome or actions were not the expected ones.
    pub anomalies: Vec<String>,
}

impl Reloads {
    /// Every latency, all kinds together.
    pub fn all_latencies(&self) -> Histogram {
        let mut all = Histogram::default();
        for kind in &self.latencies {
            all.merge(kind);
        }
        all
    }

    /// Reloads made.
    pub fn total(&self) -> u64 {
        self.latencies.iter().map(Histogram::len).sum()
    }

    fn anomaly(&mut self, text: String) {
        if self.anomalies.len() < 20 {
            self.anomalies.push(text);
        }
    }
}

/// Reloads `runtime` every `period` until `stop`.
pub async fn run(runtime: Runtime, period: Duration, stop: Arc<AtomicBool>) -> Reloads {
    let mut reloads = Reloads::default();
    let mut declared = Declared::default();
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        i += 1;
        let kind = Kind::of(i);
        let (text, next) = candidate(kind, declared, i);
        let started = Instant::now();
        let result = match parse(text.as_bytes()) {
            Ok(candidate) => runtime.apply(candidate).await,
            Err(problems) => {
                reloads.anomaly(format!(
                    "reload {i}: soak config does not parse: {problems}"
                ));
                continue;
            }
        };
        let latency = started.elapsed();
        let slot = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        reloads.latencies[slot].record(latency);
        match &result {
            Ok(record) if record.outcome == Outcome::Applied => reloads.applied += 1,
            Err(ReloadError::Invalid(_)) => reloads.rejected += 1,
            Err(ReloadError::RolledBack(_)) => reloads.rolled_back += 1,
            _ => {}
        }
        if let Some(problem) = unexpected(kind, &result) {
            reloads.anomaly(format!("reload {i} ({kind:?}): {problem}"));
        }
        if result.is_ok() {
            declared = next;
        }
    }
    reloads
}

/// The candidate of reload `i` of `kind`, and what is declared if it
/// applies.
fn candidate(kind: Kind, declared: Declared, i: u64) -> (String, Declared) {
    let Declared { ttl, epoch, shape } = declared;
    match kind {
        Kind::InPlace => {
            let next = Declared {
                ttl: if ttl == 0 { 600 } else { 0 },
                epoch: epoch + 1,
                shape,
            };
            (config_text(next.ttl, next.epoch, next.shape, false), next)
        }
        Kind::Rebuild => {
            let next = Declared {
                shape: shape + 1,
                ..declared
            };
            (config_text(next.ttl, next.epoch, next.shape, false), next)
        }
        Kind::InitFails => (config_text(ttl, epoch, shape + 1, true), declared),
        Kind::Invalid if (i / CYCLE) % 2 == 0 => {
            // An unknown type.
            let text = config_text(ttl, epoch, shape, false).replace("soak.backend", "soak.backnd");
            (text, declared)
        }
        Kind::Invalid => {
            // A metadata value of the wrong type.
            let text = config_text(ttl, epoch, shape, false)
                .replace(&format!("\"shape\":{shape}"), "\"shape\":\"seven\"");
            (text, declared)
        }
    }
}

/// Why `result` is not what a reload of `kind` must give, if it is not.
fn unexpected(kind: Kind, result: &Result<rewire::ReloadRecord, ReloadError>) -> Option<String> {
    let actions = |record: &rewire::ReloadRecord| {
        (
            record.actions.get("state/cache").copied(),
            record.actions.get("soak/backend").copied(),
        )
    };
    match (kind, result) {
        (Kind::InPlace, Ok(r)) if r.outcome == Outcome::Applied => {
            let want = (Some(Action::UpdatedInPlace), Some(Action::UpdatedInPlace));
            (actions(r) != want).then(|| format!("actions {:?}", r.actions))
        }
        (Kind::Rebuild, Ok(r)) if r.outcome == Outcome::Applied => {
            let want = (Some(Action::Unchanged), Some(Action::Rebuilt));
            (actions(r) != want).then(|| format!("actions {:?}", r.actions))
        }
        (Kind::Invalid, Err(ReloadError::Invalid(_))) => None,
        (Kind::InitFails, Err(ReloadError::RolledBack(failures))) => {
            let expected = failures.len() == 1
                && failures[0].step == FailedStep::Init
                && failures[0]
                    .component
                    .as_ref()
                    .map(ToString::to_string)
                    .as_deref()
                    == Some("soak/backend");
            (!expected).then(|| format!("rolled back with {failures:?}"))
        }
        (_, Ok(r)) => Some(format!("outcome {:?}, actions {:?}", r.outcome, r.actions)),
        (_, Err(err)) => Some(format!("error: {err}")),
    }
}
