//! The `memory` sequencer: ids per key counted in process, as Layotto's
//! `in-memory` sequencer.
//!
//! Ids start at 1 (or above `biggerThan`) and grow by one: every id is
//! larger than the last, so STRONG and WEAK are the same here. A metadata
//! change that keeps `highWaterFile` is applied in place, keeping the
//! counters; one that adds, changes or removes it rebuilds the sequencer,
//! and the new instance goes on from its predecessor's counters (the
//! marks belong to the component, see [`crate::high_water`]), writing them
//! into the new file before it serves. With `highWaterFile`, a restarted
//! process starts above every id handed out; without it, a restart (or a
//! sequencer removed and declared again) starts over.

use std::collections::BTreeMap;

use rewire_runtime::{
    Component, ComponentError, IdRange, InPlace, InPlaceUpdate, InitContext, Metadata,
    NextIdRequest, SegmentRequest, Sequencer, SequencerError,
};
use serde::Deserialize;

use crate::high_water::{check_request, HighWater};

/// Metadata of the `memory` sequencer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemorySequencerMetadata {
    /// The file keeping the high-water marks (relative to the config
    /// file's folder); none: the counters live and die with the instance.
    pub high_water_file: Option<String>,
    /// Per key, the value ids must start above (Layotto's `biggerThan`).
    pub bigger_than: BTreeMap<String, i64>,
}

/// An in-process sequencer.
#[derive(rewire_runtime::Component, Debug, Default)]
#[component(
    kind = "sequencer",
    type = "memory",
    example = r#"{"highWaterFile": "sequencer-marks.json"}"#
)]
pub struct MemorySequencer {
    #[metadata]
    metadata: MemorySequencerMetadata,
    marks: Option<HighWater>,
}

impl MemorySequencer {
    /// A sequencer counting from 1, keeping nothing on disk, ready to use.
    pub async fn new() -> Self {
        let marks = HighWater::load(None, &BTreeMap::new()).await.ok();
        Self {
            metadata: MemorySequencerMetadata::default(),
            marks,
        }
    }

    fn marks(&self) -> Result<&HighWater, SequencerError> {
        self.marks
            .as_ref()
            .ok_or_else(|| SequencerError::Backend("the sequencer is not initialised".into()))
    }
}

#[rewire_runtime::prelude::async_trait]
impl Component for MemorySequencer {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let file = self
            .metadata
            .high_water_file
            .as_ref()
            .map(|path| cx.resolve_path(path));
        let marks = HighWater::adopt(cx, file, &self.metadata.bigger_than)
            .await
            .map_err(|err| ComponentError::new(err.to_string()))?;
        self.marks = Some(marks);
        Ok(())
    }

    fn as_in_place(&self) -> Option<&dyn InPlaceUpdate> {
        Some(self)
    }
}

/// Applied at once, not deferred: raising the high-water marks is awaited
/// and only ever raises them (seeing it early is harmless; never undone).
#[rewire_runtime::prelude::async_trait]
impl InPlaceUpdate for MemorySequencer {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        let new = metadata
            .decode::<MemorySequencerMetadata>()
            .map_err(|err| ComponentError::new(format!("new metadata rejected: {err}")))?;
        if new.high_water_file != self.metadata.high_water_file {
            return Ok(InPlace::NeedsRebuild);
        }
        if let Some(marks) = &self.marks {
            marks.raise(&new.bigger_than).await;
        }
        Ok(InPlace::Applied)
    }
}

#[rewire_runtime::prelude::async_trait]
impl Sequencer for MemorySequencer {
    async fn get_next_id(&self, req: NextIdRequest) -> Result<i64, SequencerError> {
        check_request(&req.key, 1)?;
        Ok(self.marks()?.take(&req.key, 1).await?.from)
    }

    async fn get_segment(&self, req: SegmentRequest) -> Result<Option<IdRange>, SequencerError> {
        check_request(&req.key, req.size)?;
        self.marks()?.take(&req.key, req.size).await.map(Some)
    }
}
