//! Dapr's configuration route: `GET /v1.0/configuration/{store}?key=a&key=b`
//! (also under `/v1.0-alpha1`), answering `{"a": {"value", "version",
//! "metadata"}}`. No `key` means every key. `group` and `label` query
//! parameters narrow the query for stores that have them (Layotto's model);
//! the answer holds only the items of exactly that group and label (none
//! when not given: the keys themselves, not their labelled variants).
//!
//! Dapr's configuration subscriptions over HTTP:
//! `GET /v1.0/configuration/{store}/subscribe?key=a&key=b` answers
//! `{"id": "..."}`, then each change is posted to the app
//! ([`ConfigUpdates`]); `GET /v1.0/configuration/{store}/{id}/unsubscribe`
//! answers `{"ok": true}`, or as Dapr a 500 with `{"message"}` (Dapr's
//! `UnsubscribeConfigurationResponse` with `ok` false, left out as empty)
//! (both also under `/v1.0-alpha1`). A subscription delivers the items
//! with no group and no label, as Dapr's.

use std::collections::{BTreeMap, HashMap};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use rewire_runtime::{echoed, ConfigItem, ConfigQuery};

use super::error::HttpError;
use super::input::{query_pairs, query_value, request_metadata, QueryPairs};
use super::path_params::PathParams;
use crate::app::config_updates::{CloseError, ConfigUpdates, OpenError};
use crate::app::AppProtocol;
use crate::dapr::{json_string_bytes, Call, ConfigOpError, ResponseBudget};
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
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
) -> Result<Response, HttpError> {
    let store = call.config_store(&store_name)?;
    let pairs = query_pairs(query)?;
    let query = config_query(&pairs, &store_name)?;
    let budget = ResponseBudget::new(state.options.max_response_bytes);
    // The items of exactly the group and label asked for (none: the keys
    // themselves, not their grouped or labelled variants).
    let items = store.get_dapr(&query, budget).await?;
    if items.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // The budget above counts the items' bytes; written as JSON, a
    // control character takes six.
    let mut written = ResponseBudget::new(state.options.max_response_bytes);
    for item in &items {
        written
            .take(json_bytes(item))
            .map_err(|source| ConfigOpError::TooLarge {
                store: store_name.clone(),
                source,
            })?;
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

/// What `item` takes in the JSON answer (punctuation counted generously).
fn json_bytes(item: &ConfigItem) -> usize {
    let metadata: usize = item
        .metadata
        .iter()
        .map(|(key, value)| json_string_bytes(key) + json_string_bytes(value) + 2)
        .sum();
    json_string_bytes(&item.key)
        + json_string_bytes(&item.value)
        + json_string_bytes(&item.version)
        + metadata
        + 48
}

/// The query of `key`, `group`, `label` and `metadata.*` parameters.
/// Every `key` is kept, an empty one too (Dapr passes `key=` to the store,
/// which finds no such key): only no `key` parameter at all means every
/// key.
fn config_query(pairs: &[(String, String)], store_name: &str) -> Result<ConfigQuery, HttpError> {
    Ok(ConfigQuery {
        keys: pairs
            .iter()
            .filter(|(k, _)| k == "key")
            .map(|(_, v)| v.clone())
            .collect(),
        group: query_value(pairs, "group").map(str::to_string),
        label: query_value(pairs, "label").map(str::to_string),
        metadata: request_metadata(pairs, ("configuration store", store_name))?,
    })
}

/// The HTTP subscriptions of a router: updates go to the app of the
/// options (if any), until `stop`.
pub(super) fn updates(state: &ApiState, stop: CancellationToken) -> ConfigUpdates {
    ConfigUpdates::new(
        state.options.app_channel.as_ref(),
        stop,
        state.options.max_response_bytes,
        state.metrics.clone(),
    )
}

/// `GET /v1.0/configuration/{store}/subscribe`: `{"id": "..."}`; each
/// change of the keys asked for (all when none) is then posted to the app.
pub async fn subscribe(
    State(state): State<ApiState>,
    Extension(updates): Extension<ConfigUpdates>,
    call: Call,
    PathParams(store_name): PathParams<String>,
    query: QueryPairs,
) -> Result<Response, HttpError> {
    // Dapr's order: the store, then the app channel.
    let store = call.config_store(&store_name)?;
    if !updates.has_app() {
        return Err(no_app_channel(&state));
    }
    let pairs = query_pairs(query)?;
    // Dapr's subscriptions deliver the keys with no group and no label
    // (see `subscription_forward`): `group` and `label` are not for them.
    let query = ConfigQuery {
        group: None,
        label: None,
        ..config_query(&pairs, &store_name)?
    };
    store.check_keys(&query.keys)?;
    let booked = updates.book(&store_name).map_err(|err| match err {
        OpenError::NoAppChannel => no_app_channel(&state),
        too_many @ OpenError::TooMany(_) => HttpError::Api {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "ERR_CONFIGURATION_SUBSCRIBE",
            message: format!("failed to subscribe to configuration store {store_name}: {too_many}"),
        },
    })?;
    let subscription = store.subscribe(query).await?;
    let id = booked.start(subscription);
    Ok(Json(json!({ "id": id })).into_response())
}

/// Dapr's answer to a subscription without an app to post updates to.
fn no_app_channel(state: &ApiState) -> HttpError {
    let grpc = state
        .options
        .app_channel
        .as_ref()
        .is_some_and(|app| app.protocol == AppProtocol::Grpc);
    let mut message =
        "app channel is not initialized. cannot subscribe to configuration updates".to_string();
    if grpc {
        message.push_str(
            " (updates are posted to an HTTP app only; with --app-protocol grpc, subscribe over gRPC)",
        );
    }
    HttpError::Api {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "ERR_APP_CHANNEL_NIL",
        message,
    }
}

/// `GET /v1.0/configuration/{store}/{id}/unsubscribe`: `{"ok": true}`, or,
/// when no such subscription is open on that store, Dapr's 500 with
/// `{"message": "failed to unsubscribe to configuration request {id}: …"}`
/// (no `errorCode`: Dapr encodes its `UnsubscribeConfigurationResponse`).
pub async fn unsubscribe(
    Extension(updates): Extension<ConfigUpdates>,
    call: Call,
    PathParams((store_name, id)): PathParams<(String, String)>,
) -> Result<Response, HttpError> {
    call.config_store(&store_name)?;
    match updates.close(&store_name, &id) {
        Ok(()) => Ok(Json(json!({ "ok": true })).into_response()),
        Err(err) => Ok(unsubscribe_failed(&id, &err)),
    }
}

/// Dapr's 500 with `{"message"}` for a failed unsubscribe, logged at debug
/// level. The id comes from the request path (any text, `%0A` included):
/// the message quotes it as [`echoed`], and the log line shows the message
/// escaped (`?`), so one id can neither forge log lines nor fill them.
fn unsubscribe_failed(id: &str, err: &CloseError) -> Response {
    let message = unsubscribe_failure(id, err);
    tracing::debug!(code = "ERR_CONFIGURATION_UNSUBSCRIBE", message = ?message, "HTTP call failed.");
    let body = Json(json!({ "message": message }));
    (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
}

/// Dapr's message for a failed unsubscribe; an unknown id is told as
/// Dapr's configuration stores (redis, postgres) tell it. The id is
/// quoted as [`echoed`].
fn unsubscribe_failure(id: &str, err: &CloseError) -> String {
    let id = echoed(id);
    let reason = match err {
        CloseError::Unknown(_) => format!("subscription with id {id} does not exist"),
        CloseError::OtherStore { .. } => err.to_string(),
    };
    format!("failed to unsubscribe to configuration request {id}: {reason}")
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// What the log writer wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut written = self.0.lock().unwrap_or_else(|p| p.into_inner());
            written.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `key=` is a key (the store finds none), not "every key"; only no
    /// `key` parameter at all is every key. The subscribe route takes its
    /// keys here too (failed before the fix: `key=` was dropped, so
    /// `subscribe?key=` subscribed to every key).
    #[test]
    fn an_empty_key_is_kept_and_only_no_key_is_every_key() {
        let keys = |query: &[(&str, &str)]| {
            config_query(&pairs(query), "cfg")
                .unwrap_or_else(|e| panic!("{e}"))
                .keys
        };
        assert_eq!(keys(&[("key", "")]), vec![String::new()]);
        assert_eq!(keys(&[("key", ""), ("key", "a")]), vec!["", "a"]);
        assert!(keys(&[("group", "g")]).is_empty());
    }

    /// An unsubscribe id from the path (`%0A` decoded, any length) is
    /// quoted cut in the answer, and its log line is one escaped line of
    /// bounded length (failed before the fix: quoted whole, and logged
    /// raw, so one id could forge log lines).
    #[tokio::test]
    async fn an_unknown_unsubscribe_id_is_answered_cut_and_logged_on_one_line() {
        let forged = "2025-01-01T00:00:00.000000Z  INFO rewire: Reload finished.";
        let id = format!("x\n{forged}\r\n{}", "y".repeat(100_000));
        let captured = Captured::default();
        let writer = captured.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        let response = tracing::subscriber::with_default(subscriber, || {
            unsubscribe_failed(&id, &CloseError::Unknown(echoed(&id).into_owned()))
        });

        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("the body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let message = body["message"].as_str().expect("a message");
        let quoted = echoed(&id);
        assert_eq!(
            message,
            format!(
                "failed to unsubscribe to configuration request {quoted}: subscription with id {quoted} does not exist"
            )
        );
        assert!(message.len() < 1_000, "{} bytes", message.len());

        let written = captured.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let logged = String::from_utf8_lossy(&written);
        let lines: Vec<&str> = logged.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {logged:.500}");
        assert!(
            lines[0].contains("ERR_CONFIGURATION_UNSUBSCRIBE"),
            "{logged:.500}"
        );
        assert!(lines[0].contains(r"x\n2025-01-01"), "{logged:.500}");
        assert!(lines[0].len() < 2_000, "{} bytes", lines[0].len());
    }
}
