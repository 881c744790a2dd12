//! The [`Runtime`]: the public face of a running component set. It starts a
//! validated configuration, hands out handles, takes reloads (its own
//! [`apply`](Runtime::apply) and the control plane's pushes) and drives the
//! triggers' queue; the work itself is done by the running set, the
//! reloader and the triggers underneath.

mod options;
mod status;
mod worker;

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::assemble::{failure_lines, ComponentFailure};
use crate::component::{ComponentKey, Kind};
use crate::config::{
    ComponentPatch, Config, ConfigSources, LayerChange, Layers, OverlaySpec, Problems, Push,
    ValidConfig,
};
use crate::fs_watch::FileWatch;
use crate::handle::{
    ComponentHandle, ConfigStoreHandle, FileStoreHandle, Generation, LiveGeneration, LockHandle,
    PubSubHandle, SecretStoreHandle, SequencerHandle, StateStoreHandle,
};
use crate::redact::Redactor;
use crate::registry::Registry;
use crate::reload::queue::{self, QueueSender};
use crate::reload::{ReloadError, ReloadRecord, ReloadRequest, ReloadSettings, Reloader, Trigger};
use crate::running::{NotStarted, RunningSet};
use crate::trigger::{self, TriggerContext};

pub use crate::running::ComponentStatus;
pub use options::RuntimeOptions;
pub use status::Status;
pub use worker::PendingRetry;

/// How long a control-plane change waits at most for the changes the
/// triggers queued before it to be applied: past it, it goes ahead of
/// them (a reload starting a slow component, say).
const CONTROL_WAITS_FOR_QUEUED: Duration = Duration::from_secs(10);

/// Why the runtime did not start.
///
/// Its `Debug` is its `Display` (one problem per line), so a host's
/// `fn main() -> Result<(), Box<dyn Error>>` that returns it with `?`
/// prints readable text rather than a dump of the structure:
///
/// ```
/// use rewire_runtime::{ComponentFailure, ComponentKey, FailedStep, StartError};
///
/// let failure = |name: &str| ComponentFailure {
///     component: Some(ComponentKey::new("state", name)),
///     step: FailedStep::Init,
///     message: "connection refused".to_string(),
/// };
/// let error = StartError::Failed(vec![failure("orders"), failure("carts")]);
/// let returned: Box<dyn std::error::Error> = Box::new(error.clone());
/// let shown = format!("{returned:?}"); // what `main` prints after `Error: `
/// assert_eq!(shown, error.to_string());
/// assert_eq!(shown.lines().count(), 2);
/// assert!(!shown.contains("ComponentFailure"), "{shown}");
/// ```
#[derive(Clone, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid (every problem listed).
    #[error("{0}")]
    Invalid(Problems),
    /// Components failed to start; everything started was closed.
    #[error("{}", failure_lines(.0))]
    Failed(Vec<ComponentFailure>),
    /// The start-up was cancelled (see [`Runtime::start_until`]): every
    /// component started was closed, but `abandoned` of those closes were
    /// given up (timed out or panicked), so what they held may not have
    /// been released; 0 when every close ran to its end. Counted: the
    /// components of finished levels, those whose `init` the cancellation
    /// cut short or whose `init` or readiness failed and, when cancelled
    /// while the overlay was laid, every component and replaced instance.
    /// Not counted: a component whose readiness panicked (its shutdown
    /// token cancelled and its `close` run in the background, bounded by
    /// the init timeout), nor one whose `init` panicked (its shutdown
    /// token cancelled, dropped without `close`: its state is unknown).
    #[error("{}", cancelled_line(*.abandoned))]
    Cancelled {
        /// How many `close`s were abandoned.
        abandoned: usize,
    },
}

/// What a cancelled start-up says: whether every close ran to its end.
fn cancelled_line(abandoned: usize) -> String {
    match abandoned {
        0 => "start-up cancelled: every component started was closed".to_string(),
        n => format!("start-up cancelled: {n} component close(s) abandoned (timed out or panicked); the others were closed"),
    }
}

impl std::fmt::Debug for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// A running set of components. Cheap to clone: clones share the runtime.
///
/// Start it from a validated configuration, reach components through
/// handles, and change the configuration while it runs:
///
/// ```
/// use rewire_runtime::config::{parse, validate};
/// use rewire_runtime::prelude::*;
/// use rewire_runtime::{Action, ComponentKey, Registry, Runtime, RuntimeOptions};
///
/// #[derive(serde::Deserialize)]
/// struct GreeterMetadata {
///     greeting: String,
/// }
///
/// /// Says its greeting.
/// #[derive(rewire_runtime::Component)]
/// #[component(kind = "greeter", type = "plain")]
/// struct Greeter {
///     #[metadata]
///     meta: GreeterMetadata,
/// }
///
/// #[async_trait]
/// impl Component for Greeter {}
///
/// fn config(greeting: &str) -> String {
///     format!(r#"{{"components": {{"greeter": {{"hello": {{
///         "type": "plain", "metadata": {{"greeting": "{greeting}"}}}}}}}}}}"#)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = Registry::collected();
/// let valid = validate(parse(config("hi").as_bytes())?, &registry)?;
/// let runtime = Runtime::start(valid, registry, RuntimeOptions::default()).await?;
///
/// // A handle resolves in the current generation at every load.
/// let hello = runtime.component(ComponentKey::new("greeter", "hello"));
/// assert_eq!(hello.load_as::<Greeter>()?.meta.greeting, "hi");
///
/// // A new declaration is validated, diffed, built, and swapped in whole.
/// let record = runtime.apply(parse(config("hello").as_bytes())?).await?;
/// assert_eq!(record.generation, 2);
/// assert_eq!(record.actions["greeter/hello"], Action::Rebuilt);
/// assert_eq!(hello.load_as::<Greeter>()?.meta.greeting, "hello");
///
/// runtime.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    reloader: Arc<Reloader>,
    registry: Arc<Registry>,
    options: RuntimeOptions,
    redactor: Redactor,
    /// Cancelled at shutdown: the triggers and the worker stop on it.
    stopped: CancellationToken,
    /// Where the triggers send their changes.
    queue: QueueSender,
    /// A triggered reload that rolled back and is tried again.
    retry: worker::RetrySlot,
    /// The overlay documents last tried, so a watch does not send them
    /// again against the same generation.
    overlay_tried: Arc<trigger::OverlayTried>,
    /// The configuration sources' reads, run before a control-plane change.
    source_reads: Arc<trigger::SourceReads>,
    /// Held by a control-plane change from its wait for the queue to the
    /// end of its reload (a fair lock): changes go in force in the order
    /// they arrived, though the queue wakes their waits together.
    control_turn: tokio::sync::Mutex<()>,
}

impl Runtime {
    /// How long [`start_until`](Self::start_until) takes at most to
    /// return once `stop` completes while components start: every
    /// component it started is closed by then (a `close` that has not
    /// ended is abandoned). A caller that waits for the unwinding should
    /// wait a little longer than this. Not counted: an `init` or `close`
    /// that blocks its thread, and a stop while the configured overlay is
    /// laid (see `start_until`).
    pub const CANCELLED_START_UNWIND: Duration = crate::running::CANCELLED_START_UNWIND;

    /// Starts every component of `config`, stores first: each level of the
    /// dependency graph starts concurrently once the previous one is ready.
    /// On any failure, what was started is closed in reverse order.
    pub async fn start(
        config: ValidConfig,
        registry: Registry,
        options: RuntimeOptions,
    ) -> Result<Self, StartError> {
        Self::start_until(config, registry, options, std::future::pending()).await
    }

    /// Starts as [`start`](Self::start) does, unless `stop` completes
    /// first (a stop signal during a slow start, say). Then the level
    /// starting is cut short and waited for (each of its components closes
    /// what it built, bounded by the close timeout), every component
    /// started is closed, users before the stores they use (a level's
    /// components at once, each level within its share of the time left),
    /// and the start returns [`StartError::Cancelled`], all within
    /// [`CANCELLED_START_UNWIND`](Self::CANCELLED_START_UNWIND) of `stop`.
    /// Cancelled while the configured overlay is laid, it cuts that reload
    /// short (it rolls back, its undo bounded by the close timeout), then
    /// closes as [`shutdown_by`](Self::shutdown_by) does, by
    /// `CANCELLED_START_UNWIND` from the stop.
    ///
    /// Dropping the future of `start` or `start_until` instead abandons the
    /// start without waiting: a component still starting (in its `init` or
    /// readiness wait, or closing after either failed) is closed on a task
    /// of its own, bounded (by the init timeout, or the close timeout after
    /// a failed readiness), but the components already ready (of finished
    /// levels, and of the level starting) are dropped without `close`:
    /// cancel through `stop` to have them closed.
    pub async fn start_until(
        config: ValidConfig,
        registry: Registry,
        options: RuntimeOptions,
        stop: impl Future<Output = ()>,
    ) -> Result<Self, StartError> {
        let cancelled = CancellationToken::new();
        let mut starting = pin!(Self::start_unless(config, registry, options, &cancelled));
        let mut stop = pin!(stop);
        let mut stopped = false;
        loop {
            tokio::select! {
                started = &mut starting => return started,
                () = &mut stop, if !stopped => {
                    stopped = true;
                    cancelled.cancel();
                }
            }
        }
    }

    /// [`start_until`](Self::start_until), cancelled by a token.
    async fn start_unless(
        config: ValidConfig,
        registry: Registry,
        options: RuntimeOptions,
        cancelled: &CancellationToken,
    ) -> Result<Self, StartError> {
        let redactor = Redactor::shared();
        let registry = Arc::new(registry);
        let overlay = config.config.overlay.clone();
        let app_id = config.config.app_id.clone();
        let running =
            RunningSet::start_until(config, &registry, options.timeouts, &redactor, cancelled)
                .await
                .map_err(|not| match not {
                    NotStarted::Failed(failures) => StartError::Failed(failures),
                    NotStarted::Cancelled { abandoned } => StartError::Cancelled { abandoned },
                })?;
        let settings = ReloadSettings {
            timeouts: options.timeouts,
            drain_grace: options.drain_grace,
        };
        let reloader = Reloader::new(
            running,
            Arc::clone(&registry),
            settings,
            redactor.clone(),
            options.history_capacity,
        );
        let (queue, queued) = queue::queue();
        let runtime = Self {
            inner: Arc::new(Inner {
                reloader: Arc::new(reloader),
                registry,
                options,
                redactor,
                stopped: CancellationToken::new(),
                queue,
                retry: worker::RetrySlot::default(),
                overlay_tried: Arc::default(),
                source_reads: Arc::default(),
                control_turn: tokio::sync::Mutex::new(()),
            }),
        };
        let mut stop_seen = None;
        if let Some(spec) = overlay {
            let mut laying = pin!(runtime.apply_initial_overlay(&spec, &app_id));
            tokio::select! {
                () = &mut laying => {}
                () = cancelled.cancelled() => {
                    // Cut short as a reload at shutdown is: it rolls back.
                    stop_seen = Some(tokio::time::Instant::now());
                    runtime.stop_reloads();
                    laying.await;
                }
            }
        }
        if cancelled.is_cancelled() {
            // While the overlay was laid: closed as a shutdown closes, by
            // the unwinding's bound from the stop.
            let from = stop_seen.unwrap_or_else(tokio::time::Instant::now);
            let abandoned = runtime
                .shutdown_by(from + Self::CANCELLED_START_UNWIND)
                .await;
            return Err(StartError::Cancelled { abandoned });
        }
        worker::spawn_worker(
            Arc::downgrade(&runtime.inner.reloader),
            queued,
            runtime.inner.stopped.clone(),
            Arc::clone(&runtime.inner.retry),
        );
        trigger::spawn_watched_refs(runtime.trigger_context());
        Ok(runtime)
    }

    /// Lays the overlay over the file before anything else happens, so the
    /// overlay's values are in force when `start` returns. A failure leaves
    /// the file's configuration running and is recorded.
    async fn apply_initial_overlay(&self, spec: &OverlaySpec, app_id: &str) {
        let generation = self.running().watch_plan().borrow().generation;
        match trigger::read_overlay(self.live_generation(), spec, app_id).await {
            Ok((None, None)) => {}
            Ok(documents) => {
                let (common, app) = documents.clone();
                let change = LayerChange::overlay_read(spec.clone(), app_id, common, app);
                let request = ReloadRequest::of_changes(Trigger::Overlay, vec![change]);
                // Rejected: the watch does not send the same documents
                // again (a rollback, which may pass next time, it does).
                if let Err(ReloadError::Invalid(_)) = self.reload(request).await {
                    self.inner.overlay_tried.first_try(generation, &documents);
                }
            }
            Err(error) => {
                // The watch's first read, finding the same, records nothing.
                self.inner.overlay_tried.first_rejection(generation, &error);
                self.reloader().record_rejected(Trigger::Overlay, &error);
            }
        }
    }

    fn reloader(&self) -> &Arc<Reloader> {
        &self.inner.reloader
    }

    fn running(&self) -> &RunningSet {
        self.inner.reloader.running()
    }

    fn live_generation(&self) -> &LiveGeneration {
        self.running().live()
    }

    fn trigger_context(&self) -> TriggerContext {
        TriggerContext {
            queue: self.inner.queue.clone(),
            plan: self.running().watch_plan(),
            stopped: self.inner.stopped.clone(),
            live: self.live_generation().clone(),
            secret_poll_interval: self.inner.options.secret_poll_interval,
            overlay_tried: Arc::clone(&self.inner.overlay_tried),
            source_reads: Arc::clone(&self.inner.source_reads),
            file_in_force: {
                let reloader = Arc::downgrade(&self.inner.reloader);
                Arc::new(move |file: &Config| {
                    reloader
                        .upgrade()
                        .is_some_and(|r| r.running().file_is(file))
                })
            },
        }
    }

    /// Applies `candidate` as the new base configuration (the embedding
    /// program's own reload); overlays and pushes stay laid over it.
    pub async fn apply(&self, candidate: Config) -> Result<ReloadRecord, ReloadError> {
        self.reload(ReloadRequest::new(candidate, Trigger::Programmatic))
            .await
    }

    /// Runs one reload; reloads are serialised.
    pub async fn reload(&self, request: ReloadRequest) -> Result<ReloadRecord, ReloadError> {
        self.reloader().reload(request).await
    }

    /// Declares one component from the control plane: it replaces whatever
    /// the file and the overlay say about it, and survives their changes.
    pub async fn apply_component(
        &self,
        key: ComponentKey,
        patch: ComponentPatch,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.push(key, Push::Declare(patch), based_on_generation)
            .await
    }

    /// Amends one component from the control plane: the metadata fields of
    /// `patch` (a `null` removes one) and whatever else it gives, laid over
    /// what the file and the overlay declare (see [`Push::Amend`]).
    pub async fn amend_component(
        &self,
        key: ComponentKey,
        patch: ComponentPatch,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.push(key, Push::Amend(patch), based_on_generation)
            .await
    }

    /// Amends one component from the control plane when it is in force
    /// with the type `patch` gives (or none), else declares it whole from
    /// `patch` (see [`Push::AmendOrDeclare`]); which one is decided inside
    /// the serialised reload.
    pub async fn amend_or_declare_component(
        &self,
        key: ComponentKey,
        patch: ComponentPatch,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.push(key, Push::AmendOrDeclare(patch), based_on_generation)
            .await
    }

    /// Removes one component from the control plane, whatever the file and
    /// the overlay say.
    pub async fn remove_component(
        &self,
        key: ComponentKey,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.push(key, Push::Remove, based_on_generation).await
    }

    /// Lets go of a component declared or removed by the control plane:
    /// the file and the overlay say again what it is.
    pub async fn release_component(
        &self,
        key: ComponentKey,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.control(LayerChange::Release(key), based_on_generation)
            .await
    }

    async fn push(
        &self,
        key: ComponentKey,
        push: Push,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        self.control(LayerChange::Push(key, push), based_on_generation)
            .await
    }

    /// One control-plane change, as a reload. It is laid over what the
    /// configuration sources hold when it arrives: a file saved just
    /// before it (its watch still settling events) is read first, and
    /// what the triggers queued before it is applied first (waited for
    /// [`CONTROL_WAITS_FOR_QUEUED`] at most), so an amendment finds the
    /// component the file just added.
    async fn control(
        &self,
        change: LayerChange,
        based_on_generation: Option<u64>,
    ) -> Result<ReloadRecord, ReloadError> {
        let _turn = self.inner.control_turn.lock().await;
        // Bounded: a slow read (a file still being written) goes on in the
        // background rather than hold the control plane's turn.
        if let Err(err) = self.inner.source_reads.read_now().await {
            tracing::warn!(error = %err, "A control-plane change goes ahead of the configuration sources' newest content.");
        }
        if !self
            .inner
            .queue
            .handled_within(CONTROL_WAITS_FOR_QUEUED)
            .await
        {
            tracing::warn!(waited = ?CONTROL_WAITS_FOR_QUEUED, "A control-plane change goes ahead of triggered changes still being applied.");
        }
        let request = ReloadRequest {
            based_on_generation,
            ..ReloadRequest::of_changes(Trigger::Api, vec![change])
        };
        self.reload(request).await
    }

    /// Watches the configuration file at `path`: when its content changes,
    /// the new content becomes the base configuration (through the reload
    /// queue, so bursts coalesce). `resync` re-reads it periodically in case
    /// an event is lost (at most every 100 ms: a shorter period, zero
    /// included, is raised to it). The watch ends at shutdown.
    pub fn watch_config_file(&self, path: PathBuf, resync: Duration) -> FileWatch {
        trigger::watch_config_file(&self.trigger_context(), path, resync)
    }

    /// Watches every source of `sources` (the JSON file, the folder of Dapr
    /// manifests): when their content changes, what they declare together
    /// becomes the base configuration, as with
    /// [`watch_config_file`](Self::watch_config_file). The watches end at
    /// shutdown.
    pub fn watch_config_sources(&self, sources: ConfigSources, resync: Duration) -> Vec<FileWatch> {
        trigger::watch_config_sources(
            &self.trigger_context(),
            sources,
            self.registry().clone(),
            resync,
        )
    }

    /// The current generation: load it once per request and use it
    /// throughout for a consistent view.
    pub fn generation(&self) -> Arc<Generation> {
        self.live_generation().load_full()
    }

    /// A receiver told of each new generation (its number), for a
    /// subsystem that follows the generation's
    /// [`sections`](Generation::sections).
    pub fn generation_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.live_generation().changes()
    }

    /// The running configuration.
    pub fn config(&self) -> ValidConfig {
        self.running().config()
    }

    /// The layers of the configuration (file, overlay, pushes).
    pub fn layers(&self) -> Layers {
        self.running().layers()
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
        self.reloader().history()
    }

    /// Every reload record from now on, as it is made.
    ///
    /// The channel keeps the last 64 records: a receiver that falls
    /// further behind lags, its next `recv` answering
    /// [`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged)
    /// with how many it missed, and then goes on from the oldest kept.
    /// Keep receiving after a lag (`while let Ok(..)` would stop there);
    /// [`RecvError::Closed`](tokio::sync::broadcast::error::RecvError::Closed)
    /// ends it: no record will come any more.
    pub fn reload_events(&self) -> tokio::sync::broadcast::Receiver<ReloadRecord> {
        self.reloader().events()
    }

    /// Scrubs secret values the runtime has seen from `text`.
    pub fn redact(&self, text: &str) -> String {
        self.inner.redactor.scrub(text)
    }

    /// A handle to the state store `name`.
    pub fn state_store(&self, name: &str) -> StateStoreHandle {
        StateStoreHandle::new(
            ComponentKey::new(Kind::State, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the config store `name`.
    pub fn config_store(&self, name: &str) -> ConfigStoreHandle {
        ConfigStoreHandle::new(
            ComponentKey::new(Kind::ConfigStore, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the secret store `name`.
    pub fn secret_store(&self, name: &str) -> SecretStoreHandle {
        SecretStoreHandle::new(
            ComponentKey::new(Kind::SecretStore, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the lock `name`.
    pub fn lock_store(&self, name: &str) -> LockHandle {
        LockHandle::new(
            ComponentKey::new(Kind::Lock, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the sequencer `name`.
    pub fn sequencer(&self, name: &str) -> SequencerHandle {
        SequencerHandle::new(
            ComponentKey::new(Kind::Sequencer, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the file store `name`.
    pub fn file_store(&self, name: &str) -> FileStoreHandle {
        FileStoreHandle::new(
            ComponentKey::new(Kind::File, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to the pub/sub broker `name`.
    pub fn pubsub(&self, name: &str) -> PubSubHandle {
        PubSubHandle::new(
            ComponentKey::new(Kind::PubSub, name),
            self.live_generation().clone(),
        )
    }

    /// A handle to any component.
    pub fn component(&self, key: ComponentKey) -> ComponentHandle {
        ComponentHandle::new(key, self.live_generation().clone())
    }

    /// Cuts short a reload in progress and refuses every later one (each
    /// answers [`ReloadError::Stopped`]) while the components keep
    /// serving: the first step of a shutdown, taken as the stop signal
    /// arrives, so a reload pushed over an API is answered while its
    /// connection is still up, not cut with it when the servers stop.
    /// [`shutdown`](Self::shutdown) does it too.
    pub fn stop_reloads(&self) {
        self.reloader().stop();
    }

    /// Stops the triggers, cuts short a reload in progress (it rolls back)
    /// and waits for it, closes the instances reloads replaced that are
    /// still draining (without waiting for their users), then every
    /// component (users before the stores they use) and publishes an
    /// empty generation. Returns how many
    /// closes were abandoned (timed out or panicked): a component that may
    /// not have released what it holds (a lock, a consumer, a file).
    pub async fn shutdown(&self) -> usize {
        self.inner.stopped.cancel();
        self.reloader().shutdown(None).await
    }

    /// [`shutdown`](Self::shutdown), ended by `by`: a reload that does not
    /// let go, or closes that hang level after level, cannot keep the
    /// first level (the stores: their locks, consumer groups, leases) from
    /// being closed in time. A reload still in progress at half the time
    /// left is left behind (counted as one abandoned close; when it ends,
    /// what it built is undone, never committed); each level then closes
    /// within its share of the time left, the last one first.
    /// A deadline already past still asks each close (each level is given
    /// 100 ms), then abandons it.
    pub async fn shutdown_by(&self, by: tokio::time::Instant) -> usize {
        self.inner.stopped.cancel();
        self.reloader().shutdown(Some(by)).await
    }

    /// Whether a shutdown was asked for ([`shutdown`](Self::shutdown) or
    /// [`shutdown_by`](Self::shutdown_by) called, whether or not it has
    /// ended).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.stopped.is_cancelled()
    }
}

#[cfg(test)]
mod tests;
