//! One reload transaction: decide per component, build the new generation
//! level by level against its own handles, and either commit it whole or
//! undo everything.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::task::JoinSet;

use super::diff::{ConfigDiff, SpecChange};
use super::history::Action;
use crate::assemble::{
    assemble_resolved, resolve_metadata, AssemblyContext, ComponentFailure, FailedStep,
};
use crate::config::{ComponentSpec, ValidConfig};
use crate::dynamic::Applied;
use crate::handle::with_staged;
use crate::key::ComponentKey;
use crate::metadata::Metadata;
use crate::registry::Registry;
use crate::runtime::{staged_for, Running};

/// What happened to one component in the transaction.
pub(crate) enum Step {
    /// Kept its instance (its spec may be updated to an equivalent one).
    Kept(Running),
    /// `apply_config` took the new metadata; `previous` undoes it.
    InPlace {
        running: Running,
        previous: Metadata,
    },
    /// A new instance; `replaced` is the old one, if any.
    Built {
        running: Running,
        replaced: Option<Running>,
    },
}

impl Step {
    fn action(&self) -> Action {
        match self {
            Step::Kept(_) => Action::Unchanged,
            Step::InPlace { .. } => Action::UpdatedInPlace,
            Step::Built {
                replaced: Some(_), ..
            } => Action::Rebuilt,
            Step::Built { replaced: None, .. } => Action::Added,
        }
    }

    fn running(&self) -> &Running {
        match self {
            Step::Kept(running) | Step::InPlace { running, .. } | Step::Built { running, .. } => {
                running
            }
        }
    }
}

/// A transaction that succeeded, ready to be published.
pub(crate) struct Prepared {
    pub(crate) running: BTreeMap<ComponentKey, Running>,
    pub(crate) actions: BTreeMap<ComponentKey, Action>,
    /// Old instances to drain and close after the swap.
    pub(crate) retired: Vec<(ComponentKey, Running)>,
}

/// A transaction that failed and was undone.
pub(crate) struct Failed {
    pub(crate) failures: Vec<ComponentFailure>,
    pub(crate) actions: BTreeMap<ComponentKey, Action>,
}

/// Builds the generation for `candidate` from `current`. Nothing is
/// visible to callers until the caller publishes the result; on failure,
/// everything built is closed and in-place updates are reverted.
pub(crate) async fn prepare(
    current: &BTreeMap<ComponentKey, Running>,
    old: &ValidConfig,
    candidate: &ValidConfig,
    forced: &BTreeSet<ComponentKey>,
    registry: &Registry,
    cx: &AssemblyContext,
) -> Result<Prepared, Failed> {
    let mut diff = ConfigDiff::between(&old.config, &candidate.config);
    if old.config.app_id != candidate.config.app_id {
        // Components were initialised with the app id: all must restart.
        for key in candidate
            .config
            .components
            .keys()
            .filter(|k| current.contains_key(*k))
        {
            let change = diff.changed.entry(key.clone()).or_default();
            change.type_changed = true;
        }
    }
    let roots: BTreeSet<ComponentKey> = diff
        .touched()
        .into_iter()
        .chain(forced.iter().cloned())
        .collect();
    let impact = candidate.graph.with_dependents(&roots);
    let mut next: BTreeMap<ComponentKey, Running> = BTreeMap::new();
    let mut actions: BTreeMap<ComponentKey, Action> = BTreeMap::new();
    for (key, spec) in &candidate.config.components {
        if let (false, Some(running)) = (impact.contains(key), current.get(key)) {
            let mut kept = running.clone();
            kept.spec = spec.clone();
            next.insert(key.clone(), kept);
            actions.insert(key.clone(), Action::Unchanged);
        }
    }
    let mut done: Vec<Step> = Vec::new();
    for level in candidate.graph.levels() {
        let level: Vec<ComponentKey> = level.into_iter().filter(|k| impact.contains(k)).collect();
        if level.is_empty() {
            continue;
        }
        let staged = Arc::new(staged_for(&level, &candidate.graph, &next));
        let level_cx = AssemblyContext {
            staged,
            ..cx.clone()
        };
        let mut tasks = JoinSet::new();
        for key in level {
            let Some(spec) = candidate.config.components.get(&key).cloned() else {
                continue;
            };
            let change = diff.changed.get(&key).copied().unwrap_or_default();
            let previous = current.get(&key).cloned();
            let descriptor = registry.get(&key.kind, &spec.type_name).copied();
            let level_cx = level_cx.clone();
            tasks.spawn(async move {
                let Some(descriptor) = descriptor else {
                    return Err(level_cx.fail(
                        &key,
                        FailedStep::Metadata,
                        format!("unknown type `{}`", spec.type_name),
                    ));
                };
                decide_and_run(spec, change, previous, &descriptor, &level_cx).await
            });
        }
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(step)) => done.push(step),
                Ok(Err(failure)) => failures.push(failure),
                Err(err) => failures.push(ComponentFailure {
                    component: ComponentKey::new("?", "?"),
                    step: FailedStep::Init,
                    message: format!("reload task panicked: {err}"),
                }),
            }
        }
        for step in &done {
            let running = step.running();
            actions.insert(running.spec.key.clone(), step.action());
            next.insert(running.spec.key.clone(), running.clone());
        }
        if !failures.is_empty() {
            failures.sort_by(|a, b| a.component.cmp(&b.component));
            for failure in &failures {
                actions.insert(failure.component.clone(), Action::Failed);
            }
            undo(done, cx).await;
            return Err(Failed { failures, actions });
        }
    }
    let mut retired = Vec::new();
    for step in done {
        if let Step::Built {
            replaced: Some(old),
            ..
        } = step
        {
            retired.push((old.spec.key.clone(), old));
        }
    }
    for (key, running) in current {
        if !candidate.config.components.contains_key(key) {
            actions.insert(key.clone(), Action::Removed);
            retired.push((key.clone(), running.clone()));
        }
    }
    Ok(Prepared {
        running: next,
        actions,
        retired,
    })
}

/// Keeps, updates in place, or rebuilds one impacted component.
async fn decide_and_run(
    spec: ComponentSpec,
    change: SpecChange,
    previous: Option<Running>,
    descriptor: &crate::registry::ComponentDescriptor,
    cx: &AssemblyContext,
) -> Result<Step, ComponentFailure> {
    let resolved = resolve_metadata(&spec, cx).await?;
    let Some(previous) = previous else {
        let assembled = assemble_resolved(&spec, descriptor, resolved, cx).await?;
        return Ok(Step::Built {
            running: Running { spec, assembled },
            replaced: None,
        });
    };
    if !change.needs_rebuild() {
        if resolved == previous.assembled.resolved {
            let mut kept = previous;
            kept.spec = spec;
            return Ok(Step::Kept(kept));
        }
        let component = previous.assembled.instance.component();
        if let Some(dynamic) = component.as_dynamic() {
            let apply = tokio::time::timeout(cx.timeouts.init, dynamic.apply_config(&resolved));
            match with_staged(cx.staged.clone(), apply).await {
                Err(_) => {
                    tracing::warn!(component = %spec.key, timeout = ?cx.timeouts.init, "In-place update did not answer in time; rebuilding.");
                }
                Ok(Ok(Applied::Applied)) => {
                    let old_metadata = previous.assembled.resolved.clone();
                    let mut updated = previous;
                    updated.spec = spec;
                    updated.assembled.resolved = resolved;
                    return Ok(Step::InPlace {
                        running: updated,
                        previous: old_metadata,
                    });
                }
                Ok(Ok(Applied::NeedsReload)) => {}
                Ok(Err(err)) => {
                    let err = cx.redactor.scrub(&err.to_string());
                    tracing::info!(component = %spec.key, error = %err, "In-place update refused; rebuilding.");
                }
            }
        }
    }
    let assembled = assemble_resolved(&spec, descriptor, resolved, cx).await?;
    Ok(Step::Built {
        running: Running { spec, assembled },
        replaced: Some(previous),
    })
}

/// Undoes a failed transaction: closes what was built, newest first, and
/// re-applies the previous metadata of in-place updates.
async fn undo(done: Vec<Step>, cx: &AssemblyContext) {
    for step in done.into_iter().rev() {
        match step {
            Step::Kept(_) => {}
            Step::Built { running, .. } => {
                crate::runtime::close_one(
                    &running.spec.key,
                    &running.assembled.instance,
                    &running.assembled.shutdown,
                )
                .await;
            }
            Step::InPlace { running, previous } => {
                let key = &running.spec.key;
                let component = running.assembled.instance.component();
                let restored = match component.as_dynamic() {
                    Some(dynamic) => matches!(
                        tokio::time::timeout(cx.timeouts.init, dynamic.apply_config(&previous))
                            .await,
                        Ok(Ok(Applied::Applied))
                    ),
                    None => false,
                };
                if restored {
                    tracing::info!(component = %key, "In-place update reverted.");
                } else {
                    tracing::error!(component = %key, "In-place update could not be reverted; the component keeps its new metadata.");
                }
            }
        }
    }
}
