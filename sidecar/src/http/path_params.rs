//! Path parameters in Dapr's error shape: [`PathParams`] decodes them as
//! axum's [`Path`] does, but a segment that does not decode (`%FF`, which
//! is no UTF-8) is Dapr's JSON 400 `ERR_MALFORMED_REQUEST`, not axum's
//! plain-text "Invalid URL".

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::HttpError;

/// The path parameters of a route, as `T` (a `String`, or a tuple of
/// them in the route's order).
#[derive(Debug)]
pub struct PathParams<T>(pub T);

impl<T, S> FromRequestParts<S> for PathParams<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(params)) => Ok(Self(params)),
            // A path the router matched but whose parameters the handler
            // does not take is the sidecar's mistake, not the caller's.
            Err(rejection) if rejection.status().is_server_error() => Err(HttpError::Api {
                status: rejection.status(),
                code: "ERR_INTERNAL",
                message: rejection.body_text(),
            }),
            Err(rejection) => Err(HttpError::MalformedPath(rejection.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use axum::Router;
    use tower_service::Service;

    use super::*;

    async fn answer(uri: &str) -> (StatusCode, serde_json::Value) {
        let mut app = Router::new().route(
            "/state/{store}/{key}",
            get(
                |PathParams((store, key)): PathParams<(String, String)>| async move {
                    format!("{store}/{key}")
                },
            ),
        );
        let request = Request::get(uri).body(Body::empty()).expect("request");
        let response = app.call(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, body)
    }

    #[tokio::test]
    async fn a_segment_that_is_no_utf8_is_dapr_malformed_request() {
        let (status, body) = answer("/state/orders/%FF").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
        let message = body["message"].as_str().expect("a message");
        assert!(message.contains("`key`"), "{message}");
        // Decodable segments are decoded, as axum's `Path` does.
        let (status, body) = answer("/state/orders/o%2D1").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "orders/o-1");
    }
}
