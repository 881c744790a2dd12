//! In-place updates: a running component taking new metadata without being
//! rebuilt, either at once or staged until the reload commits.

use std::fmt;

use async_trait::async_trait;

use super::ComponentError;
use crate::metadata::Metadata;

/// Outcome of [`InPlaceUpdate::update_in_place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// The running instance now uses the new metadata.
    Applied,
    /// The change cannot be applied in place: build a fresh instance.
    NeedsRebuild,
}

/// Outcome of [`InPlaceUpdate::stage_in_place`].
#[derive(Debug)]
pub enum StagedInPlace {
    /// The change cannot be applied in place: build a fresh instance.
    NeedsRebuild,
    /// Already in force, and visible to every caller: a reload that then
    /// fails re-applies the previous metadata with `update_in_place`.
    Applied,
    /// Checked and prepared, not visible yet: put in force when the new
    /// generation is published, dropped if the reload rolls back.
    Deferred(PendingInPlace),
    /// Nothing done yet (the default): the reload calls `update_in_place`
    /// in its last step, once everything else in it succeeded (before
    /// subscriptions move to rebuilt brokers and the swap); a reload that
    /// fails earlier never calls it. The reload calls it at once instead
    /// when a component it starts uses this one (see [`InPlaceUpdate`]).
    AtCommit,
}

impl From<InPlace> for StagedInPlace {
    fn from(outcome: InPlace) -> Self {
        match outcome {
            InPlace::Applied => StagedInPlace::Applied,
            InPlace::NeedsRebuild => StagedInPlace::NeedsRebuild,
        }
    }
}

/// An in-place update that [`InPlaceUpdate::stage_in_place`] checked and
/// prepared but did not make visible.
///
/// [`apply`](Self::apply) puts it in force: synchronously, and it cannot
/// fail (everything that could was done while staging). Should it panic
/// all the same, the reload (committed by then) re-applies the previous
/// metadata with `update_in_place`, keeps the component on its previous
/// declaration and records its update failed. Dropping it
/// unapplied discards the change: whatever staging set aside must be
/// released then (a guard the closure owns does it).
#[must_use = "a pending in-place update does nothing until applied"]
pub struct PendingInPlace {
    apply: Box<dyn FnOnce() + Send>,
}

impl PendingInPlace {
    /// A pending update that `apply` puts in force.
    pub fn new(apply: impl FnOnce() + Send + 'static) -> Self {
        Self {
            apply: Box::new(apply),
        }
    }

    /// Puts the change in force (the reload engine calls it at commit).
    pub fn apply(self) {
        (self.apply)()
    }
}

impl fmt::Debug for PendingInPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PendingInPlace")
    }
}

/// A component that can take new metadata without being rebuilt.
///
/// The reload engine calls [`stage_in_place`](Self::stage_in_place) on a
/// metadata-only change, while it prepares the new generation; on
/// `NeedsRebuild`, an error, no answer within the init timeout or a panic
/// it builds a fresh instance instead (after a panic it first re-applies
/// the previous metadata with `update_in_place`). An implementation must
/// either take the whole change or none of it.
///
/// `stage_in_place` defaults to [`StagedInPlace::AtCommit`]: nothing is
/// called while the reload prepares; `update_in_place`, whose change is
/// visible at once, is called in the reload's last step, once the other
/// components became ready and every staged update succeeded (newest level
/// first, one level's concurrently; then pub/sub subscriptions move to
/// rebuilt brokers and the new generation is swapped in), so a reload that
/// fails earlier leaves the instance untouched and records it unchanged.
/// An answer other than `Applied` there rebuilds the component then (after
/// a panic or a timeout, once the previous metadata is re-applied); a
/// failure of that rebuild re-applies the previous metadata of the updates
/// already made and rolls the reload back. The exception is a component
/// that a component starting in the same reload must see new: a store
/// read through a secretRef or configurationRef in the reload, and anything
/// a component the reload may build (added, declared differently, forced,
/// or reading a changed store) uses, directly or through others, through a
/// componentRef or a ref, since its `init` may read it through its handle.
/// For those `update_in_place` is called when their level is prepared, and
/// a reload that fails afterwards re-applies the previous metadata.
/// Override `stage_in_place` to answer [`StagedInPlace::Deferred`]
/// instead: the change is then checked during the reload, seen by no one but
/// the reload preparing it (see
/// [`preparing_generation`](crate::preparing_generation)) until the new
/// generation is published, and a rollback simply drops it.
///
/// Declare it with `#[component(in_place)]` (the derive then finds it, and
/// refuses to compile without it) or return `Some(self)` from
/// [`Component::as_in_place`](crate::Component::as_in_place).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is `#[component(in_place)]` but cannot be updated in place",
    label = "needs `impl InPlaceUpdate for {Self}`",
    note = "implement `InPlaceUpdate` (apply all of the new metadata, or answer `InPlace::NeedsRebuild`), or remove `in_place`"
)]
#[async_trait]
pub trait InPlaceUpdate: Send + Sync {
    /// Applies `metadata` (already resolved) to the running instance, at
    /// once. A reload also calls it to re-apply the previous metadata.
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError>;

    /// Checks and prepares `metadata` (already resolved) for the running
    /// instance; a [`StagedInPlace::Deferred`] answer makes nothing visible
    /// until it is applied. Defaults to [`StagedInPlace::AtCommit`]: checks
    /// nothing, and leaves the update to `update_in_place` at the commit.
    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let _ = metadata;
        Ok(StagedInPlace::AtCommit)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    struct Legacy;

    #[async_trait]
    impl InPlaceUpdate for Legacy {
        async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
            Ok(match metadata.clone().into_map().contains_key("rebuild") {
                true => InPlace::NeedsRebuild,
                false => InPlace::Applied,
            })
        }
    }

    #[tokio::test]
    async fn staging_defaults_to_updating_at_the_commit_without_calling_the_update() {
        let rebuild = Metadata::from(
            serde_json::json!({"rebuild": 1})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        let staged = Legacy.stage_in_place(&Metadata::default()).await;
        assert!(matches!(staged, Ok(StagedInPlace::AtCommit)), "{staged:?}");
        let staged = Legacy.stage_in_place(&rebuild).await;
        assert!(matches!(staged, Ok(StagedInPlace::AtCommit)), "{staged:?}");
        let updated = Legacy.update_in_place(&rebuild).await;
        assert!(matches!(updated, Ok(InPlace::NeedsRebuild)), "{updated:?}");
    }

    #[test]
    fn a_pending_update_runs_once_when_applied_and_never_when_dropped() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = || {
            let runs = runs.clone();
            PendingInPlace::new(move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        drop(counted());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        counted().apply();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(format!("{:?}", counted()), "PendingInPlace");
    }
}
