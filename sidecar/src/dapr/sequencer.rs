//! The sequencer operations (Layotto's `GetNextId`), for every transport:
//! the next id of a key, STRONG or WEAK.

use std::collections::BTreeMap;
use std::sync::Arc;

use rewire_runtime::{echoed, Increment, Instance, Kind, NextIdRequest, Sequencer, SequencerError};

use super::call::Call;
use super::retry_rule;

/// Why a sequencer operation failed (messages name the store and key).
#[derive(Debug, thiserror::Error)]
pub enum SequencerOpError {
    /// No sequencer with that name in the call's generation (the name as
    /// [`echoed`]).
    #[error("sequencer `{0}` is not found")]
    NotFound(String),
    /// The sequencer refused or failed the request.
    #[error("failed getting the next id of `{key}` from sequencer `{store}`: {source}")]
    NextId {
        /// The sequencer.
        store: String,
        /// The key, as [`echoed`].
        key: String,
        /// Why (scrubbed).
        source: SequencerError,
    },
}

impl SequencerOpError {
    /// The sequencer's own error, when it was asked.
    pub fn store_error(&self) -> Option<&SequencerError> {
        match self {
            Self::NextId { source, .. } => Some(source),
            Self::NotFound(_) => None,
        }
    }
}

impl Call {
    /// The sequencer `name` of the call's generation.
    pub fn sequencer(&self, name: &str) -> Result<SequencerOps, SequencerOpError> {
        match self.instance(Kind::Sequencer, name) {
            Some(Instance::Sequencer(sequencer)) => Ok(SequencerOps {
                name: name.to_string(),
                sequencer: sequencer.clone(),
                call: self.clone(),
            }),
            _ => Err(SequencerOpError::NotFound(echoed(name).into_owned())),
        }
    }
}

/// The operations on one sequencer of a call's generation.
pub struct SequencerOps {
    name: String,
    sequencer: Arc<dyn Sequencer>,
    call: Call,
}

impl SequencerOps {
    /// The next id of `key` (greater than zero).
    pub async fn next_id(
        &self,
        key: String,
        increment: Increment,
        metadata: BTreeMap<String, String>,
    ) -> Result<i64, SequencerOpError> {
        let request = NextIdRequest {
            key: key.clone(),
            increment,
            metadata,
        };
        let sequencer = &self.sequencer;
        self.call
            .guarded(
                (Kind::Sequencer, &self.name),
                retry_rule::NEVER,
                request,
                |r| sequencer.get_next_id(r),
                SequencerError::Backend,
            )
            .await
            .map_err(|source| SequencerOpError::NextId {
                store: self.name.clone(),
                key: echoed(&key).into_owned(),
                source: scrubbed(&self.call, source),
            })
    }
}

fn scrubbed(call: &Call, err: SequencerError) -> SequencerError {
    match err {
        SequencerError::Invalid(m) => SequencerError::Invalid(call.scrub(&m)),
        SequencerError::Exhausted(m) => SequencerError::Exhausted(call.scrub(&m)),
        SequencerError::Capacity(m) => SequencerError::Capacity(call.scrub(&m)),
        SequencerError::Backend(m) => SequencerError::Backend(call.scrub(&m)),
    }
}
