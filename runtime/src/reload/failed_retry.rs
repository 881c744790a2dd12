//! [`FailedRetry`]: the note a reload's record carries for a marked
//! component whose best-effort retry failed (see `marked`), in the words
//! of a reload that commits or of one that rolls back.

use crate::running::Mark;

/// A marked component's retry that failed and was kept as it runs (see
/// `Plan::keep_failed_retries` in `marked`): a note for the reload's record.
pub(super) struct FailedRetry {
    /// The failure, as the record says it.
    failure: String,
    /// The component's mark before this retry.
    mark: Mark,
}

impl FailedRetry {
    /// The retry that failed with `failure`, of a component marked `mark`.
    /// Kept on one line (its control characters escaped, `\n`): a line
    /// of the record's error that begins with no component continues the
    /// line before, so the note's second line would pass for a failure of
    /// whatever the reload did next (see
    /// [`ReloadRecord::failure_lines`](super::ReloadRecord::failure_lines)).
    pub(super) fn new(failure: String, mark: Mark) -> Self {
        let failure = match failure.contains(char::is_control) {
            true => failure
                .chars()
                .map(|c| match c.is_control() {
                    true => c.escape_default().to_string(),
                    false => c.to_string(),
                })
                .collect(),
            false => failure,
        };
        Self { failure, mark }
    }

    /// The note of a reload that commits: the component is kept as it
    /// runs, its mark counting one more failed retry.
    pub(super) fn committed(&self) -> String {
        let (failure, retried) = (&self.failure, self.mark.failed_again().retried());
        format!(
            "{failure}; it is not as declared (an earlier update of it failed and could not be put back) and this reload only retried it: it is kept as it runs and the reload goes on without it; {retried}"
        )
    }

    /// The note of a reload that rolls back for another failure: the
    /// component runs as before, its mark unchanged.
    pub(super) fn rolled_back(&self) -> String {
        let (failure, retried) = (&self.failure, self.mark.retried());
        format!(
            "{failure}; it is not as declared (an earlier update of it failed and could not be put back) and this reload only retried it: it runs as before, and as the reload rolled back for another failure this retry is not counted; {retried}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure of several lines makes a note of one. Before: its second
    /// line began with no component, so the ACK of an unrelated push
    /// carried it as an error.
    #[test]
    fn a_note_is_one_line() {
        let retry = FailedRetry::new("custom/x: init failed: a\nb\r".into(), Mark::default());
        for note in [retry.committed(), retry.rolled_back()] {
            assert_eq!(note.lines().count(), 1, "{note}");
            assert!(
                note.starts_with("custom/x: init failed: a\\nb\\r; "),
                "{note}"
            );
        }
    }
}
