//! Start-up: assemble level after level, each level concurrently; on a
//! failure, close what started in reverse order.

use std::sync::Arc;

use tokio::task::JoinSet;

use super::close::close_in_reverse;
use super::{staged_for, Components, Running};
use crate::assemble::{
    assemble, Assembled, AssemblyContext, ComponentFailure, FailedStep, StartTimeouts,
};
use crate::component::ComponentKey;
use crate::config::{ComponentSpec, ValidConfig};
use crate::handle::LiveGeneration;
use crate::redact::Redactor;
use crate::registry::Registry;

/// Starts every component of `config`; on failure closes what started.
pub(super) async fn start_all(
    config: &ValidConfig,
    registry: &Registry,
    timeouts: StartTimeouts,
    live: &LiveGeneration,
    redactor: &Redactor,
) -> Result<Components, Vec<ComponentFailure>> {
    let mut components = Components::new();
    let mut started: Vec<Vec<ComponentKey>> = Vec::new();
    for level in config.graph.levels() {
        let cx = AssemblyContext {
            app_id: config.config.app_id.clone(),
            live: live.clone(),
            staged: Arc::new(staged_for(&level, &config.graph, &components)),
            timeouts,
            redactor: redactor.clone(),
            config_dir: config.config.base_dir.clone(),
        };
        let specs: Vec<ComponentSpec> = level
            .iter()
            .filter_map(|k| config.config.components.get(k).cloned())
            .collect();
        let (assembled, failures) = assemble_all(specs, registry, &cx).await;
        started.push(assembled.keys().cloned().collect());
        for (key, (spec, assembled)) in assembled {
            tracing::info!(component = %key, "Component started.");
            components.insert(key, Arc::new(Running { spec, assembled }));
        }
        if !failures.is_empty() {
            for failure in &failures {
                tracing::error!(component = ?failure.component, step = %failure.step, error = %failure.message, "Component failed to start.");
            }
            close_in_reverse(&started, &mut components).await;
            return Err(failures);
        }
    }
    Ok(components)
}

/// What [`assemble_all`] started, by key.
type Started = std::collections::BTreeMap<ComponentKey, (ComponentSpec, Assembled)>;

/// Assembles `specs` concurrently; returns what started and what failed.
pub(crate) async fn assemble_all(
    specs: Vec<ComponentSpec>,
    registry: &Registry,
    cx: &AssemblyContext,
) -> (Started, Vec<ComponentFailure>) {
    let mut tasks = JoinSet::new();
    let mut failures = Vec::new();
    for spec in specs {
        let Some(descriptor) = registry
            .get(spec.key.kind.as_str(), &spec.type_name)
            .copied()
        else {
            failures.push(cx.fail(
                &spec.key,
                FailedStep::Metadata,
                format!("unknown type `{}`", spec.type_name),
            ));
            continue;
        };
        let cx = cx.clone();
        tasks.spawn(async move {
            let result = assemble(&spec, &descriptor, &cx).await;
            (spec, result)
        });
    }
    let mut assembled = Started::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((spec, Ok(component))) => {
                assembled.insert(spec.key.clone(), (spec, component));
            }
            Ok((_, Err(failure))) => failures.push(failure),
            Err(err) => failures.push(ComponentFailure::panicked("start", &err)),
        }
    }
    failures.sort_by(|a, b| a.component.cmp(&b.component));
    (assembled, failures)
}
