//! Ctrl-C and SIGTERM for `rewire run`, and the start-up raced against
//! them: a signal during a slow start abandons it instead of waiting.

use std::process::ExitCode;
use std::time::Duration;

use rewire::{Registry, Runtime, RuntimeOptions, ValidConfig};

/// How long an abandoned start-up may take to unwind (its assemblies
/// dropped, each closing what it built) before the process exits anyway.
const ABANDON_WITHIN: Duration = Duration::from_secs(10);

/// Ctrl-C and SIGTERM, listened for from creation on: a signal that
/// arrives while the runtime is still starting is not lost (and does not
/// kill the process with the default action).
pub(super) struct StopSignals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Replaces the default action of both signals with a listener.
    pub(super) fn listen() -> Self {
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
    pub(super) async fn wait(&mut self) -> &'static str {
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

/// Starts the runtime unless a stop signal comes first. The start runs
/// on a task of its own, so an `init` that blocks its thread cannot keep
/// the signal from being seen. On a signal the start is abandoned: its
/// task is aborted (the assemblies in progress are dropped, and close what
/// they built) and waited for at most [`ABANDON_WITHIN`], or until a
/// second signal; the exit code is then a failure.
pub(super) async fn start_unless_stopped(
    valid: ValidConfig,
    registry: Registry,
    stop: &mut StopSignals,
) -> Result<Runtime, ExitCode> {
    let mut starting = tokio::spawn(Runtime::start(valid, registry, RuntimeOptions::default()));
    let signal = tokio::select! {
        started = &mut starting => return match started {
            Ok(Ok(runtime)) => Ok(runtime),
            Ok(Err(err)) => {
                eprintln!("error: start-up failed:\n{err}");
                Err(ExitCode::FAILURE)
            }
            Err(err) => {
                eprintln!("error: start-up failed: {err}");
                Err(ExitCode::FAILURE)
            }
        },
        signal = stop.wait() => signal,
    };
    eprintln!(
        "error: {signal} during start-up: start-up abandoned, closing what started (a second signal exits at once)"
    );
    starting.abort();
    let unwound = async {
        match tokio::time::timeout(ABANDON_WITHIN, &mut starting).await {
            // Started just before the abort: closed as a stop would.
            Ok(Ok(Ok(runtime))) => runtime.shutdown().await,
            Ok(_) => {}
            Err(_) => eprintln!(
                "error: the abandoned start-up did not unwind within {ABANDON_WITHIN:?} (an `init` that blocks its thread?): exiting anyway"
            ),
        }
    };
    tokio::select! {
        () = unwound => {}
        signal = stop.wait() => eprintln!("error: {signal} again: exiting at once"),
    }
    Err(ExitCode::FAILURE)
}
