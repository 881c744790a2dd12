//! A runtime started from a configuration file in one call, for programs
//! that host rewire as a library (a sidecar binary calls `rewire::main()`
//! instead). It sets up what `rewire run` sets up besides the APIs: ring as
//! the process's rustls provider and, with the sidecar, trace export.

use std::future::Future;
use std::ops::Deref;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::{JoinError, JoinHandle};
use tracing::Instrument;

use rewire_runtime::{
    Component, ComponentKey, FileWatch, HandleError, Registry, Runtime, RuntimeOptions, StartError,
    ValidConfig,
};

/// How often a followed file is re-read in case a change event was lost.
const RESYNC: Duration = Duration::from_secs(30);
/// How long the spans still queued at shutdown may take to export (here
/// and in `rewire run`).
#[cfg(feature = "sidecar")]
pub(crate) const SPAN_FLUSH: Duration = Duration::from_secs(3);
/// How long a host's shutdown may take to cut short a reload in progress
/// and close every component, the stores included (see
/// [`Runtime::shutdown_by`]); `rewire run` uses it too.
pub(crate) const CLOSE_BOUND: Duration = Duration::from_secs(60);
/// How soon after the first stop signal another one is still the same
/// stop request, not the user giving up on the shutdown: Ctrl-C reaches
/// the whole process group while a launcher (honcho, a shell wrapper)
/// sends SIGTERM too, or `kill -INT $p; kill -TERM $p`. Here and in
/// `rewire run`.
pub(crate) const SAME_STOP_WITHIN: Duration = Duration::from_millis(500);

/// A [`Runtime`] started from a file and following it: every edit of the
/// file is validated and applied as a reload, until [`Host::shutdown`].
/// Derefs to the runtime, so everything `Runtime` offers is at hand, but
/// for what the host shadows: [`Host::component`] (kind and name, typed)
/// hides [`Runtime::component`] (by key); reach that one through
/// [`Host::runtime`]: `host.runtime().component(key)`.
///
/// With the `sidecar` feature, spans are exported as `rewire run` exports
/// them: as the `OTEL_*` variables and the file's `tracing` section say,
/// re-read after every reload, the last ones flushed at shutdown (call
/// `rewire::init_logging` first: it installs the layer that records them).
///
/// End it with [`Host::shutdown`] (or [`Host::run_until_stopped`]). A host
/// dropped without it (an error returned between its start and its
/// shutdown) logs an error and runs the same bounded shutdown on the tokio
/// runtime it is dropped in: its components are closed (their readers,
/// watchers and locks' keep-alives end) rather than left running beside
/// the next host. On a multi-thread runtime the drop waits for it (so a
/// host dropped as `main` returns is closed before the runtime ends), in
/// a `LocalSet` too (where tokio refuses to block in place: a helper
/// thread waits then, while the runtime's workers close); on a
/// current-thread runtime it cannot wait, and the shutdown runs in the
/// background, to its end only if the runtime keeps running.
///
/// In a `LocalSet`, tokio's refusal is a panic, caught by the drop; the
/// process's panic hook still runs first, so the default hook prints
/// "can call blocking only when running on the multi-threaded runtime"
/// (and a hook that logs panics logs it) at every such drop, though the
/// drop goes on and closes the components. Call `shutdown().await` before
/// dropping a host inside a `LocalSet` to avoid it.
///
/// ```no_run
/// use rewire::{ComponentKey, Host};
/// # #[derive(rewire::Component)]
/// # #[component(kind = "greeter", type = "hello")]
/// # struct Greeter {}
/// # impl rewire::Component for Greeter {}
///
/// #[rewire::tokio::main(crate = "rewire::tokio")]
/// async fn main() -> Result<std::process::ExitCode, rewire::StartError> {
///     rewire::init_logging();
///     let host = Host::start("rewire.json").await?;
///     // Typed access to a component of your own, in the current generation.
///     let greeter = host.component::<Greeter>("greeter", "hi");
///     // The runtime's untyped handle by key (shadowed by the above).
///     let handle = host.runtime().component(ComponentKey::new("greeter", "hi"));
///     // Non-zero when a close was abandoned: what it held may not have
///     // been released.
///     Ok(match host.run_until_stopped().await {
///         0 => std::process::ExitCode::SUCCESS,
///         _abandoned => std::process::ExitCode::FAILURE,
///     })
/// }
/// ```
#[must_use = "a host runs until `Host::shutdown`; dropped without it, it logs an error and shuts down from its drop"]
pub struct Host {
    runtime: Runtime,
    /// Ends with the host: the file is followed while it lives.
    _watch: FileWatch,
    /// The tracing settings are followed while it is here (taken at
    /// shutdown, before the components close).
    #[cfg(feature = "sidecar")]
    tracing: Option<rewire_sidecar::telemetry::Following>,
    /// Set once [`Host::shutdown`] started its shutdown task: that task
    /// runs to its bound even if the caller stops waiting, so dropping the
    /// host then does nothing more.
    shutdown_started: bool,
}

impl Host {
    /// Validates the file at `path` against every linked component type,
    /// starts its components and follows the file. Paths in component
    /// metadata are relative to the file's folder.
    pub async fn start(path: impl AsRef<Path>) -> Result<Self, StartError> {
        Self::start_with(path, Registry::collected(), RuntimeOptions::default()).await
    }

    /// [`Host::start`] with a registry and options of the caller's choice.
    pub async fn start_with(
        path: impl AsRef<Path>,
        registry: Registry,
        options: RuntimeOptions,
    ) -> Result<Self, StartError> {
        Self::start_with_until(path, registry, options, std::future::pending()).await
    }

    /// [`Host::start`], unless `stop` completes first (a stop signal
    /// during a slow start, say): then the start is cut short, every
    /// component it started is closed (users before the stores they use,
    /// within [`Runtime::CANCELLED_START_UNWIND`] of the stop), and it
    /// returns [`StartError::Cancelled`], which says whether every close
    /// ran to its end (see [`Runtime::start_until`]). A stop that comes as
    /// the start ends counts too: the runtime just started is shut down
    /// within the same bound, and the start returns `Cancelled` all the
    /// same.
    ///
    /// Without it, a host has no way to stop during a start whose `init`s
    /// take long (a store dialling a server that does not answer, for up
    /// to the init timeout): dropping the start's future leaves the
    /// components already started unclosed, and SIGTERM's default action
    /// ends the process with nothing closed.
    ///
    /// Listen for every signal meant to stop the program, Ctrl-C (SIGINT)
    /// and SIGTERM both: one not listened for keeps its default action,
    /// ending the process during the start with nothing closed.
    ///
    /// A signal listener of tokio's, once created, stands in for the
    /// signal's default action for the rest of the process, and a signal
    /// is delivered only to the listeners that exist when it comes: one
    /// arriving between `start_until` returning and
    /// [`Host::run_until_stopped`] listening is taken by the listener the
    /// start used (lost if that one was dropped), never seen by
    /// `run_until_stopped`'s, and the program would go on running. So keep
    /// one listener for both, as below: wait on the start's again, then
    /// call [`Host::shutdown`].
    ///
    /// ```no_run
    /// use rewire::tokio::signal::unix::{signal, Signal, SignalKind};
    /// use rewire::{Host, StartError};
    /// use std::process::ExitCode;
    ///
    /// /// The next Ctrl-C (SIGINT) or SIGTERM.
    /// async fn next_stop(interrupt: &mut Signal, terminate: &mut Signal) {
    ///     rewire::tokio::select! {
    ///         _ = interrupt.recv() => {}
    ///         _ = terminate.recv() => {}
    ///     }
    /// }
    ///
    /// #[rewire::tokio::main(crate = "rewire::tokio")]
    /// async fn main() -> ExitCode {
    ///     rewire::init_logging();
    ///     // Both listened for before the start, and kept until the end.
    ///     let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT listened for");
    ///     let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM listened for");
    ///     let stopped = next_stop(&mut interrupt, &mut terminate);
    ///     let host = match Host::start_until("rewire.json", stopped).await {
    ///         Ok(host) => host,
    ///         // Stopped while starting, every close ended: a stop carried out.
    ///         Err(StartError::Cancelled { abandoned: 0 }) => return ExitCode::SUCCESS,
    ///         Err(error) => {
    ///             eprintln!("error: {error}");
    ///             return ExitCode::FAILURE;
    ///         }
    ///     };
    ///     // The same listeners: a signal since the start ended is seen here.
    ///     next_stop(&mut interrupt, &mut terminate).await;
    ///     match host.shutdown().await {
    ///         0 => ExitCode::SUCCESS,
    ///         _abandoned => ExitCode::FAILURE,
    ///     }
    /// }
    /// ```
    pub async fn start_until(
        path: impl AsRef<Path>,
        stop: impl Future<Output = ()>,
    ) -> Result<Self, StartError> {
        Self::start_with_until(path, Registry::collected(), RuntimeOptions::default(), stop).await
    }

    /// [`Host::start_until`] with a registry and options of the caller's
    /// choice.
    pub async fn start_with_until(
        path: impl AsRef<Path>,
        registry: Registry,
        options: RuntimeOptions,
        stop: impl Future<Output = ()>,
    ) -> Result<Self, StartError> {
        // Clients that build a rustls configuration without naming a
        // provider (redis-rs, at every connect) find ring; without a
        // default, rustls panics when another dependency enables
        // aws-lc-rs too. A provider installed before stands.
        rewire_components::tls::install_ring_provider();
        let path = absolute(path.as_ref());
        let config = ValidConfig::from_path(&path, &registry).map_err(StartError::Invalid)?;
        let runtime = start_runtime_until(config, registry, options, stop).await?;
        let watch = runtime.watch_config_file(path, RESYNC);
        Ok(Self {
            #[cfg(feature = "sidecar")]
            tracing: Some(rewire_sidecar::telemetry::follow(&runtime)),
            runtime,
            _watch: watch,
            shutdown_started: false,
        })
    }

    /// The runtime, to keep beyond the host (it is cheap to clone).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The component `kind/name` as its concrete type `T`, in the current
    /// generation. Call it per use: a reload may replace the instance, and
    /// the `Arc` keeps the old one alive while held.
    pub fn component<T: Component>(&self, kind: &str, name: &str) -> Result<Arc<T>, HandleError> {
        self.runtime
            .component(ComponentKey::new(kind, name))
            .load_as::<T>()
    }

    /// Waits for Ctrl-C (or SIGTERM on Unix), then shuts down (see
    /// [`Host::shutdown`]): components close users first; returns how many
    /// closes were abandoned, as `shutdown` does (exit non-zero then: what
    /// they held may not have been released). A second signal within
    /// 500 ms of the first (Ctrl-C reaching the whole process group while
    /// a launcher sends SIGTERM too) is the same stop request. A later one
    /// during the shutdown (which may take a minute) is the user giving up
    /// on it: this returns at once, saying so, and counts the shutdown
    /// left undone as one abandoned close (it goes on in its task while
    /// the tokio runtime lives).
    #[must_use = "the number of abandoned closes: exit non-zero when it is not 0 (what they held may not have been released)"]
    pub async fn run_until_stopped(self) -> usize {
        let mut stop = StopSignals::listen();
        stop.wait().await;
        tracing::info!("Stopping (a second signal stops waiting for the shutdown).");
        // Started before the race, and polled first in it: a second signal
        // already waiting cannot drop the shutdown before it begins (the
        // host's drop would then close it, blocking for up to a minute and
        // logging that `Host::shutdown` was not called).
        let shutdown = self.begin_shutdown();
        tokio::select! {
            biased;
            abandoned = shutdown => abandoned,
            () = stop.wait() => {
                tracing::error!(
                    "Shutdown cut short by a second signal: returning at once; components still \
                     closing may not have released what they hold."
                );
                1
            }
        }
    }

    /// Stops following the file and closes every component, within 60 s
    /// (see [`Runtime::shutdown_by`]); returns how many
    /// closes were abandoned. The spans still queued are then exported,
    /// within 3 s (with the `sidecar` feature).
    ///
    /// The shutdown runs in a task of its own: cut short (this future
    /// dropped, by a timeout say), it goes on to its bound, so the stores,
    /// closed last, are still closed. Should the tokio runtime end first,
    /// the shutdown left undone counts as one abandoned close; a panic in
    /// it is resumed here.
    pub async fn shutdown(self) -> usize {
        self.begin_shutdown().await
    }

    /// Starts the shutdown task now (on the current tokio runtime); the
    /// future waits for it (see [`Host::shutdown`]).
    fn begin_shutdown(mut self) -> impl Future<Output = usize> {
        // Stop following first: the closed runtime reads as "no tracing",
        // which would turn the exporter off and drop the spans queued.
        #[cfg(feature = "sidecar")]
        drop(self.tracing.take());
        self.shutdown_started = true;
        let closing = spawn_shutdown(&Handle::current(), &self.runtime);
        async move {
            // The host (its file watch) lives until the shutdown ends.
            let _host = self;
            match closing.await {
                Ok(abandoned) => abandoned,
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(error) => {
                    log_unfinished(&error);
                    1
                }
            }
        }
    }
}

/// [`Runtime::start_until`], and a stop that came as the start ended (the
/// start won the race, the stop ready but not seen) honoured too: the
/// runtime is shut down within [`Runtime::CANCELLED_START_UNWIND`], and
/// the start is [`StartError::Cancelled`].
async fn start_runtime_until(
    config: ValidConfig,
    registry: Registry,
    options: RuntimeOptions,
    stop: impl Future<Output = ()>,
) -> Result<Runtime, StartError> {
    let mut stop = std::pin::pin!(stop);
    let mut stopped = false;
    let watched_stop = std::future::poll_fn(|cx| {
        let polled = stop.as_mut().poll(cx);
        stopped |= polled.is_ready();
        polled
    });
    let runtime = Runtime::start_until(config, registry, options, watched_stop).await?;
    // Never polled again once it ended.
    if !stopped
        && stop
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    {
        return Ok(runtime);
    }
    let abandoned = shut_down_within(&runtime, Runtime::CANCELLED_START_UNWIND).await;
    Err(StartError::Cancelled { abandoned })
}

impl Drop for Host {
    /// A host whose shutdown never started runs it on the current tokio
    /// runtime (its components' tasks run there): waiting for it on a
    /// multi-thread runtime (on a helper thread in a `LocalSet` driven by
    /// `block_on`, where blocking in place panics), in the background on a
    /// current-thread one (where blocking would stop the very tasks it
    /// waits for). No panic leaves it (a panic in a drop while another
    /// unwinds aborts the process). In a `LocalSet`, tokio's refusal to
    /// block in place is a panic it catches, but the panic hook runs
    /// before that: the process's hook reports "can call blocking only
    /// when running on the multi-threaded runtime" at every such drop
    /// (call [`Host::shutdown`] and await it first to avoid it). Outside of
    /// a runtime, or while it shuts down, it can only stop the reloads and
    /// say so.
    fn drop(&mut self) {
        // Shut down by this host. (A shutdown through its `Runtime`, by
        // deref, may have been cut short before closing anything: shut
        // down again, which closes what is left.)
        if self.shutdown_started {
            return;
        }
        #[cfg(feature = "sidecar")]
        drop(self.tracing.take());
        let Ok(tokio) = Handle::try_current() else {
            return self.not_closed();
        };
        let mut closing = spawn_shutdown(&tokio, &self.runtime);
        if closing.is_finished() {
            // Already over: cancelled as it was spawned (the runtime is
            // shutting down), or run to its end by another worker.
            let ended = poll_once(&mut closing);
            if matches!(&ended, Poll::Ready(Err(error)) if error.is_cancelled()) {
                return self.not_closed();
            }
            tracing::error!(
                "A Host was dropped without `Host::shutdown`; its components were closed."
            );
            if let Poll::Ready(Err(error)) = ended {
                log_unfinished(&error);
            }
            return;
        }
        if tokio.runtime_flavor() == RuntimeFlavor::MultiThread {
            tracing::error!(bound = ?CLOSE_BOUND, "A Host was dropped without `Host::shutdown`; closing its components before the drop returns.");
            wait_for_shutdown(&tokio, closing);
        } else {
            tracing::error!(bound = ?CLOSE_BOUND, "A Host was dropped without `Host::shutdown` on a current-thread tokio runtime; closing its components in the background, which completes only if the runtime keeps running.");
        }
    }
}

impl Host {
    /// What a drop does when no runtime can close the components.
    fn not_closed(&self) {
        self.runtime.stop_reloads();
        tracing::error!("A Host was dropped without `Host::shutdown`, outside of a running tokio runtime: its components could not be closed.");
    }
}

/// Starts the bounded shutdown of `runtime` as a task of `tokio`.
fn spawn_shutdown(tokio: &Handle, runtime: &Runtime) -> JoinHandle<usize> {
    let runtime = runtime.clone();
    tokio.spawn(async move { shut_down_within(&runtime, CLOSE_BOUND).await }.in_current_span())
}

/// Waits, on this thread, for `closing` (a task of the multi-thread
/// runtime `tokio`) without ever panicking: a drop's panic while a panic
/// unwinds would abort the process.
///
/// On a worker, the runtime's other workers run the shutdown (and this
/// worker's tasks, handed over) while this thread blocks in place. tokio
/// refuses that off its workers where blocking is not allowed (in a
/// `LocalSet`'s `run_until` or one of its `spawn_local` tasks, driven by
/// `block_on`): the refusal, raised before anything else, is caught, and
/// a helper thread waits instead. This thread is no worker there, so the
/// shutdown task (in the runtime's shared queue) runs on the workers
/// while it waits.
fn wait_for_shutdown(tokio: &Handle, mut closing: JoinHandle<usize>) {
    let in_place = std::panic::catch_unwind(AssertUnwindSafe(|| {
        tokio::task::block_in_place(|| tokio.block_on(&mut closing))
    }));
    let closed = in_place.or_else(|_refused| {
        tracing::debug!("Blocking in place refused (a LocalSet off the workers): waiting for the Host's shutdown on a helper thread.");
        std::thread::scope(|scope| {
            scope
                .spawn(|| tokio.block_on(&mut closing))
                .join()
        })
    });
    match closed {
        Ok(Ok(_abandoned)) => {}
        Ok(Err(error)) => log_unfinished(&error),
        Err(_panic) => tracing::error!(
            "Waiting for the Host's shutdown failed; some components may not be closed."
        ),
    }
}

/// Polls `task` once, without a waker to call back.
fn poll_once<T>(task: &mut JoinHandle<T>) -> Poll<Result<T, JoinError>> {
    Pin::new(task).poll(&mut Context::from_waker(Waker::noop()))
}

/// Says why a host's shutdown task ended without closing everything.
fn log_unfinished(error: &JoinError) {
    if error.is_cancelled() {
        tracing::error!("The tokio runtime ended before the Host's components were all closed.");
    } else {
        tracing::error!(%error, "The Host's shutdown panicked; some components may not be closed.");
    }
}

/// Closes every component of `runtime` by `within` from now, then exports
/// the spans still queued (with the `sidecar` feature); returns how many
/// closes were abandoned.
async fn shut_down_within(runtime: &Runtime, within: Duration) -> usize {
    let abandoned = runtime
        .shutdown_by(tokio::time::Instant::now() + within)
        .await;
    if abandoned > 0 {
        tracing::warn!(abandoned, bound = ?within, "Component close(s) abandoned at shutdown.");
    }
    #[cfg(feature = "sidecar")]
    if !rewire_sidecar::telemetry::flush(SPAN_FLUSH).await {
        tracing::warn!(waited = ?SPAN_FLUSH, "Spans still queued at shutdown were not exported in time.");
    }
    abandoned
}

impl Deref for Host {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        &self.runtime
    }
}

/// `path` against the working directory, so the file is found again
/// whatever the process does to its directory later.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Ctrl-C, and SIGTERM on Unix, listened for from [`listen`](Self::listen)
/// on: a second signal is not missed between two waits.
struct StopSignals {
    /// SIGINT (`None`: not listened for; Ctrl-C is, each wait).
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    /// SIGTERM (`None`: it cannot be listened for).
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    /// When the first signal came: the next within [`SAME_STOP_WITHIN`]
    /// is the same request.
    request: StopRequest,
}

impl StopSignals {
    /// Listens from now on.
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
                request: StopRequest::default(),
            }
        }
        #[cfg(not(unix))]
        Self {
            request: StopRequest::default(),
        }
    }

    /// Resolves on the first stop signal, then on each later one that
    /// asks more than the first did: a signal within [`SAME_STOP_WITHIN`]
    /// of the first is passed over.
    async fn wait(&mut self) {
        loop {
            self.next().await;
            match self.request.heed(Instant::now()) {
                StopAsked::SameStop => tracing::info!(
                    within = ?SAME_STOP_WITHIN,
                    "A second stop signal right after the first: the same stop request."
                ),
                StopAsked::Stop | StopAsked::GiveUp => return,
            }
        }
    }

    /// Resolves on the next stop signal.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            let Self {
                interrupt,
                terminate,
                request: _,
            } = self;
            let interrupt = async {
                match interrupt {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            };
            let terminate = async {
                match terminate {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = interrupt => {}
                () = terminate => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// What a stop signal asks, by when it came (see [`StopRequest::heed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopAsked {
    /// The first signal: stop.
    Stop,
    /// Within [`SAME_STOP_WITHIN`] of the first: the same request again,
    /// nothing more.
    SameStop,
    /// Later: stop waiting for the shutdown (or the start's unwinding).
    GiveUp,
}

/// The stop signals a process received: when the first came.
#[derive(Debug, Default)]
pub(crate) struct StopRequest {
    first: Option<Instant>,
}

impl StopRequest {
    /// What a signal received `at` asks: the first stops; one within
    /// [`SAME_STOP_WITHIN`] of the first (not of the last: signals every
    /// 100 ms still give up in time) is the same request; a later one
    /// gives up.
    pub(crate) fn heed(&mut self, at: Instant) -> StopAsked {
        let Some(first) = self.first else {
            self.first = Some(at);
            return StopAsked::Stop;
        };
        if at.saturating_duration_since(first) < SAME_STOP_WITHIN {
            StopAsked::SameStop
        } else {
            StopAsked::GiveUp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two signals back to back (Ctrl-C to the process group and a
    /// launcher's SIGTERM) are one stop request; only a signal after the
    /// window gives up on the shutdown. Before: the second signal, however
    /// close, cut the shutdown short.
    #[test]
    fn a_signal_right_after_the_first_is_the_same_stop_request() {
        let first = Instant::now();
        let mut request = StopRequest::default();
        assert_eq!(request.heed(first), StopAsked::Stop);
        let soon = first + Duration::from_millis(5);
        assert_eq!(request.heed(soon), StopAsked::SameStop);
        let before_the_window_ends = first + SAME_STOP_WITHIN - Duration::from_millis(1);
        assert_eq!(request.heed(before_the_window_ends), StopAsked::SameStop);
        assert_eq!(request.heed(first + SAME_STOP_WITHIN), StopAsked::GiveUp);
        let later = first + Duration::from_secs(3);
        assert_eq!(request.heed(later), StopAsked::GiveUp);
    }

    /// The window runs from the first signal, not the last: signals sent
    /// every 100 ms (a script that keeps sending) still give up once it
    /// ends.
    #[test]
    fn the_window_runs_from_the_first_signal() {
        let first = Instant::now();
        let mut request = StopRequest::default();
        assert_eq!(request.heed(first), StopAsked::Stop);
        let asked: Vec<_> = (1..=6)
            .map(|n| request.heed(first + Duration::from_millis(100) * n))
            .collect();
        assert_eq!(asked[..4], [StopAsked::SameStop; 4]);
        assert_eq!(asked[4..], [StopAsked::GiveUp; 2]);
    }
}
