//! Closing one component: its background work cancelled, its `close` run
//! on a task of its own and bounded, so that no rollback, drain, shutdown
//! or failed start is held by one component that does not let go.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::component::ComponentKey;
use crate::guarded::{Answer, Guarded};
use crate::handle::Instance;
use crate::redact::Redactor;

/// The longest a component's `close` may take. Past it the close is
/// abandoned (its task aborted) and the caller goes on: a rolled-back
/// reload, a drain, a shutdown or a failed start-up is never held by one
/// component that does not let go.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a `close` ended: [`Ended`](Closed::Ended) when it ran to its end
/// (an error it returned included), [`Abandoned`](Closed::Abandoned) when
/// it timed out or panicked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    Ended,
    Abandoned,
}

impl Closed {
    /// 1 when abandoned, else 0: closes counted as they end.
    pub(crate) fn abandoned(self) -> usize {
        usize::from(self == Closed::Abandoned)
    }
}

/// Cancels a component's background work and closes it, in a task of its
/// own: a `close` that panics or does not end within [`CLOSE_TIMEOUT`] is
/// logged and abandoned, and the caller goes on.
pub(crate) async fn close_one(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) -> Closed {
    close_within(key, instance, shutdown, CLOSE_TIMEOUT).await
}

/// [`close_one`], its `close` abandoned after `within` instead.
pub(crate) async fn close_within(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
    within: Duration,
) -> Closed {
    let deadline = Instant::now() + within;
    Closing::start(instance, shutdown)
        .ended_by(key, deadline)
        .await
}

/// [`close_one`] awaited by a task that may itself be dropped meanwhile
/// (an assembly, when its start is abandoned by its caller): the close
/// then runs on in the background until [`CLOSE_TIMEOUT`], not aborted.
pub(crate) async fn close_one_running_on_if_dropped(
    key: &ComponentKey,
    instance: &Instance,
    shutdown: &CancellationToken,
) -> Closed {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    Closing::start(instance, shutdown)
        .runs_on_if_dropped(deadline)
        .ended_by(key, deadline)
        .await
}

/// A close in progress (see [`close_one`]): many are started at once and
/// awaited one after another by a shared deadline, a task each.
pub(crate) struct Closing {
    close: Guarded<()>,
    started: Instant,
}

impl Closing {
    /// Cancels the component's background work and starts its `close` on
    /// a task of its own.
    pub(crate) fn start(instance: &Instance, shutdown: &CancellationToken) -> Self {
        shutdown.cancel();
        let component = instance.component();
        Self {
            close: Guarded::spawn(async move { component.close().await }),
            started: Instant::now(),
        }
    }

    /// Dropped before it ended, the close runs on until `until` (see
    /// [`Guarded::runs_on_if_dropped`]).
    pub(crate) fn runs_on_if_dropped(self, until: Instant) -> Self {
        Self {
            close: self.close.runs_on_if_dropped(until),
            started: self.started,
        }
    }

    /// Waits for the close of `key` to end; past `deadline` it is logged
    /// and abandoned.
    pub(crate) async fn ended_by(self, key: &ComponentKey, deadline: Instant) -> Closed {
        match self.close.answer_by(deadline).await {
            Answer::Answered(Ok(())) => {
                tracing::info!(component = %key, "Component closed.");
                Closed::Ended
            }
            Answer::Answered(Err(err)) => {
                let error = Redactor::shared().scrub(&err.to_string());
                tracing::warn!(component = %key, error = %error, "Component close failed.");
                Closed::Ended
            }
            Answer::TimedOut => {
                let waited = self.started.elapsed();
                tracing::warn!(component = %key, waited = ?waited, "Component close did not end in time; abandoned.");
                Closed::Abandoned
            }
            Answer::Panicked(message) => {
                let error = Redactor::shared().scrub(&message);
                tracing::error!(component = %key, error = %error, "Component close panicked.");
                Closed::Abandoned
            }
            Answer::Cancelled => {
                tracing::warn!(component = %key, "Component close was cancelled before it ended; abandoned.");
                Closed::Abandoned
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::component::{Component, ComponentError};
    use crate::logged::Logged;

    /// A component whose `close` fails (or panics) quoting a secret.
    #[derive(Debug)]
    struct Careless {
        secret: &'static str,
        panics: bool,
    }

    #[async_trait]
    impl Component for Careless {
        async fn close(&self) -> Result<(), ComponentError> {
            if self.panics {
                panic!("close exploded with password {}", self.secret);
            }
            Err(ComponentError::new(format!(
                "cannot close: auth {} refused",
                self.secret
            )))
        }
    }

    /// A component whose `close` ends after 200 ms, noting it did.
    #[derive(Debug, Default)]
    struct SlowToClose(std::sync::atomic::AtomicBool);

    #[async_trait]
    impl Component for SlowToClose {
        async fn close(&self) -> Result<(), ComponentError> {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_whose_waiter_is_dropped_runs_on_when_told_to() {
        let component = Arc::new(SlowToClose::default());
        let instance = Instance::Custom(component.clone());
        let key = ComponentKey::new("custom", "slow");
        let shutdown = CancellationToken::new();
        let closing = close_one_running_on_if_dropped(&key, &instance, &shutdown);
        let waited = tokio::time::timeout(Duration::from_millis(50), closing).await;
        assert!(waited.is_err(), "closed before its waiter gave up");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            component.0.load(std::sync::atomic::Ordering::SeqCst),
            "aborted"
        );
    }

    #[tokio::test]
    async fn a_close_error_or_panic_is_logged_without_the_secret_it_quotes() {
        let logged = Logged::default();
        let _default = tracing::subscriber::set_default(logged.clone());
        for (secret, panics) in [("cl0se-err-s3cret", false), ("cl0se-panic-s3cret", true)] {
            Redactor::shared().remember(secret);
            let instance = Instance::Custom(Arc::new(Careless { secret, panics }));
            let key = ComponentKey::new("custom", "careless");
            close_one(&key, &instance, &CancellationToken::new()).await;
        }
        let text = logged.text();
        assert!(text.contains("cannot close: auth [redacted]"), "{text}");
        assert!(
            text.contains("close exploded with password [redacted]"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "a secret reached the log: {text}");
    }
}
