//! Tokens on HTTP, compared in constant time: the health probes are open;
//! the admin routes (status, metrics) need the admin token, as the
//! Lifecycle API does (without one, the app token); every other route needs
//! the app token, when one is configured, and is refused as Dapr's
//! `APITokenAuthMiddleware` refuses it (401, plain text).

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use super::routes;
use crate::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use crate::{ApiOptions, ApiToken};

/// Where the admin token may come: its own header, or `dapr-api-token` as
/// Dapr clients send tokens.
const ADMIN_HEADERS: [&str; 2] = [ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER];

/// Dapr's body for a missing or wrong `dapr-api-token` (Go's `http.Error`
/// adds the newline).
const APP_TOKEN_REFUSAL: &str = "invalid api token\n";

/// The 401 answer to a call that lacks the token its route needs, or
/// `None` when it may go on (no token is set, it carries the token, or the
/// route is a health probe).
pub fn refusal(options: &ApiOptions, request: &Request) -> Option<Response> {
    let path = request.uri().path();
    if routes::UNAUTHENTICATED.contains(&path) {
        return None;
    }
    if routes::ADMIN.contains(&path) {
        let token = admin_token(options)?;
        return (!presents(request.headers(), token, &ADMIN_HEADERS))
            .then(|| HttpError::AdminUnauthorized.into_response());
    }
    let token = options.app_token.as_ref()?;
    (!presents(request.headers(), token, &[APP_TOKEN_HEADER])).then(app_token_refusal)
}

/// Dapr's refusal of a call without the app token: 401 with the plain-text
/// body Go's `http.Error` writes (its content type and `nosniff`).
fn app_token_refusal() -> Response {
    tracing::debug!(
        status = 401,
        "HTTP call refused: missing or invalid API token in header `dapr-api-token`."
    );
    (
        StatusCode::UNAUTHORIZED,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        APP_TOKEN_REFUSAL,
    )
        .into_response()
}

/// The token guarding admin data: the admin token, else the app token.
fn admin_token(options: &ApiOptions) -> Option<&ApiToken> {
    options.admin_token.as_ref().or(options.app_token.as_ref())
}

/// Whether one of `headers` carries `token`.
fn presents(map: &HeaderMap, token: &ApiToken, headers: &[&str]) -> bool {
    headers
        .iter()
        .filter_map(|h| map.get(*h))
        .any(|v| token.matches(v.as_bytes()))
}

/// Whether a caller of an open route may see details: no token is set at
/// all, or the call carries the app token or the admin token.
pub fn authenticated(options: &ApiOptions, headers: &HeaderMap) -> bool {
    let app = options
        .app_token
        .as_ref()
        .is_some_and(|app| presents(headers, app, &[APP_TOKEN_HEADER]));
    match admin_token(options) {
        None => true,
        Some(admin) => app || presents(headers, admin, &ADMIN_HEADERS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, value: &'static str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(name, HeaderValue::from_static(value));
        map
    }

    #[test]
    fn details_need_a_token_once_any_is_set() {
        let open = ApiOptions::default();
        assert!(authenticated(&open, &HeaderMap::new()));
        let guarded = ApiOptions {
            app_token: Some(ApiToken::new("app")),
            admin_token: Some(ApiToken::new("admin")),
            ..ApiOptions::default()
        };
        assert!(!authenticated(&guarded, &HeaderMap::new()));
        assert!(!authenticated(&guarded, &headers(APP_TOKEN_HEADER, "nope")));
        assert!(authenticated(&guarded, &headers(APP_TOKEN_HEADER, "app")));
        assert!(authenticated(
            &guarded,
            &headers(ADMIN_TOKEN_HEADER, "admin")
        ));
    }
}
