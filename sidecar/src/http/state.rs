//! Dapr's state routes: save, get, delete and bulk get, with etags
//! (`etag` in the body, `If-Match` on delete, `ETag` on get), first-write
//! concurrency and `ttlInSeconds` metadata. Values are stored as the JSON
//! bytes of the `value` given, exactly as sent (never parsed and
//! re-encoded: key order, number spelling and spacing are kept), and read
//! back as those bytes.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, ETAG, IF_MATCH};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use rewire_runtime::{
    BulkGetItem, Concurrency, Consistency, DeleteRequest, GetRequest, SetRequest,
};

use super::error::HttpError;
use super::input::{
    component_json_body, lenient_metadata, query_pairs, query_value, request_metadata, Items,
    QueryPairs, RawBody,
};
use super::path_params::PathParams;
use crate::dapr::{
    check_item_count, check_metadata_copies, check_request_metadata, json_string_bytes, Call,
    ResponseBudget, StateOpError, StateOps, MAX_BULK_ITEMS,
};
use crate::ApiState;

/// One item of a save (or a transaction's `request`), as Dapr's HTTP API
/// takes it.
#[derive(Debug, Deserialize)]
pub(super) struct SaveItem {
    key: String,
    /// The value's JSON text, as sent.
    #[serde(default)]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default, deserialize_with = "lenient_metadata")]
    metadata: HashMap<String, String>,
    #[serde(default)]
    options: Option<SaveOptions>,
}

#[derive(Debug, Default, Deserialize)]
struct SaveOptions {
    #[serde(default)]
    concurrency: Option<String>,
    #[serde(default)]
    consistency: Option<String>,
}

/// A bulk get, as Dapr's HTTP API takes it (no `keys` is no key).
#[derive(Debug, Deserialize)]
struct BulkGet {
    #[serde(default)]
    keys: Items<String, MAX_BULK_ITEMS>,
    /// Metadata for every get (the query's `metadata.*` win).
    #[serde(default, deserialize_with = "lenient_metadata")]
    metadata: HashMap<String, String>,
    /// Dapr's `parallelism`: how many chunks of keys are read at once
    /// (none, zero or less: the default; see
    /// [`StateOps::bulk_get`](crate::dapr::StateOps::bulk_get)). Any
    /// integer, as daprd's Go `int` takes.
    #[serde(default)]
    parallelism: Option<i64>,
}

/// One result of a bulk get, as Dapr answers it.
#[derive(Debug, Serialize)]
pub struct BulkItem {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    etag: Option<String>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    metadata: HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `POST` (or `PUT`) `/v1.0/state/{store}`: saves every item, 204.
pub async fn save(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
    body: RawBody,
) -> Result<StatusCode, HttpError> {
    let store = call.state_store(&store_name)?;
    let query = query_pairs(query)?;
    let component = ("state store", store_name.as_str());
    let shared = request_metadata(&query, component)?;
    let limit = state.options.max_request_bytes;
    let items: Items<SaveItem, MAX_BULK_ITEMS> = component_json_body(body, limit, component)?;
    check_item_count(component, items.count)?;
    check_metadata_copies(component, &shared, items.count, limit)?;
    let requests = items
        .kept
        .into_iter()
        .enumerate()
        .map(|(index, item)| set_request(&store, index, item, &shared))
        .collect::<Result<Vec<_>, _>>()?;
    store.save(requests).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The write of item `index` of a request to `store`; `shared` (the
/// query's `metadata.*`) is added to the item's metadata.
pub(super) fn set_request(
    store: &StateOps<'_>,
    index: usize,
    item: SaveItem,
    shared: &HashMap<String, String>,
) -> Result<SetRequest, HttpError> {
    store.check_key(index, &item.key)?;
    write_of(item, shared)
}

/// The write of operation `index` of a transaction to `store`: as Dapr's
/// `onPostStateTransaction`, a key is checked for the separator as its
/// operation is read, and an empty one is left to the shared
/// [`transact`](crate::dapr::StateOps::transact), once every key was.
pub(super) fn transaction_write(
    store: &StateOps<'_>,
    index: usize,
    item: SaveItem,
    shared: &HashMap<String, String>,
) -> Result<SetRequest, HttpError> {
    if !item.key.is_empty() {
        store.check_key(index, &item.key)?;
    }
    write_of(item, shared)
}

/// The write of an item whose key is checked.
fn write_of(item: SaveItem, shared: &HashMap<String, String>) -> Result<SetRequest, HttpError> {
    let options = item.options.unwrap_or_default();
    let concurrency = concurrency(options.concurrency.as_deref())?;
    let consistency = consistency(options.consistency.as_deref())?;
    let mut metadata = item.metadata;
    metadata.extend(shared.iter().map(|(k, v)| (k.clone(), v.clone())));
    // An item without `value` stores JSON `null`, as Dapr does.
    let value = item
        .value
        .map_or_else(|| b"null".to_vec(), |raw| raw.get().as_bytes().to_vec());
    Ok(SetRequest {
        key: item.key,
        value,
        etag: item.etag.filter(|e| !e.is_empty()),
        concurrency,
        consistency,
        ttl: None,
        metadata,
    })
}

/// `GET /v1.0/state/{store}/{key}`: the stored bytes with their `ETag`
/// (none for an entry without one), or 204 when the key does not exist.
pub async fn get(
    call: Call,
    PathParams((store_name, key)): PathParams<(String, String)>,
    query: QueryPairs,
) -> Result<Response, HttpError> {
    read(call, &store_name, key, query).await
}

/// The answer to a state GET of `key` in `store_name` (routed by the
/// router or the [`hot_path`](super::hot_path)).
pub(super) async fn read(
    call: Call,
    store_name: &str,
    key: String,
    query: QueryPairs,
) -> Result<Response, HttpError> {
    let store = call.state_store(store_name)?;
    let query = query_pairs(query)?;
    let request = GetRequest {
        key,
        metadata: request_metadata(&query, ("state store", store_name))?,
    };
    let entry = store.get(request).await?;
    let Some(entry) = entry else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    // Built in place: the stored bytes become the body without a copy, and
    // the headers go straight into the response's own map.
    let mut response = Response::new(Body::from(entry.data));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // An empty etag is none (a plain string on Redis): no header, as Dapr.
    if !entry.etag.is_empty() {
        if let Ok(etag) = HeaderValue::try_from(entry.etag) {
            headers.insert(ETAG, etag);
        }
    }
    for (name, value) in &entry.metadata {
        let name = HeaderName::try_from(format!("metadata.{name}"));
        if let (Ok(name), Ok(value)) = (name, HeaderValue::from_str(value)) {
            headers.insert(name, value);
        }
    }
    Ok(response)
}

/// `DELETE /v1.0/state/{store}/{key}`: deletes the key (only at the etag
/// of `If-Match`, when given), 204.
pub async fn delete(
    call: Call,
    PathParams((store_name, key)): PathParams<(String, String)>,
    query: QueryPairs,
    headers: HeaderMap,
) -> Result<StatusCode, HttpError> {
    let store = call.state_store(&store_name)?;
    let query = query_pairs(query)?;
    let etag = match headers.get(IF_MATCH) {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| HttpError::Invalid("the If-Match header is not text".into()))?
                .to_string(),
        ),
        None => None,
    };
    let request = DeleteRequest {
        key,
        etag: etag.filter(|e| !e.is_empty()),
        concurrency: concurrency(query_value(&query, "concurrency"))?,
        consistency: consistency(query_value(&query, "consistency"))?,
        metadata: request_metadata(&query, ("state store", &store_name))?,
    };
    store.delete(request).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST` (or `PUT`) `/v1.0/state/{store}/bulk`: `[{"key", "data", "etag"}]` in the
/// order asked; missing keys come back with only their key. The body's
/// `metadata` and the query's `metadata.*` (which win) go with every get.
pub async fn bulk_get(
    State(state): State<ApiState>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
    body: RawBody,
) -> Result<Json<Vec<BulkItem>>, HttpError> {
    let store = call.state_store(&store_name)?;
    let component = ("state store", store_name.as_str());
    let query = query_pairs(query)?;
    let shared = request_metadata(&query, component)?;
    let mut request: BulkGet =
        component_json_body(body, state.options.max_request_bytes, component)?;
    check_item_count(component, request.keys.count)?;
    request.metadata.extend(shared);
    check_request_metadata(component, &request.metadata)?;
    let budget = ResponseBudget::new(state.options.max_response_bytes);
    let items = store
        .bulk_get(
            request.keys.kept,
            &request.metadata,
            request.parallelism.unwrap_or_default(),
            budget,
        )
        .await?;
    // The budget above counts stored bytes; written as JSON, bytes that
    // are no JSON become an escaped string (a control byte takes six).
    let mut written = ResponseBudget::new(state.options.max_response_bytes);
    let mut answer = Vec::with_capacity(items.len());
    for item in items {
        let item = bulk_item(item);
        written
            .take(item.json_bytes())
            .map_err(|source| StateOpError::BulkTooLarge {
                store: store_name.clone(),
                source,
            })?;
        answer.push(item);
    }
    Ok(Json(answer))
}

impl BulkItem {
    /// What the item takes in the JSON answer (punctuation counted
    /// generously).
    fn json_bytes(&self) -> usize {
        let metadata: usize = self
            .metadata
            .iter()
            .map(|(key, value)| json_string_bytes(key) + json_string_bytes(value) + 2)
            .sum();
        json_string_bytes(&self.key)
            + self.data.as_ref().map_or(0, |data| data.get().len())
            + self.etag.as_deref().map_or(0, json_string_bytes)
            + self.error.as_deref().map_or(0, json_string_bytes)
            + metadata
            + 64
    }
}

/// One result, its error already scrubbed by the shared operation.
fn bulk_item(item: BulkGetItem) -> BulkItem {
    let (data, etag, metadata) = match item.entry {
        Some(entry) => (
            Some(stored_json(&entry.data)),
            // An empty etag is none: left out, as Dapr does.
            Some(entry.etag).filter(|etag| !etag.is_empty()),
            entry.metadata,
        ),
        None => (None, None, HashMap::new()),
    };
    BulkItem {
        key: item.key,
        data,
        etag,
        metadata,
        error: item.error,
    }
}

/// Stored bytes as JSON: the bytes themselves when they are JSON (what the
/// HTTP API stores), else their text as a JSON string.
fn stored_json(data: &[u8]) -> Box<RawValue> {
    let text = String::from_utf8_lossy(data);
    RawValue::from_string(text.clone().into_owned()).unwrap_or_else(|_| {
        // A string always encodes.
        serde_json::value::to_raw_value(&text).unwrap_or_default()
    })
}

/// Dapr's concurrency option: `first-write` or `last-write` (the default).
fn concurrency(option: Option<&str>) -> Result<Concurrency, HttpError> {
    match option.unwrap_or_default() {
        "" | "last-write" => Ok(Concurrency::LastWrite),
        "first-write" => Ok(Concurrency::FirstWrite),
        other => Err(HttpError::Invalid(format!(
            "unknown concurrency `{other}` (expected `first-write` or `last-write`)"
        ))),
    }
}

/// Dapr's consistency option: `strong` or `eventual` (the default).
fn consistency(option: Option<&str>) -> Result<Consistency, HttpError> {
    match option.unwrap_or_default() {
        "" | "eventual" => Ok(Consistency::Eventual),
        "strong" => Ok(Consistency::Strong),
        other => Err(HttpError::Invalid(format!(
            "unknown consistency `{other}` (expected `strong` or `eventual`)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_follows_dapr_spelling() {
        assert_eq!(concurrency(None).ok(), Some(Concurrency::LastWrite));
        assert_eq!(
            concurrency(Some("first-write")).ok(),
            Some(Concurrency::FirstWrite)
        );
        assert!(concurrency(Some("firstWrite")).is_err());
    }

    fn write(json: &str) -> Result<SetRequest, HttpError> {
        let item: SaveItem = serde_json::from_str(json).expect("an item");
        write_of(item, &HashMap::new())
    }

    #[test]
    fn options_consistency_reaches_the_write() {
        let strong = write(r#"{"key":"k","value":1,"options":{"consistency":"strong"}}"#);
        assert_eq!(
            strong.ok().map(|w| w.consistency),
            Some(Consistency::Strong)
        );
        let eventual = write(r#"{"key":"k","value":1,"options":{"consistency":"eventual"}}"#);
        assert_eq!(
            eventual.ok().map(|w| w.consistency),
            Some(Consistency::Eventual)
        );
        let absent = write(r#"{"key":"k","value":1}"#);
        assert_eq!(
            absent.ok().map(|w| w.consistency),
            Some(Consistency::Eventual)
        );
        let unknown = write(r#"{"key":"k","options":{"consistency":"linearizable"}}"#);
        assert!(
            matches!(&unknown, Err(HttpError::Invalid(m)) if m.contains("linearizable")),
            "{unknown:?}"
        );
    }

    /// Dapr's `parallelism` is a Go `int`: a negative one is its default,
    /// not a malformed body (failed before: read as `u32`, a 400).
    #[test]
    fn bulk_parallelism_takes_any_integer_as_daprd_does() {
        for (text, expected) in [("-1", Some(-1)), ("0", Some(0)), ("4", Some(4))] {
            let body = format!(r#"{{"keys": ["a"], "parallelism": {text}}}"#);
            let bulk: Result<BulkGet, _> = serde_json::from_str(&body);
            assert_eq!(bulk.map(|b| b.parallelism).ok(), Some(expected), "{text}");
        }
        let absent: Result<BulkGet, _> = serde_json::from_str(r#"{"keys": ["a"]}"#);
        assert_eq!(absent.map(|b| b.parallelism).ok(), Some(None));
    }

    #[test]
    fn stored_bytes_come_back_as_json() {
        // JSON comes back as stored, byte for byte.
        let exact = br#"{"zeta":1, "alpha":2.50}"#;
        assert_eq!(stored_json(exact).get().as_bytes(), exact);
        assert_eq!(stored_json(b"plain").get(), r#""plain""#);
    }
}
