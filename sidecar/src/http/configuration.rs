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

use rewire_runtime::{ConfigItem, ConfigQuery};

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
fn config_query(pairs: &[(String, String)], store_name: &str) -> Result<ConfigQuery, HttpError> {
    Ok(ConfigQuery {
        keys: pairs
            .iter()
            .filter(|(k, v)| k == "key" && !v.is_empty())
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
    if let Err(err) = updates.close(&store_name, &id) {
        let message = unsubscribe_failure(&id, &err);
        tracing::debug!(code = "ERR_CONFIGURATION_UNSUBSCRIBE", %message, "HTTP call failed.");
        let body = Json(json!({ "message": message }));
        return Ok((StatusCode::INTERNAL_SERVER_ERROR, body).into_response());
    }
    Ok(Json(json!({ "ok": true })).into_response())
}

/// Dapr's message for a failed unsubscribe; an unknown id is told as
/// Dapr's configuration stores (redis, postgres) tell it.
fn unsubscribe_failure(id: &str, err: &CloseError) -> String {
    let reason = match err {
        CloseError::Unknown(_) => format!("subscription with id {id} does not exist"),
        CloseError::OtherStore { .. } => err.to_string(),
    };
    format!("failed to unsubscribe to configuration request {id}: {reason}")
}
