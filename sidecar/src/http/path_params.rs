//! Path parameters in Dapr's error shape and decoding: [`PathParams`]
//! decodes them as axum's [`Path`] does, but a segment that does not
//! decode (`%FF`, which is no UTF-8) is Dapr's JSON 400
//! `ERR_MALFORMED_REQUEST`, not axum's plain-text "Invalid URL"; and on
//! Dapr's routes a `+` is a space.
//!
//! daprd runs Go's `url.QueryUnescape` on every parameter of its routes
//! (`unescapeRequestParametersHandler`; only service invocation's wildcard
//! is kept as sent), so clients that form-encode a path (.NET's
//! `WebUtility.UrlEncode`, Java's `URLEncoder`, Python's `quote_plus`)
//! send a space as `+` and `%2B` for a `+`. rewire's own routes
//! (`/v1.0/rewire/…`: files, sequencer) keep a `+` as written.

use std::borrow::Cow;

use axum::extract::{FromRequestParts, MatchedPath, Path};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::value::{Error as ValueError, SeqDeserializer, StringDeserializer};
use serde::de::DeserializeOwned;

use super::error::HttpError;
use super::routes;

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
        // axum has decoded the parameters already, `+` and `%2B` alike: a
        // Dapr route whose path holds a `+` is decoded again from the path.
        if let Some(raw) = raw_params_with_plus(parts) {
            let values = raw
                .into_iter()
                .map(|(name, raw)| form_decoded(name, raw))
                .collect::<Result<Vec<_>, _>>()?;
            return deserialized(values).map(Self);
        }
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

/// A segment of a Dapr route as daprd reads it when it holds no `%` (the
/// state GET's [`hot_path`](super::hot_path)): each `+` a space.
pub(super) fn plus_as_space(segment: &str) -> Cow<'_, str> {
    if segment.contains('+') {
        Cow::Owned(segment.replace('+', " "))
    } else {
        Cow::Borrowed(segment)
    }
}

/// The names and raw (still percent-encoded) values of the parameters of
/// the route matched, in its order, when it is a Dapr route and its path
/// holds a `+`; else `None` (axum's decoding is Dapr's).
fn raw_params_with_plus(parts: &Parts) -> Option<Vec<(&str, &str)>> {
    let path = parts.uri.path();
    if !path.contains('+') {
        return None;
    }
    let route = parts.extensions.get::<MatchedPath>()?.as_str();
    if routes::is_rewires_own(route) {
        return None;
    }
    raw_params(route, path)
}

/// The parameters of `route` (`{name}` a segment, `{*name}` the rest) as
/// they are written in `path`, which the router matched to it.
fn raw_params<'a>(route: &'a str, path: &'a str) -> Option<Vec<(&'a str, &'a str)>> {
    let mut rest = path.strip_prefix('/')?;
    let mut params = Vec::new();
    for part in route.strip_prefix('/')?.split('/') {
        if let Some(name) = part.strip_prefix("{*") {
            params.push((name.strip_suffix('}')?, rest));
            return Some(params);
        }
        let (segment, after) = rest.split_once('/').unwrap_or((rest, ""));
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) => params.push((name, segment)),
            None if part == segment => {}
            None => return None,
        }
        rest = after;
    }
    Some(params)
}

/// `raw` decoded as `url.QueryUnescape` decodes it (`+` a space, `%XX` its
/// byte), except that a `%` not followed by two hex digits is kept, as
/// axum keeps it everywhere else; the parameter `name` must be UTF-8 then.
fn form_decoded(name: &str, raw: &str) -> Result<String, HttpError> {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = bytes
            .get(at + 1..at + 3)
            .filter(|hex| bytes[at] == b'%' && hex.iter().all(u8::is_ascii_hexdigit))
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[at], escaped) {
            (_, Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (b'+', None) => {
                decoded.push(b' ');
                at += 1;
            }
            (byte, None) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    // axum's own words for it.
    String::from_utf8(decoded)
        .map_err(|_| HttpError::MalformedPath(format!("Invalid URL: Invalid UTF-8 in `{name}`")))
}

/// `values` as the handler's `T`: one `String`, or a tuple of them.
fn deserialized<T: DeserializeOwned>(mut values: Vec<String>) -> Result<T, HttpError> {
    let result = if values.len() == 1 {
        let value = values.pop().unwrap_or_default();
        T::deserialize(StringDeserializer::<ValueError>::new(value))
    } else {
        T::deserialize(SeqDeserializer::<_, ValueError>::new(values.into_iter()))
    };
    // As in axum's `Path`: the handler does not take its route's parameters.
    result.map_err(|error| HttpError::Api {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "ERR_INTERNAL",
        message: format!("the route's path parameters: {error}"),
    })
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
        let two = |PathParams((store, key)): PathParams<(String, String)>| async move {
            format!("{store}/{key}")
        };
        let one = |PathParams(store): PathParams<String>| async move { store };
        let mut app = Router::new()
            .route("/state/{store}/{key}", get(two))
            .route("/v1.0/publish/{pubsub}/{*topic}", get(two))
            .route("/v1.0/metadata/{key}", get(one))
            .route("/v1.0/rewire/file/{store}/{*name}", get(two));
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

    #[tokio::test]
    async fn on_dapr_routes_a_plus_is_a_space_and_2b_a_plus() {
        for (uri, decoded) in [
            ("/state/orders/my+key", "orders/my key"),
            ("/state/my+orders/a%2Bb", "my orders/a+b"),
            ("/state/orders/a+b%2Fc%20d", "orders/a b/c d"),
            ("/state/orders/100%25+x", "orders/100% x"),
            // An escape that is none is kept, as axum keeps it.
            ("/state/orders/a+%zz%+1", "orders/a %zz% 1"),
            ("/v1.0/publish/pubsub/order+created", "pubsub/order created"),
            ("/v1.0/publish/pub+sub/a+b/c%2Bd", "pub sub/a b/c+d"),
            ("/v1.0/metadata/my+attribute", "my attribute"),
        ] {
            let (status, body) = answer(uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {body}");
            assert_eq!(body, decoded, "{uri}");
        }
        // Still no UTF-8: Dapr's error, naming the parameter.
        let (status, body) = answer("/state/orders/a+%FF").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST");
        assert!(body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("`key`"));
    }

    #[tokio::test]
    async fn on_rewires_own_routes_a_plus_stays() {
        let (status, body) = answer("/v1.0/rewire/file/st+ore/a+b/c%2Bd").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body, "st+ore/a+b/c+d");
    }

    #[test]
    fn raw_params_are_read_from_the_path_the_route_matched() {
        assert_eq!(
            raw_params("/v1.0/state/{store}/{key}", "/v1.0/state/a+b/c%2Bd"),
            Some(vec![("store", "a+b"), ("key", "c%2Bd")])
        );
        assert_eq!(
            raw_params("/v1.0/publish/{pubsub}/{*topic}", "/v1.0/publish/p/a/b+c"),
            Some(vec![("pubsub", "p"), ("topic", "a/b+c")])
        );
        assert_eq!(raw_params("/v1.0/state/{store}", "/v1.0/other/x"), None);
    }

    #[test]
    fn a_segment_without_percent_reads_as_its_form_decoding() {
        for segment in ["plain", "my+key", "+lead+trail+", "++"] {
            assert_eq!(
                plus_as_space(segment),
                form_decoded("key", segment).expect("UTF-8"),
                "{segment}"
            );
        }
    }
}
