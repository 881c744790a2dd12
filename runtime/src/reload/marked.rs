//! The marked components a reload forces (their running entry is not what
//! their declaration says: see [`Marks`]), best effort: one that neither
//! the request nor the change names and whose retry fails is kept as it
//! runs, and the reload goes on without it (a note on its record says
//! so), as a component outside the change is kept: a failure of a store
//! unrelated to the change does not roll the reload back. Its mark stays,
//! the failed retry counted; once
//! [`FORCED_RETRIES`](crate::running::FORCED_RETRIES) retries failed in a
//! row, only a reload that names it tries again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::actions::Action;
use super::transaction::{Plan, Progress, Step};
use crate::assemble::{ComponentFailure, FailedStep};
use crate::component::ComponentKey;
use crate::config::ConfigDiff;
use crate::running::{Mark, Marks, Running};

/// What a reload forces: the components `requested` (by the request),
/// and the marked ones whose mark still forces them; returned with those
/// of them forced on their mark's account alone (neither `requested` nor
/// named by `diff`), whose retry is best effort.
pub(super) fn forced(
    marks: &Marks,
    requested: &BTreeSet<ComponentKey>,
    diff: &ConfigDiff,
) -> (BTreeSet<ComponentKey>, BTreeSet<ComponentKey>) {
    let named = diff.touched();
    let by_mark = marks.forcing();
    let best_effort = by_mark
        .iter()
        .filter(|key| !requested.contains(*key) && !named.contains(*key))
        .cloned()
        .collect();
    let mut forced = by_mark;
    forced.extend(requested.iter().cloned());
    (forced, best_effort)
}

impl Plan<'_> {
    /// Keeps as they run the components of `failures` whose retry was best
    /// effort (see [`forced`]; not one cut short by shutdown), noting
    /// why in `progress`; returns the other failures. `at_commit`: the
    /// index in `progress.done` of each update left to the commit, whose
    /// step the kept entry replaces (else it is added).
    pub(super) fn keep_failed_retries(
        &self,
        failures: Vec<ComponentFailure>,
        progress: &mut Progress,
        at_commit: Option<&HashMap<ComponentKey, usize>>,
    ) -> Vec<ComponentFailure> {
        let mut others = Vec::new();
        for failure in failures {
            let kept = failure
                .component
                .as_ref()
                .filter(|_| failure.step != FailedStep::Cancelled)
                .filter(|key| self.best_effort.contains(*key))
                .and_then(|key| Some((key, self.current.get(key)?, self.marks.get(key)?)));
            let Some((key, running, mark)) = kept else {
                others.push(failure);
                continue;
            };
            let key = key.clone();
            let mut running = Running::clone(running);
            // Written differently maybe (scopes), declared alike.
            if let Some(spec) = self.candidate.config.components.get(&key) {
                running.spec = Arc::clone(spec);
            }
            tracing::warn!(component = %key, error = %failure, "Retrying a component not as declared failed; it is kept as it runs.");
            progress
                .notes
                .push(retry_failed_note(&failure, mark.failed_again()));
            progress.marks_left.failed.insert(key.clone());
            progress.actions.insert(key.clone(), Action::Unchanged);
            progress.next.insert(key.clone(), Arc::new(running.clone()));
            let step = Step::Kept(running);
            match at_commit.and_then(|indexes| indexes.get(&key)) {
                Some(index) => progress.done[*index] = step,
                None => progress.done.push(step),
            }
        }
        others
    }

    /// The marked components of `kept` (kept as they run, not resolved
    /// again): their marks stay.
    pub(super) fn marked_among(&self, kept: &BTreeSet<ComponentKey>) -> BTreeSet<ComponentKey> {
        kept.iter()
            .filter(|key| self.marks.get(key).is_some())
            .cloned()
            .collect()
    }
}

/// The note a reload's record keeps of a marked component whose retry
/// (`failure`) failed, leaving its mark `after`.
fn retry_failed_note(failure: &ComponentFailure, after: Mark) -> String {
    let retried = after.retried();
    format!(
        "{failure}; it is not as declared (an earlier update of it failed and could not be put back) and this reload only retried it: it is kept as it runs and the reload goes on without it; {retried}"
    )
}
