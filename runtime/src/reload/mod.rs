//! Hot reload: a candidate configuration is validated whole, diffed against
//! the running one, and applied as a transaction — components that did not
//! change keep their very instance, metadata-only changes are applied in
//! place where the component allows it, everything else is built fresh
//! against the new generation's handles and must become ready before one
//! atomic swap. Any failure undoes the lot and the old generation keeps
//! serving. Replaced instances are closed after their in-flight users let
//! go.
//!
//! The [`Reloader`] runs reloads one at a time over the
//! [`RunningSet`](crate::running::RunningSet), which it commits to; it
//! knows nothing of triggers or of the runtime that drives it.

mod actions;
mod at_commit;
mod drain;
mod failed_retry;
mod history;
mod in_place;
mod marked;
mod put_back;
pub(crate) mod queue;
mod record;
mod request;
mod steps;
mod trace;
mod transaction;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::Span;

pub use actions::{Action, Actions};
pub use history::{Outcome, ReloadRecord, Trigger};
pub use request::{ReloadError, ReloadRequest};

use crate::assemble::{ComponentFailure, FailedStep, StartTimeouts};
use crate::guarded::panic_message;
use crate::redact::Redactor;
use crate::registry::Registry;
use crate::running::RunningSet;
use history::History;

/// What a reload task committed, left for [`Reloader::joined_marked`]
/// should the task panic after its commit.
#[derive(Debug)]
struct Committed {
    /// [`Outcome::Applied`] or [`Outcome::NoChange`].
    outcome: Outcome,
    /// The generation serving from the commit on.
    generation: u64,
    actions: std::collections::BTreeMap<crate::component::ComponentKey, Action>,
    serving: imbl::OrdSet<crate::component::ComponentKey>,
}

/// How reloads build and retire components.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReloadSettings {
    /// Init and readiness timeouts of rebuilt components.
    pub(crate) timeouts: StartTimeouts,
    /// How long a replaced instance may keep in-flight users.
    pub(crate) drain_grace: Duration,
}

/// Runs reloads over a running set, one at a time, and records them.
pub(crate) struct Reloader {
    running: RunningSet,
    registry: Arc<Registry>,
    settings: ReloadSettings,
    redactor: Redactor,
    history: Mutex<History>,
    /// Held for the whole of a reload: reloads are serialised.
    serial: tokio::sync::Mutex<()>,
    /// Cancelled at shutdown: no reload starts after it, and the one in
    /// progress is cut short (its assembly's stop is a child of it).
    stopped: CancellationToken,
    events: broadcast::Sender<ReloadRecord>,
    /// What reloads replaced, closing once let go.
    drains: drain::Drains,
    /// Closes abandoned by a reload cut short by shutdown (its failed
    /// assemblies' and its undo's): the shutdown counts them. Those of a
    /// reload that rolled back on its own were logged then, not counted.
    abandoned_when_cut: AtomicUsize,
}

impl Reloader {
    /// A reloader of `running`, keeping `history_capacity` records.
    pub(crate) fn new(
        running: RunningSet,
        registry: Arc<Registry>,
        settings: ReloadSettings,
        redactor: Redactor,
        history_capacity: usize,
    ) -> Self {
        Self {
            running,
            registry,
            settings,
            redactor,
            history: Mutex::new(History::new(history_capacity)),
            serial: tokio::sync::Mutex::new(()),
            stopped: CancellationToken::new(),
            events: broadcast::channel(64).0,
            drains: drain::Drains::default(),
            abandoned_when_cut: AtomicUsize::new(0),
        }
    }

    /// The running set it reloads.
    pub(crate) fn running(&self) -> &RunningSet {
        &self.running
    }

    /// Runs `request` as one transaction, serialised with every other. It
    /// runs in its own task: a caller that gives up (a timeout, a
    /// disconnected API client) cannot leave it half done.
    pub(crate) async fn reload(
        self: &Arc<Self>,
        request: ReloadRequest,
    ) -> Result<ReloadRecord, ReloadError> {
        let recording = record::Recording::start(request.trigger.clone(), request.attempt);
        let reloader = Arc::clone(self);
        let traced = Arc::new(OnceLock::new());
        let committed = Arc::new(OnceLock::new());
        let task = tokio::spawn({
            let traced = Arc::clone(&traced);
            let committed = Arc::clone(&committed);
            async move { reloader.run(request, &traced, &committed).await }
        });
        self.joined_marked(recording, &traced, &committed, task)
            .await
    }

    /// [`joined_marked`](Self::joined_marked) of a task that never
    /// commits.
    #[cfg(test)]
    async fn joined(
        &self,
        recording: record::Recording,
        traced: &OnceLock<Span>,
        task: tokio::task::JoinHandle<Result<ReloadRecord, ReloadError>>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.joined_marked(recording, traced, &OnceLock::new(), task)
            .await
    }

    /// The end of the reload `task`. When it panicked (a bug: components'
    /// own calls are guarded), nothing was recorded: it is recorded here,
    /// so history, events and metrics still show it; on the reload's own
    /// root span, `traced` (one reload, one trace), or on a new one if the
    /// task panicked before it had one. Before its commit, it is rolled
    /// back (the running set is untouched; a trigger retries it). After
    /// it (`committed` says what), the new generation serves: it is
    /// recorded as committed, the panic in its error, and answered as
    /// such (retrying it would apply it again, to no end).
    async fn joined_marked(
        &self,
        recording: record::Recording,
        traced: &OnceLock<Span>,
        committed: &OnceLock<Committed>,
        task: tokio::task::JoinHandle<Result<ReloadRecord, ReloadError>>,
    ) -> Result<ReloadRecord, ReloadError> {
        let err = match task.await {
            Ok(result) => return result,
            Err(err) => err,
        };
        let why = match err.is_panic() {
            true => panic_message(&*err.into_panic()).to_string(),
            false => "cancelled".to_string(),
        };
        let span = match traced.get() {
            Some(span) => span.clone(),
            None => trace::reload_span(recording.trigger(), recording.attempt()),
        };
        if let Some(committed) = committed.get() {
            let message = self
                .redactor
                .scrub(&format!("the reload panicked after its commit: {why}"));
            tracing::error!(error = %message, generation = committed.generation, "Reload task failed after its commit; recorded as committed.");
            let ending = record::Ending {
                outcome: committed.outcome,
                generation: committed.generation,
                actions: committed.actions.clone(),
                serving: committed.serving.clone(),
                error: Some(message),
            };
            return Ok(span.in_scope(|| self.finish(recording, ending)));
        }
        let message = self.redactor.scrub(&format!("the reload panicked: {why}"));
        tracing::error!(error = %message, "Reload task failed; recorded as rolled back.");
        let ending = record::Ending {
            outcome: Outcome::RolledBack,
            generation: self.running.generation_number(),
            actions: std::collections::BTreeMap::new(),
            serving: imbl::OrdSet::new(),
            error: Some(message.clone()),
        };
        span.in_scope(|| self.finish(recording, ending));
        Err(ReloadError::RolledBack(vec![ComponentFailure {
            component: None,
            step: FailedStep::Panicked,
            message,
        }]))
    }

    /// The last reloads, oldest first.
    pub(crate) fn history(&self) -> Vec<ReloadRecord> {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records()
    }

    /// Every reload record from now on, as it is made.
    pub(crate) fn events(&self) -> broadcast::Receiver<ReloadRecord> {
        self.events.subscribe()
    }

    /// Cuts short a reload in progress (it answers
    /// [`ReloadError::Stopped`]) and refuses any later one, without waiting
    /// or closing anything: the components keep serving.
    pub(crate) fn stop(&self) {
        self.stopped.cancel();
    }

    /// Cuts short a reload in progress (its resolves, `init`s and
    /// readiness waits: it rolls back, its undo bounded) and waits for it,
    /// refuses any later one, closes what reloads replaced (without
    /// waiting for their users, all at once, each bounded by
    /// `CLOSE_TIMEOUT`: they may use the components in force, not the
    /// other way round) and only then every component.
    /// Returns how many closes were abandoned (timed out or panicked).
    ///
    /// With a deadline `by`, the whole of it ends by then and the stores
    /// are still closed: the reload is waited for until half the time
    /// left (past it, it is left behind, counted as one abandoned close,
    /// and the components in force are closed all the same), the drains
    /// for at most half of what is then left, and every level of the
    /// components closes within its share of the rest (see
    /// `close_in_reverse`), the first level, the stores, included.
    pub(crate) async fn shutdown(&self, by: Option<tokio::time::Instant>) -> usize {
        self.stopped.cancel();
        let half_left = |by: tokio::time::Instant| {
            let now = tokio::time::Instant::now();
            now + by.saturating_duration_since(now) / 2
        };
        let serial = match by {
            None => Some(self.serial.lock().await),
            Some(by) => {
                let until = half_left(by);
                let serial = tokio::time::timeout_at(until, self.serial.lock()).await;
                serial.ok()
            }
        };
        let left_behind = usize::from(serial.is_none());
        if serial.is_none() {
            tracing::error!("The reload in progress did not end in time at shutdown; closing the components in force without it.");
        }
        // Told before the reload let go of the lock, if it ended.
        let cut = self.abandoned_when_cut.swap(0, Ordering::Relaxed);
        let retired = self.drains.finish(by.map(half_left)).await;
        left_behind + cut + retired + self.running.close_all(by).await
    }
}

#[cfg(test)]
pub(crate) mod tests;
