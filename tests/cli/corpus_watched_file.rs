//! The bad-input corpus written over a watched configuration file: every
//! case is recorded as a rejected file reload with its expected problem
//! lines (or, for a mistake only building finds, as rolled back), and the
//! running configuration is untouched — same generation, configuration,
//! layers and instances. Then a valid file with one real change applies.
//!
//! The cases are split over a few runtimes, each watching its own file, so
//! the whole corpus takes a few debounce periods per lane, not per case.

use crate::support;
use crate::support::corpus;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use corpus::Case;
use rewire::config::Layers;
use rewire::Generation;
use rewire::{Action, ComponentKey, Outcome, ReloadRecord, Runtime, Trigger};
use tokio::sync::broadcast;

/// Runtimes watching a file each; the cases are dealt out among them.
const LANES: usize = 4;

/// How long one write may take to be recorded.
const PATIENCE: Duration = Duration::from_secs(10);

/// Replaces `path`'s content at once (a rename), so the watcher never
/// reads a half-written file.
fn write_whole(path: &Path, bytes: &[u8]) {
    let temp = path.with_extension("json.tmp");
    std::fs::write(&temp, bytes).unwrap_or_else(|e| panic!("write {}: {e}", temp.display()));
    std::fs::rename(&temp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// The next reload record of the file trigger.
async fn next_file_record(events: &mut broadcast::Receiver<ReloadRecord>) -> Option<ReloadRecord> {
    tokio::time::timeout(PATIENCE, async {
        loop {
            match events.recv().await {
                Ok(record) if record.trigger == Trigger::File => return Some(record),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// What must not change when a write is refused.
struct Snapshot {
    generation: Arc<Generation>,
    config: rewire::Config,
    layers: Layers,
}

impl Snapshot {
    fn of(runtime: &Runtime) -> Self {
        Self {
            generation: runtime.generation(),
            config: runtime.config().config,
            layers: runtime.layers(),
        }
    }

    fn changes_in(&self, runtime: &Runtime) -> Vec<String> {
        let mut changes = Vec::new();
        let now = Snapshot::of(runtime);
        if now.generation.number != self.generation.number {
            changes.push(format!(
                "generation {} -> {}",
                self.generation.number, now.generation.number
            ));
        }
        if now.config != self.config {
            changes.push("the running configuration changed".to_string());
        }
        if now.layers != self.layers {
            changes.push("the file layer changed".to_string());
        }
        if now.generation.len() != self.generation.len() {
            changes.push("the set of running components changed".to_string());
        }
        for (key, instance) in self.generation.iter() {
            if !now.generation.get(key).is_some_and(|i| i.same_as(instance)) {
                changes.push(format!("{key} is another instance, or gone"));
            }
        }
        changes
    }
}

/// What is wrong with the record of `case`'s write, if anything.
fn check_record(case: &Case, record: Option<ReloadRecord>) -> Vec<String> {
    let Some(record) = record else {
        return vec![format!("no file reload recorded within {PATIENCE:?}")];
    };
    let mut wrong = Vec::new();
    let error = record.error.clone().unwrap_or_default();
    if case.spec.caught_at_build.is_some() {
        if record.outcome != Outcome::RolledBack {
            wrong.push(format!(
                "outcome {:?}, expected RolledBack: {error}",
                record.outcome
            ));
        }
        for part in &case.spec.build_error {
            if !error.contains(part.as_str()) {
                wrong.push(format!("the error does not mention {part:?}: {error}"));
            }
        }
    } else {
        if record.outcome != Outcome::Rejected {
            wrong.push(format!("outcome {:?}, expected Rejected", record.outcome));
        }
        // The record keeps a bounded error (a 100,000-character name cut
        // in its middle): the validation's whole error, as a record keeps it.
        let expected = ReloadRecord::kept_error(&case.errors().join("\n"));
        if error != expected {
            wrong.push(format!(
                "error\n  got:      {error:?}\n  expected: {expected:?}"
            ));
        }
    }
    for secret in &case.spec.never {
        if error.contains(secret.as_str()) {
            wrong.push(format!("a secret value in the record: {secret}"));
        }
    }
    wrong
}

/// Starts a runtime on the base, watching `dir/rewire.json`.
async fn lane_runtime(dir: &Path) -> (Runtime, PathBuf, rewire::FileWatch) {
    let path = dir.join("rewire.json");
    write_whole(&path, corpus::valid_text().as_bytes());
    let runtime = support::start(&corpus::valid_text()).await.unwrap();
    let watch = runtime.watch_config_file(path.clone(), Duration::from_secs(60));
    (runtime, path, watch)
}

/// Writes each of `cases` over the lane's file in turn, then the base with
/// one real change. Returns what went wrong.
async fn run_lane(cases: Vec<Case>) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, path, _watch) = lane_runtime(dir.path()).await;
    // Let the watcher settle on the base before the first write.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut events = runtime.reload_events();
    let before = Snapshot::of(&runtime);
    let mut failures = Vec::new();
    for case in &cases {
        write_whole(&path, &case.bytes);
        let record = next_file_record(&mut events).await;
        let mut wrong = Vec::new();
        // The record is the history's newest of the file trigger, too.
        let newest = runtime
            .history()
            .into_iter()
            .rev()
            .find(|r| r.trigger == Trigger::File);
        if let Some(record) = &record {
            if newest.as_ref().map(|r| (r.outcome, &r.error))
                != Some((record.outcome, &record.error))
            {
                wrong.push(format!("the history's newest file record is {newest:?}"));
            }
        }
        wrong.extend(check_record(case, record));
        wrong.extend(before.changes_in(&runtime));
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n  {}",
                case.name(),
                case.spec.breaks,
                wrong.join("\n  ")
            ));
        }
    }
    write_whole(&path, corpus::valid_with_sessions_ttl(600).as_bytes());
    match next_file_record(&mut events).await {
        Some(record) if record.outcome == Outcome::Applied => {
            let sessions = ComponentKey::new("state", "sessions");
            let action = record.actions.get("state/sessions").copied();
            let ttl = runtime
                .config()
                .config
                .components
                .get(&sessions)
                .and_then(|s| s.metadata.get("defaultTtlInSeconds").cloned());
            if action != Some(Action::UpdatedInPlace) || ttl != Some(serde_json::json!(600)) {
                failures.push(format!(
                    "the good write applied as {action:?} with TTL {ttl:?}"
                ));
            }
            let unchanged = record
                .actions
                .iter()
                .filter(|(_, a)| **a == Action::Unchanged)
                .count();
            if record.generation != 2 || unchanged != record.actions.len() - 1 {
                failures.push(format!("the good write: {record:?}"));
            }
        }
        other => failures.push(format!(
            "the good write after the corpus did not apply: {other:?}"
        )),
    }
    runtime.shutdown().await;
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_case_written_over_the_file_is_rejected_and_a_good_write_then_applies() {
    let cases = corpus::cases();
    let mut lanes: Vec<Vec<Case>> = vec![Vec::new(); LANES];
    for (i, case) in cases.iter().enumerate() {
        lanes[i % LANES].push(case.clone());
    }
    let handles: Vec<_> = lanes
        .into_iter()
        .map(|lane| tokio::spawn(run_lane(lane)))
        .collect();
    let mut failures = Vec::new();
    for handle in handles {
        failures.extend(handle.await.expect("a lane failed"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} writes answered wrongly:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_fails_to_decode_is_not_quoted_in_the_record() {
    // Valid on paper (an injected field takes any value at validation):
    // only building `state/carts` finds that the secret is not a number.
    let dir = tempfile::tempdir().unwrap();
    let (runtime, path, _watch) = lane_runtime(dir.path()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut events = runtime.reload_events();
    let before = Snapshot::of(&runtime);
    let text =
        corpus::valid_text().replacen("\"name\": \"carts-ttl\"", "\"name\": \"not-a-number\"", 1);
    write_whole(&path, text.as_bytes());
    let record = next_file_record(&mut events)
        .await
        .unwrap_or_else(|| panic!("no file reload recorded: {:#?}", runtime.history()));
    assert_eq!(record.outcome, Outcome::RolledBack, "{record:?}");
    let error = record.error.clone().unwrap_or_default();
    assert!(
        error.contains("state/carts") && error.contains("defaultTtlInSeconds"),
        "{error}"
    );
    assert!(
        !error.contains("hunter2-secret-value"),
        "the secret value is in the record: {error}"
    );
    let changes = before.changes_in(&runtime);
    assert!(changes.is_empty(), "{changes:?}");
    runtime.shutdown().await;
}
