//! A reload's calls into a component's in-place update, each in a task of
//! its own: a panic in the component fails that call, not the reload, and
//! an answer that does not come within the init timeout is abandoned.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::component::StagedInPlace;
use crate::component::{Component, ComponentKey, InPlace, PendingInPlace};
pub(super) use crate::guarded::Answer;
use crate::guarded::{guarded, panic_message};
use crate::handle::{with_staged, Generation, Instance, LiveGeneration};
use crate::metadata::Metadata;
use crate::redact::Redactor;
use crate::registry::{in_place_of, InPlaceHook};
use crate::running::Running;

/// Stages `metadata` on the running `component`, the handles of `live`
/// resolving in `staged` (the generation being built for it).
pub(super) async fn stage(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
    (live, staged): (LiveGeneration, Arc<Generation>),
    within: Duration,
) -> Answer<StagedInPlace> {
    let call = async move {
        match in_place_of(component.as_ref(), hook) {
            Some(dynamic) => dynamic.stage_in_place(&metadata).await,
            None => Ok(StagedInPlace::NeedsRebuild),
        }
    };
    guarded(with_staged(live, staged, call), within).await
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

/// Applies `metadata` to the running `component` at once, the handles of
/// `live` resolving in `staged` (the generation being built for it): how a
/// reload puts in force an update that was not staged
/// ([`StagedInPlace::AtCommit`]).
pub(super) async fn update_staged(
    component: Arc<dyn Component>,
    hook: Option<InPlaceHook>,
    metadata: Metadata,
    (live, staged): (LiveGeneration, Arc<Generation>),
    within: Duration,
) -> Answer<InPlace> {
    let call = update_call(component, hook, metadata);
    guarded(with_staged(live, staged, call), within).await
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

/// An in-place update a reload staged, to put in force at its commit.
pub(crate) struct StagedUpdate {
    pub(crate) key: ComponentKey,
    pub(crate) pending: PendingInPlace,
    /// The entry its key had before the reload: what the running set goes
    /// back to should applying panic.
    pub(crate) previous: Arc<Running>,
    /// The type's declared in-place update, to re-apply `previous` with.
    pub(crate) hook: Option<InPlaceHook>,
}

/// A staged update that panicked when applied: committed, but not (or
/// only partly) in force.
pub(crate) struct Unapplied {
    pub(crate) key: ComponentKey,
    pub(crate) previous: Arc<Running>,
    pub(crate) hook: Option<InPlaceHook>,
    /// The panic's message, secrets scrubbed.
    pub(crate) message: String,
}

/// An in-place update a reload that rolled back could not undo:
/// re-applying the previous metadata on `instance` failed (an error, a
/// panic, no answer in time), so it may run with (part of) `tried`.
pub(crate) struct Unreverted {
    pub(crate) key: ComponentKey,
    /// The instance that may run with part of `tried`.
    pub(crate) instance: Instance,
    /// The metadata the update tried, its secret values held with it.
    pub(crate) tried: Metadata,
}

impl Unreverted {
    /// What the record of the reload that rolled back says of it.
    pub(crate) fn line(&self) -> String {
        format!(
            "{}: re-applying its previous metadata failed: it may run with part of the new one",
            self.key
        )
    }
}

/// The [`Unreverted`] updates of a transaction's concurrent tasks,
/// gathered as their reverts fail (before a rebuild that may fail too).
#[derive(Clone, Default)]
pub(crate) struct Unreverting(Arc<Mutex<Vec<Unreverted>>>);

impl Unreverting {
    /// Notes that `unreverted` could not be undone.
    pub(crate) fn push(&self, unreverted: Unreverted) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(unreverted);
    }

    /// Every update noted so far, let go of here.
    pub(crate) fn take(&self) -> Vec<Unreverted> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Puts in force the in-place updates a committed reload staged. Called
/// right after the swap: nothing they make visible can belong to a
/// generation that did not commit. Applying cannot fail; a panic (a bug in
/// the component) is logged, the next update is applied all the same, and
/// the update is returned, for the reload to put the component back.
pub(super) fn apply_deferred(deferred: Vec<StagedUpdate>) -> Vec<Unapplied> {
    let mut unapplied = Vec::new();
    for staged in deferred {
        let StagedUpdate {
            key,
            pending,
            previous,
            hook,
        } = staged;
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pending.apply()));
        match applied {
            Ok(()) => tracing::debug!(component = %key, "Staged in-place update applied."),
            Err(panic) => {
                let message = Redactor::shared().scrub(panic_message(&*panic));
                tracing::error!(component = %key, error = %message, "Staged in-place update panicked when applied.");
                unapplied.push(Unapplied {
                    key,
                    previous,
                    hook,
                    message,
                });
            }
        }
    }
    unapplied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assemble::Assembled;
    use crate::handle::Instance;
    use crate::logged::Logged;

    #[derive(Debug)]
    struct Plain;
    impl Component for Plain {}

    /// `custom/{name}` as it ran before a reload.
    fn previous(name: &str) -> Arc<Running> {
        let text = format!(r#"{{"components": {{"custom": {{"{name}": {{"type": "t"}}}}}}}}"#);
        let config = crate::config::parse(text.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let spec = config.components[&ComponentKey::new("custom", name)].clone();
        let assembled = Assembled {
            instance: Instance::Custom(Arc::new(Plain)),
            shutdown: tokio_util::sync::CancellationToken::new(),
            resolved: Metadata::default(),
        };
        Arc::new(Running { spec, assembled })
    }

    fn staged(name: &str, apply: impl FnOnce() + Send + 'static) -> StagedUpdate {
        StagedUpdate {
            key: ComponentKey::new("custom", name),
            pending: PendingInPlace::new(apply),
            previous: previous(name),
            hook: None,
        }
    }

    #[test]
    fn a_panic_applying_a_staged_update_is_logged_without_the_secret_it_quotes() {
        Redactor::shared().remember("app1y-panic-s3cret");
        let logged = Logged::default();
        let careless = staged("careless", || {
            panic!("cannot apply password app1y-panic-s3cret")
        });
        let applied = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fine = staged("fine", {
            let applied = Arc::clone(&applied);
            move || applied.store(true, std::sync::atomic::Ordering::SeqCst)
        });
        let unapplied = tracing::subscriber::with_default(logged.clone(), || {
            apply_deferred(vec![careless, fine])
        });
        let text = logged.text();
        assert!(text.contains("cannot apply password [redacted]"), "{text}");
        assert!(!text.contains("s3cret"), "a secret reached the log: {text}");
        // The one that panicked is handed back, scrubbed; the next applied.
        assert!(applied.load(std::sync::atomic::Ordering::SeqCst));
        let keys: Vec<String> = unapplied.iter().map(|u| u.key.to_string()).collect();
        assert_eq!(keys, ["custom/careless"]);
        assert_eq!(unapplied[0].message, "cannot apply password [redacted]");
    }
}
