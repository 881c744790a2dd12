//! Dapr's publish routes: `POST /v1.0/publish/{pubsub}/{topic}` (the body
//! is the event, its `Content-Type` the event's) and
//! `POST /v1.0-alpha1/publish/bulk/{pubsub}/{topic}` (a JSON array of
//! `{"entryId", "event", "contentType", "metadata"}`), answering `204` on
//! success and Dapr's error codes otherwise.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::{DeserializeSeed, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::error::HttpError;
use super::input::{
    body_bytes, json_problem, query_pairs, request_metadata, Items, QueryPairs, RawBody,
};
use super::path_params::PathParams;
use crate::dapr::json_text::{reason_of, JsonCheck, TOP_DEPTH};
use crate::dapr::pubsub_bulk_event::raw_bulk_event_bytes;
use crate::dapr::{
    check_item_metadata, Call, PubSubOpError, PubSubOps, PublishEvent, RequestLimitError,
    MAX_BULK_ITEMS,
};
use crate::ApiState;
use rewire_runtime::PubSubError;

/// A publish error in Dapr's HTTP form.
pub struct PublishError(PubSubOpError);

impl IntoResponse for PublishError {
    fn into_response(self) -> Response {
        let (status, code) = match &self.0 {
            PubSubOpError::NameEmpty => (StatusCode::NOT_FOUND, "ERR_PUBSUB_EMPTY"),
            PubSubOpError::NotFound(_) => (StatusCode::NOT_FOUND, "ERR_PUBSUB_NOT_FOUND"),
            PubSubOpError::TopicEmpty(_) => (StatusCode::NOT_FOUND, "ERR_TOPIC_NAME_EMPTY"),
            PubSubOpError::EntryId { .. }
            | PubSubOpError::EventConversion { .. }
            | PubSubOpError::Limit(RequestLimitError::TooManyItems { .. }) => {
                (StatusCode::BAD_REQUEST, "ERR_PUBSUB_EVENTS_SER")
            }
            PubSubOpError::Limit(_) | PubSubOpError::Metadata { .. } => {
                (StatusCode::BAD_REQUEST, "ERR_PUBSUB_REQUEST_METADATA")
            }
            PubSubOpError::CloudEvent { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_PUBSUB_CLOUD_EVENTS_SER",
            ),
            PubSubOpError::Busy { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "ERR_PUBSUB_PUBLISH_MESSAGE")
            }
            // The broker refused the request itself (a topic it cannot
            // take, its metadata): the client's to fix, not retry.
            PubSubOpError::Publish {
                source: PubSubError::Invalid(_),
                ..
            } => (StatusCode::BAD_REQUEST, "ERR_PUBSUB_PUBLISH_MESSAGE"),
            PubSubOpError::Publish { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_PUBSUB_PUBLISH_MESSAGE",
            ),
            // Not an HTTP call's (subscriptions are the sidecar's own).
            PubSubOpError::Subscribe { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, "ERR_PUBSUB_SUBSCRIBE")
            }
        };
        let mut body = json!({"errorCode": code, "message": self.0.to_string()});
        if let Some(detail) = self.0.detail() {
            body["details"] = super::error_details::details_json(&detail);
        }
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

/// The trace headers a published event carries (see
/// [`event_trace`](crate::telemetry::propagation::event_trace)), from the
/// call's read as W3C asks
/// ([`trace_headers`](crate::telemetry::propagation::trace_headers)).
fn event_trace(headers: &HeaderMap) -> (Option<String>, Option<String>) {
    use crate::telemetry::propagation;
    let (traceparent, tracestate) = propagation::trace_headers(headers);
    propagation::event_trace(traceparent, tracestate.as_deref())
}

/// `POST` (or `PUT`) `/v1.0/publish/{pubsub}/{topic}`.
pub async fn publish(
    State(state): State<ApiState>,
    call: Call,
    PathParams((pubsub_name, topic)): PathParams<(String, String)>,
    query: QueryPairs,
    headers: HeaderMap,
    body: RawBody,
) -> Result<StatusCode, Response> {
    let pubsub = call.pubsub(&pubsub_name).map_err(to_response)?;
    let pairs = query_pairs(query).map_err(IntoResponse::into_response)?;
    let metadata =
        request_metadata(&pairs, ("pubsub", &pubsub_name)).map_err(|e| to_response(e.into()))?;
    let data =
        body_bytes(body, state.options.max_request_bytes).map_err(IntoResponse::into_response)?;
    let (traceparent, tracestate) = event_trace(&headers);
    let event = PublishEvent {
        data: data.to_vec(),
        content_type: header_text(&headers, header::CONTENT_TYPE.as_str()),
        metadata,
        traceparent,
        tracestate,
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
    /// Checked by the shared operation (empty or repeated is refused).
    #[serde(default)]
    entry_id: String,
    event: EntryEvent,
    #[serde(default)]
    content_type: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

/// A bulk entry's `event`: its JSON text, checked as a `serde_json::Value`
/// would be read in its entry (the same input accepted, the same reasons)
/// but not built (a tree holds up to ~90 times its text, and every entry
/// is held until the request is published).
#[derive(Debug)]
struct EntryEvent(Box<RawValue>);

impl<'de> Deserialize<'de> for EntryEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        // The entry's object takes one level of serde_json's depth.
        let check = JsonCheck {
            depth_left: TOP_DEPTH - 1,
        };
        check
            .deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
            .map_err(|err| D::Error::custom(reason_of(&err)))?;
        Ok(Self(raw))
    }
}

/// `POST` (or `PUT`) `/v1.0-alpha1/publish/bulk/{pubsub}/{topic}` (also
/// under `/v1.0`, as Dapr serves it): `204`, or `500`
/// with the failed entries.
pub async fn bulk_publish(
    State(state): State<ApiState>,
    call: Call,
    PathParams((pubsub_name, topic)): PathParams<(String, String)>,
    query: QueryPairs,
    headers: HeaderMap,
    body: RawBody,
) -> Result<StatusCode, Response> {
    let pubsub = call.pubsub(&pubsub_name).map_err(to_response)?;
    let pairs = query_pairs(query).map_err(IntoResponse::into_response)?;
    let metadata =
        request_metadata(&pairs, ("pubsub", &pubsub_name)).map_err(|e| to_response(e.into()))?;
    let data =
        body_bytes(body, state.options.max_request_bytes).map_err(IntoResponse::into_response)?;
    let entries: Items<BulkEntry, MAX_BULK_ITEMS> = serde_json::from_slice(&data).map_err(|e| {
        let error = HttpError::MalformedBody {
            component: format!("pubsub `{pubsub_name}`"),
            problem: json_problem(&e),
        };
        error.into_response()
    })?;
    drop(data);
    pubsub
        .check_entry_count(entries.count)
        .map_err(to_response)?;
    for (index, entry) in entries.kept.iter().enumerate() {
        check_item_metadata(("pubsub", &pubsub_name), index, &entry.metadata)
            .map_err(|e| to_response(e.into()))?;
    }
    let (traceparent, tracestate) = event_trace(&headers);
    // As Dapr's loop: each entry's event is converted before its id is
    // checked, so a bad event before the first bad id is the one refused;
    // from the first bad id on, the shared operation refuses the request.
    let first_bad_id =
        PubSubOps::first_bad_entry_id(entries.kept.iter().map(|e| e.entry_id.as_str()));
    let mut events = Vec::with_capacity(entries.kept.len());
    for (index, entry) in entries.kept.into_iter().enumerate() {
        let data = raw_bulk_event_bytes(&entry.event.0, &entry.content_type).map_err(|reason| {
            to_response(PubSubOpError::EventConversion {
                pubsub: pubsub_name.clone(),
                app_id: call.generation().app_id().to_string(),
                topic: topic.clone(),
                reason,
            })
        })?;
        let event = PublishEvent {
            data,
            content_type: Some(entry.content_type).filter(|c| !c.is_empty()),
            metadata: entry.metadata,
            traceparent: traceparent.clone(),
            tracestate: tracestate.clone(),
        };
        events.push((entry.entry_id, event));
        if first_bad_id == Some(index) {
            break;
        }
    }
    let failed = pubsub
        .bulk_publish_within(&topic, &metadata, events, state.options.request_timeout)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A bulk entry as read before: its `event` parsed into a tree.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct ParsedEntry {
        #[serde(default)]
        entry_id: String,
        event: Value,
        #[serde(default)]
        content_type: String,
        #[serde(default)]
        metadata: HashMap<String, String>,
    }

    /// A bulk body of one entry whose `event` is `event`.
    fn body(event: &str) -> String {
        format!(r#"[{{"entryId": "1", "event": {event}, "contentType": "application/json"}}]"#)
    }

    /// A publish the broker refuses as invalid (the redis pub/sub's topic
    /// holding `||`) is the client's error: 400, not 500; a broker failure
    /// stays 500. Before: every refusal was 500.
    #[test]
    fn a_publish_the_broker_refuses_as_invalid_is_a_bad_request() {
        let refused = |source| {
            PublishError(PubSubOpError::Publish {
                pubsub: "orders".into(),
                topic: "lock||a||b".into(),
                source,
            })
        };
        let invalid = refused(PubSubError::Invalid("topic can't contain `||`".into()));
        assert_eq!(invalid.into_response().status(), StatusCode::BAD_REQUEST);
        let failed = refused(PubSubError::Backend("connection reset".into()));
        assert_eq!(
            failed.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    /// The event is kept as the text sent, and a body is accepted or
    /// refused as when each event was parsed, for the same reason.
    #[test]
    fn an_entry_event_is_its_text_read_as_a_value_would_be() {
        let mut events: Vec<String> = [
            r#"{"b": 1, "a": [1.0, 1e2], "a": null}"#,
            r#"[{"":0},{"":0}]"#,
            r#""\u0041""#,
            "null",
            "1e400",
            r#""\ud800""#,
            r#"{"a" 1}"#,
            "[1,]",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        for depth in [125, 126, 127, 128] {
            events.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        }
        for event in events {
            let body = body(&event);
            let raw = serde_json::from_str::<Items<BulkEntry, MAX_BULK_ITEMS>>(&body);
            let parsed = serde_json::from_str::<Items<ParsedEntry, MAX_BULK_ITEMS>>(&body);
            match (raw, parsed) {
                (Ok(raw), Ok(_)) => assert_eq!(raw.kept[0].event.0.get(), event),
                (Err(raw), Err(parsed)) => {
                    assert_eq!(raw.to_string(), parsed.to_string(), "{event}");
                }
                (raw, parsed) => panic!("{event}: {raw:?} / {parsed:?}"),
            }
        }
        let missing = r#"[{"entryId": "1"}]"#;
        let raw = serde_json::from_str::<Items<BulkEntry, MAX_BULK_ITEMS>>(missing);
        let parsed = serde_json::from_str::<Items<ParsedEntry, MAX_BULK_ITEMS>>(missing);
        assert_eq!(
            raw.expect_err("no event").to_string(),
            parsed.expect_err("no event").to_string()
        );
    }

    /// A publish's trace headers are read as W3C asks, as the call's span
    /// reads them: a `traceparent` given twice is none (outside a traced
    /// span the event carries none), several `tracestate` headers are
    /// joined. Before, the first of each went into the event.
    #[test]
    fn a_published_event_reads_the_trace_headers_as_w3c_asks() {
        const VALID: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut headers = HeaderMap::new();
        headers.append("traceparent", VALID.parse().unwrap());
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        assert_eq!(
            event_trace(&headers),
            (Some(VALID.to_string()), Some("a=1,b=2".to_string()))
        );
        headers.append("traceparent", VALID.parse().unwrap());
        assert_eq!(event_trace(&headers), (None, None));
    }
}
