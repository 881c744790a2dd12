//! The longest a call may take (`request_timeout`): past it the call is
//! abandoned and answered 504.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use tokio::time::error::Elapsed;

use super::error::HttpError;

/// A call's answer, or 504 when it outlived `limit`: for
/// `tokio::time::timeout(limit, call).await`, awaited where the call is
/// made. (Not an `async fn` taking the call: one keeps its argument beside
/// the future it awaits, so a request's future, kilobytes, would double.)
pub fn answer(limit: Duration, timed: Result<Response, Elapsed>) -> Response {
    timed.unwrap_or_else(|_| HttpError::Timeout(limit).into_response())
}
