//! The app token: when one is configured, every route but the health
//! probes needs it in `dapr-api-token`, compared in constant time.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use super::routes;
use crate::auth::APP_TOKEN_HEADER;
use crate::ApiState;

/// Middleware: 401 unless the call carries the app token (or none is set,
/// or the route is a health probe).
pub async fn require_app_token(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = state.options.app_token.as_ref() else {
        return next.run(request).await;
    };
    if routes::UNAUTHENTICATED.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(APP_TOKEN_HEADER)
        .map(|v| v.as_bytes());
    if presented.is_some_and(|p| token.matches(p)) {
        next.run(request).await
    } else {
        HttpError::Unauthorized.into_response()
    }
}
