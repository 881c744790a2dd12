//! Calls into a component made safe for their caller: each on a task of
//! its own, so a panic fails the call (with its message), not the caller,
//! and a call that does not answer in time is abandoned.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::component::ComponentError;

/// The text a panic was raised with.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// How a call into a component made with [`guarded`] ended.
pub(crate) enum Answer<T> {
    /// It answered.
    Answered(Result<T, ComponentError>),
    /// No answer within the time allowed; the call was abandoned.
    TimedOut,
    /// It panicked, with this message.
    Panicked(String),
}

/// Runs `call` (a call into a component: an in-place update, a close) in
/// a task of its own, in the current span, so a panic in it fails that
/// call, not its caller; aborts it if it does not answer `within`.
pub(crate) async fn guarded<T: Send + 'static>(
    call: impl Future<Output = Result<T, ComponentError>> + Send + 'static,
    within: Duration,
) -> Answer<T> {
    let deadline = Instant::now() + within;
    Guarded::spawn(call).answer_by(deadline).await
}

/// A call into a component running on a task of its own (see
/// [`guarded`]): started now, its answer awaited later, so that many calls
/// can run at once and be awaited one after another by one deadline.
/// Dropped before it answered (its waiter gave up), the call is aborted,
/// as one that timed out.
pub(crate) struct Guarded<T>(JoinHandle<Result<T, ComponentError>>);

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        // Nothing to do once it finished.
        self.0.abort();
    }
}

impl<T: Send + 'static> Guarded<T> {
    /// Starts `call` on a task of its own, in the current span.
    pub(crate) fn spawn(
        call: impl Future<Output = Result<T, ComponentError>> + Send + 'static,
    ) -> Self {
        Self(tokio::spawn(call.in_current_span()))
    }

    /// Its answer, or [`Answer::TimedOut`] (the task aborted) if there is
    /// none by `deadline`.
    pub(crate) async fn answer_by(mut self, deadline: Instant) -> Answer<T> {
        match tokio::time::timeout_at(deadline, &mut self.0).await {
            // Aborted as it is dropped.
            Err(_) => Answer::TimedOut,
            Ok(Ok(answer)) => Answer::Answered(answer),
            Ok(Err(err)) if err.is_panic() => {
                Answer::Panicked(panic_message(&*err.into_panic()).to_string())
            }
            Ok(Err(err)) => Answer::Panicked(err.to_string()),
        }
    }
}
