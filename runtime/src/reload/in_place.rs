//! A reload's calls into a component's in-place update, each in a task of
//! its own: a panic in the component fails that call, not the reload, and
//! an answer that does not come within the init timeout is abandoned.

use std::sync::Arc;
use std::time::Duration;

use crate::component::StagedInPlace;
use crate::component::{Component, ComponentKey, InPlace, PendingInPlace};
pub(super) use crate::guarded::Answer;
use crate::guarded::{guarded, panic_message};
use crate::handle::{with_staged, Generation};
use crate::metadata::Metadata;
use crate::redact::Redactor;
use crate::registry::{in_place_of, InPlaceHook};

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
    guarded(update_call(component, hook, metadata), within).await
}

/// Applies `metadata` to the running `component` at once, handles
/// resolving in `staged` (the generation being built): how a reload puts
/// in force an update that was not staged ([`StagedInPlace::AtCommit`]).
pub(super) async fn update_staged(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
    staged: Arc<Generation>,
    within: Duration,
) -> Answer<InPlace> {
    let call = update_call(component, hook, metadata);
    guarded(with_staged(staged, call), within).await
}

async fn update_call(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
) -> Result<InPlace, crate::component::ComponentError> {
    match in_place_of(component.as_ref(), hook) {
        Some(dynamic) => dynamic.update_in_place(&metadata).await,
        None => Ok(InPlace::NeedsRebuild),
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
                let message = Redactor::shared().scrub(panic_message(&*panic));
                tracing::error!(component = %key, error = %message, "Staged in-place update panicked when applied.");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logged::Logged;

    #[test]
    fn a_panic_applying_a_staged_update_is_logged_without_the_secret_it_quotes() {
        Redactor::shared().remember("app1y-panic-s3cret");
        let logged = Logged::default();
        let pending = PendingInPlace::new(|| panic!("cannot apply password app1y-panic-s3cret"));
        let key = ComponentKey::new("custom", "careless");
        tracing::subscriber::with_default(logged.clone(), || {
            apply_deferred(vec![(key, pending)]);
        });
        let text = logged.text();
        assert!(text.contains("cannot apply password [redacted]"), "{text}");
        assert!(!text.contains("s3cret"), "a secret reached the log: {text}");
    }
}
