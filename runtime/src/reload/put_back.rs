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

use super::actions::Action;
use super::in_place::Unapplied;
use super::record::Ending;
use super::transaction::revert;
use super::Reloader;
use crate::assemble::AssemblyContext;
use crate::running::Marks;

/// What a commit left to put back, and the reload's context to do it in
/// (its init timeout, cut short by shutdown as the reload is).
pub(super) struct PutBack {
    pub(super) unapplied: Vec<Unapplied>,
    pub(super) cx: AssemblyContext,
}

impl Reloader {
    /// Makes each unapplied component's previous entry the running set's
    /// again, re-applies its previous metadata on the instance (the
    /// update may have been half made), and marks it failed in `ending`,
    /// with why. `not_as_declared`: the marks of the components whose
    /// running entry was not what their declaration says before the
    /// reload (their previous entry is put back marked so again, one more
    /// failed retry counted).
    pub(super) async fn put_back(
        &self,
        put_back: PutBack,
        not_as_declared: &Marks,
        ending: &mut Ending,
    ) {
        let PutBack { unapplied, cx } = put_back;
        let mut lines = Vec::new();
        for Unapplied {
            key,
            previous,
            hook,
            message,
        } in unapplied
        {
            let component = previous.assembled.instance.component();
            let metadata = previous.assembled.resolved.clone();
            // The values of the update put back, which the instance may
            // still use if the revert fails: held meanwhile, then with the
            // restored entry (its own metadata holds only the old ones).
            let updated = self.running.snapshot().components.get(&key).cloned();
            let new_values = updated.map(|u| u.assembled.resolved.held_secrets());
            let instance = previous.assembled.instance.clone();
            // Recorded first: the revert may take up to the init timeout.
            let mark = not_as_declared.get(&key).map(|mark| mark.failed_again());
            let kept = match (self.running.restore(previous, mark), mark) {
                (Ok(()), Some(mark)) if !mark.forces() => format!(
                    "its previous entry, not as declared, stays in force; {}",
                    mark.retried()
                ),
                (Ok(()), _) => "its previous declaration stays in force; reload the change to try again"
                    .to_string(),
                (Err(why), _) => format!(
                    "its previous declaration could not be restored ({why}); reload the change to try again"
                ),
            };
            let reverted = revert(&key, component, hook, metadata, &cx).await;
            if let (false, Some(new_values)) = (reverted, new_values) {
                self.running.hold_too(&key, &instance, new_values);
            }
            let metadata = match reverted {
                true => "its previous metadata was re-applied",
                false => "re-applying its previous metadata failed too: it may run with part of the new one",
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
}
