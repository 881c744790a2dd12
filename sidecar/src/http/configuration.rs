//! Dapr's configuration route: `GET /v1.0/configuration/{store}?key=a&key=b`
//! (also under `/v1.0-alpha1`), answering `{"a": {"value", "version",
//! "metadata"}}`. No `key` means every key. `group` and `label` query
//! parameters narrow the query for stores that have them (Layotto's model).

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use rewire_runtime::ConfigQuery;

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use crate::dapr::{Call, ResponseBudget};
use crate::ApiState;

/// One item, as Dapr answers it.
#[derive(Debug, Serialize)]
pub struct Item {
    value: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    version: String,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    metadata: HashMap<String, String>,
}

/// `GET /v1.0/configuration/{store}`: the items found, or 204 when none is.
pub async fn get(
    State(state): State<ApiState>,
    call: Call,
    Path(store_name): Path<String>,
    query: QueryPairs,
) -> Result<Response, HttpError> {
    let store = call.config_store(&store_name)?;
    let pairs = query_pairs(query)?;
    let query = ConfigQuery {
        keys: pairs
            .iter()
            .filter(|(k, v)| k == "key" && !v.is_empty())
            .map(|(_, v)| v.clone())
            .collect(),
        group: query_value(&pairs, "group").map(str::to_string),
        label: query_value(&pairs, "label").map(str::to_string),
        metadata: request_metadata(&pairs, ("configuration store", &store_name))?,
    };
    let budget = ResponseBudget::new(state.options.max_response_bytes);
    let items = store.get(&query, budget).await?;
    if items.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let items: BTreeMap<String, Item> = items
        .into_iter()
        .map(|item| {
            let shown = Item {
                value: item.value,
                version: item.version,
                metadata: item.metadata,
            };
            (item.key, shown)
        })
        .collect();
    Ok(Json(items).into_response())
}
