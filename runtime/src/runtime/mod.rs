//! The [`Runtime`]: starts a validated configuration level by level, serves
//! it through handles, reloads it transactionally, and closes it in reverse
//! order.

mod start;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::assemble::{Assembled, ComponentFailure, StartTimeouts};
use crate::config::{ComponentSpec, Layers, Problems, ValidConfig};
use crate::handle::{
    ComponentHandle, ConfigStoreHandle, Generation, Live, LiveGeneration, LockHandle,
    SecretStoreHandle, StateStoreHandle,
};
use crate::instance::Instance;
use crate::key::{ComponentKey, CONFIG_STORE, LOCK, SECRET_STORE, STATE};
use crate::redact::Redactor;
use crate::registry::Registry;
use crate::reload::{History, LayerChange, ReloadRecord, Trigger};
use crate::watch::overlay::read_overlay;
use crate::watch::queue::{self, QueueSender, Queued};
use crate::watch::supervisor;

pub(crate) use start::close_one;

/// How the runtime starts, reloads and retires components.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Init and readiness timeouts, per component.
    pub timeouts: StartTimeouts,
    /// How long a replaced instance may keep in-flight users before it is
    /// closed anyway.
    pub drain_grace: Duration,
    /// How many reload records are kept.
    pub history_capacity: usize,
    /// How often watched secretRefs are polled (secret stores cannot
    /// notify).
    pub secret_poll_interval: Duration,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            timeouts: StartTimeouts::default(),
            drain_grace: Duration::from_secs(10),
            history_capacity: 100,
            secret_poll_interval: Duration::from_secs(10),
        }
    }
}

/// Why the runtime did not start.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid (every problem listed).
    #[error("{0}")]
    Invalid(Problems),
    /// Components failed to start; everything started was closed.
    #[error("{}", failure_lines(.0))]
    Failed(Vec<ComponentFailure>),
}

/// One failure per line.
pub(crate) fn failure_lines(failures: &[ComponentFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running component: how it was declared and what was started.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    pub(crate) spec: ComponentSpec,
    pub(crate) assembled: Assembled,
}

/// A running set of components. Cheap to clone: clones share the runtime.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) live: LiveGeneration,
    pub(crate) registry: Arc<Registry>,
    pub(crate) options: RuntimeOptions,
    pub(crate) redactor: Redactor,
    pub(crate) state: Mutex<RuntimeState>,
    /// Held for the whole of a reload: reloads are serialised.
    pub(crate) reload_lock: tokio::sync::Mutex<()>,
    pub(crate) history: Mutex<History>,
    /// Cancelled at shutdown: background triggers stop on it.
    pub(crate) stopped: CancellationToken,
    /// Where background triggers queue their changes.
    pub(crate) queue: QueueSender,
    /// Every reload record, as it is made.
    pub(crate) reload_events: tokio::sync::broadcast::Sender<ReloadRecord>,
}

pub(crate) struct RuntimeState {
    /// The effective configuration (layers merged, validated).
    pub(crate) config: ValidConfig,
    /// The layers it was merged from.
    pub(crate) layers: Layers,
    pub(crate) running: BTreeMap<ComponentKey, Running>,
}

impl Inner {
    pub(crate) fn state(&self) -> MutexGuard<'_, RuntimeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record(&self, record: ReloadRecord) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record.clone());
        // No receiver is fine: nobody is counting.
        let _ = self.reload_events.send(record);
    }
}

impl Runtime {
    /// Starts every component of `config`, stores first: each level of the
    /// dependency graph starts concurrently once the previous one is ready.
    /// On any failure, what was started is closed in reverse order.
    pub async fn start(
        config: ValidConfig,
        registry: Registry,
        options: RuntimeOptions,
    ) -> Result<Self, StartError> {
        let live = Live::new();
        let redactor = Redactor::shared();
        let running = start::start_all(&config, &registry, &options, &live, &redactor).await?;
        live.publish(
            Generation::new(1, instances_of(&running))
                .described(&config.config.app_id, types_of(&running)),
        );
        let (queue, queued) = tokio::sync::mpsc::unbounded_channel();
        let overlay = config.config.overlay.clone();
        let app_id = config.config.app_id.clone();
        let runtime = Self {
            inner: Arc::new(Inner {
                live,
                registry: Arc::new(registry),
                history: Mutex::new(History::new(options.history_capacity)),
                options,
                redactor,
                state: Mutex::new(RuntimeState {
                    layers: Layers::new(config.config.clone()),
                    config,
                    running,
                }),
                reload_lock: tokio::sync::Mutex::new(()),
                stopped: CancellationToken::new(),
                queue,
                reload_events: tokio::sync::broadcast::channel(64).0,
            }),
        };
        if let Some(spec) = overlay {
            runtime.apply_initial_overlay(&spec, &app_id).await;
        }
        queue::spawn_worker(Arc::downgrade(&runtime.inner), queued);
        supervisor::spawn_supervisor(Arc::downgrade(&runtime.inner));
        Ok(runtime)
    }

    /// Lays the overlay over the file before anything else happens, so the
    /// overlay's values are in force when `start` returns. A failure leaves
    /// the file's configuration running and is recorded.
    async fn apply_initial_overlay(&self, spec: &crate::config::OverlaySpec, app_id: &str) {
        match read_overlay(self, spec, app_id).await {
            Ok((None, None)) => {}
            Ok((common, app)) => {
                let changes = vec![LayerChange::Overlay(common, app)];
                let _ = self
                    .transact(Trigger::Overlay, changes, Default::default(), None)
                    .await;
            }
            Err(error) => self.record_rejected(Trigger::Overlay, &error),
        }
    }

    /// Queues a change for the reload worker.
    pub(crate) fn enqueue(&self, queued: Queued) {
        if self.inner.queue.send(queued).is_err() {
            tracing::debug!("Reload queue closed; change dropped at shutdown.");
        }
    }

    /// The current generation: load it once per request and use it
    /// throughout for a consistent view.
    pub fn generation(&self) -> Arc<Generation> {
        self.inner.live.load_full()
    }

    /// Where generations are published (for handles made by hand).
    pub fn live(&self) -> LiveGeneration {
        self.inner.live.clone()
    }

    /// The running configuration.
    pub fn config(&self) -> ValidConfig {
        self.inner.state().config.clone()
    }

    /// The registry the runtime builds from.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The runtime's options.
    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// The last reloads, oldest first.
    pub fn history(&self) -> Vec<ReloadRecord> {
        self.inner
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records()
    }

    /// Every reload record from now on, as it is made.
    pub fn reload_events(&self) -> tokio::sync::broadcast::Receiver<ReloadRecord> {
        self.inner.reload_events.subscribe()
    }

    /// Scrubs secret values the runtime has seen from `text`.
    pub fn redact(&self, text: &str) -> String {
        self.inner.redactor.scrub(text)
    }

    /// A handle to the state store `name`.
    pub fn state_store(&self, name: &str) -> StateStoreHandle {
        StateStoreHandle::new(ComponentKey::new(STATE, name), self.live())
    }

    /// A handle to the config store `name`.
    pub fn config_store(&self, name: &str) -> ConfigStoreHandle {
        ConfigStoreHandle::new(ComponentKey::new(CONFIG_STORE, name), self.live())
    }

    /// A handle to the secret store `name`.
    pub fn secret_store(&self, name: &str) -> SecretStoreHandle {
        SecretStoreHandle::new(ComponentKey::new(SECRET_STORE, name), self.live())
    }

    /// A handle to the lock `name`.
    pub fn lock_store(&self, name: &str) -> LockHandle {
        LockHandle::new(ComponentKey::new(LOCK, name), self.live())
    }

    /// A handle to any component.
    pub fn component(&self, key: ComponentKey) -> ComponentHandle {
        ComponentHandle::new(key, self.live())
    }

    /// Stops background triggers, waits for a reload in progress, closes
    /// every component (users before the stores they use) and publishes an
    /// empty generation.
    pub async fn shutdown(&self) {
        self.inner.stopped.cancel();
        let _reloads = self.inner.reload_lock.lock().await;
        let (levels, mut running) = {
            let mut state = self.inner.state();
            (
                state.config.graph.levels(),
                std::mem::take(&mut state.running),
            )
        };
        let (number, app_id) = {
            let current = self.inner.live.current();
            (current.number + 1, current.app_id().to_string())
        };
        self.inner
            .live
            .publish(Generation::new(number, BTreeMap::new()).described(app_id, BTreeMap::new()));
        start::close_in_reverse(&levels, &mut running).await;
    }
}

/// The instances the components of `level` depend on: what they may reach
/// while they are assembled. Only direct dependencies, so assembling a
/// level costs in proportion to its edges, not to the whole set.
pub(crate) fn staged_for(
    level: &[ComponentKey],
    graph: &crate::graph::DependencyGraph,
    running: &BTreeMap<ComponentKey, Running>,
) -> Generation {
    let instances = level
        .iter()
        .flat_map(|key| graph.dependencies(key))
        .filter_map(|dep| {
            running
                .get(&dep)
                .map(|r| (dep, r.assembled.instance.clone()))
        })
        .collect();
    Generation::new(0, instances)
}

pub(crate) fn instances_of(
    running: &BTreeMap<ComponentKey, Running>,
) -> BTreeMap<ComponentKey, Instance> {
    running
        .iter()
        .map(|(key, r)| (key.clone(), r.assembled.instance.clone()))
        .collect()
}

/// Each running component's configured `type`, for the generation's
/// description.
pub(crate) fn types_of(
    running: &BTreeMap<ComponentKey, Running>,
) -> BTreeMap<ComponentKey, String> {
    running
        .iter()
        .map(|(key, r)| (key.clone(), r.spec.type_name.clone()))
        .collect()
}
