//! Dapr's configuration subscriptions over HTTP: `GET
//! /v1.0/configuration/{store}/subscribe` answers `{"id"}`, then each change
//! is posted to the app (a small server in the test) at
//! `/configuration/{store}/{key}` with Dapr's body, also after the store is
//! rebuilt by a hot reload, until `GET .../{id}/unsubscribe`; a failing or
//! hanging app route holds up no other update; without an app channel, or
//! for an unknown store or id, Dapr's errors.

use crate::support::grpc::PATIENCE;
use crate::support::sidecar::Sidecar;

use std::path::Path;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{StatusCode as AppStatus, Uri};
use reqwest::{Client, StatusCode};
use rewire::config::parse;
use rewire::sidecar::app::AppChannel;
use rewire::sidecar::ApiOptions;
use rewire::ConfigItem;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const CONFIG: &str = r#"{"appId": "shop", "components": {"config_store": {"config": {"type": "memory",
    "metadata": {"items": {"color": "red", "size": "L", "other": "x"}}}}}}"#;

/// A POST the app got: its path and JSON body.
type Got = (String, Value);

/// The app: records every request; `/configuration/config/bad` answers
/// 500, `/configuration/config/slow` never answers.
async fn start_app() -> (AppChannel, mpsc::UnboundedReceiver<Got>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |uri: Uri, body: Bytes| {
        let tx = tx.clone();
        async move {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let path = uri.path().to_string();
            let _ = tx.send((path.clone(), body));
            match path.as_str() {
                "/configuration/config/bad" => AppStatus::INTERNAL_SERVER_ERROR,
                "/configuration/config/slow" => std::future::pending().await,
                _ => AppStatus::OK,
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let channel = AppChannel::local(listener.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (channel, rx)
}

async fn start_with_app() -> (Sidecar, mpsc::UnboundedReceiver<Got>) {
    let (channel, rx) = start_app().await;
    let options = ApiOptions {
        app_channel: Some(channel),
        ..ApiOptions::default()
    };
    (Sidecar::start(CONFIG, options).await, rx)
}

/// The next POST the app gets (within the patience).
async fn next_post(rx: &mut mpsc::UnboundedReceiver<Got>) -> Got {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("a POST within the patience")
        .expect("app alive")
}

async fn call(client: &Client, url: String) -> (StatusCode, Value) {
    let response = client.get(url).send().await.expect("request failed");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn subscribe(client: &Client, sidecar: &Sidecar, prefix: &str, query: &str) -> String {
    let url = format!(
        "{}/{prefix}/configuration/config/subscribe{query}",
        sidecar.http_url()
    );
    let (status, body) = call(client, url).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["id"].as_str().expect("an id").to_string();
    assert_eq!(body, json!({ "id": id }));
    id
}

async fn set(sidecar: &Sidecar, key: &str, value: &str) {
    let store = sidecar.runtime.config_store("config").load().unwrap();
    let item = ConfigItem {
        key: key.into(),
        value: value.into(),
        ..ConfigItem::default()
    };
    store.set(vec![item]).await.expect("set failed");
}

fn write_json(path: &Path, json: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, json).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

/// Asserts `(path, body)` is the update of `key` to `value` by `id`.
fn assert_update(got: &Got, id: &str, key: &str, value: &str) {
    assert_eq!(got.0, format!("/configuration/config/{key}"), "{got:?}");
    assert_eq!(got.1["id"], id, "{got:?}");
    let items = got.1["items"].as_object().expect("items");
    assert_eq!(items.len(), 1, "only the changed key: {got:?}");
    assert_eq!(items[key]["value"], value, "{got:?}");
}

#[tokio::test]
async fn changes_are_posted_to_the_app_across_a_reload_until_unsubscribed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    let (sidecar, mut rx) = start_with_app().await;
    let client = Client::new();

    let id = subscribe(&client, &sidecar, "v1.0", "?key=color&key=size").await;
    set(&sidecar, "other", "ignored").await;
    set(&sidecar, "color", "blue").await;
    assert_update(&next_post(&mut rx).await, &id, "color", "blue");

    // Rebuild the store (memory → file, same name): the subscription
    // follows it.
    write_json(&file, r#"{"color": "green", "size": "L"}"#);
    let candidate = json!({"appId": "shop", "components": {"config_store": {"config": {
        "type": "file", "metadata": {"path": file, "pollIntervalMs": 100}}}}});
    let candidate = parse(candidate.to_string().as_bytes()).unwrap();
    sidecar
        .runtime
        .apply(candidate)
        .await
        .expect("reload failed");
    assert_update(&next_post(&mut rx).await, &id, "color", "green");
    write_json(&file, r#"{"color": "yellow", "size": "L"}"#);
    assert_update(&next_post(&mut rx).await, &id, "color", "yellow");

    // Unsubscribe (alpha1 path), then a subscription of `size` only: a
    // change of both keys reaches the app once, by the new subscription.
    let unsubscribe = format!(
        "{}/v1.0-alpha1/configuration/config/{id}/unsubscribe",
        sidecar.http_url()
    );
    assert_eq!(
        call(&client, unsubscribe.clone()).await,
        (StatusCode::OK, json!({"ok": true}))
    );
    let sizes = subscribe(&client, &sidecar, "v1.0-alpha1", "?key=size").await;
    write_json(&file, r#"{"color": "black", "size": "XL"}"#);
    assert_update(&next_post(&mut rx).await, &sizes, "size", "XL");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "nothing posted for the ended subscription"
    );

    // The id is gone: Dapr's answer, its `UnsubscribeConfigurationResponse`
    // with `ok` false (left out) and no `errorCode`.
    assert_eq!(
        call(&client, unsubscribe).await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"message": format!(
                "failed to unsubscribe to configuration request {id}: \
                 subscription with id {id} does not exist"
            )})
        )
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_failing_or_hanging_app_route_holds_up_no_other_update() {
    let (sidecar, mut rx) = start_with_app().await;
    let client = Client::new();
    let slow = subscribe(&client, &sidecar, "v1.0", "?key=slow").await;
    let all = subscribe(&client, &sidecar, "v1.0", "?key=bad&key=size").await;

    // The app never answers this one.
    set(&sidecar, "slow", "1").await;
    assert_update(&next_post(&mut rx).await, &slow, "slow", "1");
    // The app answers 500: logged, not retried.
    set(&sidecar, "bad", "1").await;
    assert_update(&next_post(&mut rx).await, &all, "bad", "1");
    // The next change of that subscription is posted all the same.
    set(&sidecar, "size", "M").await;
    assert_update(&next_post(&mut rx).await, &all, "size", "M");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "the refused update was not retried");
    sidecar.stop().await;
}

#[tokio::test]
async fn without_an_app_channel_or_store_dapr_errors() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    for prefix in ["v1.0", "v1.0-alpha1"] {
        let url = format!(
            "{}/{prefix}/configuration/config/subscribe?key=color",
            sidecar.http_url()
        );
        assert_eq!(
            call(&client, url).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"errorCode": "ERR_APP_CHANNEL_NIL",
                       "message": "app channel is not initialized. cannot subscribe to configuration updates"})
            ),
            "{prefix}"
        );
        // The store is checked first, as in Dapr.
        for path in ["apollo/subscribe", "apollo/some-id/unsubscribe"] {
            let url = format!("{}/{prefix}/configuration/{path}", sidecar.http_url());
            assert_eq!(
                call(&client, url).await,
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"errorCode": "ERR_CONFIGURATION_STORE_NOT_FOUND",
                           "message": "configuration store apollo not found"})
                ),
                "{prefix} {path}"
            );
        }
        let url = format!(
            "{}/{prefix}/configuration/config/config-nope/unsubscribe",
            sidecar.http_url()
        );
        assert_eq!(
            call(&client, url).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"message": "failed to unsubscribe to configuration request config-nope: \
                                   subscription with id config-nope does not exist"})
            ),
            "{prefix}"
        );
    }
    sidecar.stop().await;
}

/// A subscription keeps its keys for as long as it is open: keys past the
/// sidecar's bounds (10,000 keys; the byte bound, 512 KiB, is past what a URI holds) are
/// a 400 `ERR_MALFORMED_REQUEST` naming the store and the limit, on both
/// paths. Failed before the fix: the subscription opened with every key.
#[tokio::test]
async fn keys_past_the_sidecars_bounds_are_malformed_requests() {
    let (sidecar, _rx) = start_with_app().await;
    let client = Client::new();
    // (A URI holds at most 64 KiB: the same short key, many times.)
    let many = "&key=a".repeat(10_001);
    for prefix in ["v1.0", "v1.0-alpha1"] {
        {
            let (keys, limit) = (many.as_str(), "10000");
            let url = format!(
                "{}/{prefix}/configuration/config/subscribe?{}",
                sidecar.http_url(),
                &keys[1..]
            );
            let (status, body) = call(&client, url).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{prefix}: {body}");
            assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST", "{body}");
            let message = body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("configuration store `config`") && message.contains(limit),
                "{message}"
            );
        }
    }
    // Within them, a subscription opens.
    let keys: String = (0..1_000).map(|i| format!("&key=k{i}")).collect();
    subscribe(&client, &sidecar, "v1.0", &format!("?{}", &keys[1..])).await;
    sidecar.stop().await;
}
