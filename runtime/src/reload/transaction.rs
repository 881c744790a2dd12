//! One reload transaction: decide per component, build the new generation
//! level by level against its own handles, put in force last the in-place
//! updates that were not staged, and either commit it whole or undo
//! everything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use imbl::OrdSet;
use tracing::{Instrument, Span};

use super::actions::Action;
use super::failed_retry::FailedRetry;
use super::in_place::{self, Answer, Unreverted, Unreverting};
use super::trace;
use crate::assemble::{
    assemble_resolved, resolve_metadata, AssemblyContext, ComponentFailure, FailedStep,
};
use crate::assembly_tasks::ComponentTasks;
use crate::closing::{close_one, CLOSE_TIMEOUT};
use crate::component::{Component, ComponentKey, InPlace, PendingInPlace, StagedInPlace};
use crate::config::{ComponentSpec, ConfigDiff, SpecChange, ValidConfig};
use crate::metadata::Metadata;
use crate::registry::{in_place_of, ComponentDescriptor, InPlaceHook, Registry};
use crate::running::{staged_sharing, Components, Mark, Marks, MarksLeft, Running};

/// What happened to one component in the transaction.
pub(crate) enum Step {
    /// Kept its instance (its spec may be updated to an equivalent one).
    Kept(Running),
    /// The running instance took (or is to take) the new metadata in place.
    InPlace {
        running: Running,
        /// Where the update stands.
        update: Update,
        previous: Metadata,
        /// The type's declared in-place update, to revert with.
        hook: Option<InPlaceHook>,
    },
    /// A new instance; `replaced` is the old one, if any.
    Built {
        running: Running,
        replaced: Option<Box<Running>>,
    },
}

/// Where an in-place update stands in a transaction.
pub(crate) enum Update {
    /// Already in force, and `previous` undoes it.
    InForce,
    /// Staged only, put in force at commit (dropped on rollback).
    Staged(PendingInPlace),
    /// Not made yet ([`StagedInPlace::AtCommit`]): `update_in_place` is
    /// called in the transaction's last step (nothing to undo before),
    /// which records its action on the component's span, this one.
    AtCommit(Span),
}

impl Step {
    pub(super) fn action(&self) -> Action {
        match self {
            // Not made (yet): a reload that fails before its last step
            // left the instance as it was.
            Step::Kept(_) => Action::Unchanged,
            Step::InPlace {
                update: Update::AtCommit(_),
                ..
            } => Action::Unchanged,
            Step::InPlace { .. } => Action::UpdatedInPlace,
            Step::Built {
                replaced: Some(_), ..
            } => Action::Rebuilt,
            Step::Built { replaced: None, .. } => Action::Added,
        }
    }

    pub(super) fn running(&self) -> &Running {
        match self {
            Step::Kept(running) | Step::InPlace { running, .. } | Step::Built { running, .. } => {
                running
            }
        }
    }

    /// Whether it is an in-place update left to the commit, not made yet.
    pub(super) fn is_at_commit(&self) -> bool {
        matches!(
            self,
            Step::InPlace {
                update: Update::AtCommit(_),
                ..
            }
        )
    }
}

/// A transaction that succeeded, ready to be committed.
pub(crate) struct Prepared {
    pub(crate) components: Components,
    /// What was done to each component that was not simply kept.
    pub(crate) actions: BTreeMap<ComponentKey, Action>,
    /// Old instances to drain and close after the swap.
    pub(crate) retired: Vec<(ComponentKey, Arc<Running>)>,
    /// In-place updates staged to be put in force once the swap is done.
    pub(crate) deferred: Vec<in_place::StagedUpdate>,
    /// The old configuration's start order (retired users close first).
    pub(crate) old_order: Vec<ComponentKey>,
    /// Undoes it, should it not be committed after all.
    pub(crate) undo: Undo,
    /// The marked components it left as they ran (see
    /// [`super::marked`]), for the commit.
    pub(crate) marks_left: MarksLeft,
    /// Notes for the record (one line each) of what it left undone
    /// without failing: a marked component's retry that failed.
    pub(crate) notes: Vec<String>,
    /// The in-place updates it could not undo on instances it keeps (a
    /// marked component's retry kept as it runs): once committed, the
    /// running set is to record and hold them (see
    /// [`Reloader::keep_unreverted`](super::Reloader::keep_unreverted)).
    pub(crate) unreverted: Vec<Unreverted>,
}

/// What undoes a prepared generation that is not committed after all (a
/// shutdown cut the reload short after its preparation): closes what was
/// built and re-applies the previous metadata of in-place updates in
/// force, as a failed transaction's undo does (a staged update is
/// discarded with [`Prepared::deferred`]).
pub(crate) struct Undo {
    done: Vec<Step>,
    levels: Vec<Vec<ComponentKey>>,
    cx: AssemblyContext,
}

impl Undo {
    /// The reload's context (its timeouts, its stop).
    pub(crate) fn context(&self) -> &AssemblyContext {
        &self.cx
    }

    /// Returns how many of its closes were abandoned.
    pub(crate) async fn run(self) -> usize {
        let count = || {
            let closes = &self.cx.abandoned_closes;
            closes.load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = count();
        // Shutting down: each failed re-apply was logged, and the running
        // set closes with the instance.
        let _unreverted = undo(self.done, &self.levels, &self.cx).await;
        count().saturating_sub(before)
    }
}

/// A transaction that failed and was undone.
pub(crate) struct Failed {
    pub(crate) failures: Vec<ComponentFailure>,
    pub(crate) actions: BTreeMap<ComponentKey, Action>,
    /// What would have served: those `actions` does not name were kept.
    pub(crate) serving: OrdSet<ComponentKey>,
    /// Notes for the record (one line each) of the marked components whose
    /// retry failed too before the reload rolled back (their marks stay
    /// as they were), then of the updates in [`Self::unreverted`].
    pub(crate) notes: Vec<String>,
    /// The in-place updates it could not undo (by key): their instances
    /// may run with part of the new metadata, which the running set is to
    /// record and hold (see
    /// [`Reloader::keep_unreverted`](super::Reloader::keep_unreverted)).
    // Read by the rollback in `steps` (`prepare`) once that file takes it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) unreverted: Vec<Unreverted>,
}

/// What a transaction goes from and to.
pub(crate) struct Plan<'a> {
    /// What runs now.
    pub(crate) current: Arc<Components>,
    /// The running configuration.
    pub(crate) old: Arc<ValidConfig>,
    /// The validated candidate.
    pub(crate) candidate: &'a ValidConfig,
    /// From the running configuration to the candidate.
    pub(crate) diff: ConfigDiff,
    /// Components to re-resolve although their declaration did not change.
    pub(crate) forced: BTreeSet<ComponentKey>,
    /// Those of `forced` forced by their mark alone, which neither the
    /// request nor the change reaches: when one fails, it is kept as it
    /// runs instead of failing the transaction, and so are its dependents
    /// in the reload only on its account (see [`super::marked`]).
    pub(crate) best_effort: BTreeSet<ComponentKey>,
    /// The running set's marks (components not as declared).
    pub(crate) marks: Marks,
}

/// The transaction under way: what the new generation holds so far.
pub(super) struct Progress {
    pub(super) next: Components,
    /// Every action but the keeping of a component outside the impact.
    pub(super) actions: BTreeMap<ComponentKey, Action>,
    pub(super) done: Vec<Step>,
    /// The marked components left as they ran.
    pub(super) marks_left: MarksLeft,
    /// The marked components' retries that failed and were kept as they
    /// run: notes for the record, worded once the reload commits or rolls
    /// back.
    pub(super) notes: Vec<FailedRetry>,
    /// The in-place updates whose revert failed before a rebuild (which
    /// replaces them only if the reload commits).
    pub(super) unreverted: Unreverting,
}

impl Plan<'_> {
    /// Builds the generation for the candidate. Nothing is visible to
    /// callers until the result is committed; on failure, everything built
    /// is closed and in-place updates are reverted.
    pub(crate) async fn prepare(
        self,
        registry: &Registry,
        cx: &AssemblyContext,
    ) -> Result<Prepared, Failed> {
        let roots: BTreeSet<ComponentKey> = self
            .diff
            .touched()
            .into_iter()
            .chain(self.forced.iter().cloned())
            .collect();
        let impact = self.candidate.graph.with_dependents(&roots);
        let now = self.updated_now(&impact);
        let kept = self.kept_as_they_run(&impact);
        let mut progress = self.keep_unimpacted(&impact);
        progress.marks_left.unresolved = self.marked_among(&kept);
        let behind_best_effort = self.behind_best_effort_roots(&roots, &impact);
        let levels = self.candidate.graph.levels_within(&impact);
        for level in &levels {
            let behind = self.kept_with_best_effort_roots(level, &behind_best_effort, &progress);
            let kept = match behind.is_empty() {
                true => std::borrow::Cow::Borrowed(&kept),
                false => {
                    let marked = self.marked_among(&behind);
                    progress.marks_left.unresolved.extend(marked);
                    std::borrow::Cow::Owned(kept.union(&behind).cloned().collect())
                }
            };
            let failures = self
                .run_level(level, &now, &kept, &mut progress, registry, cx)
                .await;
            if !failures.is_empty() {
                return Err(Self::fail(progress, failures, &levels, cx).await);
            }
        }
        // Last, once everything else succeeded: a reload that failed above
        // never touched these instances.
        let committed = self.at_commit(&levels, &mut progress, registry, cx);
        if let Err(failures) = committed.await {
            return Err(Self::fail(progress, failures, &levels, cx).await);
        }
        Ok(self.retire(progress, levels, cx))
    }

    /// Undoes `progress` after `failures`.
    async fn fail(
        progress: Progress,
        failures: Vec<ComponentFailure>,
        levels: &[Vec<ComponentKey>],
        cx: &AssemblyContext,
    ) -> Failed {
        let mut actions = progress.actions;
        for failure in &failures {
            if let Some(component) = &failure.component {
                actions.insert(component.clone(), Action::Failed);
            }
        }
        let mut unreverted = progress.unreverted.take();
        unreverted.extend(undo(progress.done, levels, cx).await);
        unreverted.sort_by(|a, b| a.key.cmp(&b.key));
        let notes = progress.notes.iter().map(FailedRetry::rolled_back);
        let notes = notes.chain(unreverted.iter().map(Unreverted::line));
        Failed {
            failures,
            actions,
            serving: progress.next.key_set(),
            notes: notes.collect(),
            unreverted,
        }
    }

    /// Components outside the impact set keep their very instance: the
    /// running map is shared whole (a persistent map: the copy costs
    /// nothing), then the few the candidate removes, rewrites or impacts
    /// are set apart, each copying one path of the tree.
    fn keep_unimpacted(&self, impact: &BTreeSet<ComponentKey>) -> Progress {
        let mut next = Components::clone(&self.current);
        for key in impact.iter().chain(&self.diff.removed) {
            next.remove(key);
        }
        // Declared alike, written differently (scopes).
        for key in self.diff.rewritten.difference(impact) {
            let (Some(spec), Some(running)) =
                (self.candidate.config.components.get(key), next.get(key))
            else {
                continue;
            };
            let rewritten = Arc::new(Running {
                spec: spec.clone(),
                assembled: running.assembled.clone(),
            });
            next.insert(key.clone(), rewritten);
        }
        trace::instant_kept(
            next.len(),
            next.iter().map(|(key, r)| (key, r.spec.type_name.as_str())),
        );
        Progress {
            next,
            actions: BTreeMap::new(),
            done: Vec::new(),
            marks_left: MarksLeft::default(),
            notes: Vec::new(),
            unreverted: Unreverting::default(),
        }
    }

    /// Runs the impacted components of one level concurrently, against the
    /// instances the new generation holds so far; returns the failures
    /// (a marked component retried best effort that fails is kept as it
    /// runs instead: see [`super::marked`]). `now`: those whose update
    /// left to the commit is made at once; `kept`: those kept as they
    /// run, their refs not resolved again.
    async fn run_level(
        &self,
        level: &[ComponentKey],
        now: &BTreeSet<ComponentKey>,
        kept: &BTreeSet<ComponentKey>,
        progress: &mut Progress,
        registry: &Registry,
        cx: &AssemblyContext,
    ) -> Vec<ComponentFailure> {
        let staged = Arc::new(staged_sharing(&progress.next));
        let level_cx = AssemblyContext {
            staged,
            ..cx.clone()
        };
        let mut tasks = ComponentTasks::new();
        // Each task's span, to mark it failed if the task panics.
        let mut spans = std::collections::HashMap::new();
        for key in level.iter().cloned() {
            let Some(spec) = self.candidate.config.components.get(&key).cloned() else {
                continue;
            };
            let change = self.diff.changed.get(&key).copied().unwrap_or_default();
            let previous = self.current.get(&key).map(|r| Running::clone(r));
            let descriptor = registry.get(key.kind.as_str(), &spec.type_name).copied();
            let now = now.contains(&key);
            let keep = kept.contains(&key);
            let level_cx = level_cx.clone();
            let unreverting = progress.unreverted.clone();
            // Its entry records what an update tried, maybe half made.
            let half_made = self.marks.get(&key).is_some_and(Mark::is_unreverted);
            let span = trace::component_span(&key, &spec.type_name);
            let traced = span.clone();
            let started = std::time::Instant::now();
            spans.insert(key.clone(), (span.clone(), started));
            let named = key.clone();
            let task = async move {
                let previous = match (keep, previous) {
                    (true, Some(mut running)) => {
                        // Written differently maybe (scopes), declared alike.
                        running.spec = spec;
                        return Ok(Step::Kept(running));
                    }
                    (_, previous) => previous,
                };
                let Some(descriptor) = descriptor else {
                    return Err(level_cx.fail(
                        &key,
                        FailedStep::Metadata,
                        format!("unknown type `{}`", spec.type_name),
                    ));
                };
                let run = (&descriptor, now, &unreverting, half_made);
                decide_and_run(spec, change, previous, run, &level_cx).await
            };
            tasks.spawn(
                named,
                async move {
                    let result = task.await;
                    match &result {
                        // Left to the commit: nothing done yet, the
                        // commit step records its action on this span.
                        Ok(step) if step.is_at_commit() => {}
                        Ok(step) => trace::record_action(&traced, step.action(), started),
                        Err(failure) => {
                            trace::record_failed(&traced, &failure.to_string(), started)
                        }
                    }
                    result
                }
                .instrument(span),
            );
        }
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next(cx).await {
            match joined {
                Ok(Ok(step)) => {
                    let running = step.running();
                    progress
                        .actions
                        .insert(running.spec.key.clone(), step.action());
                    progress
                        .next
                        .insert(running.spec.key.clone(), Arc::new(running.clone()));
                    progress.done.push(step);
                }
                Ok(Err(failure)) => failures.push(failure),
                Err(failure) => {
                    // The task panicked before its span was told.
                    let span = failure.component.as_ref().and_then(|k| spans.get(k));
                    if let Some((span, started)) = span {
                        trace::record_failed(span, &failure.to_string(), *started);
                    }
                    failures.push(failure);
                }
            }
        }
        failures.sort_by(|a, b| a.component.cmp(&b.component));
        self.keep_failed_retries(failures, progress, None)
    }

    /// The replaced and removed instances, to drain after the commit.
    fn retire(
        self,
        progress: Progress,
        levels: Vec<Vec<ComponentKey>>,
        cx: &AssemblyContext,
    ) -> Prepared {
        let Progress {
            next,
            mut actions,
            done,
            marks_left,
            notes,
            unreverted,
        } = progress;
        // Those replaced by their rebuild retire with their instance; a
        // kept one (a marked component's failed retry) runs on.
        let mut unreverted: Vec<Unreverted> = unreverted
            .take()
            .into_iter()
            .filter(|u| {
                let running = next.get(&u.key);
                running.is_some_and(|r| r.assembled.instance.same_as(&u.instance))
            })
            .collect();
        unreverted.sort_by(|a, b| a.key.cmp(&b.key));
        let mut retired = Vec::new();
        let mut deferred = Vec::new();
        let mut undone = Vec::new();
        for step in done {
            match step {
                Step::Built { running, replaced } => {
                    if let Some(old) = replaced {
                        retired.push((old.spec.key.clone(), Arc::new(*old)));
                    }
                    let replaced = None;
                    undone.push(Step::Built { running, replaced });
                }
                Step::InPlace {
                    running,
                    update: Update::Staged(pending),
                    hook,
                    ..
                } => {
                    let key = running.spec.key.clone();
                    // An in-place step always replaces a running entry.
                    if let Some(previous) = self.current.get(&key) {
                        let previous = Arc::clone(previous);
                        let staged = in_place::StagedUpdate {
                            key,
                            pending,
                            previous,
                            hook,
                        };
                        deferred.push(staged);
                    }
                }
                Step::InPlace {
                    update: Update::InForce,
                    ..
                } => undone.push(step),
                _ => {}
            }
        }
        for key in &self.diff.removed {
            if let Some(running) = self.current.get(key) {
                trace::instant_action(key, &running.spec.type_name, Action::Removed);
                actions.insert(key.clone(), Action::Removed);
                // An entry of its own, as a replaced one's: the drain counts
                // the old generation's entry as a holder, so a call still
                // borrowing the instance through it (an embedder's
                // `generation().get(..)`) holds the close back.
                retired.push((key.clone(), Arc::new(Running::clone(running))));
            }
        }
        // Only what retires needs the old order (users close first).
        let old_order = match retired.is_empty() {
            true => Vec::new(),
            false => self.old.graph.start_order(),
        };
        Prepared {
            components: next,
            actions,
            retired,
            deferred,
            old_order,
            undo: Undo {
                done: undone,
                levels,
                cx: cx.clone(),
            },
            marks_left,
            notes: notes.iter().map(FailedRetry::committed).collect(),
            unreverted,
        }
    }
}

/// Why a component whose reload was cut short did not take its change.
pub(super) const CUT_BY_SHUTDOWN: &str = "the reload was cut short by shutdown";

/// `answering`'s answer, or `None` once shutdown cuts the reload short
/// first (the call is then dropped, which aborts it): an in-place update
/// against a dead backend cannot hold SIGTERM for the init timeout.
pub(super) async fn unless_cut<T>(
    answering: impl std::future::Future<Output = Answer<T>>,
    cx: &AssemblyContext,
) -> Option<Answer<T>> {
    tokio::select! {
        biased;
        answer = answering => Some(answer),
        () = cx.stop.cancelled() => None,
    }
}

/// Keeps, updates in place, or rebuilds one impacted component of
/// `descriptor`'s type; `now`: an update left to the commit is made at
/// once instead; an update whose revert fails before the rebuild is noted
/// in `unreverting`; `half_made`: the running entry records metadata an
/// update tried but could not undo (see [`Mark::is_unreverted`]), so the
/// same metadata resolved again is applied again, never taken as in
/// force.
async fn decide_and_run(
    spec: Arc<ComponentSpec>,
    change: SpecChange,
    previous: Option<Running>,
    (descriptor, now, unreverting, half_made): (&ComponentDescriptor, bool, &Unreverting, bool),
    cx: &AssemblyContext,
) -> Result<Step, ComponentFailure> {
    // Cut short by shutdown, as `init` and readiness are.
    let resolved = tokio::select! {
        biased;
        resolved = resolve_metadata(&spec, cx) => resolved?,
        () = cx.stop.cancelled() => {
            return Err(cx.fail(&spec.key, FailedStep::Cancelled, CUT_BY_SHUTDOWN));
        }
    };
    let Some(previous) = previous else {
        let assembled = assemble_resolved(&spec, descriptor, resolved, cx).await?;
        return Ok(Step::Built {
            running: Running { spec, assembled },
            replaced: None,
        });
    };
    if !change.needs_rebuild() {
        if !half_made && resolved == previous.assembled.resolved {
            // The same fields, maybe filled otherwise (an inline value moved
            // to a secretRef): the new metadata holds the values in force
            // and knows which came from a secret; the old one goes with the
            // record it leaves.
            let mut kept = previous;
            kept.spec = spec;
            kept.assembled.resolved = resolved;
            return Ok(Step::Kept(kept));
        }
        let component = previous.assembled.instance.component();
        if in_place_of(component.as_ref(), descriptor.in_place).is_some() {
            let staging = (descriptor, now, unreverting);
            let staged = stage(&spec.key, component, &previous, staging, &resolved, cx);
            let staged = staged.await;
            if staged.is_none() && cx.stop.is_cancelled() {
                // Not rebuilt: the reload rolls back.
                return Err(cx.fail(&spec.key, FailedStep::Cancelled, CUT_BY_SHUTDOWN));
            }
            if let Some(update) = staged {
                let old_metadata = previous.assembled.resolved.clone();
                let mut updated = previous;
                updated.spec = spec;
                updated.assembled.resolved = resolved;
                return Ok(Step::InPlace {
                    running: updated,
                    update,
                    previous: old_metadata,
                    hook: descriptor.in_place,
                });
            }
        }
    }
    let assembled = assemble_resolved(&spec, descriptor, resolved, cx).await?;
    Ok(Step::Built {
        running: Running { spec, assembled },
        replaced: Some(Box::new(previous)),
    })
}

/// Stages `resolved` on the running `component` (whose metadata is
/// `previous`'s) with `descriptor`'s hook: `Some` when it took it or will
/// at the commit (an update left to the commit is made at once when
/// `now`), `None` when it is to be rebuilt instead. A panic or a timeout
/// first re-applies the previous metadata, since the update may have been
/// half made on the instance that keeps serving; should that fail too,
/// the instance is noted in `unreverting` (kept, should the reload roll
/// back, with part of `resolved` maybe).
async fn stage(
    key: &ComponentKey,
    component: Arc<dyn Component>,
    previous: &Running,
    (descriptor, now, unreverting): (&ComponentDescriptor, bool, &Unreverting),
    resolved: &Metadata,
    cx: &AssemblyContext,
) -> Option<Update> {
    let within = cx.timeouts.init;
    let hook = descriptor.in_place;
    let staging = in_place::stage(
        component.clone(),
        hook,
        resolved.clone(),
        (cx.live.clone(), cx.staged.clone()),
        within,
    );
    let old = &previous.assembled.resolved;
    let reverting = || async {
        if !revert(key, component.clone(), hook, old.clone(), cx).await {
            unreverting.push(Unreverted {
                key: key.clone(),
                instance: previous.assembled.instance.clone(),
                tried: resolved.clone(),
            });
        }
    };
    let Some(answer) = unless_cut(staging, cx).await else {
        // Abandoned mid-way: it may have been half made.
        tracing::warn!(component = %key, "In-place update cut short by shutdown; re-applying the previous metadata.");
        reverting().await;
        return None;
    };
    match answer {
        Answer::Answered(Ok(StagedInPlace::Applied)) => Some(Update::InForce),
        Answer::Answered(Ok(StagedInPlace::Deferred(pending))) => Some(Update::Staged(pending)),
        Answer::Answered(Ok(StagedInPlace::AtCommit)) if now => {
            // Its dependents read it through refs in this reload.
            let metadata = resolved.clone();
            let staged = (cx.live.clone(), cx.staged.clone());
            let updating =
                in_place::update_staged(component.clone(), hook, metadata, staged, within);
            let answer = unless_cut(updating, cx).await;
            match settled(key, component.clone(), hook, old, answer, cx).await {
                Settled::Applied => Some(Update::InForce),
                Settled::Rebuild { reverted: true } => None,
                Settled::Rebuild { reverted: false } => {
                    unreverting.push(Unreverted {
                        key: key.clone(),
                        instance: previous.assembled.instance.clone(),
                        tried: resolved.clone(),
                    });
                    None
                }
            }
        }
        // The component's span is current here (its level's task).
        Answer::Answered(Ok(StagedInPlace::AtCommit)) => Some(Update::AtCommit(Span::current())),
        Answer::Answered(Ok(StagedInPlace::NeedsRebuild)) => None,
        Answer::Answered(Err(err)) => {
            let err = cx.redactor.scrub(&err.to_string());
            tracing::info!(component = %key, error = %err, "In-place update refused; rebuilding.");
            None
        }
        Answer::TimedOut => {
            // Abandoned mid-way: it may have been half made, as a panic.
            tracing::warn!(component = %key, timeout = ?within, "In-place update did not answer in time; re-applying the previous metadata, then rebuilding.");
            reverting().await;
            None
        }
        Answer::Panicked(message) => {
            let message = cx.redactor.scrub(&message);
            tracing::error!(component = %key, error = %message, "In-place update panicked; re-applying the previous metadata, then rebuilding.");
            reverting().await;
            None
        }
        Answer::Cancelled => {
            // Cut mid-way: it may have been half made, as a panic.
            tracing::warn!(component = %key, "In-place update was cancelled before it answered; re-applying the previous metadata, then rebuilding.");
            reverting().await;
            None
        }
    }
}

/// How an update made at once ended (see [`settled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// The running instance has the new metadata.
    Applied,
    /// To be rebuilt instead; `reverted`: the instance runs its previous
    /// metadata (not re-applied when it refused the update, which left it
    /// as it was), else it may run with part of the new one.
    Rebuild { reverted: bool },
}

/// How an update made at once (`answer`; `None`: cut short by shutdown)
/// left the running `component`: with the new metadata, or to be rebuilt
/// instead (or, cut short, the reload rolls back), telling whether its
/// previous metadata runs. A panic, a timeout or a cut first re-applies
/// `previous`, since the update may have been half made on the instance
/// that keeps serving; should that fail, it may run with part of the new
/// metadata, which the caller notes (see [`Unreverted`]).
pub(super) async fn settled(
    key: &ComponentKey,
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    previous: &Metadata,
    answer: Option<Answer<InPlace>>,
    cx: &AssemblyContext,
) -> Settled {
    let within = cx.timeouts.init;
    let reverted = |reverted| Settled::Rebuild { reverted };
    let Some(answer) = answer else {
        tracing::warn!(component = %key, "In-place update cut short by shutdown; re-applying the previous metadata.");
        return reverted(revert(key, component, hook, previous.clone(), cx).await);
    };
    match answer {
        Answer::Answered(Ok(InPlace::Applied)) => Settled::Applied,
        Answer::Answered(Ok(InPlace::NeedsRebuild)) => reverted(true),
        Answer::Answered(Err(err)) => {
            let err = cx.redactor.scrub(&err.to_string());
            tracing::info!(component = %key, error = %err, "In-place update refused; rebuilding.");
            reverted(true)
        }
        Answer::TimedOut => {
            tracing::warn!(component = %key, timeout = ?within, "In-place update did not answer in time; re-applying the previous metadata, then rebuilding.");
            reverted(revert(key, component, hook, previous.clone(), cx).await)
        }
        Answer::Panicked(message) => {
            let message = cx.redactor.scrub(&message);
            tracing::error!(component = %key, error = %message, "In-place update panicked; re-applying the previous metadata, then rebuilding.");
            reverted(revert(key, component, hook, previous.clone(), cx).await)
        }
        Answer::Cancelled => {
            tracing::warn!(component = %key, "In-place update was cancelled before it answered; re-applying the previous metadata, then rebuilding.");
            reverted(revert(key, component, hook, previous.clone(), cx).await)
        }
    }
}

/// Re-applies `previous` to the running `component`, best effort (a panic
/// or an error is logged, not raised: `false` then), within the init
/// timeout; once shutdown cuts the reload short, within `CLOSE_TIMEOUT`
/// of that (as a close is), then abandoned: a dead backend cannot hold
/// SIGTERM for an init timeout per level.
pub(super) async fn revert(
    key: &ComponentKey,
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    previous: Metadata,
    cx: &AssemblyContext,
) -> bool {
    let started = tokio::time::Instant::now();
    let mut reverting = std::pin::pin!(in_place::update(
        component,
        hook,
        previous,
        cx.timeouts.init
    ));
    let answer = tokio::select! {
        biased;
        answer = &mut reverting => answer,
        () = cx.stop.cancelled() => {
            let hurried = tokio::time::timeout(CLOSE_TIMEOUT, &mut reverting).await;
            hurried.unwrap_or(Answer::TimedOut)
        }
    };
    let why = match answer {
        Answer::Answered(Ok(InPlace::Applied)) => {
            tracing::info!(component = %key, "In-place update reverted.");
            return true;
        }
        Answer::Answered(Ok(InPlace::NeedsRebuild)) => "it asked for a rebuild".to_string(),
        Answer::Answered(Err(err)) => cx.redactor.scrub(&err.to_string()),
        Answer::TimedOut => format!("no answer within {:?}", started.elapsed()),
        Answer::Panicked(message) => format!("it panicked: {}", cx.redactor.scrub(&message)),
        Answer::Cancelled => "it was cancelled before it answered".to_string(),
    };
    tracing::error!(component = %key, error = %why, "In-place update could not be reverted; the component may keep (part of) its new metadata.");
    false
}

/// Undoes a failed transaction: closes what was built and re-applies the
/// previous metadata of in-place updates, a level at a time, last level
/// first (users before the stores they may use), the steps of one level at
/// once, each on a task of its own. So the closes of a level share one
/// deadline (`CLOSE_TIMEOUT` from their start) and its reverts one init
/// timeout: a rollback holds the reload lock for a bound per level, not
/// one per component (100 closes that hang would hold it 100 times over).
/// Returns the in-place updates whose previous metadata could not be
/// re-applied.
async fn undo(
    done: Vec<Step>,
    levels: &[Vec<ComponentKey>],
    cx: &AssemblyContext,
) -> Vec<Unreverted> {
    let level_of: HashMap<&ComponentKey, usize> = levels
        .iter()
        .enumerate()
        .flat_map(|(at, level)| level.iter().map(move |key| (key, at)))
        .collect();
    let mut by_level: BTreeMap<usize, Vec<Step>> = BTreeMap::new();
    for step in done {
        // Every step's key is in a level; one that were not is a store's.
        let at = level_of.get(&step.running().spec.key).copied();
        by_level.entry(at.unwrap_or(0)).or_default().push(step);
    }
    let mut unreverted = Vec::new();
    for (_, steps) in by_level.into_iter().rev() {
        let mut undoing = tokio::task::JoinSet::new();
        for step in steps {
            if let Step::InPlace {
                running,
                update: Update::AtCommit(span),
                ..
            } = &step
            {
                // Never made: nothing to roll back, the component was kept.
                tracing::info!(component = %running.spec.key, "In-place update left to the commit not made.");
                trace::record_action(span, Action::Unchanged, std::time::Instant::now());
                continue;
            }
            let spec = &step.running().spec;
            let span = trace::rolled_back_span(&spec.key, &spec.type_name);
            undoing.spawn(undo_one(step, cx.clone()).instrument(span));
        }
        while let Some(undone) = undoing.join_next().await {
            match undone {
                Ok(undone) => unreverted.extend(undone),
                // Not reached: each close and revert catches its own panic.
                Err(err) => {
                    tracing::error!(error = %err, "Undoing a step of a rolled-back reload failed.")
                }
            }
        }
    }
    unreverted
}

/// Undoes one step of a failed transaction; returns the update it could
/// not undo, if any.
async fn undo_one(step: Step, cx: AssemblyContext) -> Option<Unreverted> {
    match step {
        Step::Kept(_) => None,
        Step::Built { running, .. } => {
            let assembled = &running.assembled;
            let closed = close_one(&running.spec.key, &assembled.instance, &assembled.shutdown);
            cx.count(closed.await);
            None
        }
        Step::InPlace {
            running,
            update: Update::Staged(pending),
            ..
        } => {
            drop(pending);
            tracing::info!(component = %running.spec.key, "Staged in-place update discarded.");
            None
        }
        // Never made: `undo` tells its span it was kept.
        Step::InPlace {
            update: Update::AtCommit(_),
            ..
        } => None,
        Step::InPlace {
            running,
            update: Update::InForce,
            previous,
            hook,
        } => {
            let key = &running.spec.key;
            let component = running.assembled.instance.component();
            let reverted = revert(key, component, hook, previous, &cx).await;
            let Running { spec, assembled } = running;
            (!reverted).then(|| Unreverted {
                key: spec.key.clone(),
                instance: assembled.instance,
                tried: assembled.resolved,
            })
        }
    }
}
