//! The sequencer route (rewire's own; Dapr has none):
//! `POST /v1.0/rewire/sequencer/{store}/{key}?increment=strong|weak` →
//! `{"id": N, "nextId": "N"}`; `metadata.<name>` parameters go to the sequencer. `GET`
//! is kept for existing clients; every answer says `Cache-Control:
//! no-store`, since each call hands out a new id (a cache or a proxy
//! replaying an answer would hand one out twice, and a prefetching client
//! would burn ids).

use axum::http::header::CACHE_CONTROL;
use axum::http::HeaderValue;
use axum::Json;
use serde_json::{json, Value};

use rewire_runtime::{echoed, Increment};

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use super::path_params::PathParams;
use super::rewire_error::RewireHttpError;
use crate::dapr::Call;

/// `POST` (or `GET`) `/v1.0/rewire/sequencer/{store}/{key}`: the next id
/// of `key`, never to be cached (nor is an error: a path that does not
/// decode is answered here, not by the extractor).
pub async fn next_id(
    call: Call,
    path: Result<PathParams<(String, String)>, HttpError>,
    query: QueryPairs,
) -> (
    [(axum::http::HeaderName, HeaderValue); 1],
    Result<Json<Value>, RewireHttpError>,
) {
    let no_store = [(CACHE_CONTROL, HeaderValue::from_static("no-store"))];
    (no_store, next_id_of(call, path, query).await)
}

async fn next_id_of(
    call: Call,
    path: Result<PathParams<(String, String)>, HttpError>,
    query: QueryPairs,
) -> Result<Json<Value>, RewireHttpError> {
    let PathParams((store, key)) = path?;
    let pairs = query_pairs(query)?;
    let increment = increment_of(query_value(&pairs, "increment"))?;
    let metadata = request_metadata(&pairs, ("sequencer", &store))
        .map_err(HttpError::from)?
        .into_iter()
        .collect();
    let id = call
        .sequencer(&store)?
        .next_id(key, increment, metadata)
        .await?;
    // `nextId` as text too (protojson's int64, Layotto's field name): a
    // JSON number past 2^53 reads rounded in JavaScript and any reader
    // parsing numbers as doubles, handing one id out as several.
    Ok(Json(json!({ "id": id, "nextId": id.to_string() })))
}

/// The `increment` query parameter: weak when not given; any other text
/// than `strong` or `weak` is a malformed query quoting it as [`echoed`].
fn increment_of(text: Option<&str>) -> Result<Increment, HttpError> {
    match text {
        None => Ok(Increment::Weak),
        Some(text) => Increment::parse(text).ok_or_else(|| {
            HttpError::MalformedQuery(format!(
                "query parameter `increment` is `{}`; expected `strong` or `weak`",
                echoed(text)
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `increment` of any length is quoted cut in the error (failed
    /// before the fix: quoted whole, in the answer and the debug log).
    #[test]
    fn an_unknown_increment_is_quoted_cut() {
        assert!(matches!(increment_of(None), Ok(Increment::Weak)));
        assert!(matches!(
            increment_of(Some("strong")),
            Ok(Increment::Strong)
        ));
        let text = format!("x\n{}", "y".repeat(100_000));
        let Err(HttpError::MalformedQuery(message)) = increment_of(Some(&text)) else {
            panic!("a malformed query");
        };
        assert!(message.len() < 1_000, "{} bytes", message.len());
        assert!(message.contains(&*echoed(&text)), "{message}");
        let Err(HttpError::MalformedQuery(short)) = increment_of(Some("fast")) else {
            panic!("a malformed query");
        };
        assert_eq!(
            short,
            "query parameter `increment` is `fast`; expected `strong` or `weak`"
        );
    }
}
