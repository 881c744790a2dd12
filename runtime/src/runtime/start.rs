//! Start-up: assemble level after level, each level concurrently; close in
//! reverse order.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{staged_for, Running, RuntimeOptions, StartError};
use crate::assemble::{assemble, Assembled, AssemblyContext, ComponentFailure, FailedStep};
use crate::config::{ComponentSpec, ValidConfig};
use crate::handle::LiveGeneration;
use crate::instance::Instance;
use crate::key::ComponentKey;
use crate::redact::Redactor;
use crate::registry::Registry;

/// Starts every component of `config`; on failure closes what started.
pub(super) async fn start_all(
    config: &ValidConfig,
    registry: &Registry,
    options: &RuntimeOptions,
    live: &LiveGeneration,
    redactor: &Redactor,
) -> Result<BTreeMap<ComponentKey, Running>, StartError> {
    let mut running: BTreeMap<ComponentKey, Running> = BTreeMap::new();
    let mut started: Vec<Vec<ComponentKey>> = Vec::new();
    for level in config.graph.levels() {
        let cx = AssemblyContext {
            app_id: config.config.app_id.clone(),
            live: live.clone(),
            staged: Arc::new(staged_for(&level, &config.graph, &running)),
            timeouts: options.timeouts,
            redactor: redactor.clone(),
        };
        let specs: Vec<ComponentSpec> = level
            .iter()
            .filter_map(|k| config.config.components.get(k).cloned())
            .collect();
        let (assembled, failures) = assemble_all(specs, registry, &cx).await;
        started.push(assembled.keys().cloned().collect());
        for (key, (spec, assembled)) in assembled {
            tracing::info!(component = %key, "Component started.");
            running.insert(key, Running { spec, assembled });
        }
        if !failures.is_empty() {
            for failure in &failures {
                tracing::error!(component = %failure.component, step = %failure.step, error = %failure.message, "Component failed to start.");
            }
            close_in_reverse(&started, &mut running).await;
            return Err(StartError::Failed(failures));
        }
    }
    Ok(running)
}

/// Assembles `specs` concurrently; returns what started and what failed.
pub(crate) async fn assemble_all(
    specs: Vec<ComponentSpec>,
    registry: &Registry,
    cx: &AssemblyContext,
) -> (
    BTreeMap<ComponentKey, (ComponentSpec, Assembled)>,
    Vec<ComponentFailure>,
) {
    let mut tasks = JoinSet::new();
    let mut failures = Vec::new();
    for spec in specs {
        let Some(descriptor) = registry.get(&spec.key.kind, &spec.type_name).copied() else {
            failures.push(ComponentFailure {
                component: spec.key.clone(),
                step: FailedStep::Metadata,
                message: format!("unknown type `{}`", spec.type_name),
            });
            continue;
        };
        let cx = cx.clone();
        tasks.spawn(async move {
            let result = assemble(&spec, &descriptor, &cx).await;
            (spec, result)
        });
    }
    let mut assembled = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((spec, Ok(component))) => {
                assembled.insert(spec.key.clone(), (spec, component));
            }
            Ok((_, Err(failure))) => failures.push(failure),
            Err(err) => failures.push(ComponentFailure {
                component: ComponentKey::new("?", "?"),
                step: FailedStep::Init,
                message: format!("start task panicked: {err}"),
            }),
        }
    }
    failures.sort_by(|a, b| a.component.cmp(&b.component));
    (assembled, failures)
}

/// Closes the components of `levels` found in `running`, last level first.
pub(crate) async fn close_in_reverse(
    levels: &[Vec<ComponentKey>],
    running: &mut BTreeMap<ComponentKey, Running>,
) {
    for level in levels.iter().rev() {
        for key in level.iter().rev() {
            if let Some(r) = running.remove(key) {
                close_one(key, &r.assembled.instance, &r.assembled.shutdown).await;
            }
        }
    }
}

/// Cancels a component's background work and closes it.
pub(crate) async fn close_one(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) {
    shutdown.cancel();
    match instance.component().close().await {
        Ok(()) => tracing::info!(component = %key, "Component closed."),
        Err(err) => tracing::warn!(component = %key, error = %err, "Component close failed."),
    }
}
