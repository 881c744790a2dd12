//! The [`Runtime`]: starts a validated configuration level by level, serves
//! it through handles, and closes it in reverse order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::assemble::{assemble, Assembled, AssemblyContext, ComponentFailure, StartTimeouts};
use crate::config::{Problems, ValidConfig};
use crate::handle::{
    ComponentHandle, ConfigStoreHandle, Generation, Live, LiveGeneration, LockHandle, SecretStoreHandle, StateStoreHandle,
};
use crate::instance::Instance;
use crate::key::{ComponentKey, CONFIG_STORE, LOCK, SECRET_STORE, STATE};
use crate::redact::Redactor;
use crate::registry::Registry;

/// How the runtime starts components.
#[derive(Debug, Clone, Default)]
pub struct RuntimeOptions {
    /// Init and readiness timeouts, per component.
    pub timeouts: StartTimeouts,
}

/// Why the runtime did not start.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid (every problem listed).
    #[error("{0}")]
    Invalid(Problems),
    /// Components failed to start; everything started was closed.
    #[error("{}", lines(.0))]
    Failed(Vec<ComponentFailure>),
}

fn lines(failures: &[ComponentFailure]) -> String {
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

/// What the runtime knows about a running component.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) assembled: Assembled,
}

/// A running set of components.
pub struct Runtime {
    live: LiveGeneration,
    registry: Arc<Registry>,
    options: RuntimeOptions,
    redactor: Redactor,
    state: Mutex<RuntimeState>,
}

struct RuntimeState {
    config: ValidConfig,
    running: BTreeMap<ComponentKey, Running>,
}

impl Runtime {
    /// Starts every component of `config`, stores first: each level of the
    /// dependency graph starts concurrently once the previous one is ready.
    /// On any failure, what was started is closed in reverse order.
    pub async fn start(config: ValidConfig, registry: Registry, options: RuntimeOptions) -> Result<Self, StartError> {
        let live = Live::new();
        let registry = Arc::new(registry);
        let redactor = Redactor::default();
        let mut running: BTreeMap<ComponentKey, Running> = BTreeMap::new();
        let mut started: Vec<Vec<ComponentKey>> = Vec::new();
        for level in config.graph.levels() {
            let staged = Arc::new(Generation::new(0, instances_of(&running)));
            let cx = AssemblyContext {
                app_id: config.config.app_id.clone(),
                live: live.clone(),
                staged,
                timeouts: options.timeouts,
                redactor: redactor.clone(),
            };
            let (assembled, failures) = assemble_level(&level, &config, &registry, &cx).await;
            started.push(assembled.keys().cloned().collect());
            for (key, assembled) in assembled {
                tracing::info!(component = %key, "Component started.");
                running.insert(key, Running { assembled });
            }
            if !failures.is_empty() {
                for failure in &failures {
                    tracing::error!(component = %failure.component, step = %failure.step, error = %failure.message, "Component failed to start.");
                }
                close_in_reverse(&started, &mut running).await;
                return Err(StartError::Failed(failures));
            }
        }
        live.publish(Generation::new(1, instances_of(&running)));
        Ok(Self {
            live,
            registry,
            options,
            redactor,
            state: Mutex::new(RuntimeState { config, running }),
        })
    }

    /// The current generation: load it once per request and use it
    /// throughout for a consistent view.
    pub fn generation(&self) -> Arc<Generation> {
        self.live.load_full()
    }

    /// Where generations are published (for handles made by hand).
    pub fn live(&self) -> LiveGeneration {
        self.live.clone()
    }

    /// The running configuration.
    pub fn config(&self) -> ValidConfig {
        self.lock().config.clone()
    }

    /// The registry the runtime builds from.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The runtime's options.
    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// Scrubs secret values the runtime has seen from `text`.
    pub fn redact(&self, text: &str) -> String {
        self.redactor.scrub(text)
    }

    /// A handle to the state store `name`.
    pub fn state_store(&self, name: &str) -> StateStoreHandle {
        StateStoreHandle::new(ComponentKey::new(STATE, name), self.live.clone())
    }

    /// A handle to the config store `name`.
    pub fn config_store(&self, name: &str) -> ConfigStoreHandle {
        ConfigStoreHandle::new(ComponentKey::new(CONFIG_STORE, name), self.live.clone())
    }

    /// A handle to the secret store `name`.
    pub fn secret_store(&self, name: &str) -> SecretStoreHandle {
        SecretStoreHandle::new(ComponentKey::new(SECRET_STORE, name), self.live.clone())
    }

    /// A handle to the lock `name`.
    pub fn lock_store(&self, name: &str) -> LockHandle {
        LockHandle::new(ComponentKey::new(LOCK, name), self.live.clone())
    }

    /// A handle to any component.
    pub fn component(&self, key: ComponentKey) -> ComponentHandle {
        ComponentHandle::new(key, self.live.clone())
    }

    /// Closes every component, users before the stores they use, and
    /// publishes an empty generation.
    pub async fn shutdown(&self) {
        let (levels, mut running) = {
            let mut state = self.lock();
            (state.config.graph.levels(), std::mem::take(&mut state.running))
        };
        let number = self.live.current().number + 1;
        self.live.publish(Generation::new(number, BTreeMap::new()));
        close_in_reverse(&levels, &mut running).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RuntimeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn instances_of(running: &BTreeMap<ComponentKey, Running>) -> BTreeMap<ComponentKey, Instance> {
    running
        .iter()
        .map(|(key, r)| (key.clone(), r.assembled.instance.clone()))
        .collect()
}

/// Assembles one level concurrently; returns what started and what failed.
async fn assemble_level(
    level: &[ComponentKey],
    config: &ValidConfig,
    registry: &Registry,
    cx: &AssemblyContext,
) -> (BTreeMap<ComponentKey, Assembled>, Vec<ComponentFailure>) {
    let mut tasks = JoinSet::new();
    let mut failures = Vec::new();
    for key in level {
        let Some(spec) = config.config.components.get(key).cloned() else {
            continue;
        };
        let Some(descriptor) = registry.get(&key.kind, &spec.type_name).copied() else {
            failures.push(ComponentFailure {
                component: key.clone(),
                step: crate::assemble::FailedStep::Metadata,
                message: format!("unknown type `{}`", spec.type_name),
            });
            continue;
        };
        let cx = cx.clone();
        tasks.spawn(async move { (spec.key.clone(), assemble(&spec, &descriptor, &cx).await) });
    }
    let mut assembled = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((key, Ok(component))) => {
                assembled.insert(key, component);
            }
            Ok((_, Err(failure))) => failures.push(failure),
            Err(err) => failures.push(ComponentFailure {
                component: ComponentKey::new("?", "?"),
                step: crate::assemble::FailedStep::Init,
                message: format!("start task panicked: {err}"),
            }),
        }
    }
    failures.sort_by(|a, b| a.component.cmp(&b.component));
    (assembled, failures)
}

/// Closes the components of `levels` found in `running`, last level first.
async fn close_in_reverse(levels: &[Vec<ComponentKey>], running: &mut BTreeMap<ComponentKey, Running>) {
    for level in levels.iter().rev() {
        for key in level.iter().rev() {
            if let Some(r) = running.remove(key) {
                close_one(key, &r.assembled.instance, &r.assembled.shutdown).await;
            }
        }
    }
}

pub(crate) async fn close_one(key: &ComponentKey, instance: &Instance, shutdown: &CancellationToken) {
    shutdown.cancel();
    match instance.component().close().await {
        Ok(()) => tracing::info!(component = %key, "Component closed."),
        Err(err) => tracing::warn!(component = %key, error = %err, "Component close failed."),
    }
}
