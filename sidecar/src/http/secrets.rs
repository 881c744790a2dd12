//! Dapr's secret routes: one secret (a map of keys to values) or every
//! secret of a store. Values go to the caller only: never to a log, a
//! metric or an error. A secret the `secrets` section's scopes refuse is
//! 403 `ERR_PERMISSION_DENIED` (the bulk answer leaves it out).

use std::collections::BTreeMap;

use axum::Json;

use super::error::HttpError;
use super::input::{query_pairs, request_metadata, QueryPairs};
use super::path_params::PathParams;
use crate::dapr::{exposed, Call};

/// `GET /v1.0/secrets/{store}/{name}`: `{"key": "value", ...}`.
pub async fn get(
    call: Call,
    PathParams((store_name, name)): PathParams<(String, String)>,
    query: QueryPairs,
) -> Result<Json<BTreeMap<String, String>>, HttpError> {
    let store = call.secret_store(&store_name)?;
    let metadata = request_metadata(&query_pairs(query)?, ("secret store", &store_name))?;
    let secret = store.get(&name, &metadata).await?;
    Ok(Json(exposed(secret)))
}

/// `GET /v1.0/secrets/{store}/bulk`: `{"name": {"key": "value"}, ...}`.
pub async fn bulk(
    call: Call,
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
) -> Result<Json<BTreeMap<String, BTreeMap<String, String>>>, HttpError> {
    let store = call.secret_store(&store_name)?;
    let metadata = request_metadata(&query_pairs(query)?, ("secret store", &store_name))?;
    let secrets = store.bulk_get(&metadata).await?;
    Ok(Json(
        secrets
            .into_iter()
            .map(|(name, secret)| (name, exposed(secret)))
            .collect(),
    ))
}
