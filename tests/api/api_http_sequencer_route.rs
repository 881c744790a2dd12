//! The sequencer route hands out an id on every call: `POST` is accepted
//! (as well as `GET`, for existing clients), and no answer may be cached.

use reqwest::{Client, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

use crate::support::sidecar;

#[tokio::test]
async fn next_ids_by_post_and_get_are_never_cached() {
    let config = json!({"appId": "ids-route", "components": {"sequencer": {
        "ids": {"type": "memory"}
    }}});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let url = format!(
        "{}/v1.0/rewire/sequencer/ids/orders?increment=strong",
        sidecar.http_url()
    );
    let client = Client::new();
    let mut last = 0;
    for post in [true, false, true] {
        let request = if post {
            client.post(&url)
        } else {
            client.get(&url)
        };
        let reply = request.send().await.unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "post: {post}");
        assert_eq!(
            reply.headers().get("cache-control").map(|v| v.as_bytes()),
            Some(&b"no-store"[..]),
            "post: {post}"
        );
        let body: Value = reply.json().await.unwrap();
        let id = body["id"].as_i64().unwrap();
        assert!(id > last, "{id} after {last}");
        last = id;
    }
    // Refusals are not cached either; a key past 1 KiB is one.
    let long = format!(
        "{}/v1.0/rewire/sequencer/ids/{}",
        sidecar.http_url(),
        "k".repeat(1025)
    );
    let refused = client.post(&long).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        refused.headers().get("cache-control").map(|v| v.as_bytes()),
        Some(&b"no-store"[..])
    );
    let body: Value = refused.json().await.unwrap();
    assert!(body.to_string().contains("1024"), "{body}");
    sidecar.stop().await;
}
