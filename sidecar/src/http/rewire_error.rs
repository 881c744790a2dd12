//! Errors of rewire's own routes (sequencer, file), in the JSON shape of
//! Dapr's: `{"errorCode": "ERR_…", "message": "…"}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use rewire_runtime::{FileError, SequencerError};

use super::error::HttpError;
use crate::connection::DownloadsFull;
use crate::dapr::{FileOpError, SequencerOpError, UploadError};

/// Why a call to a rewire route failed.
#[derive(Debug, thiserror::Error)]
pub enum RewireHttpError {
    /// The request itself (query, body) is wrong.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// A sequencer operation failed.
    #[error(transparent)]
    Sequencer(#[from] SequencerOpError),
    /// A file operation failed.
    #[error(transparent)]
    File(#[from] FileOpError),
    /// An upload was cut for inactivity (the client's or the store's), or
    /// refused for too many running.
    #[error(transparent)]
    Upload(UploadError),
    /// A download refused for too many running.
    #[error(transparent)]
    Downloads(#[from] DownloadsFull),
}

impl From<UploadError> for RewireHttpError {
    fn from(err: UploadError) -> Self {
        match err {
            UploadError::File(err) => Self::File(err),
            idle => Self::Upload(idle),
        }
    }
}

impl RewireHttpError {
    /// The error code and HTTP status.
    fn code_and_status(&self) -> (&'static str, StatusCode) {
        match self {
            Self::Http(err) => (err.code(), err.status()),
            Self::Sequencer(SequencerOpError::NotFound(_)) => {
                ("ERR_SEQUENCER_NOT_FOUND", StatusCode::BAD_REQUEST)
            }
            Self::Sequencer(SequencerOpError::NextId { source, .. }) => match source {
                SequencerError::Invalid(_) => ("ERR_SEQUENCER_INVALID", StatusCode::BAD_REQUEST),
                // A valid request the sequencer has no room for: 429, as
                // Dapr answers `RESOURCE_EXHAUSTED` (and rewire a busy
                // publish), not 400.
                SequencerError::Capacity(_) => {
                    ("ERR_SEQUENCER_GET_NEXT_ID", StatusCode::TOO_MANY_REQUESTS)
                }
                SequencerError::Exhausted(_) | SequencerError::Backend(_) => (
                    "ERR_SEQUENCER_GET_NEXT_ID",
                    StatusCode::INTERNAL_SERVER_ERROR,
                ),
            },
            Self::File(FileOpError::NotFound(_)) => {
                ("ERR_FILE_STORE_NOT_FOUND", StatusCode::BAD_REQUEST)
            }
            Self::File(FileOpError::Store { source, .. }) => match source {
                FileError::NotFound(_) => ("ERR_FILE_NOT_FOUND", StatusCode::NOT_FOUND),
                FileError::Invalid(_) => ("ERR_FILE_INVALID", StatusCode::BAD_REQUEST),
                FileError::TooLarge { .. } => ("ERR_FILE_TOO_LARGE", StatusCode::PAYLOAD_TOO_LARGE),
                FileError::Backend(_) => ("ERR_FILE_STORE", StatusCode::INTERNAL_SERVER_ERROR),
            },
            Self::Upload(UploadError::TooMany { .. }) | Self::Downloads(_) => {
                ("ERR_TOO_MANY_REQUESTS", StatusCode::TOO_MANY_REQUESTS)
            }
            Self::Upload(UploadError::StoreStalled { .. }) => {
                ("ERR_TIMEOUT", StatusCode::GATEWAY_TIMEOUT)
            }
            Self::Upload(_) => ("ERR_TIMEOUT", StatusCode::REQUEST_TIMEOUT),
        }
    }
}

impl IntoResponse for RewireHttpError {
    fn into_response(self) -> Response {
        if let Self::Http(err) = self {
            return err.into_response();
        }
        let (code, status) = self.code_and_status();
        let body = json!({ "errorCode": code, "message": self.to_string() });
        (status, Json(body)).into_response()
    }
}
