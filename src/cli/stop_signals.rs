//! Ctrl-C and SIGTERM for `rewire run`, listened for on a thread of their
//! own, and the start-up raced against them: a signal during a slow start
//! cancels it instead of waiting, even when an `init` blocks every worker.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::host::{StopAsked, StopRequest, SAME_STOP_WITHIN};
use rewire::{Registry, Runtime, RuntimeOptions, StartError, ValidConfig};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a cancelled start-up may take to unwind (the level starting
/// cut short, every component started closed) before the process exits
/// anyway: the runtime's own bound on that unwinding
/// ([`Runtime::CANCELLED_START_UNWIND`]) and a margin, so a start-up that
/// keeps its bound is never cut off (10 s).
const ABANDON_WITHIN: Duration = Runtime::CANCELLED_START_UNWIND.saturating_add(UNWIND_MARGIN);

/// Added to the runtime's bound: scheduling, and the last log lines.
const UNWIND_MARGIN: Duration = Duration::from_secs(2);

/// Ctrl-C and SIGTERM, listened for from creation on, on a thread of
/// their own: a signal that arrives while the runtime is still starting
/// is not lost (and does not kill the process with the default action),
/// and is seen even while every worker of the main runtime is blocked (an
/// `init` that blocks its thread: on a multi-thread runtime only an idle
/// worker drives the signal and timer drivers, never the `block_on`
/// thread, so a listener there would wait for the `init` to return).
pub(super) struct StopSignals {
    /// The signals that came once the runtime started (for the shutdown).
    received: mpsc::UnboundedReceiver<&'static str>,
    start: Arc<StartWatch>,
}

/// The start-up the signal thread cancels, and where it stands.
struct StartWatch {
    phase: Mutex<Phase>,
    /// Cancelled by the first signal before the start ended.
    cancel: CancellationToken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not started yet (configuration loading included): a signal cancels.
    Starting,
    /// A signal cancelled the start: it unwinds, within [`ABANDON_WITHIN`].
    Abandoning,
    /// The cancelled start unwound in time: the process is exiting.
    Unwound,
    /// Started: signals are handed to [`StopSignals::wait`].
    Running,
}

impl StartWatch {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StopSignals {
    /// Replaces the default action of both signals with a listener, on a
    /// thread started here; returns once both are listened for.
    pub(super) fn listen() -> Self {
        let (forward, received) = mpsc::unbounded_channel();
        let start = Arc::new(StartWatch {
            phase: Mutex::new(Phase::Starting),
            cancel: CancellationToken::new(),
        });
        let watch = Arc::clone(&start);
        let (listening, listened) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("rewire-signals".into())
            .spawn(move || listen_on_this_thread(&watch, &forward, &listening));
        match spawned {
            Ok(_) => {
                let _ = listened.recv();
            }
            Err(err) => {
                tracing::warn!(error = %err, "Cannot listen for the stop signals: no thread for them.")
            }
        }
        Self { received, start }
    }

    /// Waits for the next stop signal once started; returns its name.
    pub(super) async fn wait(&mut self) -> &'static str {
        match self.received.recv().await {
            Some(signal) => signal,
            None => std::future::pending().await,
        }
    }

    /// Whether the start ended before any signal: then later signals are
    /// for [`Self::wait`]. False when a signal cancelled it meanwhile.
    fn started(&self) -> bool {
        let mut phase = self.start.phase();
        if *phase == Phase::Starting {
            *phase = Phase::Running;
        }
        *phase == Phase::Running
    }

    /// The cancelled start-up unwound in time: the deadline no longer
    /// applies.
    fn unwound(&self) {
        *self.start.phase() = Phase::Unwound;
    }
}

/// The signal thread's body: listens on a runtime of its own, says so on
/// `listening`, then for ever handles each signal. A signal within
/// [`SAME_STOP_WITHIN`] of the first is the same stop request, passed
/// over: only a later one abandons the start's unwinding or cuts the
/// shutdown short.
fn listen_on_this_thread(
    start: &StartWatch,
    forward: &mpsc::UnboundedSender<&'static str>,
    listening: &std::sync::mpsc::SyncSender<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::warn!(error = %err, "Cannot listen for the stop signals: no runtime for them.");
            let _ = listening.send(());
            return;
        }
    };
    let mut signals = runtime.block_on(async { Signals::listen() });
    let _ = listening.send(());
    let mut abandon_by: Option<Instant> = None;
    let mut request = StopRequest::default();
    loop {
        let next = signals.next();
        let signal = match abandon_by {
            None => runtime.block_on(next),
            Some(by) => {
                match runtime.block_on(async { tokio::time::timeout_at(by.into(), next).await }) {
                    Ok(signal) => signal,
                    Err(_) => {
                        // Held to the exit: the main thread cannot say it
                        // unwound (and return from `main`) meanwhile.
                        let phase = start.phase();
                        if *phase == Phase::Abandoning {
                            eprintln!(
                                "error: the abandoned start-up did not unwind within {ABANDON_WITHIN:?} (an `init` that blocks its thread?): exiting anyway"
                            );
                            std::process::exit(1);
                        }
                        drop(phase);
                        abandon_by = None;
                        continue;
                    }
                }
            }
        };
        if request.heed(Instant::now()) == StopAsked::SameStop {
            // Ctrl-C to the process group and a launcher's SIGTERM, say.
            tracing::info!(
                signal,
                within = ?SAME_STOP_WITHIN,
                "A second stop signal right after the first: the same stop request."
            );
            continue;
        }
        let mut phase = start.phase();
        match *phase {
            Phase::Starting => {
                *phase = Phase::Abandoning;
                drop(phase);
                eprintln!(
                    "{signal} during start-up: start-up abandoned, closing what started (a later signal exits at once)"
                );
                abandon_by = Some(Instant::now() + ABANDON_WITHIN);
                start.cancel.cancel();
            }
            Phase::Abandoning => {
                eprintln!("error: {signal} again: exiting at once");
                std::process::exit(1);
            }
            Phase::Unwound => {}
            Phase::Running => {
                let _ = forward.send(signal);
            }
        }
    }
}

/// The two stop signals, on the signal thread's runtime.
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Within the runtime the signals are received on.
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(signal) => Some(signal),
                Err(err) => {
                    tracing::warn!(signal = name, error = %err, "Cannot listen for a stop signal.");
                    None
                }
            };
            Self {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next stop signal; returns its name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = next(self.interrupt.as_mut()) => "SIGINT",
                () = next(self.terminate.as_mut()) => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// What a cancelled start-up that unwound in time says, and its exit
/// code: success only when every close ran to its end.
fn cancelled_exit(abandoned: usize) -> ExitCode {
    let (line, code) = cancelled_outcome(abandoned);
    eprintln!("{line}");
    code
}

/// The line [`cancelled_exit`] prints and its exit code.
fn cancelled_outcome(abandoned: usize) -> (String, ExitCode) {
    let said = StartError::Cancelled { abandoned }.to_string();
    match abandoned {
        0 => (said, ExitCode::SUCCESS),
        _ => (format!("error: {said}"), ExitCode::FAILURE),
    }
}

/// Starts the runtime unless a stop signal comes first. The signal
/// thread ([`StopSignals`]) cancels the start on a signal (see
/// [`Runtime::start_until`]: what started is closed, users first) and
/// gives it at most [`ABANDON_WITHIN`], or until a second signal, before
/// it exits the process (1) itself: a start whose `init` blocks every
/// worker cannot keep it from exiting. The error is then the exit code:
/// success when everything started was closed in time (a stop asked for
/// is not a failure, to systemd or Kubernetes), a failure when a close
/// was abandoned or the start failed on its own.
pub(super) async fn start_unless_stopped(
    valid: ValidConfig,
    registry: Registry,
    options: RuntimeOptions,
    stop: &mut StopSignals,
) -> Result<Runtime, ExitCode> {
    let cancel = stop.start.cancel.clone().cancelled_owned();
    let started = tokio::spawn(Runtime::start_until(valid, registry, options, cancel)).await;
    if stop.started() {
        return match started {
            Ok(Ok(runtime)) => Ok(runtime),
            Ok(Err(err)) => {
                eprintln!("error: start-up failed:\n{err}");
                Err(ExitCode::FAILURE)
            }
            Err(err) => {
                eprintln!("error: start-up failed: {err}");
                Err(ExitCode::FAILURE)
            }
        };
    }
    let code = match started {
        // Started just before the cancel: closed as a stop would.
        // Bounded as the start's unwinding is: the signal thread exits the
        // process not long after.
        Ok(Ok(runtime)) => {
            let within = Runtime::CANCELLED_START_UNWIND;
            cancelled_exit(super::shutdown::shut_down_within(&runtime, within).await)
        }
        Ok(Err(StartError::Cancelled { abandoned })) => cancelled_exit(abandoned),
        Ok(Err(err)) => {
            eprintln!("error: start-up failed:\n{err}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: start-up failed: {err}");
            ExitCode::FAILURE
        }
    };
    stop.unwound();
    Err(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_start_succeeds_only_when_every_close_ended() {
        let (line, code) = cancelled_outcome(0);
        assert_eq!(code, ExitCode::SUCCESS);
        assert!(
            line.contains("every component started was closed"),
            "{line}"
        );

        let (line, code) = cancelled_outcome(2);
        assert_eq!(code, ExitCode::FAILURE);
        assert!(line.starts_with("error: "), "{line}");
        assert!(line.contains("2 component close(s) abandoned"), "{line}");
        assert!(!line.contains("every component"), "{line}");
    }
}
