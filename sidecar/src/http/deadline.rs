//! The longest a call may take (`request_timeout`): past it the call is
//! abandoned and answered 504.

use std::future::Future;
use std::time::Duration;

use axum::response::{IntoResponse, Response};

use super::error::HttpError;

/// `call`'s answer, or 504 when it outlives `limit`.
pub async fn within(limit: Duration, call: impl Future<Output = Response>) -> Response {
    match tokio::time::timeout(limit, call).await {
        Ok(response) => response,
        Err(_) => HttpError::Timeout(limit).into_response(),
    }
}
