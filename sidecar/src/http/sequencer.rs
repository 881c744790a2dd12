//! The sequencer route (rewire's own; Dapr has none):
//! `GET /v1.0/rewire/sequencer/{store}/{key}?increment=strong|weak` →
//! `{"id": N}`; `metadata.<name>` parameters go to the sequencer.

use axum::extract::Path;
use axum::Json;
use serde_json::{json, Value};

use rewire_runtime::Increment;

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use super::rewire_error::RewireHttpError;
use crate::dapr::Call;

/// `GET /v1.0/rewire/sequencer/{store}/{key}`: the next id of `key`.
pub async fn next_id(
    call: Call,
    Path((store, key)): Path<(String, String)>,
    query: QueryPairs,
) -> Result<Json<Value>, RewireHttpError> {
    let pairs = query_pairs(query)?;
    let increment = match query_value(&pairs, "increment") {
        None => Increment::Weak,
        Some(text) => Increment::parse(text).ok_or_else(|| {
            HttpError::MalformedQuery(format!(
                "query parameter `increment` is `{text}`; expected `strong` or `weak`"
            ))
        })?,
    };
    let metadata = request_metadata(&pairs, ("sequencer", &store))
        .map_err(HttpError::from)?
        .into_iter()
        .collect();
    let id = call
        .sequencer(&store)?
        .next_id(key, increment, metadata)
        .await?;
    Ok(Json(json!({ "id": id })))
}
