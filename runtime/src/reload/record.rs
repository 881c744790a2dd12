//! Recording a reload: the record, the log lines, the history.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use imbl::OrdSet;

use super::actions::{Action, Actions};
use super::history::{Outcome, ReloadRecord, Trigger};
use super::Reloader;
use crate::component::ComponentKey;

/// A reload being timed, until it is recorded.
pub(super) struct Recording {
    trigger: Trigger,
    attempt: u32,
    started: Instant,
}

/// How a reload ended, to be recorded.
pub(super) struct Ending {
    pub(super) outcome: Outcome,
    /// The generation serving afterwards.
    pub(super) generation: u64,
    pub(super) actions: BTreeMap<ComponentKey, Action>,
    /// Every component serving after it (or that would have): each one
    /// `actions` does not name was kept, unchanged.
    pub(super) serving: OrdSet<ComponentKey>,
    /// Why it did not apply, or which of its updates failed after the
    /// commit (scrubbed, then [`bounded`], before it is kept).
    pub(super) error: Option<String>,
}

impl Recording {
    pub(super) fn start(trigger: Trigger, attempt: u32) -> Self {
        Self {
            trigger,
            attempt,
            started: Instant::now(),
        }
    }

    /// Which attempt it is (0: fresh input).
    pub(super) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// What started the reload.
    pub(super) fn trigger(&self) -> &Trigger {
        &self.trigger
    }
}

impl Reloader {
    /// Records the end of `recording`: history, event, log, and the
    /// outcome on the current (reload) span.
    pub(super) fn finish(&self, recording: Recording, ending: Ending) -> ReloadRecord {
        let record = ReloadRecord {
            generation: ending.generation,
            trigger: recording.trigger,
            attempt: recording.attempt,
            outcome: ending.outcome,
            error: ending.error.map(|e| bounded(&self.redactor.scrub(&e))),
            actions: Actions::new(ending.actions, ending.serving),
            duration_ms: u64::try_from(recording.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            at_unix_ms: now_unix_ms(),
        };
        super::trace::record_ending(&tracing::Span::current(), &record);
        log_record(&record);
        let kept = std::sync::Arc::new(record);
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(kept.clone());
        // A copy only for whoever listens.
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(ReloadRecord::clone(&kept));
        }
        std::sync::Arc::unwrap_or_clone(kept)
    }

    /// Records a change that could not even be parsed.
    pub(crate) fn record_rejected(&self, trigger: Trigger, error: &str) {
        let ending = Ending {
            outcome: Outcome::Rejected,
            generation: self.running.generation_number(),
            actions: BTreeMap::new(),
            serving: OrdSet::new(),
            error: Some(error.to_string()),
        };
        // Nothing ran: its duration is that of recording it, 0 ms.
        let span = super::trace::reload_span(&trigger, 0);
        let _in_reload = span.enter();
        self.finish(Recording::start(trigger, 0), ending);
    }
}

impl ReloadRecord {
    /// What a record keeps of an `error` (already scrubbed): at most 32
    /// lines of about 1 KiB each, the middle of a longer one cut to `…`,
    /// then `… and N more lines`. For comparing a record with the whole
    /// error a validation gives.
    pub fn kept_error(error: &str) -> String {
        bounded(error)
    }
}

/// The longest line of a record's error: longer ones keep their start
/// and their end (the key or location, and what is wrong with it).
const ERROR_LINE_LIMIT: usize = 1024;
/// The most lines a record's error keeps; the rest are counted.
const ERROR_LINES_LIMIT: usize = 32;

/// `error` as a record keeps it: at most [`ERROR_LINES_LIMIT`] lines (then
/// `… and N more lines`), each at most about [`ERROR_LINE_LIMIT`] bytes,
/// its middle cut to `…`. An error quotes names and values of the
/// candidate, which have no length bound: whole, a multi-MB name is kept
/// 100 times in the history, logged at each push, exported as the span's
/// status and returned by every status call (past gRPC's 4 MB limit).
/// Cut after scrubbing, so no secret is cut short of being recognised.
fn bounded(error: &str) -> String {
    let mut kept = String::new();
    let mut lines = error.lines();
    for line in lines.by_ref().take(ERROR_LINES_LIMIT) {
        if !kept.is_empty() {
            kept.push('\n');
        }
        if line.len() <= ERROR_LINE_LIMIT {
            kept.push_str(line);
        } else {
            let half = ERROR_LINE_LIMIT / 2;
            let mut head = half;
            while !line.is_char_boundary(head) {
                head -= 1;
            }
            let mut tail = line.len() - half;
            while !line.is_char_boundary(tail) {
                tail += 1;
            }
            kept.push_str(&line[..head]);
            kept.push('…');
            kept.push_str(&line[tail..]);
        }
    }
    let more = lines.count();
    if more > 0 {
        kept.push_str(&format!("\n… and {more} more lines"));
    }
    kept
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

fn log_record(record: &ReloadRecord) {
    for (component, action) in record.actions.acted() {
        if *action != Action::Unchanged {
            tracing::info!(component = %component, generation = record.generation, ?action, "Component reloaded.");
        }
    }
    match &record.error {
        None => {
            tracing::info!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, duration_ms = record.duration_ms, "Reload finished.")
        }
        Some(error) if record.outcome == Outcome::Applied => {
            tracing::warn!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, error = %error, "Reload applied, but not all of it.")
        }
        Some(error) if record.outcome == Outcome::NoChange => {
            tracing::warn!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, error = %error, "Reload changed nothing, and a retry failed.")
        }
        Some(error) => {
            tracing::warn!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, error = %error, "Reload not applied.")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many problems keep their first lines and a count of the rest; a
    /// short error is kept as it is.
    #[test]
    fn an_error_of_many_lines_keeps_the_first_and_counts_the_rest() {
        assert_eq!(bounded("a: bad\nb: worse"), "a: bad\nb: worse");
        let many: Vec<String> = (0..1000).map(|i| format!("custom/c{i}: bad")).collect();
        let kept = bounded(&many.join("\n"));
        let lines: Vec<&str> = kept.lines().collect();
        assert_eq!(lines.len(), ERROR_LINES_LIMIT + 1, "{kept}");
        assert_eq!(lines[0], "custom/c0: bad");
        assert_eq!(lines[ERROR_LINES_LIMIT], "… and 968 more lines");
    }
}
