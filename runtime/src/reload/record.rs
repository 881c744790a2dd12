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
    /// Why it did not apply (scrubbed before it is kept).
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
            error: ending.error.map(|e| self.redactor.scrub(&e)),
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
        Some(error) => {
            tracing::warn!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, error = %error, "Reload not applied.")
        }
    }
}
