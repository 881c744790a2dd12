//! Calls into a component made safe for their caller: each on a task of
//! its own, so a panic fails the call (with its message), not the caller,
//! and a call that does not answer in time is abandoned.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;
use tracing::Instrument;

use crate::component::ComponentError;

pub(crate) use crate::panic_text::panic_message;

/// How a call into a component made with [`guarded`] ended.
pub(crate) enum Answer<T> {
    /// It answered.
    Answered(Result<T, ComponentError>),
    /// No answer within the time allowed; the call was abandoned.
    TimedOut,
    /// It panicked, with this message.
    Panicked(String),
    /// Its task was cancelled before it answered (aborted by its waiter
    /// giving up early, or by the runtime shutting down): no answer, and
    /// no panic either.
    Cancelled,
}

/// Runs `call` (a call into a component: an in-place update, a close) in
/// a task of its own, in the current span, so a panic in it fails that
/// call, not its caller; aborts it if it does not answer `within`.
pub(crate) async fn guarded<T: Send + 'static>(
    call: impl Future<Output = Result<T, ComponentError>> + Send + 'static,
    within: Duration,
) -> Answer<T> {
    let deadline = crate::deadline::deadline_after(within);
    Guarded::spawn(call).answer_by(deadline).await
}

/// A call into a component running on a task of its own (see
/// [`guarded`]): started now, its answer awaited later, so that many calls
/// can run at once and be awaited one after another by one deadline.
/// Dropped before it answered (its waiter gave up), the call is aborted,
/// as one that timed out, unless it was told to
/// [run on](Guarded::runs_on_if_dropped).
pub(crate) struct Guarded<T> {
    task: JoinHandle<Result<T, ComponentError>>,
    /// When dropped unanswered: left to run until then, then aborted.
    runs_on_until: Option<Instant>,
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        if self.task.is_finished() {
            return;
        }
        let (Some(until), Ok(runtime)) = (self.runs_on_until, Handle::try_current()) else {
            self.task.abort();
            return;
        };
        let abort = self.task.abort_handle();
        runtime.spawn(async move {
            tokio::time::sleep_until(until).await;
            abort.abort();
        });
    }
}

impl<T: Send + 'static> Guarded<T> {
    /// Starts `call` on a task of its own, in the current span.
    pub(crate) fn spawn(
        call: impl Future<Output = Result<T, ComponentError>> + Send + 'static,
    ) -> Self {
        Self {
            task: tokio::spawn(call.in_current_span()),
            runs_on_until: None,
        }
    }

    /// Dropped before it answered (its waiter itself dropped: a start
    /// abandoned by its caller), the call runs on in the background until
    /// `until`, then is aborted: a close that releases a lock or a lease
    /// still gets its bounded time.
    pub(crate) fn runs_on_if_dropped(mut self, until: Instant) -> Self {
        self.runs_on_until = Some(until);
        self
    }

    /// Aborts the call at once, whatever it was told (its waiter gives up
    /// early: a start-up's unwinding hurried).
    pub(crate) fn aborter(&self) -> AbortHandle {
        self.task.abort_handle()
    }

    /// Its answer, or [`Answer::TimedOut`] (the task aborted) if there is
    /// none by `deadline`; [`Answer::Cancelled`] if the task was aborted
    /// (by [`aborter`](Self::aborter), or at runtime shutdown) first.
    pub(crate) async fn answer_by(mut self, deadline: Instant) -> Answer<T> {
        match tokio::time::timeout_at(deadline, &mut self.task).await {
            Err(_) => {
                self.task.abort();
                Answer::TimedOut
            }
            Ok(Ok(answer)) => Answer::Answered(answer),
            Ok(Err(err)) if err.is_panic() => {
                Answer::Panicked(panic_message(&*err.into_panic()).to_string())
            }
            Ok(Err(_)) => Answer::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A call that ends after `takes`, noting it did.
    fn call(takes: Duration, ended: &Arc<AtomicBool>) -> Guarded<()> {
        let ended = Arc::clone(ended);
        Guarded::spawn(async move {
            tokio::time::sleep(takes).await;
            ended.store(true, Ordering::SeqCst);
            Ok(())
        })
    }

    /// Waits for `guarded`'s answer for 50 ms only: the waiter is dropped.
    async fn given_up(guarded: Guarded<()>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let answer = tokio::time::timeout(Duration::from_millis(50), guarded.answer_by(deadline));
        assert!(answer.await.is_err(), "answered before its waiter gave up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_dropped_unanswered_is_aborted_unless_told_to_run_on_until_its_bound() {
        let aborted = Arc::new(AtomicBool::new(false));
        given_up(call(Duration::from_millis(200), &aborted)).await;
        let runs_on = Arc::new(AtomicBool::new(false));
        let until = Instant::now() + Duration::from_millis(300);
        given_up(call(Duration::from_millis(200), &runs_on).runs_on_if_dropped(until)).await;
        let past = Arc::new(AtomicBool::new(false));
        let until = Instant::now() + Duration::from_millis(100);
        given_up(call(Duration::from_millis(200), &past).runs_on_if_dropped(until)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!aborted.load(Ordering::SeqCst), "dropped, it ran on");
        assert!(
            runs_on.load(Ordering::SeqCst),
            "told to run on, it was aborted"
        );
        assert!(!past.load(Ordering::SeqCst), "it ran past its bound");
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_call_is_reported_cancelled_not_panicked() {
        let ended = Arc::new(AtomicBool::new(false));
        let guarded = call(Duration::from_secs(10), &ended);
        guarded.aborter().abort();
        let deadline = Instant::now() + Duration::from_secs(60);
        match guarded.answer_by(deadline).await {
            Answer::Cancelled => {}
            Answer::Panicked(message) => panic!("a cancelled call reported panicked: {message}"),
            Answer::TimedOut => panic!("a cancelled call reported timed out"),
            Answer::Answered(_) => panic!("an aborted call answered"),
        }
        assert!(!ended.load(Ordering::SeqCst), "the aborted call ran on");
    }
}
