//! The in-place updates a transaction leaves to its last step
//! ([`StagedInPlace::AtCommit`](crate::component::StagedInPlace)): which
//! ones must be made early instead, and making the others once everything
//! else in the reload succeeded.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use super::in_place::{self, Unreverted, Unreverting};
use super::trace;
use super::transaction::{
    settled, unless_cut, Plan, Progress, Settled, Step, Update, CUT_BY_SHUTDOWN,
};
use crate::assemble::{assemble_resolved, AssemblyContext, ComponentFailure, FailedStep};
use crate::assembly_tasks::ComponentTasks;
use crate::component::ComponentKey;
use crate::metadata::Metadata;
use crate::registry::{ComponentDescriptor, InPlaceHook, Registry};
use crate::running::{staged_sharing, Running};

impl Plan<'_> {
    /// The components of `impact` whose update left to the commit is made
    /// when their level is prepared instead ("now"), reverted if the
    /// reload fails: a component this reload may build (add, or rebuild)
    /// initialises against them, and must see their new state:
    ///
    /// * every store read through a secretRef or configurationRef by an
    ///   impacted component (it resolves them in this reload), and what
    ///   that store uses, directly or through others (the read goes
    ///   through it);
    /// * everything a component that may be built uses, directly or
    ///   through others, by componentRef or by ref.
    ///
    /// Whether an impacted component is rebuilt is only known once it is
    /// asked, a level later: one whose declaration changed, that is
    /// forced, or that reads a store of the impact may be, so it counts.
    pub(super) fn updated_now(&self, impact: &BTreeSet<ComponentKey>) -> BTreeSet<ComponentKey> {
        let specs = &self.candidate.config.components;
        let graph = &self.candidate.graph;
        let mut now: BTreeSet<ComponentKey> = impact
            .iter()
            .filter_map(|key| specs.get(key))
            .flat_map(|spec| spec.injected_refs().map(|r| r.store()).collect::<Vec<_>>())
            .collect();
        // A store read through a ref is read through what it uses too: it
        // is expanded as well (a visited set of its own, since `now`
        // already holds it).
        let mut queue: Vec<ComponentKey> = impact
            .iter()
            .filter(|key| self.may_build(key, impact))
            .flat_map(|key| graph.dependencies(key))
            .chain(now.iter().cloned())
            .collect();
        let mut visited = BTreeSet::new();
        while let Some(key) = queue.pop() {
            if impact.contains(&key) && visited.insert(key.clone()) {
                queue.extend(graph.dependencies(&key));
                now.insert(key);
            }
        }
        now
    }

    /// The components of `impact` kept as they run, their refs not
    /// resolved again: those this reload may not build (see
    /// [`Self::may_build`]). They are impacted only as users of a changed
    /// component, which they reach through its handle (as before: a
    /// dependent whose own values are the same keeps its instance); their
    /// refs read stores this reload leaves alone, so reading them again
    /// could only bring a value rotated out of band (to rebuild them with,
    /// against a dependency whose update is left to the commit), or a
    /// failure of a store unrelated to the change (rolling the reload
    /// back).
    pub(super) fn kept_as_they_run(
        &self,
        impact: &BTreeSet<ComponentKey>,
    ) -> BTreeSet<ComponentKey> {
        impact
            .iter()
            .filter(|key| !self.may_build(key, impact))
            .cloned()
            .collect()
    }

    /// Whether this reload may build a new instance of `key` (one of
    /// `impact`): it is added, its declaration changed, it is forced, or
    /// it reads a store of the impact. Otherwise it keeps its running
    /// instance and the metadata resolved for it
    /// ([`Self::kept_as_they_run`]).
    fn may_build(&self, key: &ComponentKey, impact: &BTreeSet<ComponentKey>) -> bool {
        let Some(spec) = self.candidate.config.components.get(key) else {
            return false;
        };
        self.current.get(key).is_none()
            || self.diff.changed.contains_key(key)
            || self.forced.contains(key)
            || spec.injected_refs().any(|r| impact.contains(&r.store()))
    }

    /// Makes the in-place updates left to the commit, level by level,
    /// newest first (a dependent's before its store's: a rebuild that fails
    /// there leaves the stores below untouched), the updates of one level
    /// concurrently, each with `update_in_place` within the init timeout.
    /// Any answer but `Applied` rebuilds that component now (after a panic
    /// or a timeout, once its previous metadata is re-applied), against the
    /// generation built so far. A level with a failure fails the
    /// transaction once all of it is joined (but for a marked component
    /// retried best effort, kept as it runs: see [`super::marked`]); the
    /// undo re-applies the previous metadata of the updates made, and
    /// those never reached stay not made.
    pub(super) async fn at_commit(
        &self,
        levels: &[Vec<ComponentKey>],
        progress: &mut Progress,
        registry: &Registry,
        cx: &AssemblyContext,
    ) -> Result<(), Vec<ComponentFailure>> {
        let waiting: HashMap<ComponentKey, usize> = progress
            .done
            .iter()
            .enumerate()
            .filter(|(_, step)| step.is_at_commit())
            .map(|(index, step)| (step.running().spec.key.clone(), index))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        for level in levels.iter().rev() {
            let steps: HashMap<ComponentKey, usize> = level
                .iter()
                .filter_map(|key| Some((key.clone(), *waiting.get(key)?)))
                .collect();
            if steps.is_empty() {
                continue;
            }
            let failures = self.commit_level(&steps, progress, registry, cx).await;
            let failures = self.keep_failed_retries(failures, progress, Some(&steps));
            if !failures.is_empty() {
                // Those of this level still left to the commit were tried
                // and failed (their spans say so; a half-made update was
                // re-applied before the rebuild): like a component failed
                // in a level, they leave no step for the undo, which would
                // take them for never made and record them kept.
                progress.done.retain(|step| {
                    !step.is_at_commit() || !steps.contains_key(&step.running().spec.key)
                });
                return Err(failures);
            }
        }
        Ok(())
    }

    /// Makes the updates left to the commit of one level (`steps`: their
    /// indexes in `progress.done`) concurrently; returns the failures.
    async fn commit_level(
        &self,
        steps: &HashMap<ComponentKey, usize>,
        progress: &mut Progress,
        registry: &Registry,
        cx: &AssemblyContext,
    ) -> Vec<ComponentFailure> {
        let level_cx = AssemblyContext {
            staged: Arc::new(staged_sharing(&progress.next)),
            ..cx.clone()
        };
        let mut tasks = ComponentTasks::new();
        let mut spans = HashMap::new();
        for index in steps.values() {
            let Step::InPlace {
                running,
                update: Update::AtCommit(span),
                previous,
                hook,
            } = &progress.done[*index]
            else {
                continue;
            };
            let key = running.spec.key.clone();
            let update = (running.clone(), previous.clone(), *hook);
            let descriptor = registry.get(key.kind.as_str(), &running.spec.type_name);
            let descriptor = descriptor.copied();
            let replaced = self.current.get(&key).map(|r| Box::new(Running::clone(r)));
            let started = Instant::now();
            spans.insert(key.clone(), (span.clone(), started));
            let (traced, level_cx) = (span.clone(), level_cx.clone());
            let unreverting = progress.unreverted.clone();
            // In a task of its own, as in a level: a panicking rebuild
            // fails this component, not the reload.
            let task = async move {
                let building = (descriptor, replaced, &unreverting);
                let result = update_or_rebuild(update, building, &level_cx).await;
                match &result {
                    Ok(step) => trace::record_action(&traced, step.action(), started),
                    Err(failure) => trace::record_failed(&traced, &failure.to_string(), started),
                }
                result
            };
            tasks.spawn(key, task.instrument(span.clone()));
        }
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next(&level_cx).await {
            match joined {
                Ok(Ok(step)) => {
                    let key = step.running().spec.key.clone();
                    let Some(index) = steps.get(&key) else {
                        continue;
                    };
                    progress.actions.insert(key.clone(), step.action());
                    let running = Arc::new(step.running().clone());
                    progress.next.insert(key, running);
                    progress.done[*index] = step;
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
        failures
    }
}

/// Puts `running`'s new metadata in force on its instance (`previous` and
/// `hook` undo it), or, when it will not take it, builds a fresh instance
/// instead, to replace `replaced`; an update whose revert fails before the
/// rebuild is noted in `unreverting` (kept, should the reload roll back,
/// with part of the new metadata maybe).
async fn update_or_rebuild(
    (running, previous, hook): (Running, Metadata, Option<InPlaceHook>),
    (descriptor, replaced, unreverting): (
        Option<ComponentDescriptor>,
        Option<Box<Running>>,
        &Unreverting,
    ),
    cx: &AssemblyContext,
) -> Result<Step, ComponentFailure> {
    let key = running.spec.key.clone();
    let component = running.assembled.instance.component();
    let resolved = running.assembled.resolved.clone();
    let within = cx.timeouts.init;
    let updating = in_place::update_staged(
        component.clone(),
        hook,
        resolved,
        (cx.live.clone(), cx.staged.clone()),
        within,
    );
    let answer = unless_cut(updating, cx).await;
    match settled(&key, component, hook, &previous, answer, cx).await {
        Settled::Applied => {
            return Ok(Step::InPlace {
                running,
                update: Update::InForce,
                previous,
                hook,
            })
        }
        Settled::Rebuild { reverted: true } => {}
        Settled::Rebuild { reverted: false } => unreverting.push(Unreverted {
            key: key.clone(),
            instance: running.assembled.instance.clone(),
            tried: running.assembled.resolved.clone(),
        }),
    }
    if cx.stop.is_cancelled() {
        // Not rebuilt: the reload rolls back.
        return Err(cx.fail(&key, FailedStep::Cancelled, CUT_BY_SHUTDOWN));
    }
    let Some(descriptor) = descriptor else {
        let message = format!("unknown type `{}`", running.spec.type_name);
        return Err(cx.fail(&key, FailedStep::Metadata, message));
    };
    let spec = running.spec.clone();
    let resolved = running.assembled.resolved.clone();
    let assembled = assemble_resolved(&spec, &descriptor, resolved, cx).await?;
    Ok(Step::Built {
        running: Running { spec, assembled },
        replaced,
    })
}
