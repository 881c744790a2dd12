//! The config service routes: `/configs` and the `/notifications/v2` long
//! poll, with access-key signature checks and fault switches.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::hmac::hmac_sha1;
use super::{AppState, Fault, NamespaceId, Route};

/// Apollo refuses signatures older (or newer) than this.
const SIGNATURE_WINDOW_MS: i64 = 60_000;

/// `GET /configs/{appId}/{cluster}/{namespace}?releaseKey=..`
pub(super) async fn configs(
    State(app): State<AppState>,
    Path((app_id, cluster, namespace)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    app.shared.count(Route::Configs);
    app.shared.record_config_request(super::ConfigRequest {
        namespace: namespace.clone(),
        release_key: query.get("releaseKey").cloned(),
        messages: query.get("messages").cloned(),
    });
    if let Err(refused) = check_signature(&app, &app_id, &headers, &uri) {
        return *refused;
    }
    if let Some(faulted) = fault(&app, Route::Configs).await {
        return faulted;
    }
    // Apollo serves `application.properties` as `application`.
    let ns: NamespaceId = (
        app_id.clone(),
        cluster.clone(),
        filter_namespace_name(&namespace).to_string(),
    );
    let messages = query.get("messages").map(String::as_str);
    let Some(current) = app.shared.served_of(&ns, messages) else {
        let message = format!(
            "Could not load configurations with appId: {app_id}, clusterName: {cluster}, namespace: {namespace}"
        );
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"status": 404, "message": message})),
        )
            .into_response();
    };
    if query.get("releaseKey") == Some(&current.release_key) {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    Json(json!({
        "appId": app_id,
        "cluster": cluster,
        "namespaceName": namespace,
        "configurations": current.configurations,
        "releaseKey": current.release_key,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Watched {
    namespace_name: String,
    notification_id: i64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Notified {
    namespace_name: String,
    notification_id: i64,
    messages: serde_json::Value,
}

/// Counts a held long poll while it lives.
struct HeldPoll<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> HeldPoll<'a> {
    fn new(counter: &'a std::sync::atomic::AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for HeldPoll<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `GET /notifications/v2?appId=..&cluster=..&notifications=[..]`: answers
/// at once if a watched namespace has a newer release message, else holds
/// the request until a release or the hold timeout (304).
pub(super) async fn notifications(
    State(app): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    app.shared.count(Route::Notifications);
    let (Some(app_id), Some(cluster), Some(text)) = (
        query.get("appId"),
        query.get("cluster"),
        query.get("notifications"),
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            "appId, cluster and notifications are required",
        )
            .into_response();
    };
    let watched = match serde_json::from_str::<Vec<Watched>>(text) {
        Ok(list) if !list.is_empty() => list,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                format!("Invalid format of notifications: {text}"),
            )
                .into_response()
        }
    };
    if let Err(refused) = check_signature(&app, app_id, &headers, &uri) {
        return *refused;
    }
    if let Some(faulted) = fault(&app, Route::Notifications).await {
        return faulted;
    }
    let mut released = app.shared.released.subscribe();
    let hold = *super::lock(&app.shared.hold);
    let deadline = tokio::time::Instant::now() + hold;
    let mut held = None;
    loop {
        let notified = newer(&app, app_id, cluster, &watched);
        if !notified.is_empty() {
            if held.is_some() {
                app.shared
                    .held_polls_notified
                    .fetch_add(1, Ordering::SeqCst);
            }
            return Json(notified).into_response();
        }
        held.get_or_insert_with(|| HeldPoll::new(&app.shared.outstanding_polls));
        tokio::select! {
            changed = released.changed() => {
                if changed.is_err() {
                    return StatusCode::NOT_MODIFIED.into_response();
                }
            }
            () = tokio::time::sleep_until(deadline) => return StatusCode::NOT_MODIFIED.into_response(),
            () = app.stop.cancelled() => return StatusCode::NOT_MODIFIED.into_response(),
        }
    }
}

/// `namespace` without a `.properties` suffix (any case), as Apollo's
/// `NamespaceUtil.filterNamespaceName` strips it from the names in
/// `/configs` and `/notifications/v2` requests. The long poll answers with
/// the stripped name: the suffix is not restored.
fn filter_namespace_name(namespace: &str) -> &str {
    const SUFFIX: &str = ".properties";
    let cut = namespace.len().saturating_sub(SUFFIX.len());
    match namespace.get(cut..) {
        Some(tail) if cut > 0 && tail.eq_ignore_ascii_case(SUFFIX) => &namespace[..cut],
        _ => namespace,
    }
}

/// The watched namespaces whose latest release message (a release, or
/// its deletion) is newer than the
/// client's notification id (names answered without `.properties`).
fn newer(app: &AppState, app_id: &str, cluster: &str, watched: &[Watched]) -> Vec<Notified> {
    watched
        .iter()
        .filter_map(|w| {
            let name = filter_namespace_name(&w.namespace_name).to_string();
            let ns = (app_id.to_string(), cluster.to_string(), name.clone());
            let latest = app.shared.message_id_of(&ns)?;
            (latest > w.notification_id).then(|| {
                let watch_key = format!("{app_id}+{cluster}+{name}");
                Notified {
                    namespace_name: name,
                    notification_id: latest,
                    messages: json!({"details": {watch_key: latest}}),
                }
            })
        })
        .collect()
}

/// Checks the access-key signature when the server requires one.
fn check_signature(
    app: &AppState,
    app_id: &str,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<(), Box<Response>> {
    let Some(secret) = super::lock(&app.shared.secret).clone() else {
        return Ok(());
    };
    let refuse = |why: &str| {
        app.shared
            .signatures_rejected
            .fetch_add(1, Ordering::SeqCst);
        Err(Box::new(
            (StatusCode::UNAUTHORIZED, why.to_string()).into_response(),
        ))
    };
    let header_text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let Some(timestamp) = header_text("Timestamp") else {
        return refuse("missing Timestamp");
    };
    let Ok(millis) = timestamp.parse::<i64>() else {
        return refuse("bad Timestamp");
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    if (now - millis).abs() > SIGNATURE_WINDOW_MS {
        return refuse("Timestamp out of window");
    }
    let Some(authorization) = header_text(header::AUTHORIZATION.as_str()) else {
        return refuse("missing Authorization");
    };
    let Some((signer, signature)) = authorization
        .strip_prefix("Apollo ")
        .and_then(|rest| rest.split_once(':'))
    else {
        return refuse("Authorization is not `Apollo appId:signature`");
    };
    if signer != app_id {
        return refuse("Authorization names another app");
    }
    let path_with_query = uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or_else(|| uri.path());
    let expected = hmac_sha1(
        secret.as_bytes(),
        format!("{timestamp}\n{path_with_query}").as_bytes(),
    );
    if base64::engine::general_purpose::STANDARD.encode(expected) != signature {
        return refuse("signature mismatch");
    }
    app.shared
        .signatures_verified
        .fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The answer a faulted route gives instead of its own, if any.
async fn fault(app: &AppState, route: Route) -> Option<Response> {
    match app.shared.fault(route)? {
        Fault::ServerError => {
            Some((StatusCode::INTERNAL_SERVER_ERROR, "injected failure").into_response())
        }
        Fault::MalformedJson => Some(
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                r#"{"appId": "checkout", "configurations": {"#,
            )
                .into_response(),
        ),
        Fault::Oversized(bytes) => Some(
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                vec![b' '; bytes],
            )
                .into_response(),
        ),
        Fault::Hang => {
            let mut faults = app.shared.faults.subscribe();
            tokio::select! {
                _ = faults.wait_for(|f| f.get(&route) != Some(&Fault::Hang)) => None,
                () = app.stop.cancelled() => Some(StatusCode::SERVICE_UNAVAILABLE.into_response()),
            }
        }
    }
}
