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
use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
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
    ResponseBudget, StateOpError, StateOps, MAX_BULK_ITEMS, MAX_REQUEST_METADATA_ENTRIES,
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
    /// The item's own metadata, bounded as it is read (see
    /// [`item_metadata`]).
    #[serde(default, deserialize_with = "item_metadata")]
    metadata: HashMap<String, String>,
    #[serde(default)]
    options: Option<SaveOptions>,
}

/// An item's own metadata, read as [`lenient_metadata`] reads it but
/// refused as soon as it holds more than [`MAX_REQUEST_METADATA_ENTRIES`]
/// names (a `null` value counted too): one item of many thousand entries
/// is never built whole. Each value is kept as its JSON text until then,
/// and only the bounded object is read leniently. Its bytes are checked
/// with the entries by
/// [`StateOps::check_item_metadata`](crate::dapr::StateOps::check_item_metadata)
/// once the item is decoded.
fn item_metadata<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<HashMap<String, String>, D::Error> {
    let Some(BoundedMetadata(text)) = Option::<BoundedMetadata>::deserialize(deserializer)? else {
        return Ok(HashMap::new());
    };
    serde_json::from_str::<ItemLike>(&text)
        .map(|item| item.metadata)
        .map_err(|e| D::Error::custom(without_position(&e)))
}

/// Bounded metadata re-read as the `metadata` of an object, as an item of
/// a save holds it: nested values meet serde's depth limit where they did
/// when the item was read leniently at once.
#[derive(Deserialize)]
struct ItemLike {
    #[serde(deserialize_with = "lenient_metadata")]
    metadata: HashMap<String, String>,
}

/// A metadata object of at most [`MAX_REQUEST_METADATA_ENTRIES`] names,
/// as the JSON text of an [`ItemLike`] (each name once, with its last
/// value, as a map keeps it).
struct BoundedMetadata(String);

impl<'de> Deserialize<'de> for BoundedMetadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(BoundedMetadataVisitor)
    }
}

/// Reads a [`BoundedMetadata`].
struct BoundedMetadataVisitor;

impl<'de> Visitor<'de> for BoundedMetadataVisitor {
    type Value = BoundedMetadata;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<BoundedMetadata, M::Error> {
        let mut entries: HashMap<String, Box<RawValue>> = HashMap::new();
        while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
            entries.insert(name, value);
            if entries.len() > MAX_REQUEST_METADATA_ENTRIES {
                return Err(M::Error::custom(format!(
                    "the item's metadata has more than {MAX_REQUEST_METADATA_ENTRIES} entries, \
                     the sidecar's limit (as for request metadata)"
                )));
            }
        }
        let mut text = String::from(r#"{"metadata":{"#);
        for (index, (name, value)) in entries.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            text.push_str(&serde_json::to_string(name).map_err(M::Error::custom)?);
            text.push(':');
            text.push_str(value.get());
        }
        text.push_str("}}");
        Ok(BoundedMetadata(text))
    }
}

/// serde's reason without its " at line L column C" (the position in the
/// re-read metadata, not in the body).
fn without_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let position = format!(" at line {} column {}", err.line(), err.column());
    text.strip_suffix(&position).unwrap_or(&text).to_string()
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
    /// Dapr's `parallelism`: how many gets run at once, as daprd counts
    /// them (none, zero or less: the default; see
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
    store.check_item_metadata(index, &item.metadata)?;
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
    store.check_item_metadata(index, &item.metadata)?;
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

    /// An item's metadata reads as [`lenient_metadata`] reads it (strings
    /// as themselves, `null` as no entry, the last of a repeated name,
    /// anything else as its JSON text), errors with serde's reason.
    #[test]
    fn item_metadata_reads_as_lenient_metadata_does() {
        #[derive(Deserialize)]
        struct Lenient {
            #[serde(default, deserialize_with = "lenient_metadata")]
            metadata: HashMap<String, String>,
        }
        #[derive(Deserialize)]
        struct Bounded {
            #[serde(default, deserialize_with = "item_metadata")]
            metadata: HashMap<String, String>,
        }
        let texts = [
            r#"{"metadata": {"ttl": 60, "f": 1.0, "e": 1e2, "big": 123456789012345678901234}}"#,
            r#"{"metadata": {"t": true, "s": "a\u0041", "n": null, "s": null, "\"q\"": "x"}}"#,
            r#"{"metadata": {"o": {"z": [1, {"y": 2, "x": "\n"}], "a": 1, "a": 2}}}"#,
            r#"{"metadata": {"l": [{"":0},{"":0}], "u": "\ud800"}}"#,
            r#"{"metadata": {"x": 1e400}}"#,
            r#"{"metadata": 5}"#,
            r#"{"metadata": null}"#,
            r#"{}"#,
        ]
        .map(String::from);
        let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let deep = [124, 125, 126, 127, 300]
            .map(|depth| format!(r#"{{"metadata": {{"d": {}}}}}"#, deep(depth)));
        for text in texts.iter().chain(&deep) {
            let text = text.as_str();
            let lenient = serde_json::from_str::<Lenient>(text).map(|item| item.metadata);
            let bounded = serde_json::from_str::<Bounded>(text).map(|item| item.metadata);
            match (lenient, bounded) {
                (Ok(lenient), Ok(bounded)) => assert_eq!(bounded, lenient, "{text}"),
                (Err(lenient), Err(bounded)) => {
                    let reason = without_position(&lenient);
                    assert!(
                        bounded.to_string().starts_with(&reason),
                        "{text}: {bounded}"
                    );
                }
                (lenient, bounded) => panic!("{text}: {lenient:?} / {bounded:?}"),
            }
        }
    }

    /// Metadata of `count` entries `mNNNN` (empty values) as JSON.
    fn metadata_json(count: usize) -> String {
        let entries: Vec<String> = (0..count).map(|i| format!(r#""m{i:04}":"""#)).collect();
        format!("{{{}}}", entries.join(","))
    }

    /// An item's own metadata of more than 64 entries is refused as it
    /// is read, naming the item and the limit (failed before: any number
    /// was read whole, 350,000 entries of a 4 MiB body ~60 MiB, and
    /// written).
    #[test]
    fn an_items_metadata_past_64_entries_is_refused_as_it_is_read_naming_the_item() {
        let items = |count: usize| {
            let body = format!(
                r#"[{{"key":"a"}},{{"key":"b","metadata":{}}}]"#,
                metadata_json(count)
            );
            serde_json::from_str::<Items<SaveItem, MAX_BULK_ITEMS>>(&body)
        };
        let kept = items(64).map(|items| items.kept[1].metadata.len());
        assert_eq!(kept.ok(), Some(64));
        let message = items(350_000)
            .map(|_| ())
            .expect_err("too many")
            .to_string();
        assert!(
            message.starts_with(
                "item 1, field `metadata`: the item's metadata has more than 64 entries, \
                 the sidecar's limit (as for request metadata)"
            ),
            "{message}"
        );
    }

    /// A runtime with a state store `s` (of a test store that is never
    /// asked here).
    async fn runtime() -> rewire_runtime::Runtime {
        use rewire_runtime::config::{parse, validate};
        use rewire_runtime::{Registry, Runtime, RuntimeOptions};
        let config = r#"{"components": {"state": {"s": {"type": "test.dapr.slow_bulk"}}}}"#;
        let file = parse(config.as_bytes()).unwrap_or_else(|p| panic!("{p}"));
        let registry = Registry::collected();
        let config = validate(file, &registry).unwrap_or_else(|p| panic!("{p}"));
        Runtime::start(config, registry, RuntimeOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// An item's own metadata over 16 KiB is refused, in a save and in a
    /// transaction, naming the item and the limit (failed before: written
    /// whatever its size).
    #[tokio::test]
    async fn an_items_metadata_past_16_kib_is_refused_naming_the_item() {
        let runtime = runtime().await;
        let call = Call::new(&runtime, crate::dapr::StoreLabel::default());
        let store = call.state_store("s").unwrap_or_else(|e| panic!("{e}"));
        let item = |bytes: usize| -> SaveItem {
            let text = format!(
                r#"{{"key":"k","metadata":{{"m":"{}"}}}}"#,
                "v".repeat(bytes)
            );
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"))
        };
        let shared = HashMap::new();
        assert!(set_request(&store, 2, item(16 * 1024 - 100), &shared).is_ok());
        for refused in [
            set_request(&store, 2, item(16 * 1024), &shared),
            transaction_write(&store, 2, item(16 * 1024), &shared),
        ] {
            let message = match refused {
                Err(HttpError::Invalid(message)) => message,
                other => panic!("{other:?}"),
            };
            assert!(
                message.starts_with(
                    "the metadata of item 2 of the request for state store `s` takes more than 16384 bytes"
                ),
                "{message}"
            );
        }
        runtime.shutdown().await;
    }

    #[test]
    fn stored_bytes_come_back_as_json() {
        // JSON comes back as stored, byte for byte.
        let exact = br#"{"zeta":1, "alpha":2.50}"#;
        assert_eq!(stored_json(exact).get().as_bytes(), exact);
        assert_eq!(stored_json(b"plain").get(), r#""plain""#);
    }
}
