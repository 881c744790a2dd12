//! A reload's calls into a component's in-place update, each in a task of
//! its own: a panic in the component fails that call, not the reload, and
//! an answer that does not come within the init timeout is abandoned.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::assembly_tasks::panic_message;
use crate::component::StagedInPlace;
use crate::component::{Component, ComponentError, ComponentKey, InPlace, PendingInPlace};
use crate::handle::{with_staged, Generation};
use crate::metadata::Metadata;
use crate::registry::{in_place_of, InPlaceHook};

/// How a call into an in-place update ended.
pub(super) enum Answer<T> {
    /// It answered.
    Answered(Result<T, ComponentError>),
    /// No answer within the time allowed; the call was abandoned.
    TimedOut,
    /// It panicked, with this message.
    Panicked(String),
}

/// Stages `metadata` on the running `component`, handles resolving in
/// `staged` (the generation being built).
pub(super) async fn stage(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
    staged: Arc<Generation>,
    within: Duration,
) -> Answer<StagedInPlace> {
    let call = async move {
        match in_place_of(component.as_ref(), hook) {
            Some(dynamic) => dynamic.stage_in_place(&metadata).await,
            None => Ok(StagedInPlace::NeedsRebuild),
        }
    };
    guarded(with_staged(staged, call), within).await
}

/// Applies `metadata` to the running `component` at once: how a reload
/// re-applies the previous metadata.
pub(super) async fn update(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
    within: Duration,
) -> Answer<InPlace> {
    let call = async move {
        match in_place_of(component.as_ref(), hook) {
            Some(dynamic) => dynamic.update_in_place(&metadata).await,
            None => Ok(InPlace::NeedsRebuild),
        }
    };
    guarded(call, within).await
}

/// Runs `call` in a task of its own, in the current span; aborts it if it
/// does not answer `within`.
async fn guarded<T: Send + 'static>(
    call: impl std::future::Future<Output = Result<T, ComponentError>> + Send + 'static,
    within: Duration,
) -> Answer<T> {
    let mut task = tokio::spawn(call.in_current_span());
    match tokio::time::timeout(within, &mut task).await {
        Err(_) => {
            task.abort();
            Answer::TimedOut
        }
        Ok(Ok(answer)) => Answer::Answered(answer),
        Ok(Err(err)) if err.is_panic() => {
            Answer::Panicked(panic_message(&*err.into_panic()).to_string())
        }
        Ok(Err(err)) => Answer::Panicked(err.to_string()),
    }
}

/// Puts in force the in-place updates a committed reload staged. Called
/// right after the swap: nothing they make visible can belong to a
/// generation that did not commit. Applying cannot fail; a panic (a bug in
/// the component) is logged and the next update is applied all the same.
pub(super) fn apply_deferred(deferred: Vec<(ComponentKey, PendingInPlace)>) {
    for (key, pending) in deferred {
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pending.apply()));
        match applied {
            Ok(()) => tracing::debug!(component = %key, "Staged in-place update applied."),
            Err(panic) => {
                let message = panic_message(&*panic);
                tracing::error!(component = %key, error = %message, "Staged in-place update panicked when applied.");
            }
        }
    }
}
