//! Hot reload: a candidate configuration is validated whole, diffed against
//! the running one, and applied as a transaction — components that did not
//! change keep their very instance, metadata-only changes are applied in
//! place where the component allows it, everything else is built fresh
//! against the new generation's handles and must become ready before one
//! atomic swap. Any failure undoes the lot and the old generation keeps
//! serving. Replaced instances are closed after their in-flight users let
//! go.

mod diff;
mod drain;
mod history;
mod transaction;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use diff::{ConfigDiff, SpecChange};
pub use history::{Action, History, Outcome, ReloadRecord, Trigger};

use crate::assemble::{AssemblyContext, ComponentFailure};
use crate::config::{validate, ComponentPatch, ConfigFile, ConfigPatch, Layers, Problems, Push};
use crate::handle::Generation;
use crate::key::ComponentKey;
use crate::runtime::{failure_lines, instances_of, types_of, Runtime};

/// A reload of the base configuration (the file layer) to perform.
#[derive(Debug, Clone)]
pub struct ReloadRequest {
    /// The new base configuration; overlays and pushes stay laid over it.
    pub candidate: ConfigFile,
    /// What asked for it.
    pub trigger: Trigger,
    /// Components to re-resolve even if their declaration did not change
    /// (a watched value changed).
    pub forced: BTreeSet<ComponentKey>,
    /// Reject the reload if the running generation is newer than this.
    pub based_on_generation: Option<u64>,
}

impl ReloadRequest {
    /// A reload of `candidate` started by `trigger`.
    pub fn new(candidate: ConfigFile, trigger: Trigger) -> Self {
        Self {
            candidate,
            trigger,
            forced: BTreeSet::new(),
            based_on_generation: None,
        }
    }
}

/// Why a reload did not apply. In every case the running generation is
/// untouched.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    /// The candidate is invalid (every problem listed).
    #[error("configuration rejected:\n{0}")]
    Invalid(Problems),
    /// The update was based on an older generation than the running one.
    #[error("stale update: based on generation {based_on}, but generation {running} is running")]
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

/// A change to one layer of the configuration.
#[derive(Debug, Clone)]
pub(crate) enum LayerChange {
    /// A new base configuration.
    File(ConfigFile),
    /// New overlay documents (common, app-specific).
    Overlay(Option<ConfigPatch>, Option<ConfigPatch>),
    /// A control-plane decision about one component.
    Push(ComponentKey, Push),
}

impl Runtime {
    /// Applies `candidate` as the new base configuration (the embedding
    /// program's own reload); overlays and pushes stay laid over it.
    pub async fn apply(&self, candidate: ConfigFile) -> Result<ReloadRecord, ReloadError> {
        self.reload(ReloadRequest::new(candidate, Trigger::Programmatic))
            .await
    }

    /// Runs one reload of the base configuration; reloads are serialised.
    pub async fn reload(&self, request: ReloadRequest) -> Result<ReloadRecord, ReloadError> {
        let changes = vec![LayerChange::File(request.candidate)];
        self.transact(
            request.trigger,
            changes,
            request.forced,
            request.based_on_generation,
        )
        .await
    }

    /// Declares one component from the control plane: it replaces whatever
    /// the file and the overlay say about it, and survives their changes.
    pub async fn apply_component(
        &self,
        key: ComponentKey,
        patch: ComponentPatch,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        let changes = vec![LayerChange::Push(key, Push::Declare(patch))];
        self.transact(Trigger::Api, changes, BTreeSet::new(), based_on_generation)
            .await
    }

    /// Removes one component from the control plane, whatever the file and
    /// the overlay say.
    pub async fn remove_component(
        &self,
        key: ComponentKey,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        let changes = vec![LayerChange::Push(key, Push::Remove)];
        self.transact(Trigger::Api, changes, BTreeSet::new(), based_on_generation)
            .await
    }

    /// The layers of the configuration (file, overlay, pushes).
    pub fn layers(&self) -> Layers {
        self.inner.state().layers.clone()
    }

    /// Records a candidate that could not even be parsed.
    pub(crate) fn record_rejected(&self, trigger: Trigger, error: &str) {
        let record = ReloadRecord {
            generation: self.inner.live.current().number,
            trigger,
            outcome: Outcome::Rejected,
            error: Some(self.inner.redactor.scrub(error)),
            actions: BTreeMap::new(),
            duration_ms: 0,
            at_unix_ms: now_unix_ms(),
        };
        log_record(&record);
        self.inner.record(record);
    }

    /// One reload transaction over the layers changed by `changes`;
    /// serialised with every other. The layers change only if it applies.
    ///
    /// The transaction runs in its own task: a caller that gives up (a
    /// timeout, a disconnected API client) cannot leave it half done.
    pub(crate) async fn transact(
        &self,
        trigger: Trigger,
        changes: Vec<LayerChange>,
        forced: BTreeSet<ComponentKey>,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        let runtime = self.clone();
        let task = tokio::spawn(async move {
            runtime
                .transact_to_the_end(trigger, changes, forced, based_on_generation)
                .await
        });
        match task.await {
            Ok(result) => result,
            Err(err) => Err(ReloadError::RolledBack(vec![ComponentFailure {
                component: ComponentKey::new("?", "?"),
                step: crate::assemble::FailedStep::Init,
                message: format!("reload task failed: {err}"),
            }])),
        }
    }

    async fn transact_to_the_end(
        &self,
        trigger: Trigger,
        changes: Vec<LayerChange>,
        forced: BTreeSet<ComponentKey>,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        let inner = &self.inner;
        let _serialised = inner.reload_lock.lock().await;
        if inner.stopped.is_cancelled() {
            return Err(ReloadError::Stopped);
        }
        let started = Instant::now();
        let running_generation = inner.live.current().number;
        let finish = |outcome,
                      generation,
                      actions: BTreeMap<ComponentKey, Action>,
                      error: Option<String>| {
            let record = ReloadRecord {
                generation,
                trigger: trigger.clone(),
                outcome,
                error: error.map(|e| inner.redactor.scrub(&e)),
                actions: actions
                    .into_iter()
                    .map(|(k, a)| (k.to_string(), a))
                    .collect(),
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                at_unix_ms: now_unix_ms(),
            };
            log_record(&record);
            inner.record(record.clone());
            record
        };
        if let Some(based_on) = based_on_generation.filter(|g| *g < running_generation) {
            let err = ReloadError::Stale {
                based_on,
                running: running_generation,
            };
            finish(
                Outcome::Rejected,
                running_generation,
                BTreeMap::new(),
                Some(err.to_string()),
            );
            return Err(err);
        }
        let mut layers = inner.state().layers.clone();
        for change in changes {
            match change {
                LayerChange::File(file) => layers.file = file,
                LayerChange::Overlay(common, app) => {
                    layers.overlay = common;
                    layers.overlay_app = app;
                }
                LayerChange::Push(key, push) => {
                    layers.pushes.insert(key, push);
                }
            }
        }
        let (effective, _) = layers.effective();
        let candidate = match validate(effective, &inner.registry) {
            Ok(candidate) => candidate,
            Err(problems) => {
                finish(
                    Outcome::Rejected,
                    running_generation,
                    BTreeMap::new(),
                    Some(problems.to_string()),
                );
                return Err(ReloadError::Invalid(problems));
            }
        };
        let (old, current) = {
            let state = inner.state();
            (state.config.clone(), state.running.clone())
        };
        let cx = AssemblyContext {
            app_id: candidate.config.app_id.clone(),
            live: inner.live.clone(),
            staged: std::sync::Arc::new(Generation::default()),
            timeouts: inner.options.timeouts,
            redactor: inner.redactor.clone(),
        };
        let prepared =
            match transaction::prepare(&current, &old, &candidate, &forced, &inner.registry, &cx)
                .await
            {
                Ok(prepared) => prepared,
                Err(failed) => {
                    let error = failure_lines(&failed.failures);
                    finish(
                        Outcome::RolledBack,
                        running_generation,
                        failed.actions,
                        Some(error),
                    );
                    return Err(ReloadError::RolledBack(failed.failures));
                }
            };
        drop(current);
        let changed = prepared.actions.values().any(|a| *a != Action::Unchanged);
        let old_order = old.graph.start_order();
        let generation = if changed {
            running_generation + 1
        } else {
            running_generation
        };
        {
            let mut state = inner.state();
            // A new app id alone (no component running) changes no
            // instance, but the generation's description.
            if changed || old.config.app_id != candidate.config.app_id {
                inner.live.publish(
                    Generation::new(generation, instances_of(&prepared.running))
                        .described(&candidate.config.app_id, types_of(&prepared.running)),
                );
            }
            state.config = candidate;
            state.running = prepared.running;
            state.layers = layers;
        }
        let mut retired = prepared.retired;
        retired.sort_by_key(|(key, _)| std::cmp::Reverse(old_order.iter().position(|k| k == key)));
        drain::spawn_drain(retired, inner.options.drain_grace);
        let outcome = if changed {
            Outcome::Applied
        } else {
            Outcome::NoChange
        };
        Ok(finish(outcome, generation, prepared.actions, None))
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

fn log_record(record: &ReloadRecord) {
    for (component, action) in &record.actions {
        if *action != Action::Unchanged {
            tracing::info!(component = %component, generation = record.generation, ?action, "Component reloaded.");
        }
    }
    match &record.error {
        None => {
            tracing::info!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, duration_ms = record.duration_ms, "Reload finished.")
        }
        Some(error) => {
            tracing::warn!(generation = record.generation, trigger = %record.trigger, outcome = ?record.outcome, error = %error, "Reload not applied.")
        }
    }
}
