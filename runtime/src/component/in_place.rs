//! In-place configuration updates.

use async_trait::async_trait;

use super::ComponentError;
use crate::metadata::Metadata;

/// Outcome of [`DynamicComponent::apply_config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The running instance now uses the new metadata.
    Applied,
    /// The change cannot be applied in place: build a fresh instance.
    NeedsReload,
}

/// A component that can take new metadata without being rebuilt.
///
/// The reload engine calls `apply_config` on a metadata-only change; on
/// [`Applied::NeedsReload`] or an error it builds a fresh instance instead.
/// An implementation must either apply the whole change or none of it.
#[async_trait]
pub trait DynamicComponent: Send + Sync {
    /// Applies `metadata` (already resolved) to the running instance.
    async fn apply_config(&self, metadata: &Metadata) -> Result<Applied, ComponentError>;
}
