//! The marks of the components whose running entry is not what their
//! declaration says (see [`RunningSet::restore`](super::RunningSet::restore)):
//! a reload forces a marked component (re-resolves it and applies its
//! update again) as long as its retries have not failed
//! [`FORCED_RETRIES`] times in a row; past that, only a reload that names
//! it (its declaration changed, or the request forces it) tries again, so
//! an update that always fails does not fail every unrelated reload.

use std::collections::{BTreeMap, BTreeSet};

use super::Components;
use crate::component::ComponentKey;

/// How many retries in a row of a marked component may fail before its
/// mark stops forcing it into every reload.
pub(crate) const FORCED_RETRIES: u32 = 3;

/// One component's mark: how many retries of it failed in a row since it
/// was marked, and why it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mark {
    failed_retries: u32,
    cause: MarkCause,
}

/// Why a component is not as declared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum MarkCause {
    /// An update of it failed at a commit and its previous declaration
    /// could not be put back: it runs its previous values under its new
    /// declaration (see [`RunningSet::restore`](super::RunningSet::restore)).
    #[default]
    PutBack,
    /// A reload that rolled back could not re-apply its previous metadata:
    /// it may run with part of the new values under its previous
    /// declaration (see
    /// [`RunningSet::keep_tried`](super::RunningSet::keep_tried)).
    Unreverted,
}

impl Mark {
    /// `self` (the mark a component had, or a new one) once a rolled-back
    /// reload could not re-apply its previous metadata: its failed retries
    /// are kept.
    #[must_use]
    pub(crate) fn unreverted(self) -> Self {
        Self {
            cause: MarkCause::Unreverted,
            ..self
        }
    }

    /// `self` (the mark a component had, or a new one) once an update of
    /// it was put back after a commit and its entry is its previous one
    /// (or keeps the new references only): its failed retries are kept,
    /// its cause is the put-back, whatever it was before.
    #[must_use]
    pub(crate) fn put_back(self) -> Self {
        Self {
            cause: MarkCause::PutBack,
            ..self
        }
    }

    /// Whether the running entry records metadata an update tried but
    /// could not undo ([`Self::unreverted`]): the instance may run a mix of
    /// it and what it ran before, so a reload that resolves the very same
    /// metadata must apply it again, not keep the instance as it runs.
    pub(crate) fn is_unreverted(self) -> bool {
        self.cause == MarkCause::Unreverted
    }

    /// How many retries failed in a row.
    #[cfg(test)]
    pub(crate) fn failed_retries(self) -> u32 {
        self.failed_retries
    }

    /// Whether a reload forces the component on the mark's account (its
    /// retries have not failed [`FORCED_RETRIES`] times in a row yet).
    pub(crate) fn forces(self) -> bool {
        self.failed_retries < FORCED_RETRIES
    }

    /// Whether reloads retry the component still, or what to do: for a
    /// record's note and a status.
    pub(crate) fn retried(self) -> String {
        let failed = self.failed_retries;
        match self.forces() {
            true => format!(
                "the next reload retries it ({failed} of {FORCED_RETRIES} retries failed in a row)"
            ),
            false => format!(
                "{failed} retries failed in a row, so reloads no longer retry it: reload it explicitly or change its declaration to retry"
            ),
        }
    }

    /// What a component's status says of its mark.
    pub(crate) fn status_note(self) -> String {
        let retried = self.retried();
        match self.cause {
            MarkCause::PutBack => format!("an update of it failed and could not be put back: it runs its previous values under its new declaration; {retried}"),
            MarkCause::Unreverted => format!("a reload that rolled back could not re-apply its previous metadata: it may run with part of the new values under its previous declaration; {retried}"),
        }
    }

    /// The mark after one more failed retry.
    #[must_use]
    pub(crate) fn failed_again(self) -> Self {
        Self {
            failed_retries: self.failed_retries.saturating_add(1),
            ..self
        }
    }
}

/// Every marked component, with its mark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Marks(BTreeMap<ComponentKey, Mark>);

impl Marks {
    /// The mark of `key`, if it is marked.
    pub(crate) fn get(&self, key: &ComponentKey) -> Option<Mark> {
        self.0.get(key).copied()
    }

    /// The marked components.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> BTreeSet<ComponentKey> {
        self.0.keys().cloned().collect()
    }

    /// The marked components a reload forces on the marks' account.
    pub(crate) fn forcing(&self) -> BTreeSet<ComponentKey> {
        self.0
            .iter()
            .filter(|(_, mark)| mark.forces())
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Marks `key` with `mark`.
    pub(super) fn insert(&mut self, key: ComponentKey, mark: Mark) {
        self.0.insert(key, mark);
    }

    /// The marks a commit leaves: a component it acted on is as declared
    /// from then on (its mark cleared), unless `left` says the reload left
    /// it as it ran; one whose forced retry failed counts it; one that no
    /// longer runs (in `components`) has no mark.
    pub(super) fn after_commit(
        self,
        acted_on: &BTreeSet<ComponentKey>,
        left: &MarksLeft,
        components: &Components,
    ) -> Self {
        let marks = self
            .0
            .into_iter()
            .filter(|(key, _)| components.get(key).is_some())
            .filter_map(|(key, mark)| {
                if left.failed.contains(&key) {
                    return Some((key, mark.failed_again()));
                }
                let kept = !acted_on.contains(&key) || left.unresolved.contains(&key);
                kept.then_some((key, mark))
            })
            .collect();
        Self(marks)
    }
}

/// What a reload tells its commit of the marked components it left as
/// they ran (their marks stay).
#[derive(Debug, Clone, Default)]
pub(crate) struct MarksLeft {
    /// Kept without being resolved again (not forced: their retries
    /// failed too often; impacted only as users of a changed component).
    pub(crate) unresolved: BTreeSet<ComponentKey>,
    /// Forced by their mark alone, their retry failed, kept as they run:
    /// one more failed retry each.
    pub(crate) failed: BTreeSet<ComponentKey>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mark forces its component until its retries fail
    /// [`FORCED_RETRIES`] times in a row.
    #[test]
    fn a_mark_stops_forcing_after_its_retries_fail_in_a_row() {
        let mut mark = Mark::default();
        for failed in 0..FORCED_RETRIES {
            assert!(mark.forces(), "after {failed} failed retries");
            mark = mark.failed_again();
        }
        assert!(!mark.forces());
        assert_eq!(mark.failed_retries(), FORCED_RETRIES);
    }
}
