//! One reload, as named steps: check it is fresh, lay the changes over the
//! layers, validate, prepare the transaction, commit, record.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use imbl::OrdSet;
use tokio::sync::MutexGuard;
use tracing::{Instrument, Span};

use super::actions::Action;
use super::history::{Outcome, ReloadRecord};
use super::in_place;
use super::put_back::PutBack;
use super::record::{Ending, Recording};
use super::request::{ReloadError, ReloadRequest};
use super::transaction::{self, Prepared};
use super::{Committed, Reloader};
use crate::assemble::{failure_lines, AssemblyContext, ComponentFailure, FailedStep};
use crate::component::{ComponentKey, Handover, LeftMark};
use crate::config::{validate_reload, ConfigDiff, LayerChange, Problems, ValidConfig};
use crate::handle::Generation;
use crate::running::{Commit, RunningLayers, Snapshot};

impl Reloader {
    /// Runs `request` to the end, as a trace of its own; the running set
    /// changes only if it applies. The trace starts once the reload has its
    /// turn (its root span's duration is the reload's own work), the time
    /// it waited recorded on it as `rewire.queued_ms`; the root span is
    /// also left in `traced`, for the caller to record on should the
    /// reload panic. The root span links to the request's cause (let go
    /// of then: the cause's span is not held for the whole reload), names
    /// the components it forces, and is left in the request's `ran_as`
    /// slot when it has one (for a retry to link to; none by default, so a
    /// run leaves no span behind). What it committed, once it has, is left
    /// in `committed_as` (for the caller, should the reload panic after it).
    pub(super) async fn run(
        &self,
        mut request: ReloadRequest,
        traced: &OnceLock<Span>,
        committed_as: &OnceLock<Committed>,
    ) -> Result<ReloadRecord, ReloadError> {
        let asked = Instant::now();
        let serial = self.serial.lock().await;
        let span = super::trace::reload_span(&request.trigger, request.attempt);
        super::trace::record_queued(&span, asked.elapsed());
        super::trace::link_cause(&span, request.cause.take().as_ref());
        super::trace::record_forced(&span, &request.forced);
        if let Some(slot) = request.ran_as.as_ref().filter(|_| !span.is_disabled()) {
            slot.put(span.clone());
        }
        let _ = traced.set(span.clone());
        self.run_steps(request, committed_as, serial)
            .instrument(span)
            .await
    }

    /// The steps of `request`, its turn (`_serial`) held to the end; what
    /// it committed left in `committed_as`.
    async fn run_steps(
        &self,
        mut request: ReloadRequest,
        committed_as: &OnceLock<Committed>,
        _serial: MutexGuard<'_, ()>,
    ) -> Result<ReloadRecord, ReloadError> {
        if self.stopped.is_cancelled() {
            let generation = self.running.generation_number();
            super::trace::record_stopped(&Span::current(), generation);
            return Err(ReloadError::Stopped);
        }
        let recording = Recording::start(request.trigger.clone(), request.attempt);
        let snapshot = self.running.snapshot();
        let rejected = |error: ReloadError| Ending {
            outcome: Outcome::Rejected,
            generation: snapshot.generation,
            actions: BTreeMap::new(),
            serving: OrdSet::new(),
            error: Some(match &error {
                ReloadError::Invalid(problems) => problems.to_string(),
                other => other.to_string(),
            }),
        };
        let changes = std::mem::take(&mut request.changes);
        let candidate = match self.candidate(&snapshot, &request, changes) {
            Ok(candidate) => candidate,
            Err(error) => {
                self.finish(recording, rejected(error.clone()));
                return Err(error);
            }
        };
        let (config, layers, diff) = candidate;
        let ended = Ended::by(&diff, &snapshot.config, &config, self.running.handover());
        // Declared alike but written differently (scopes): no action, but
        // a new declaration in force, so a new generation.
        let rewritten = !diff.rewritten.is_empty();
        // Forced into this reload (see `prepare`); the commit clears their
        // marks, which a put-back of one gives back.
        let not_as_declared = snapshot.not_as_declared.clone();
        let prepared = match self.prepare(snapshot, &config, diff, &request).await {
            Ok(prepared) => prepared,
            Err((ending, error)) => {
                self.finish(recording, ending);
                return Err(error);
            }
        };
        if prepared.actions.values().any(|a| *a != Action::Unchanged) {
            // Pub/sub subscriptions attach to rebuilt brokers while the
            // old ones still take every publish.
            let next = || {
                prepared
                    .components
                    .iter()
                    .map(|(key, running)| (key.clone(), running.assembled.instance.clone()))
                    .collect()
            };
            // Cut by a shutdown: it would only hold it (up to the warm
            // deadline), and the reload is undone below.
            tokio::select! {
                () = self.running.live().warm(next) => {}
                () = self.stopped.cancelled() => {}
            }
        }
        // Warming takes seconds: a shutdown may have left this reload
        // behind meanwhile and closed the components in force.
        let committed = match self.stopped.is_cancelled() {
            true => Err(Box::new(Cut::of(prepared))),
            false => self.commit(config, layers, prepared, (ended, rewritten), committed_as),
        };
        match committed {
            Ok((mut ending, put_back)) => {
                if let Some(put_back) = put_back {
                    self.put_back(put_back, &not_as_declared, &mut ending).await;
                }
                Ok(self.finish(recording, ending))
            }
            Err(cut) => Err(self.undo_cut(recording, cut).await),
        }
    }

    /// Undoes a prepared generation a shutdown cut short before its commit
    /// (its closes abandoned counted at shutdown) and records it.
    async fn undo_cut(&self, recording: Recording, cut: Box<Cut>) -> ReloadError {
        tracing::warn!("A reload prepared when shutdown began is undone, not committed.");
        let abandoned = cut.undo.run().await;
        let counted = &self.abandoned_when_cut;
        counted.fetch_add(abandoned, std::sync::atomic::Ordering::Relaxed);
        let ending = Ending {
            outcome: Outcome::RolledBack,
            generation: self.running.generation_number(),
            actions: cut.actions,
            serving: cut.serving,
            error: Some(transaction::CUT_BY_SHUTDOWN.to_string()),
        };
        self.finish(recording, ending);
        ReloadError::Stopped
    }

    /// Checks `request` is based on the running generation (when it says),
    /// lays its changes over the running layers, and validates the result
    /// against the running configuration (what is declared as before
    /// passed already); returns it with the layers and its difference from
    /// the running configuration. A request based on a generation newer
    /// than the running one is stale too: generation numbers start again
    /// at 1 when the runtime restarts, so whoever read that number read
    /// another runtime's configuration.
    fn candidate(
        &self,
        snapshot: &Snapshot,
        request: &ReloadRequest,
        changes: Vec<LayerChange>,
    ) -> Result<(ValidConfig, RunningLayers, ConfigDiff), ReloadError> {
        if let Some(based_on) = request
            .based_on_generation
            .filter(|g| *g != snapshot.generation)
        {
            return Err(ReloadError::Stale {
                based_on,
                running: snapshot.generation,
            });
        }
        let invalid = |problem| ReloadError::Invalid(Problems(vec![problem]));
        let mut changes = changes.into_iter();
        // The running layers, copied with the first change laid (a new
        // file is not preceded by a copy of the old one).
        let running = &snapshot.config.config;
        let mut layers = match changes.next() {
            Some(first) => snapshot.layers.changed(running, first).map_err(invalid)?,
            None => snapshot.layers.whole(running),
        };
        for change in changes {
            layers.apply(change).map_err(invalid)?;
        }
        let (effective, layers) = RunningLayers::lay(layers);
        let diff = ConfigDiff::for_reload(&snapshot.config.config, &effective);
        let config = validate_reload(effective, &self.registry, &snapshot.config, &diff)
            .map_err(ReloadError::Invalid)?;
        Ok((config, layers, diff))
    }

    /// Builds the new generation off to the side; on failure everything
    /// built is undone and the ending to record is returned. The
    /// components whose running entry is not what their declaration says
    /// are forced, as the request's are: re-resolved and updated again
    /// although the diff sees no change in their declaration (best effort:
    /// see [`super::marked`]).
    async fn prepare(
        &self,
        snapshot: Snapshot,
        candidate: &ValidConfig,
        diff: ConfigDiff,
        request: &ReloadRequest,
    ) -> Result<Prepared, (Ending, ReloadError)> {
        let cx = AssemblyContext {
            app_id: candidate.config.app_id.clone(),
            live: self.running.live().clone(),
            staged: Arc::new(Generation::default()),
            timeouts: self.settings.timeouts,
            redactor: self.redactor.clone(),
            config_dir: candidate.config.base_dir.clone(),
            handover: self.running.handover().clone(),
            // Cut short by shutdown, as a start-up is: a resolve, `init` or
            // readiness wait against a dead backend cannot hold SIGTERM
            // for the init timeout; the reload then rolls back.
            stop: self.stopped.child_token(),
            // Its own: counted at shutdown only if shutdown cut it short.
            abandoned_closes: Arc::default(),
        };
        let abandoned = Arc::clone(&cx.abandoned_closes);
        let generation = snapshot.generation;
        let marks = snapshot.not_as_declared;
        let graph = &candidate.graph;
        let (forced, best_effort) = super::marked::forced(&marks, &request.forced, &diff, graph);
        let plan = transaction::Plan {
            current: snapshot.components,
            old: snapshot.config,
            candidate,
            diff,
            forced,
            best_effort,
            marks,
        };
        let prepared = plan.prepare(&self.registry, &cx).await;
        if self.stopped.is_cancelled() {
            let abandoned = abandoned.load(std::sync::atomic::Ordering::Relaxed);
            let counted = &self.abandoned_when_cut;
            counted.fetch_add(abandoned, std::sync::atomic::Ordering::Relaxed);
        }
        prepared.map_err(|mut failed| {
            // What the undo could not re-apply may run: recorded, held and
            // marked for the next reload to apply its declaration again.
            self.keep_unreverted(std::mem::take(&mut failed.unreverted));
            let cut = self.stopped.is_cancelled() && told_cut(&mut failed.failures);
            let ending = Ending {
                outcome: Outcome::RolledBack,
                generation,
                actions: failed.actions,
                serving: failed.serving,
                error: Some(with_notes(failure_lines(&failed.failures), &failed.notes)),
            };
            // Not a rejection of the change: the runtime is going away.
            let error = match cut {
                true => ReloadError::Stopped,
                false => ReloadError::RolledBack(failed.failures),
            };
            (ending, error)
        })
    }

    /// Commits `prepared` as the running set, puts the in-place updates it
    /// staged in force right after the swap, forgets what the components
    /// it `ended` left for their own type, and drains what it replaced,
    /// users before the stores they use; gives back the staged updates
    /// that panicked when applied, to put back. Once the running set is
    /// closed (a shutdown left this reload behind), it is not made: what
    /// undoes `prepared` is given back. A new generation is published when
    /// a section or an instance changed, or a component is `rewritten`
    /// (declared alike, written differently: its scopes). What it
    /// committed is left in `committed_as` as soon as the running set
    /// took it (for the caller, should anything after panic).
    fn commit(
        &self,
        config: ValidConfig,
        layers: RunningLayers,
        prepared: Prepared,
        (ended, rewritten): (Ended, bool),
        committed_as: &OnceLock<Committed>,
    ) -> Result<(Ending, Option<PutBack>), Box<Cut>> {
        let sections_changed = self.running.sections_differ(&config.config.sections);
        let changed = sections_changed
            || rewritten
            || prepared.actions.values().any(|a| *a != Action::Unchanged);
        let old_order = prepared.old_order;
        let notes = prepared.notes;
        let unreverted = prepared.unreverted;
        let serving = prepared.components.key_set();
        let components = Arc::new(prepared.components);
        let committed = self.running.commit(Commit {
            config,
            layers,
            components: components.clone(),
            acted_on: prepared.actions.keys().cloned().collect(),
            publish: changed,
            marks_left: prepared.marks_left,
        });
        let Ok(generation) = committed else {
            // The instances retired were closed with the set; the staged
            // updates are discarded with `prepared.deferred`.
            return Err(Box::new(Cut {
                undo: prepared.undo,
                actions: prepared.actions,
                serving,
            }));
        };
        let outcome = match changed {
            true => Outcome::Applied,
            false => Outcome::NoChange,
        };
        let _ = committed_as.set(Committed {
            outcome,
            generation,
            actions: prepared.actions.clone(),
            serving: serving.clone(),
        });
        for note in &notes {
            // Only once committed: a reload that rolls back did not go on.
            tracing::warn!(note = %note, "Retrying a component not as declared failed; it is kept as it runs and the reload goes on without it.");
        }
        // A kept retry whose revert failed: what may run is recorded,
        // held and marked as soon as the commit stands.
        let mut notes = notes;
        notes.extend(unreverted.iter().map(in_place::Unreverted::line));
        self.keep_unreverted(unreverted);
        let unapplied = in_place::apply_deferred(prepared.deferred);
        let put_back = (!unapplied.is_empty()).then(|| PutBack {
            unapplied,
            cx: prepared.undo.context().clone(),
        });
        ended.forget(self.running.handover());
        let mut retired = prepared.retired;
        let position: std::collections::HashMap<_, _> = old_order
            .iter()
            .enumerate()
            .map(|(i, key)| (key, i))
            .collect();
        retired.sort_by_key(|(key, _)| std::cmp::Reverse(position.get(key).copied()));
        self.drains.spawn(retired, self.settings.drain_grace);
        let ending = Ending {
            outcome,
            generation,
            actions: prepared.actions,
            serving,
            error: (!notes.is_empty()).then(|| notes.join("\n")),
        };
        Ok((ending, put_back))
    }
}

/// A rolled-back reload's `error` lines, with the `notes` of the marked
/// components whose retry failed too, one line each.
fn with_notes(error: String, notes: &[String]) -> String {
    std::iter::once(error)
        .chain(notes.iter().cloned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A prepared generation a shutdown cut short before its commit: what
/// undoes it, and what to record.
struct Cut {
    undo: transaction::Undo,
    actions: BTreeMap<ComponentKey, Action>,
    serving: OrdSet<ComponentKey>,
}

impl Cut {
    fn of(prepared: Prepared) -> Self {
        Self {
            serving: prepared.components.key_set(),
            undo: prepared.undo,
            actions: prepared.actions,
        }
    }
}

/// Whether shutdown cut the reload short: a component of it was cancelled.
/// Their failures then say so in a reload's words, not in the start-up's
/// the assembly shares with it.
fn told_cut(failures: &mut [ComponentFailure]) -> bool {
    let mut cut = false;
    for failure in failures.iter_mut() {
        if failure.step == FailedStep::Cancelled {
            failure.message = transaction::CUT_BY_SHUTDOWN.to_string();
            cut = true;
        }
    }
    cut
}

/// The components whose declaration a reload ends: removed, or declared
/// with another `type`. At its commit (never before: a rollback keeps
/// them), what their earlier instances left in the handover area for the
/// same type only is forgotten, so a retired instance still held (a call
/// in flight, an embedder's `Arc`) cannot hand its data to a new
/// declaration (see [`Handover::leave_for_same_type`]).
struct Ended {
    keys: Vec<ComponentKey>,
    /// Taken before the reload builds anything: what the instances it
    /// builds leave stays.
    before: LeftMark,
}

impl Ended {
    fn by(diff: &ConfigDiff, old: &ValidConfig, new: &ValidConfig, handover: &Handover) -> Self {
        // `type_changed` also marks every component of an app id change
        // (to rebuild it): only a `type` that differs ends a component.
        let type_of = |config: &ValidConfig, key: &ComponentKey| {
            config
                .config
                .components
                .get(key)
                .map(|spec| spec.type_name.clone())
        };
        let type_changed = diff
            .changed
            .iter()
            .filter(|(_, change)| change.type_changed)
            .map(|(key, _)| key)
            .filter(|key| type_of(old, key) != type_of(new, key));
        Self {
            keys: diff.removed.iter().chain(type_changed).cloned().collect(),
            before: handover.mark(),
        }
    }

    fn forget(self, handover: &Handover) {
        for key in &self.keys {
            handover.forget_same_type_left_before(key, self.before);
        }
    }
}
