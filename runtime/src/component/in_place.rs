//! In-place updates: a running component taking new metadata without being
//! rebuilt.

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

/// A component that can take new metadata without being rebuilt.
///
/// The reload engine calls `update_in_place` on a metadata-only change; on
/// [`InPlace::NeedsRebuild`] or an error it builds a fresh instance instead.
/// An implementation must either apply the whole change or none of it.
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
    /// Applies `metadata` (already resolved) to the running instance.
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError>;
}
