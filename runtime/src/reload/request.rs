//! What a reload is asked to do, and why one may not apply.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::Span;

use super::history::Trigger;
use crate::assemble::{failure_lines, ComponentFailure};
use crate::component::ComponentKey;
use crate::config::{Config, LayerChange, Problems};

/// One reload to perform: changes to any layers of the configuration
/// (file, overlay, control-plane pushes), laid over the running layers.
#[derive(Debug, Clone)]
pub struct ReloadRequest {
    /// What asked for it.
    pub trigger: Trigger,
    /// The layer changes, applied in order.
    pub changes: Vec<LayerChange>,
    /// Components to re-resolve even if their declaration did not change
    /// (a watched value changed).
    pub forced: BTreeSet<ComponentKey>,
    /// Reject the reload unless this is the running generation (an older
    /// one: a change was made meanwhile; a newer one: the runtime may have
    /// restarted, its generations counting from 1 again).
    pub based_on_generation: Option<u64>,
    /// 0 for fresh input; `n` for the `n`-th retry of a triggered reload
    /// that rolled back (the runtime's worker sets it).
    pub attempt: u32,
    /// The span that asked for the reload: the reload's own trace (its
    /// root span `rewire.reload`) links to it, as OpenTelemetry's span
    /// link. By default the span current where the request is made (a
    /// control-plane push's `rewire.api` span); for a retry, the root span
    /// of the attempt that rolled back before it. Held until the reload
    /// starts, so the span is still open to be linked (its duration is
    /// that of its own work: it ends when last exited).
    pub cause: Option<Span>,
    /// Where a run leaves its root span, when a slot is given (opt-in:
    /// only the runtime's worker gives one, holding a clone of the request
    /// to make that span the cause of the retry). `None` (the default): a
    /// run leaves no span behind, so a host reloading clones of a kept
    /// template does not hold each run's root span open (unexported) in
    /// the template.
    pub ran_as: Option<RanAs>,
}

/// Where a run of a [`ReloadRequest`] leaves its root span, shared by the
/// request's clones (see [`ReloadRequest::ran_as`]).
#[derive(Debug, Clone, Default)]
pub struct RanAs(Arc<Mutex<Option<Span>>>);

impl RanAs {
    /// Leaves `span`, the root span of a run, in place of any before it.
    pub(crate) fn put(&self, span: Span) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(span);
    }

    /// The root span of the last run, taken out (`None`: not run since,
    /// or not traced).
    pub(crate) fn take(&self) -> Option<Span> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl ReloadRequest {
    /// A reload of `candidate` as the new base configuration (the file
    /// layer), started by `trigger`; overlays and pushes stay laid over it.
    pub fn new(candidate: Config, trigger: Trigger) -> Self {
        Self::of_changes(trigger, vec![LayerChange::File(candidate)])
    }

    /// A reload applying `changes`, started by `trigger`, caused by the
    /// span current here (none when that span is not recorded).
    pub fn of_changes(trigger: Trigger, changes: Vec<LayerChange>) -> Self {
        let current = Span::current();
        Self {
            trigger,
            changes,
            forced: BTreeSet::new(),
            based_on_generation: None,
            attempt: 0,
            cause: (!current.is_disabled()).then_some(current),
            ran_as: None,
        }
    }

    /// This request, caused by `span` (see [`cause`](Self::cause)) rather
    /// than by the span current where it was made.
    #[must_use]
    pub fn caused_by(mut self, span: Span) -> Self {
        self.cause = (!span.is_disabled()).then_some(span);
        self
    }

    /// This request with a fresh slot for its run's root span (see
    /// [`ran_as`](Self::ran_as)), shared with no earlier clone.
    #[must_use]
    pub(crate) fn leaving_its_span(mut self) -> Self {
        self.ran_as = Some(RanAs::default());
        self
    }

    /// The root span the run left in this request's slot, taken out
    /// (`None`: no slot, not run since, or not traced).
    pub(crate) fn take_ran_as(&self) -> Option<Span> {
        self.ran_as.as_ref().and_then(RanAs::take)
    }
}

/// Why a reload did not apply. In every case the running generation is
/// untouched.
///
/// Its `Debug` is its `Display` (one problem per line), so a host's `main`
/// that returns it with `?` prints readable text, not the structure.
#[derive(Clone, thiserror::Error)]
pub enum ReloadError {
    /// The candidate is invalid (every problem listed).
    #[error("configuration rejected:\n{0}")]
    Invalid(Problems),
    /// The update was based on an older generation than the running one.
    #[error("stale update: based on generation {based_on}, but generation {running} is running (if newer, the runtime may have restarted)")]
    Stale {
        /// The generation the update was based on.
        based_on: u64,
        /// The running generation.
        running: u64,
    },
    /// A component failed to build or become ready; everything was undone.
    #[error("reload rolled back:\n{}", failure_lines(.0))]
    RolledBack(Vec<ComponentFailure>),
    /// The runtime is shut down.
    #[error("the runtime is shut down")]
    Stopped,
}

impl std::fmt::Debug for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::ReloadError;
    use crate::config::{Problem, Problems};

    #[test]
    fn debug_is_the_readable_display_one_problem_per_line() {
        let problems = Problems(vec![Problem::file("first"), Problem::file("second")]);
        let error = ReloadError::Invalid(problems);
        let returned: Box<dyn std::error::Error> = Box::new(error.clone());
        assert_eq!(
            format!("{returned:?}"),
            "configuration rejected:\nfirst\nsecond"
        );
        let stale = ReloadError::Stale {
            based_on: 1,
            running: 2,
        };
        assert_eq!(format!("{stale:?}"), stale.to_string());
    }
}
