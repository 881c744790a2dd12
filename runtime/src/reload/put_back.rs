//! After the commit: putting back the components whose staged in-place
//! update panicked when applied. The reload is committed (its other
//! changes serve) and the component kept its instance, so it is not
//! rebuilt there; it goes back to its previous metadata and declaration,
//! as a reload's other panics in an in-place update revert it, and the
//! record says its update failed. The layers still declare the change, so
//! the same candidate reloaded again tries it again; when the previous
//! declaration cannot be put back, the running set marks the component
//! instead, so the next reload tries it again even when the declarations
//! compare equal (only a reference moved), until its retries failed
//! [`FORCED_RETRIES`](crate::running::FORCED_RETRIES) times in a row
//! (then only a reload that names it does).
//!
//! And after a rollback: the in-place updates whose previous metadata it
//! could not re-apply ([`Reloader::keep_unreverted`]).

use std::sync::Arc;

use tokio::task::JoinSet;
use tracing::Instrument;

use super::actions::Action;
use super::in_place::{Unapplied, Unreverted};
use super::record::Ending;
use super::transaction::revert;
use super::Reloader;
use crate::assemble::AssemblyContext;
use crate::component::ComponentKey;
use crate::handle::Instance;
use crate::metadata::Metadata;
use crate::running::{HeldToo, Mark, Marks, Running};

/// What a commit left to put back, and the reload's context to do it in
/// (its init timeout, cut short by shutdown as the reload is).
pub(super) struct PutBack {
    pub(super) unapplied: Vec<Unapplied>,
    pub(super) cx: AssemblyContext,
}

/// One component being put back: what its revert needs, and what the
/// record says once it answered.
struct PuttingBack {
    key: ComponentKey,
    /// How its previous entry was restored (or why not), for the record.
    kept: String,
    /// The metadata the update put back tried, which the instance may
    /// still run (part of) if the revert fails: then recorded as what may
    /// run (see [`RunningSet::keep_tried`]).
    ///
    /// [`RunningSet::keep_tried`]: crate::running::RunningSet::keep_tried
    tried: Option<Metadata>,
    /// The restored entry made to hold the new values too, before any
    /// wait: let go of once the revert succeeded.
    holding: Option<HeldToo>,
    instance: Instance,
    message: String,
}

impl Reloader {
    /// Makes each unapplied component's previous entry the running set's
    /// again, re-applies its previous metadata on the instance (the
    /// update may have been half made), and marks it failed in `ending`,
    /// with why. `not_as_declared`: the marks of the components whose
    /// running entry was not what their declaration says before the
    /// reload (their previous entry is put back marked so again, one more
    /// failed retry counted). The entries are restored first, one by one
    /// (no wait); then every re-apply runs at once, each on a task of its
    /// own, within one init timeout from their start: hung re-applies
    /// hold the reload lock one init timeout, not one each.
    pub(super) async fn put_back(
        &self,
        put_back: PutBack,
        not_as_declared: &Marks,
        ending: &mut Ending,
    ) {
        let PutBack { unapplied, cx } = put_back;
        let mut putting_back = Vec::new();
        let mut reverting = JoinSet::new();
        for Unapplied {
            key,
            previous,
            hook,
            message,
        } in unapplied
        {
            let component = previous.assembled.instance.component();
            let metadata = previous.assembled.resolved.clone();
            let updated = self.running.snapshot().components.get(&key).cloned();
            let tried = updated.map(|u| u.assembled.resolved.clone());
            let instance = previous.assembled.instance.clone();
            let kept = self.restore_previous(previous, not_as_declared.get(&key));
            // Held by the running entry before any wait: the instance may
            // use them until its revert answers, even should this reload
            // be dropped meanwhile.
            let holding = tried.as_ref().and_then(|tried| {
                let new_values = tried.held_secrets();
                self.running.hold_too(&key, &instance, new_values)
            });
            let index = putting_back.len();
            let (named, cx) = (key.clone(), cx.clone());
            let reapplying =
                async move { (index, revert(&named, component, hook, metadata, &cx).await) };
            reverting.spawn(reapplying.in_current_span());
            putting_back.push(PuttingBack {
                key,
                kept,
                tried,
                holding,
                instance,
                message,
            });
        }
        let mut reverted = vec![false; putting_back.len()];
        while let Some(joined) = reverting.join_next().await {
            // Not reached: a revert catches its component's panic.
            if let Ok((index, answered)) = joined {
                reverted[index] = answered;
            }
        }
        let mut lines = Vec::new();
        for (put, reverted) in putting_back.into_iter().zip(reverted) {
            let PuttingBack {
                key,
                kept,
                tried,
                holding,
                instance,
                message,
            } = put;
            let metadata = match reverted {
                true => {
                    if let Some(holding) = holding {
                        self.running.let_go(holding);
                    }
                    "its previous metadata was re-applied"
                }
                // What may run is recorded, held and marked, for the next
                // reload to apply its declaration again.
                false => match tried.is_some_and(|t| self.running.keep_tried(&key, &instance, t)) {
                    true => "re-applying its previous metadata failed too: it may run with part of the new one, which is recorded as what runs, not as declared, for the next reload to apply its declaration again",
                    false => "re-applying its previous metadata failed too: it may run with part of the new one",
                },
            };
            tracing::error!(component = %key, "Staged in-place update panicked when applied; {metadata}; {kept}.");
            lines.push(format!(
                "{key}: staged in-place update panicked when applied: {message}; {metadata}; {kept}"
            ));
            ending.actions.insert(key, Action::Failed);
        }
        let error = lines.join("\n");
        ending.error = Some(match ending.error.take() {
            Some(earlier) => format!("{earlier}\n{error}"),
            None => error,
        });
    }

    /// Makes `previous` its key's running entry again (`mark`: it was not
    /// as declared before the reload, see [`Self::put_back`]); returns
    /// what the record says of it.
    fn restore_previous(&self, previous: Arc<Running>, mark: Option<Mark>) -> String {
        let mark = mark.map(Mark::failed_again);
        match (self.running.restore(previous, mark), mark) {
            (Ok(()), Some(mark)) if !mark.forces() => format!(
                "its previous entry, not as declared, stays in force; {}",
                mark.retried()
            ),
            (Ok(()), _) => {
                "its previous declaration stays in force; reload the change to try again"
                    .to_string()
            }
            (Err(why), _) => format!(
                "its previous declaration could not be restored ({why}); reload the change to try again"
            ),
        }
    }
    /// After a reload that rolled back: records each update it could not
    /// undo as what may run (see [`RunningSet::keep_tried`]): the running
    /// set says the instance runs the tried metadata, holds its secret
    /// values as long as it does (the redactor does not forget them after
    /// its grace), and marks it not as declared, so the next reload
    /// re-applies its declaration (the record's error already says so,
    /// one line each: [`Unreverted::line`]).
    ///
    /// [`RunningSet::keep_tried`]: crate::running::RunningSet::keep_tried
    pub(super) fn keep_unreverted(&self, unreverted: Vec<Unreverted>) {
        for Unreverted {
            key,
            instance,
            tried,
        } in unreverted
        {
            match self.running.keep_tried(&key, &instance, tried) {
                true => {
                    tracing::error!(component = %key, "A rolled-back reload could not re-apply its previous metadata; it is recorded as running the new one, not as declared, for the next reload to apply its declaration again.")
                }
                false => {
                    tracing::warn!(component = %key, "A rolled-back reload could not re-apply its previous metadata, and it no longer runs that instance.")
                }
            }
        }
    }
}
