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

/// A sequencer out of room for another key (its high-water file full)
/// refuses a valid request as 429 (Dapr's answer to resource exhaustion),
/// not as the caller's 400; keys it holds go on.
#[tokio::test]
async fn a_sequencer_out_of_room_answers_429() {
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks.json");
    // 8,400 keys of 1,000 bytes: past the 8 MiB where new keys stop.
    let full: serde_json::Map<String, Value> = (0..8_400)
        .map(|n| (format!("{n:01000}"), json!(5)))
        .collect();
    std::fs::write(&marks, serde_json::to_vec(&full).unwrap()).unwrap();
    let config = json!({"appId": "ids-full", "components": {"sequencer": {
        "ids": {"type": "memory", "metadata": {"highWaterFile": marks.display().to_string()}}
    }}});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let url = |key: &str| format!("{}/v1.0/rewire/sequencer/ids/{key}", sidecar.http_url());
    let client = Client::new();
    let refused = client.post(url("new")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_SEQUENCER_GET_NEXT_ID", "{body}");
    assert!(body["message"].as_str().unwrap().contains("full"), "{body}");
    let known = client
        .post(url(&format!("{:01000}", 7)))
        .send()
        .await
        .unwrap();
    assert_eq!(known.status(), StatusCode::OK);
    let body: Value = known.json().await.unwrap();
    assert_eq!(body["id"], 6, "{body}");
    sidecar.stop().await;
}

/// An id past 2^53 is exact as text: `nextId` (a JSON number there reads
/// rounded as a double, two ids as one).
#[tokio::test]
async fn an_id_past_two_to_the_53_is_exact_as_text() {
    let config = json!({"appId": "big-ids", "components": {"sequencer": {
        "ids": {"type": "memory", "metadata": {"biggerThan": {"k": 9007199254740992_i64}}}
    }}});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let url = format!("{}/v1.0/rewire/sequencer/ids/k", sidecar.http_url());
    let client = Client::new();
    let mut texts = Vec::new();
    for _ in 0..2 {
        let body: Value = client
            .post(&url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let text = body["nextId"].as_str().expect("nextId as text").to_string();
        assert_eq!(text.parse::<i64>().ok(), body["id"].as_i64(), "{body}");
        texts.push(text.parse::<i64>().unwrap());
    }
    assert!(texts[0] > 9007199254740992, "{texts:?}");
    assert_eq!(texts[1], texts[0] + 1, "{texts:?}");
    sidecar.stop().await;
}
