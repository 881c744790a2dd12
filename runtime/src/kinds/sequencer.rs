//! Sequencers (`sequencer`): unique ids per key, as in Layotto's Sequencer
//! API (`GetNextId`, and `GetSegment` for a range at once).

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::component::{Component, ComponentError};

/// How ids of one key must grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Increment {
    /// Trend-increasing: unique, usually but not always larger than the last.
    #[default]
    Weak,
    /// Strictly increasing: every id larger than any handed out before.
    Strong,
}

impl Increment {
    /// Reads `weak` / `strong` (any case); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "weak" => Some(Increment::Weak),
            "strong" => Some(Increment::Strong),
            _ => None,
        }
    }
}

/// Ask for the next id of a key.
#[derive(Debug, Clone, Default)]
pub struct NextIdRequest {
    /// The sequence (order numbers, a table name...).
    pub key: String,
    /// How the ids must grow.
    pub increment: Increment,
    /// Per-request options for the backend.
    pub metadata: BTreeMap<String, String>,
}

/// Ask for `size` consecutive ids of a key at once.
#[derive(Debug, Clone, Default)]
pub struct SegmentRequest {
    /// The sequence.
    pub key: String,
    /// How many ids (at least one).
    pub size: u32,
    /// Per-request options for the backend.
    pub metadata: BTreeMap<String, String>,
}

/// Ids `from..=to`, all handed out to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The first id.
    pub from: i64,
    /// The last id.
    pub to: i64,
}

/// Why a sequencer operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequencerError {
    /// The request is malformed (empty key, zero size...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The sequence cannot go on (its ids would pass `i64::MAX`).
    #[error("sequence `{0}` is exhausted")]
    Exhausted(String),
    /// The request is valid but the sequencer has no room for it (too
    /// many keys, a full high-water file): `RESOURCE_EXHAUSTED`, not the
    /// caller's mistake.
    #[error("out of capacity: {0}")]
    Capacity(String),
    /// The backend failed.
    #[error("{0}")]
    Backend(String),
}

/// A sequencer: ids are positive and never handed out twice for a key.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is declared with `kind = \"sequencer\"` but does not implement `Sequencer`",
    note = "add `#[async_trait] impl Sequencer for {Self}` with the operations of the kind"
)]
#[async_trait]
pub trait Sequencer: Component {
    /// The next id of `req.key` (greater than zero).
    async fn get_next_id(&self, req: NextIdRequest) -> Result<i64, SequencerError>;

    /// `req.size` consecutive ids of `req.key`; `Ok(None)` when the
    /// sequencer does not hand out ranges.
    async fn get_segment(&self, req: SegmentRequest) -> Result<Option<IdRange>, SequencerError> {
        let _ = req;
        Ok(None)
    }
}

impl From<SequencerError> for ComponentError {
    fn from(err: SequencerError) -> Self {
        ComponentError::new(err.to_string())
    }
}
