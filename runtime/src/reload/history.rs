//! The record of past reloads.

use std::collections::VecDeque;
use std::fmt;

use serde::Serialize;

use super::actions::Actions;
use crate::component::ComponentKey;

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
/// a map of only the components it acted on, and `unchanged`: how many
/// other components it left serving as they were (see [`Actions`]).
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
    /// The lines of `error` about `component`: those that begin with its
    /// `kind/name: `, as each line about a component does (the reason its
    /// update failed after the commit, or the note of a retry of it kept
    /// as it runs), but not those of another component the reload acted on
    /// whose `kind/name` begins so too (a name `a: b` beside `a`). A line
    /// cut in its middle ([`Self::kept_error`]) keeps its beginning.
    ///
    /// For an answer about one component (a push's ACK): the record's
    /// error may hold notes about others, which it must not pass off as
    /// its own.
    pub fn error_lines_about(&self, component: &ComponentKey) -> Vec<&str> {
        let Some(error) = &self.error else {
            return Vec::new();
        };
        let own = format!("{component}: ");
        let others: Vec<String> = self
            .actions
            .acted()
            .map(|(key, _)| format!("{key}: "))
            .filter(|other| other.len() > own.len() && other.starts_with(&own))
            .collect();
        error
            .lines()
            .filter(|line| line.starts_with(&own))
            .filter(|line| !others.iter().any(|other| line.starts_with(other.as_str())))
            .collect()
    }
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
    use super::super::actions::Action;
    use super::*;

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

    /// Only the lines about the component itself: not those about
    /// another, even one whose name begins with its name.
    #[test]
    fn the_error_lines_about_a_component_are_its_own() {
        let record = record(
            "state/x: init failed: down; it is not as declared\n\
             state/y: staged in-place update panicked when applied: boom\n\
             state/y: b: staged in-place update panicked when applied: bang\n\
             state/yz: init failed",
            &["x", "y", "y: b", "yz"],
        );
        let y = ComponentKey::new("state", "y");
        assert_eq!(
            record.error_lines_about(&y),
            ["state/y: staged in-place update panicked when applied: boom"]
        );
        let x = ComponentKey::new("state", "x");
        assert_eq!(record.error_lines_about(&x).len(), 1);
        let none = ComponentKey::new("state", "z");
        assert!(record.error_lines_about(&none).is_empty());
        let clean = ReloadRecord {
            error: None,
            ..record.clone()
        };
        assert!(clean.error_lines_about(&y).is_empty());
    }

    /// Written with the components acted on and a count of the others.
    #[test]
    fn a_record_is_written_with_what_it_acted_on_and_a_count_of_the_rest() {
        let json = serde_json::to_value(record("e", &["x"])).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"generation": 2, "trigger": "api", "attempt": 0,
                               "outcome": "applied", "error": "e",
                               "actions": {"state/x": "unchanged"}, "unchanged": 0,
                               "duration_ms": 1, "at_unix_ms": 1})
        );
    }
}
