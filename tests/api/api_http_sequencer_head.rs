//! A `HEAD` of a route whose `GET` changes state changes nothing: the
//! sequencer's route hands out no id (a `HEAD` answer has no body, so the
//! id would be spent unseen) and answers as a known route asked with
//! another method does.

use reqwest::{Client, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
use sidecar::Sidecar;

use crate::support::sidecar;

#[tokio::test]
async fn a_head_of_the_sequencer_route_spends_no_id() {
    let config = json!({"appId": "ids-head", "components": {"sequencer": {
        "ids": {"type": "memory"}
    }}});
    let sidecar = Sidecar::start(&config.to_string(), ApiOptions::default()).await;
    let url = format!(
        "{}/v1.0/rewire/sequencer/ids/orders?increment=strong",
        sidecar.http_url()
    );
    let client = Client::new();
    let next = |answer: reqwest::Response| async move {
        assert_eq!(answer.status(), StatusCode::OK);
        let body: Value = answer.json().await.unwrap();
        body["id"].as_i64().unwrap()
    };
    let first = next(client.post(&url).send().await.unwrap()).await;
    let head = client.head(&url).send().await.unwrap().status();
    let second = next(client.get(&url).send().await.unwrap()).await;
    assert_eq!(second, first + 1, "the HEAD spent an id");
    assert_eq!(head, StatusCode::NOT_FOUND);
    sidecar.stop().await;
}
