//! Dapr's publish routes: `POST /v1.0/publish/{pubsub}/{topic}` (the body
//! is the event, its `Content-Type` the event's) and
//! `POST /v1.0-alpha1/publish/bulk/{pubsub}/{topic}` (a JSON array of
//! `{"entryId", "event", "contentType", "metadata"}`), answering `204` on
//! success and Dapr's error codes otherwise.

use std::collections::HashMap;

use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::HttpError;
use super::input::{query_pairs, request_metadata, QueryPairs, RawBody};
use crate::dapr::{Call, PubSubOpError, PublishEvent};

/// A publish error in Dapr's HTTP form.
pub struct PublishError(PubSubOpError);

impl IntoResponse for PublishError {
    fn into_response(self) -> Response {
        let (status, code) = match &self.0 {
            PubSubOpError::NameEmpty => (StatusCode::NOT_FOUND, "ERR_PUBSUB_EMPTY"),
            PubSubOpError::NotFound(_) => (StatusCode::NOT_FOUND, "ERR_PUBSUB_NOT_FOUND"),
            PubSubOpError::TopicEmpty(_) => (StatusCode::NOT_FOUND, "ERR_TOPIC_NAME_EMPTY"),
            PubSubOpError::Busy { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "ERR_PUBSUB_PUBLISH_MESSAGE")
            }
            PubSubOpError::Publish { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_PUBSUB_PUBLISH_MESSAGE",
            ),
        };
        let body = json!({"errorCode": code, "message": self.0.to_string()});
        (status, Json(body)).into_response()
    }
}

impl From<PubSubOpError> for PublishError {
    fn from(err: PubSubOpError) -> Self {
        Self(err)
    }
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// `POST /v1.0/publish/{pubsub}/{topic}`.
pub async fn publish(
    call: Call,
    Path((pubsub_name, topic)): Path<(String, String)>,
    query: QueryPairs,
    headers: HeaderMap,
    body: RawBody,
) -> Result<StatusCode, Response> {
    let metadata = request_metadata(&query_pairs(query).map_err(IntoResponse::into_response)?);
    let data = body.map_err(IntoResponse::into_response)?;
    let pubsub = call.pubsub(&pubsub_name).map_err(to_response)?;
    let event = PublishEvent {
        data: data.to_vec(),
        content_type: header_text(&headers, header::CONTENT_TYPE.as_str()),
        metadata,
        traceparent: header_text(&headers, "traceparent")
            .or_else(crate::telemetry::propagation::current_traceparent),
        tracestate: header_text(&headers, "tracestate"),
    };
    pubsub.publish(&topic, event).await.map_err(to_response)?;
    Ok(StatusCode::NO_CONTENT)
}

fn to_response(err: PubSubOpError) -> Response {
    PublishError(err).into_response()
}

/// One entry of a bulk publish.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BulkEntry {
    entry_id: String,
    event: Value,
    #[serde(default)]
    content_type: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

/// `POST /v1.0-alpha1/publish/bulk/{pubsub}/{topic}`: `204`, or `500`
/// with the failed entries.
pub async fn bulk_publish(
    call: Call,
    Path((pubsub_name, topic)): Path<(String, String)>,
    query: QueryPairs,
    headers: HeaderMap,
    body: RawBody,
) -> Result<StatusCode, Response> {
    let metadata = request_metadata(&query_pairs(query).map_err(IntoResponse::into_response)?);
    let data = body.map_err(IntoResponse::into_response)?;
    let entries: Vec<BulkEntry> = serde_json::from_slice(&data)
        .map_err(|e| HttpError::Malformed(e.to_string()).into_response())?;
    let pubsub = call.pubsub(&pubsub_name).map_err(to_response)?;
    let events = entries
        .into_iter()
        .map(|entry| {
            let data = match entry.event {
                Value::String(text) if !entry.content_type.contains("json") => text.into_bytes(),
                other => other.to_string().into_bytes(),
            };
            let mut all = metadata.clone();
            all.extend(entry.metadata);
            let event = PublishEvent {
                data,
                content_type: Some(entry.content_type).filter(|c| !c.is_empty()),
                metadata: all,
                traceparent: header_text(&headers, "traceparent")
                    .or_else(crate::telemetry::propagation::current_traceparent),
                tracestate: header_text(&headers, "tracestate"),
            };
            (entry.entry_id, event)
        })
        .collect();
    let failed = pubsub
        .bulk_publish(&topic, events)
        .await
        .map_err(to_response)?;
    if failed.is_empty() {
        return Ok(StatusCode::NO_CONTENT);
    }
    let failed: Vec<Value> = failed
        .into_iter()
        .map(|(entry_id, error)| json!({"entryId": entry_id, "error": error}))
        .collect();
    let body = json!({
        "failedEntries": failed,
        "errorCode": "ERR_PUBSUB_PUBLISH_MESSAGE",
    });
    Err((StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response())
}
