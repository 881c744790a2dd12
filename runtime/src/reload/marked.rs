//! The marked components a reload forces (their running entry is not what
//! their declaration says: see [`Marks`]), best effort: one that neither
//! the request nor the change reaches (named, or a dependent of what is
//! named) and whose retry fails is kept as it runs, and the reload goes on
//! without it (a note on its record says so), as a component outside the
//! change is kept: a failure of a store unrelated to the change does not
//! roll the reload back; its dependents in the reload only on its account
//! are kept as they run too (see [`Plan::kept_with_best_effort_roots`]).
//! Its mark stays, the failed retry counted; once
//! [`FORCED_RETRIES`](crate::running::FORCED_RETRIES) retries failed in a
//! row, only a reload that names it tries again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::actions::Action;
use super::failed_retry::FailedRetry;
use super::transaction::{Plan, Progress, Step};
use crate::assemble::{ComponentFailure, FailedStep};
use crate::component::ComponentKey;
use crate::config::{ConfigDiff, DependencyGraph};
use crate::running::{Marks, Running};

/// What a reload forces: the components `requested` (by the request),
/// and the marked ones whose mark still forces them; returned with those
/// of them forced on their mark's account alone, whose retry is best
/// effort: neither `requested` nor named by `diff`, nor a dependent (in
/// the candidate's `graph`) of one of those: a marked component that reads
/// a changed store is reached by the change, and fails it as an unmarked
/// one would.
pub(super) fn forced(
    marks: &Marks,
    requested: &BTreeSet<ComponentKey>,
    diff: &ConfigDiff,
    graph: &DependencyGraph,
) -> (BTreeSet<ComponentKey>, BTreeSet<ComponentKey>) {
    let mut named = diff.touched();
    named.extend(requested.iter().cloned());
    let reached = graph.with_dependents(&named);
    let by_mark = marks.forcing();
    let best_effort = by_mark.difference(&reached).cloned().collect();
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
            // Logged at the commit only: the reload may still roll back.
            let failure = failure.to_string();
            progress.notes.push(FailedRetry::new(failure, mark));
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

    /// The components of `impact` in this reload only as dependents of
    /// best-effort roots (see [`forced`]): not reached from the other
    /// `roots`, and not best effort themselves.
    pub(super) fn behind_best_effort_roots(
        &self,
        roots: &BTreeSet<ComponentKey>,
        impact: &BTreeSet<ComponentKey>,
    ) -> BTreeSet<ComponentKey> {
        let reached = roots.difference(&self.best_effort).cloned().collect();
        let reached = self.candidate.graph.with_dependents(&reached);
        impact
            .difference(&reached)
            .filter(|key| !self.best_effort.contains(*key))
            .cloned()
            .collect()
    }

    /// The components of `level` (of those `behind` best-effort roots) to
    /// keep as they run, their refs not resolved again: none of what they
    /// use in this reload took a change (each was kept as it runs, a
    /// best-effort root's failed retry included), so reading again could
    /// only fail on the outage that failed that retry (a user reading a
    /// marked store whose backend is down), rolling back a reload that
    /// does not reach them.
    pub(super) fn kept_with_best_effort_roots(
        &self,
        level: &[ComponentKey],
        behind: &BTreeSet<ComponentKey>,
        progress: &Progress,
    ) -> BTreeSet<ComponentKey> {
        let graph = &self.candidate.graph;
        let unchanged = |key: &ComponentKey| match progress.actions.get(key) {
            Some(action) => *action == Action::Unchanged,
            // Outside the reload: kept.
            None => true,
        };
        level
            .iter()
            .filter(|key| behind.contains(*key) && self.current.get(key).is_some())
            .filter(|key| graph.dependencies(key).iter().all(unchanged))
            .cloned()
            .collect()
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
