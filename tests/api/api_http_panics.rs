//! A panic under an HTTP call (here, in a state store's code) is answered
//! 500 with Dapr's JSON error, on the state GET's hot path and through the
//! router alike; the connection stays usable, the sidecar keeps serving,
//! and `/metrics` counts the calls with their 500.

use crate::support::sidecar;

use reqwest::{Client, StatusCode};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use serde_json::{json, Value};
use sidecar::Sidecar;

/// A state store whose every call panics.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.api.panicking_state")]
struct PanickingState {}

#[async_trait]
impl Component for PanickingState {}

#[async_trait]
impl StateStore for PanickingState {
    async fn get(&self, _: GetRequest) -> Result<Option<StateEntry>, StateError> {
        panic!("test store: get panics");
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        panic!("test store: set panics");
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        panic!("test store: delete panics");
    }
}

const CONFIG: &str = r#"{"appId": "shop", "components": {"state": {
    "boom": {"type": "test.api.panicking_state"},
    "orders": {"type": "memory"}
}}}"#;

#[tokio::test]
async fn a_panicking_handler_is_answered_500_and_counted() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    // One connection for every call: a panic must not cost it.
    let client = Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let url = format!("{}/v1.0/state/boom", sidecar.http_url());

    // The hot path (a plain key), then two routes of the router.
    let get = client.get(format!("{url}/k")).send().await.unwrap();
    let save = client
        .post(&url)
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    let delete = client.delete(format!("{url}/k")).send().await.unwrap();
    for (operation, answer) in [
        ("GetState", get),
        ("SaveState", save),
        ("DeleteState", delete),
    ] {
        assert_eq!(
            answer.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{operation}"
        );
        let body: Value = answer.json().await.expect("a JSON error");
        assert_eq!(body["errorCode"], "ERR_INTERNAL", "{operation}: {body}");
        assert_eq!(
            body["message"],
            format!("{operation} failed: the sidecar's handler panicked"),
            "{body}"
        );
    }

    // The sidecar goes on serving.
    let saved = client
        .post(format!("{}/v1.0/state/orders", sidecar.http_url()))
        .json(&json!([{"key": "k", "value": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::NO_CONTENT);
    let metrics = client
        .get(format!("{}/metrics", sidecar.http_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for operation in ["GetState", "SaveState", "DeleteState"] {
        let counted = format!(
            r#"rewire_requests_total{{api="http",method="{operation}",store="boom",code="500"}} 1"#
        );
        assert!(metrics.contains(&counted), "no `{counted}` in\n{metrics}");
    }
    sidecar.stop().await;
}
