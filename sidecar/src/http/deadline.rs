//! The longest a call may take (`request_timeout`): past it the call is
//! abandoned and answered 504.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use crate::ApiState;

/// Middleware: 504 when the call outlives `request_timeout`.
pub async fn within_timeout(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.options.request_timeout;
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => HttpError::Timeout(limit).into_response(),
    }
}
