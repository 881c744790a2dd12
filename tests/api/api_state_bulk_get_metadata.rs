//! A bulk get passes its request metadata to every get, as Dapr does: over
//! HTTP the body's `metadata` merged with the query's `metadata.*` (which
//! win), over gRPC `GetBulkStateRequest.metadata` (on the hot path and
//! through tonic alike). An HTTP body without `keys` answers `[]`, as
//! Dapr's.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::BTreeMap;

use grpc::dapr::GetBulkStateRequest;
use reqwest::{Client, StatusCode};
use rewire::prelude::*;
use rewire::sidecar::ApiOptions;
use rewire::{DeleteRequest, GetRequest, SetRequest, StateEntry, StateError};
use serde_json::{json, Value};
use sidecar::Sidecar;
use tonic::Request;

/// A state store whose every key holds the metadata it was read with, as
/// a JSON object.
#[derive(rewire::Component)]
#[component(kind = "state", type = "test.api.metadata_echo")]
struct MetadataEcho {}

#[async_trait]
impl Component for MetadataEcho {}

#[async_trait]
impl StateStore for MetadataEcho {
    async fn get(&self, req: GetRequest) -> Result<Option<StateEntry>, StateError> {
        let sorted: BTreeMap<_, _> = req.metadata.into_iter().collect();
        Ok(Some(StateEntry {
            data: serde_json::to_vec(&sorted).unwrap_or_default(),
            etag: "1".into(),
            metadata: Default::default(),
        }))
    }
    async fn set(&self, _: SetRequest) -> Result<(), StateError> {
        Ok(())
    }
    async fn delete(&self, _: DeleteRequest) -> Result<(), StateError> {
        Ok(())
    }
}

const CONFIG: &str = r#"{"appId": "shop", "components": {"state": {
    "echo": {"type": "test.api.metadata_echo"}
}}}"#;

#[tokio::test]
async fn http_bulk_get_passes_body_and_query_metadata_to_every_get() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let client = Client::new();
    let url = format!(
        "{}/v1.0/state/echo/bulk?metadata.partitionKey=from-query&metadata.q=1",
        sidecar.http_url()
    );
    let body = json!({
        "keys": ["a", "b"],
        "metadata": {"partitionKey": "from-body", "b": "2"}
    });
    let response = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let items: Value = response.json().await.unwrap();
    let expected = json!({"b": "2", "partitionKey": "from-query", "q": "1"});
    for (index, key) in ["a", "b"].into_iter().enumerate() {
        assert_eq!(items[index]["key"], key, "{items}");
        assert_eq!(items[index]["data"], expected, "{items}");
    }

    // No metadata at all: the store's own bulk read (here, empty metadata).
    let plain = format!("{}/v1.0/state/echo/bulk", sidecar.http_url());
    let response = client
        .post(&plain)
        .json(&json!({"keys": ["a"]}))
        .send()
        .await
        .unwrap();
    let items: Value = response.json().await.unwrap();
    assert_eq!(items[0]["data"], json!({}), "{items}");

    // No keys: an empty answer, as Dapr's.
    let response = client.post(&plain).json(&json!({})).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.unwrap(), json!([]));
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_bulk_get_passes_request_metadata_to_every_get() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    for through_tonic in [false, true] {
        let mut request = Request::new(GetBulkStateRequest {
            store_name: "echo".into(),
            keys: vec!["a".into(), "b".into()],
            parallelism: 0,
            metadata: [("partitionKey".to_string(), "p".to_string())].into(),
        });
        if through_tonic {
            let identity = "identity".parse().expect("encoding");
            request.metadata_mut().insert("grpc-encoding", identity);
        }
        let items = client.get_bulk_state(request).await.unwrap().into_inner();
        assert_eq!(items.items.len(), 2);
        for item in items.items {
            assert_eq!(item.data, br#"{"partitionKey":"p"}"#, "{through_tonic}");
        }
    }
    sidecar.stop().await;
}
