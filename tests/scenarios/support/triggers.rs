//! Helpers for the trigger scenarios: waiting on the reload history.

use std::time::{Duration, Instant};

use rewire::{ComponentKey, Outcome, ReloadRecord, Runtime, Trigger};

/// Polls `check` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The reload records of `trigger`.
pub fn records_of(runtime: &Runtime, trigger: Trigger) -> Vec<ReloadRecord> {
    runtime
        .history()
        .into_iter()
        .filter(|r| r.trigger == trigger)
        .collect()
}

/// Waits for an applied reload of `trigger` after the first `seen` ones.
pub async fn applied_after(runtime: &Runtime, trigger: Trigger, seen: usize) -> ReloadRecord {
    let found = eventually(Duration::from_secs(10), || {
        records_of(runtime, trigger.clone())
            .into_iter()
            .skip(seen)
            .find(|r| r.outcome == Outcome::Applied)
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "no applied {trigger} reload; history: {:#?}",
            runtime.history()
        )
    })
}

/// The declared metadata field `field` of `key` in the running configuration.
pub fn running_field(
    runtime: &Runtime,
    key: &ComponentKey,
    field: &str,
) -> Option<serde_json::Value> {
    runtime
        .config()
        .config
        .components
        .get(key)?
        .metadata
        .get(field)
        .cloned()
}
