//! The file routes (rewire's own; Dapr has none). Contents stream both
//! ways, bounded by the store's `maxFileSize`, never held whole:
//!
//! * `PUT /v1.0/rewire/file/{store}/{*name}`: the body is the file →
//!   `{"name", "size", "lastModified"}`; bounded by inactivity, not as a
//!   whole: 408 when no bytes arrive for `request_timeout`; 429 when
//!   `max_uploads` run already;
//! * `GET` the same path: the file (`Content-Length`, `Last-Modified`);
//! * `HEAD`: the same headers, no body (stat);
//! * `DELETE`: 204;
//! * `GET /v1.0/rewire/file/{store}?prefix=&marker=&limit=`: one page,
//!   `{"files": [...], "marker": "..."}` (`marker` only when more follow).

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use rewire_runtime::{FileInfo, ListRequest};

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use super::path_params::PathParams;
use super::rewire_error::RewireHttpError;
use crate::connection::{pumped, BodyCharge};
use crate::dapr::{http_date, Call};
use crate::ApiState;

/// Bytes sent per chunk of a streamed file.
const CHUNK: usize = 64 * 1024;

fn info_json(info: &FileInfo) -> Value {
    json!({
        "name": info.name,
        "size": info.size,
        "lastModified": http_date(info.modified),
    })
}

fn info_headers(info: &FileInfo) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(info.size));
    if let Ok(modified) = HeaderValue::from_str(&http_date(info.modified)) {
        headers.insert(header::LAST_MODIFIED, modified);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers
}

/// `PUT /v1.0/rewire/file/{store}/{*name}`: writes the body as the file.
/// Not bounded as a whole (`observe` leaves this route out): however long
/// the upload takes while bytes keep coming (the store bounds its size),
/// cut with 408 when none arrive for `request_timeout`. Each chunk the
/// store is handed stops counting against the listener's budget of request
/// bytes ([`BodyCharge`]): an upload holds only what it has read and not
/// yet passed on, so it may be larger than that budget. It takes a place
/// among `max_uploads` for as long as it runs (429 when none is left).
pub async fn put(
    State(state): State<ApiState>,
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
    query: QueryPairs,
    charge: Option<Extension<BodyCharge>>,
    body: Body,
) -> Result<Json<Value>, RewireHttpError> {
    let metadata = request_metadata(&query_pairs(query)?, ("file store", &store))
        .map_err(HttpError::from)?
        .into_iter()
        .collect();
    let ops = call.file_store(&store)?;
    let _place = state
        .metrics
        .uploads()
        .take(state.options.max_uploads, ops.name(), &name)
        .map_err(crate::dapr::UploadError::from)?;
    let charge = charge.map(|Extension(charge)| charge);
    let chunks = body.into_data_stream().map(move |chunk| {
        if let (Ok(bytes), Some(charge)) = (&chunk, &charge) {
            charge.taken(bytes.len());
        }
        chunk.map_err(std::io::Error::other)
    });
    let idle = state.options.request_timeout;
    let info = ops.put_streamed(name, chunks, metadata, idle).await?;
    Ok(Json(info_json(&info)))
}

/// `GET /v1.0/rewire/file/{store}/{*name}`: the file, streamed; let go
/// of (the response failed) when the client takes no chunk for
/// [`CLIENT_READS_WITHIN`](crate::connection::CLIENT_READS_WITHIN), not
/// held for as long as its connection lives.
pub async fn get(
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<Response, RewireHttpError> {
    let read = call.file_store(&store)?.get(&name).await?;
    let body = Body::from_stream(pumped(read.body, CHUNK));
    Ok((info_headers(&read.info), body).into_response())
}

/// `HEAD /v1.0/rewire/file/{store}/{*name}`: the file's size and age (a
/// folder is not found, as its `GET` is).
pub async fn stat(
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<Response, RewireHttpError> {
    let info = call.file_store(&store)?.stat_file(&name).await?;
    Ok(info_headers(&info).into_response())
}

/// `DELETE /v1.0/rewire/file/{store}/{*name}`: removes the file.
pub async fn delete(
    call: Call,
    PathParams((store, name)): PathParams<(String, String)>,
) -> Result<StatusCode, RewireHttpError> {
    call.file_store(&store)?.delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1.0/rewire/file/{store}`: one page of the listing.
pub async fn list(
    call: Call,
    PathParams(store): PathParams<String>,
    query: QueryPairs,
) -> Result<Json<Value>, RewireHttpError> {
    let pairs = query_pairs(query)?;
    let max_keys = match query_value(&pairs, "limit") {
        None => 0,
        Some(text) => text.parse::<usize>().map_err(|_| {
            HttpError::MalformedQuery(format!(
                "query parameter `limit` is `{text}`; expected a whole number"
            ))
        })?,
    };
    let request = ListRequest {
        prefix: query_value(&pairs, "prefix")
            .unwrap_or_default()
            .to_string(),
        marker: query_value(&pairs, "marker").map(str::to_string),
        max_keys,
    };
    let page = call.file_store(&store)?.list(request).await?;
    let files: Vec<Value> = page.files.iter().map(info_json).collect();
    let mut body = json!({ "files": files });
    if let Some(marker) = page.marker {
        body["marker"] = json!(marker);
    }
    Ok(Json(body))
}
