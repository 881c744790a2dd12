//! The Open API routes: edit a namespace's draft items, release the draft.
//! Every call needs `Authorization: {token}`.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::stall::{wait_out, Stall};
use super::{lock, AppState, DraftItem, NamespaceId, Route, ENV};

type NamespacePath = (String, String, String, String);
type ItemPath = (String, String, String, String, String);

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({"status": status.as_u16(), "message": message})),
    )
        .into_response()
}

/// Checks the token and the environment; the namespace id of the path.
fn admit(
    app: &AppState,
    headers: &HeaderMap,
    env: &str,
    ns: NamespaceId,
) -> Result<NamespaceId, Box<Response>> {
    let expected = lock(&app.shared.open_api_token).clone();
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if expected.is_none() || given != expected.as_deref() {
        return Err(Box::new(error(StatusCode::UNAUTHORIZED, "Unauthorized")));
    }
    if !env.eq_ignore_ascii_case(ENV) {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("env {env} does not exist"),
        )));
    }
    if !lock(&app.shared.data).namespaces.contains_key(&ns) {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            &format!("namespace {} not found", ns.2),
        )));
    }
    Ok(ns)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ItemBody {
    key: String,
    value: String,
    #[serde(default)]
    data_change_created_by: Option<String>,
    #[serde(default)]
    data_change_last_modified_by: Option<String>,
}

/// `PUT …/items/{key}?createIfNotExists=true`
pub(super) async fn put_item(
    State(app): State<AppState>,
    Path((env, app_id, cluster, namespace, key)): Path<ItemPath>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Option<Json<ItemBody>>,
) -> Response {
    app.shared.count(Route::OpenApiItems);
    let ns = match admit(&app, &headers, &env, (app_id, cluster, namespace)) {
        Ok(ns) => ns,
        Err(refused) => return *refused,
    };
    wait_out(&app, Stall::ItemBefore(key.clone())).await;
    if app.shared.item_fails(&key) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "item edit failed (test fault)",
        );
    }
    let Some(Json(body)) = body else {
        return error(StatusCode::BAD_REQUEST, "a JSON item is required");
    };
    if body.key != key {
        return error(
            StatusCode::BAD_REQUEST,
            "the item's key differs from the path's",
        );
    }
    let Some(modified_by) = body.data_change_last_modified_by.filter(|u| !u.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "dataChangeLastModifiedBy is required",
        );
    };
    let create = query.get("createIfNotExists").is_some_and(|v| v == "true");
    if let Some(refused) = put_in_draft(
        &app,
        &ns,
        &key,
        &body.value,
        create,
        modified_by,
        body.data_change_created_by,
    ) {
        return refused;
    }
    wait_out(&app, Stall::ItemAfter(key.clone())).await;
    Json(json!({"key": key, "value": body.value})).into_response()
}

/// Puts `key` = `value` in the draft of `ns`; the refusal, if any.
fn put_in_draft(
    app: &AppState,
    ns: &NamespaceId,
    key: &str,
    value: &str,
    create: bool,
    modified_by: String,
    created_by: Option<String>,
) -> Option<Response> {
    let mut data = lock(&app.shared.data);
    let Some(namespace) = data.namespaces.get_mut(ns) else {
        return Some(error(StatusCode::NOT_FOUND, "namespace not found"));
    };
    match namespace.draft.get_mut(key) {
        Some(item) => {
            item.value = value.to_string();
            item.modified_by = modified_by;
        }
        None if create => {
            let created_by = created_by.unwrap_or_else(|| modified_by.clone());
            let item = DraftItem {
                value: value.to_string(),
                created_by,
                modified_by,
            };
            namespace.draft.insert(key.to_string(), item);
        }
        None => {
            return Some(error(
                StatusCode::NOT_FOUND,
                &format!("item {key} not found"),
            ))
        }
    }
    None
}

/// `DELETE …/items/{key}?operator={user}`
pub(super) async fn delete_item(
    State(app): State<AppState>,
    Path((env, app_id, cluster, namespace, key)): Path<ItemPath>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    app.shared.count(Route::OpenApiItems);
    let ns = match admit(&app, &headers, &env, (app_id, cluster, namespace)) {
        Ok(ns) => ns,
        Err(refused) => return *refused,
    };
    wait_out(&app, Stall::ItemBefore(key.clone())).await;
    if app.shared.item_fails(&key) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "item edit failed (test fault)",
        );
    }
    if query.get("operator").is_none_or(|o| o.is_empty()) {
        return error(StatusCode::BAD_REQUEST, "operator is required");
    }
    let removed = lock(&app.shared.data)
        .namespaces
        .get_mut(&ns)
        .and_then(|n| n.draft.remove(&key));
    wait_out(&app, Stall::ItemAfter(key.clone())).await;
    match removed {
        Some(_) => StatusCode::OK.into_response(),
        None => error(StatusCode::NOT_FOUND, &format!("item {key} not found")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReleaseBody {
    #[serde(default)]
    release_title: Option<String>,
    #[serde(default)]
    released_by: Option<String>,
}

/// `POST …/namespaces/{namespace}/releases`
pub(super) async fn release(
    State(app): State<AppState>,
    Path((env, app_id, cluster, namespace)): Path<NamespacePath>,
    headers: HeaderMap,
    body: Option<Json<ReleaseBody>>,
) -> Response {
    app.shared.count(Route::OpenApiReleases);
    let ns = match admit(
        &app,
        &headers,
        &env,
        (app_id.clone(), cluster.clone(), namespace.clone()),
    ) {
        Ok(ns) => ns,
        Err(refused) => return *refused,
    };
    let Some(Json(body)) = body else {
        return error(StatusCode::BAD_REQUEST, "a JSON release is required");
    };
    let (Some(title), Some(by)) = (
        body.release_title.filter(|t| !t.is_empty()),
        body.released_by.filter(|b| !b.is_empty()),
    ) else {
        return error(
            StatusCode::BAD_REQUEST,
            "releaseTitle and releasedBy are required",
        );
    };
    let released = app.shared.release_draft(&ns, &title, &by);
    wait_out(&app, Stall::ReleaseAfter).await;
    if let Some(status) = app.shared.release_answer() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        return error(status, "released, then the answer failed (test fault)");
    }
    match released {
        Some(record) => Json(json!({
            "appId": app_id,
            "clusterName": cluster,
            "namespaceName": namespace,
            "name": record.title,
            "configurations": record.configurations,
            "dataChangeCreatedBy": record.released_by,
        }))
        .into_response(),
        None => error(StatusCode::NOT_FOUND, "namespace not found"),
    }
}
