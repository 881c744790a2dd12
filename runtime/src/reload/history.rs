//! The record of past reloads.

use std::collections::VecDeque;
use std::fmt;

use serde::Serialize;

use super::actions::{Action, Actions};

/// What started a reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The configuration file changed.
    File,
    /// The overlay key in a config store changed.
    Overlay,
    /// A watched secretRef/configurationRef value changed (shown as
    /// `watch`).
    #[serde(rename = "watch")]
    WatchedRef,
    /// A push through the Lifecycle API.
    Api,
    /// `Runtime::apply` from the embedding program.
    Programmatic,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Trigger::File => "file",
            Trigger::Overlay => "overlay",
            Trigger::WatchedRef => "watch",
            Trigger::Api => "api",
            Trigger::Programmatic => "programmatic",
        })
    }
}

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A new generation is serving. A component whose staged update
    /// panicked when applied is [`Action::Failed`](super::Action::Failed)
    /// and named in the error. A component not as declared (an earlier
    /// update of it could not be put back) that the reload retried in vain
    /// is kept as it runs and noted in the error, but does not fail it.
    Applied,
    /// Nothing differed from the running configuration (the error may
    /// note a component not as declared retried in vain, kept as it runs).
    NoChange,
    /// The candidate was invalid or stale; nothing was touched.
    Rejected,
    /// Building the new generation failed; the old one keeps serving.
    RolledBack,
}

/// One reload, as recorded. It serializes with its fields, `actions` as
/// a map of only the components it changed, and `unchanged`: how many
/// other components it left serving as they were, reached or not (see
/// [`Actions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadRecord {
    /// The generation serving after the reload.
    pub generation: u64,
    /// What started it.
    pub trigger: Trigger,
    /// 0 for fresh input; `n` for the `n`-th retry of a triggered reload
    /// that rolled back.
    pub attempt: u32,
    /// How it ended.
    pub outcome: Outcome,
    /// Why it was rejected or rolled back; or, applied (or no change),
    /// which component's update failed after the commit, and which
    /// component not as declared was retried in vain and kept as it runs
    /// (secret values scrubbed; at most 32 lines of about 1 KiB each, a
    /// longer line cut in its middle).
    pub error: Option<String>,
    /// Per component (`kind/name`), what was done (or would have been, for a
    /// rolled-back reload).
    pub actions: Actions,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

impl ReloadRecord {
    /// The lines of `error` an answer about this reload (a push's ACK)
    /// carries as its failures: every line but the notes about components
    /// the reload acted on that did not fail (a marked component's
    /// best-effort retry that failed, kept as it runs, recorded
    /// `unchanged`), which stay in the record (status, logs). Kept: the
    /// lines about a component that failed (its staged in-place update
    /// panicked when applied), those that name no component acted on
    /// (the reload panicked after its commit) and the lines that continue
    /// a kept one (a multi-line panic message); see
    /// [`Self::failure_lines_among`].
    pub fn failure_lines(&self) -> Vec<&str> {
        let Some(error) = &self.error else {
            return Vec::new();
        };
        let acted: Vec<(String, bool)> = self
            .actions
            .acted()
            .map(|(key, action)| (key.to_string(), *action == Action::Failed))
            .collect();
        Self::failure_lines_among(error.lines(), &acted)
    }

    /// Of `lines` (a reload's error, or an ACK's errors), those that are
    /// not notes about a component that did not fail. `acted`: each
    /// component the reload acted on (`kind/name`) and whether it failed.
    /// A line is about the acted component whose `kind/name: ` it begins
    /// with (the longest, so `a: b` is not taken for `a`); a line that
    /// begins with none continues the line before it (a message's own
    /// line break), and is dropped or kept with it; at the start, it is
    /// kept (it names no component: the reload panicked after its
    /// commit). `… and N more lines` after a dropped note is dropped too:
    /// what it counts that failed has its action `failed`.
    pub fn failure_lines_among<'a, K: AsRef<str>>(
        lines: impl IntoIterator<Item = &'a str>,
        acted: &[(K, bool)],
    ) -> Vec<&'a str> {
        let mut kept = Vec::new();
        // Whether the line before was kept (none before: kept).
        let mut keeping = true;
        for line in lines {
            if let Some(failed) = about(line, acted) {
                keeping = failed;
            }
            if keeping {
                kept.push(line);
            }
        }
        kept
    }
}

/// Whether the acted component `line` is about (see
/// [`ReloadRecord::failure_lines_among`]) failed; `None` when it begins
/// with no acted component's `kind/name: `.
fn about<K: AsRef<str>>(line: &str, acted: &[(K, bool)]) -> Option<bool> {
    acted
        .iter()
        .filter(|(key, _)| {
            let key = key.as_ref();
            line.len() > key.len() + 1
                && line.starts_with(key)
                && line[key.len()..].starts_with(": ")
        })
        .max_by_key(|(key, _)| key.as_ref().len())
        .map(|(_, failed)| *failed)
}

impl Serialize for ReloadRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The record as written: its fields, with the count of the
        /// components `actions` leaves out.
        #[derive(Serialize)]
        struct Written<'a> {
            generation: u64,
            trigger: &'a Trigger,
            attempt: u32,
            outcome: Outcome,
            error: &'a Option<String>,
            actions: &'a Actions,
            unchanged: usize,
            duration_ms: u64,
            at_unix_ms: u64,
        }
        Written {
            generation: self.generation,
            trigger: &self.trigger,
            attempt: self.attempt,
            outcome: self.outcome,
            error: &self.error,
            actions: &self.actions,
            unchanged: self.actions.unlisted(),
            duration_ms: self.duration_ms,
            at_unix_ms: self.at_unix_ms,
        }
        .serialize(serializer)
    }
}

/// The last reloads, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct History {
    /// Shared, so keeping one costs no copy of its (possibly many) actions.
    records: VecDeque<std::sync::Arc<ReloadRecord>>,
    capacity: usize,
}

impl History {
    /// Keeps the last `capacity` records.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            records: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Adds a record, forgetting the oldest beyond capacity.
    pub(crate) fn push(&mut self, record: std::sync::Arc<ReloadRecord>) {
        if self.records.len() == self.capacity {
            self.records.pop_front();
        }
        self.records.push_back(record);
    }

    /// The records, oldest first.
    pub(crate) fn records(&self) -> Vec<ReloadRecord> {
        self.records
            .iter()
            .map(|r| ReloadRecord::clone(r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::ComponentKey;

    fn record(error: &str, acted: &[&str]) -> ReloadRecord {
        ReloadRecord {
            generation: 2,
            trigger: Trigger::Api,
            attempt: 0,
            outcome: Outcome::Applied,
            error: Some(error.to_string()),
            actions: acted
                .iter()
                .map(|name| (ComponentKey::new("state", name), Action::Unchanged))
                .collect(),
            duration_ms: 1,
            at_unix_ms: 1,
        }
    }

    /// Every line but the notes about components that did not fail: a
    /// failed one's lines (a continued one too), and a line naming no
    /// component. Before (ac67227): only the pushed component's lines, so
    /// a dependent's failure, a panic after the commit and a message's
    /// second line were dropped from the ACK.
    #[test]
    fn the_failure_lines_are_all_but_the_notes_about_components_that_did_not_fail() {
        let mut record = record(
            "state/x: init failed: down; it is not as declared\n\
             second line of x's note\n\
             state/y: staged in-place update panicked when applied: bad\n\
             state; it may run with part of the new one\n\
             state/y: b: init failed: kept as it runs\n\
             … and 3 more lines",
            &["x", "y", "y: b"],
        );
        record.actions = [
            ("x", Action::Unchanged),
            ("y", Action::Failed),
            ("y: b", Action::Unchanged),
        ]
        .into_iter()
        .map(|(name, action)| (ComponentKey::new("state", name), action))
        .collect();
        assert_eq!(
            record.failure_lines(),
            [
                "state/y: staged in-place update panicked when applied: bad",
                "state; it may run with part of the new one",
            ]
        );
        let panicked = ReloadRecord {
            error: Some("the reload panicked after its commit: boom\nat line 2".into()),
            ..record.clone()
        };
        assert_eq!(
            panicked.failure_lines(),
            ["the reload panicked after its commit: boom", "at line 2"]
        );
        let clean = ReloadRecord {
            error: None,
            ..record.clone()
        };
        assert!(clean.failure_lines().is_empty());
    }

    /// Only notes: none is a failure, nor is what counts more of them.
    #[test]
    fn notes_alone_are_no_failure() {
        let record = record(
            "state/x: init failed: down\nstate/z: init failed: down\n… and 9 more lines",
            &["x", "z"],
        );
        assert!(
            record.failure_lines().is_empty(),
            "{:?}",
            record.failure_lines()
        );
    }

    /// Written with the components changed and a count of the others
    /// (those reached and found unchanged too).
    #[test]
    fn a_record_is_written_with_what_it_acted_on_and_a_count_of_the_rest() {
        let json = serde_json::to_value(record("e", &["x"])).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"generation": 2, "trigger": "api", "attempt": 0,
                               "outcome": "applied", "error": "e",
                               "actions": {}, "unchanged": 1,
                               "duration_ms": 1, "at_unix_ms": 1})
        );
    }
}
