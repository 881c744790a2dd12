//! The Dapr configuration route over HTTP (`/v1.0/configuration/{store}`
//! and the alpha1 path), against a `memory` config store.

use crate::support::sidecar;

use reqwest::{Client, Response, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

const CONFIG: &str = r#"{"appId": "shop", "components": {"config_store": {
    "settings": {"type": "memory", "metadata": {"items": {"greeting": "hello", "limits": {"max": 3}, "mode": "fast"}}}
}}}"#;

async fn body_json(response: Response) -> Value {
    response.json().await.expect("not JSON")
}

async fn get(client: &Client, url: String) -> Response {
    client.get(url).send().await.expect("request failed")
}

#[tokio::test]
async fn get_keys_in_dapr_shape_on_both_paths() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    for prefix in ["v1.0", "v1.0-alpha1"] {
        let url = format!(
            "{}/{prefix}/configuration/settings?key=greeting&key=limits",
            sidecar.http_url()
        );
        let response = get(&client, url).await;
        assert_eq!(response.status(), StatusCode::OK, "{prefix}");
        let items = body_json(response).await;
        let items = items.as_object().expect("not an object");
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items["greeting"]["value"], "hello");
        assert_eq!(items["limits"]["value"], r#"{"max":3}"#);
        assert!(items["greeting"]["version"].is_string(), "{items:?}");
    }

    // No key: every key.
    let all = get(
        &client,
        format!("{}/v1.0/configuration/settings", sidecar.http_url()),
    )
    .await;
    let all = body_json(all).await;
    assert_eq!(all.as_object().map(|o| o.len()), Some(3), "{all}");
    assert_eq!(all["mode"]["value"], "fast");

    // Only unknown keys: nothing found, 204 as in Dapr.
    let none = get(
        &client,
        format!(
            "{}/v1.0/configuration/settings?key=nope",
            sidecar.http_url()
        ),
    )
    .await;
    assert_eq!(none.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

/// An empty `key=` is a key like any other, as Dapr passes it to the
/// store: `?key=` finds nothing (204, Dapr's `respondWithEmpty`), and
/// `?key=&key=mode` finds only `mode`; only no `key` at all is every key
/// (failed before the fix: empty values were dropped, so `?key=` answered
/// the whole store).
#[tokio::test]
async fn an_empty_key_parameter_is_a_key_not_every_key() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let base = format!("{}/v1.0/configuration/settings", sidecar.http_url());
    let empty = get(&client, format!("{base}?key=")).await;
    assert_eq!(empty.status(), StatusCode::NO_CONTENT);
    assert_eq!(empty.text().await.expect("body"), "");
    let one = body_json(get(&client, format!("{base}?key=&key=mode")).await).await;
    assert_eq!(one.as_object().map(|o| o.len()), Some(1), "{one}");
    assert_eq!(one["mode"]["value"], "fast");
    sidecar.stop().await;
}

/// Dapr's current answer (`Configuration(name).StoreNotFound()`): 500
/// (failed before the fix: 400, Dapr's answer before its standardized
/// configuration errors).
#[tokio::test]
async fn unknown_store_is_a_dapr_error() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let response = get(
        &client,
        format!("{}/v1.0/configuration/apollo?key=a", sidecar.http_url()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(response).await,
        json!({"errorCode": "ERR_CONFIGURATION_STORE_NOT_FOUND", "message": "configuration store apollo not found"})
    );
    sidecar.stop().await;
}

/// Dapr's requests carry no group or label: the get of every key and the
/// get of `host` both answer the key itself, not its `prod` variant.
/// Failed before the fix: the get of every key answered `host=b`.
#[tokio::test]
async fn get_ignores_labelled_variants_on_etcd() {
    let etcd = testkit::etcd::EtcdServer::start().await;
    let config = format!(
        r#"{{"appId": "shop", "components": {{"config_store": {{"cfg": {{"type": "etcd",
            "metadata": {{"endpoints": "{}", "keyPrefix": "/config/"}}}}}}}}}}"#,
        etcd.endpoint()
    );
    let sidecar = Sidecar::start(&config, ApiOptions::default()).await;
    let store = sidecar.runtime.config_store("cfg").load().unwrap();
    for (label, value) in [(None, "a"), (Some("prod"), "b")] {
        let item = rewire::ConfigItem {
            key: "host".into(),
            value: value.into(),
            label: label.map(str::to_string),
            ..rewire::ConfigItem::default()
        };
        store.set(vec![item]).await.expect("set failed");
    }
    let client = Client::new();
    for query in ["", "?key=host"] {
        let url = format!("{}/v1.0/configuration/cfg{query}", sidecar.http_url());
        let response = get(&client, url).await;
        assert_eq!(response.status(), StatusCode::OK, "{query}");
        let items = body_json(response).await;
        assert_eq!(
            items.as_object().map(|o| o.len()),
            Some(1),
            "{query}: {items}"
        );
        assert_eq!(items["host"]["value"], "a", "{query}: {items}");
    }
    // Asked for by label (rewire's own parameter), the variant itself.
    let url = format!("{}/v1.0/configuration/cfg?label=prod", sidecar.http_url());
    let items = body_json(get(&client, url).await).await;
    assert_eq!(items.as_object().map(|o| o.len()), Some(1), "{items}");
    assert_eq!(items["host"]["value"], "b", "{items}");
    sidecar.stop().await;
}

/// No configuration store at all: Dapr's 500
/// `ERR_CONFIGURATION_STORE_NOT_CONFIGURED` (failed before the fix: 400
/// `ERR_CONFIGURATION_STORE_NOT_FOUND`).
#[tokio::test]
async fn no_configuration_store_at_all_is_not_configured() {
    let sidecar = Sidecar::start(
        r#"{"appId": "shop", "components": {}}"#,
        ApiOptions::default(),
    )
    .await;
    let client = Client::new();
    let response = get(
        &client,
        format!("{}/v1.0/configuration/cfg?key=a", sidecar.http_url()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(response).await["errorCode"],
        "ERR_CONFIGURATION_STORE_NOT_CONFIGURED"
    );
    sidecar.stop().await;
}

/// Keys past the sidecar's bounds (10,000 keys; the byte bound, 512 KiB,
/// is past what a URI holds) are a 400 `ERR_MALFORMED_REQUEST` naming the store and the
/// limit. Failed before the fix: every key was taken.
#[tokio::test]
async fn keys_past_the_sidecars_bounds_are_malformed_requests() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    // (A URI holds at most 64 KiB: the same short key, many times.)
    let many = "&key=a".repeat(10_001);
    {
        let (keys, limit) = (many.as_str(), "10000");
        let url = format!(
            "{}/v1.0/configuration/settings?{}",
            sidecar.http_url(),
            &keys[1..]
        );
        let response = get(&client, url).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let error = body_json(response).await;
        assert_eq!(error["errorCode"], "ERR_MALFORMED_REQUEST");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("configuration store `settings`") && message.contains(limit),
            "{message}"
        );
    }
    sidecar.stop().await;
}
