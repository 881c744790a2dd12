//! Ctrl-C and SIGTERM for `rewire run`, and the start-up raced against
//! them: a signal during a slow start cancels it instead of waiting.

use std::process::ExitCode;
use std::time::Duration;

use rewire::{Registry, Runtime, RuntimeOptions, StartError, ValidConfig};
use tokio_util::sync::CancellationToken;

/// How long a cancelled start-up may take to unwind (the level starting
/// cut short, every component started closed) before the process exits
/// anyway: the runtime's own bound on that unwinding
/// ([`Runtime::CANCELLED_START_UNWIND`]) and a margin, so a start-up that
/// keeps its bound is never cut off (10 s).
const ABANDON_WITHIN: Duration = Runtime::CANCELLED_START_UNWIND.saturating_add(UNWIND_MARGIN);

/// Added to the runtime's bound: scheduling, and the last log lines.
const UNWIND_MARGIN: Duration = Duration::from_secs(2);

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

/// Starts the runtime unless a stop signal comes first. The start runs
/// on a task of its own, so an `init` that blocks its thread cannot keep
/// the signal from being seen. On a signal the start is cancelled (see
/// [`Runtime::start_until`]: what started is closed, users first) and
/// waited for at most [`ABANDON_WITHIN`], or until a second signal. The
/// error is then the exit code: success when everything started was
/// closed in time (a stop asked for is not a failure, to systemd or
/// Kubernetes), a failure when a close was abandoned, the unwinding did
/// not finish or the start failed on its own.
pub(super) async fn start_unless_stopped(
    valid: ValidConfig,
    registry: Registry,
    options: RuntimeOptions,
    stop: &mut StopSignals,
) -> Result<Runtime, ExitCode> {
    let cancel = CancellationToken::new();
    let mut starting = tokio::spawn(Runtime::start_until(
        valid,
        registry,
        options,
        cancel.clone().cancelled_owned(),
    ));
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
        "{signal} during start-up: start-up abandoned, closing what started (a second signal exits at once)"
    );
    cancel.cancel();
    let by = tokio::time::Instant::now() + ABANDON_WITHIN;
    let unwound = async {
        match tokio::time::timeout_at(by, &mut starting).await {
            // Started just before the cancel: closed as a stop would.
            Ok(Ok(Ok(runtime))) => match tokio::time::timeout_at(by, runtime.shutdown()).await {
                Ok(abandoned) => cancelled_exit(abandoned),
                Err(_) => {
                    eprintln!("error: the runtime started just before the signal did not close within {ABANDON_WITHIN:?}: exiting anyway");
                    ExitCode::FAILURE
                }
            },
            Ok(Ok(Err(StartError::Cancelled { abandoned }))) => cancelled_exit(abandoned),
            Ok(Ok(Err(err))) => {
                eprintln!("error: start-up failed:\n{err}");
                ExitCode::FAILURE
            }
            Ok(Err(err)) => {
                eprintln!("error: start-up failed: {err}");
                ExitCode::FAILURE
            }
            Err(_) => {
                eprintln!(
                    "error: the abandoned start-up did not unwind within {ABANDON_WITHIN:?} (an `init` that blocks its thread?): exiting anyway"
                );
                ExitCode::FAILURE
            }
        }
    };
    let code = tokio::select! {
        code = unwound => code,
        signal = stop.wait() => {
            eprintln!("error: {signal} again: exiting at once");
            ExitCode::FAILURE
        }
    };
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
