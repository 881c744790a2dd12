//! Dapr's secret routes: one secret (a map of keys to values) or every
//! secret of a store. Values go to the caller only: never to a log, a
//! metric or an error.

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::Json;

use super::call::Call;
use super::error::HttpError;
use super::input::{query_pairs, request_metadata, QueryPairs};
use crate::kinds::SecretMap;

/// `GET /v1.0/secrets/{store}/{name}`: `{"key": "value", ...}`.
pub async fn get(
    call: Call,
    Path((store_name, name)): Path<(String, String)>,
    query: QueryPairs,
) -> Result<Json<BTreeMap<String, String>>, HttpError> {
    let store = call.secret_store(&store_name)?;
    let metadata = request_metadata(&query_pairs(query)?);
    let secret =
        store
            .get_secret(&name, &metadata)
            .await
            .map_err(|source| HttpError::SecretGet {
                store: store_name,
                name,
                source: call.scrub_secret(source),
            })?;
    Ok(Json(exposed(secret)))
}

/// `GET /v1.0/secrets/{store}/bulk`: `{"name": {"key": "value"}, ...}`.
pub async fn bulk(
    call: Call,
    Path(store_name): Path<String>,
    query: QueryPairs,
) -> Result<Json<BTreeMap<String, BTreeMap<String, String>>>, HttpError> {
    let store = call.secret_store(&store_name)?;
    let metadata = request_metadata(&query_pairs(query)?);
    let secrets =
        store
            .bulk_get_secret(&metadata)
            .await
            .map_err(|source| HttpError::SecretBulkGet {
                store: store_name,
                source: call.scrub_secret(source),
            })?;
    Ok(Json(
        secrets
            .into_iter()
            .map(|(name, secret)| (name, exposed(secret)))
            .collect(),
    ))
}

/// The values of `secret`, for the caller who asked for them.
fn exposed(secret: SecretMap) -> BTreeMap<String, String> {
    secret
        .into_iter()
        .map(|(key, value)| (key, value.expose().to_string()))
        .collect()
}
