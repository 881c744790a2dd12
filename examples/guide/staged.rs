//! The guide's in-place update once more, staged until the reload commits
//! (`docs/components.md` §4): the same cache, not registered, so that both
//! forms of the impl compile.

use rewire::components::LiveMetadata;
use rewire::prelude::*;

use super::CacheMetadata;

/// The guide's cache reduced to what the staged update touches.
#[allow(dead_code)] // Compiled for the docs, never built.
pub struct LruCache {
    meta: LiveMetadata<CacheMetadata>,
}

#[async_trait]
impl InPlaceUpdate for LruCache {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        self.meta.replace(metadata.decode()?);
        Ok(InPlace::Applied)
    }

    async fn stage_in_place(&self, metadata: &Metadata) -> Result<StagedInPlace, ComponentError> {
        let new: CacheMetadata = metadata.decode()?;
        Ok(StagedInPlace::Deferred(self.meta.stage(new)))
    }
}
