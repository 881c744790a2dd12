//! A get or delete of one key holding Dapr's `||` separator is refused, as
//! Dapr refuses it (its keys are `{appId}||{key}`; locks share a server
//! as `lock||{appId}||{resource}`, sequencers as `sequencer|||{key}`): a
//! 400 `ERR_MALFORMED_REQUEST` over HTTP (the GET's hot path and its
//! router alike, and DELETE), `INVALID_ARGUMENT` over gRPC (the hot path
//! and tonic alike, Dapr's and Layotto's front doors), with Dapr's rich
//! error details: `ErrorInfo` `DAPR_STATE_ILLEGAL_KEY`, the store's
//! `ResourceInfo` and a `BadRequest` naming the key.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::common::StateItem;
use grpc::dapr::{DeleteStateRequest, GetStateRequest, SaveStateRequest};
use grpc::layotto;
use layotto::runtime_client::RuntimeClient;
use reqwest::StatusCode;
use rewire::sidecar::ApiOptions;
use serde_json::Value;
use sidecar::Sidecar;
use tonic::{Code, Request, Status};
use tonic_types::{ErrorDetail, StatusExt};

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

/// Another app's lock and a sequencer's counter, as a state key.
const KEYS: [&str; 2] = ["lock||other-app||order-1", "sequencer|||k"];

/// `message`, sent through tonic when `through_tonic` (else the hot path).
fn request<T>(message: T, through_tonic: bool) -> Request<T> {
    let mut request = Request::new(message);
    if through_tonic {
        let identity = "identity".parse().expect("encoding");
        request.metadata_mut().insert("grpc-encoding", identity);
    }
    request
}

async fn refused_as_malformed(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{what}");
    let body: Value = response.json().await.expect("a JSON error");
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST", "{what}: {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("can't contain `||`"), "{what}: {body}");
    // In Dapr's order (`InvalidKeyName`): BadRequest, ResourceInfo,
    // ErrorInfo.
    let details = &body["details"];
    assert_eq!(
        details[0]["@type"], "type.googleapis.com/google.rpc.BadRequest",
        "{what}: {body}"
    );
    assert_eq!(details[1]["resource_type"], "state", "{what}: {body}");
    assert_eq!(details[1]["resource_name"], "orders", "{what}: {body}");
    assert_eq!(
        details[2]["reason"], "DAPR_STATE_ILLEGAL_KEY",
        "{what}: {body}"
    );
    assert_eq!(details[2]["domain"], "dapr.io", "{what}: {body}");
    assert_eq!(details.as_array().map(Vec::len), Some(3), "{what}: {body}");
}

/// `status` carries Dapr's illegal-key details for `key` of `orders`.
fn illegal_key_details(status: &Status, key: &str, what: &str) {
    let info = status.get_details_error_info();
    let info = info.unwrap_or_else(|| panic!("{what}: no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, "DAPR_STATE_ILLEGAL_KEY", "{what}");
    assert_eq!(info.domain, "dapr.io", "{what}");
    let resource = status.get_details_resource_info();
    let resource = resource.unwrap_or_else(|| panic!("{what}: no ResourceInfo"));
    assert_eq!(
        (
            resource.resource_type.as_str(),
            resource.resource_name.as_str()
        ),
        ("state", "orders"),
        "{what}"
    );
    let bad = status.get_details_bad_request();
    let field = bad.and_then(|b| b.field_violations.into_iter().next());
    assert_eq!(field.map(|f| f.field).as_deref(), Some(key), "{what}");
    // In Dapr's order (`InvalidKeyName`): BadRequest, ResourceInfo,
    // ErrorInfo.
    let details = status.get_error_details_vec();
    assert!(
        matches!(
            details.as_slice(),
            [
                ErrorDetail::BadRequest(_),
                ErrorDetail::ResourceInfo(_),
                ErrorDetail::ErrorInfo(_)
            ]
        ),
        "{what}: {details:?}"
    );
}

#[tokio::test]
async fn http_get_and_delete_refuse_a_key_with_the_separator() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let base = sidecar.http_url();
    let client = reqwest::Client::new();
    for key in KEYS {
        let encoded = key.replace('|', "%7C");
        // Plain: the GET's hot path; percent-encoded: the router.
        for path in [key.to_string(), encoded.clone()] {
            let url = format!("{base}/v1.0/state/orders/{path}");
            let response = client.get(&url).send().await.unwrap();
            refused_as_malformed(response, &format!("GET {path}")).await;
            let response = client.delete(&url).send().await.unwrap();
            refused_as_malformed(response, &format!("DELETE {path}")).await;
        }
    }
    // A key without the separator is still read and deleted.
    let url = format!("{base}/v1.0/state/orders/a|b");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = client.delete(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_get_and_delete_refuse_a_key_with_the_separator() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    let mut layotto = RuntimeClient::new(grpc::channel(sidecar.grpc_url()).await);
    for key in KEYS {
        for through_tonic in [false, true] {
            let how = if through_tonic { "tonic" } else { "hot path" };
            let get = GetStateRequest {
                store_name: "orders".into(),
                key: key.into(),
                ..GetStateRequest::default()
            };
            let status = dapr
                .get_state(request(get, through_tonic))
                .await
                .expect_err("GetState of a key with `||`");
            assert_eq!(status.code(), Code::InvalidArgument, "GetState, {how}");
            assert!(
                status.message().contains("can't contain `||`"),
                "{status:?}"
            );
            illegal_key_details(&status, key, &format!("GetState, {how}"));

            let delete = DeleteStateRequest {
                store_name: "orders".into(),
                key: key.into(),
                ..DeleteStateRequest::default()
            };
            let status = dapr
                .delete_state(request(delete, through_tonic))
                .await
                .expect_err("DeleteState of a key with `||`");
            assert_eq!(status.code(), Code::InvalidArgument, "DeleteState, {how}");

            let get = layotto::GetStateRequest {
                store_name: "orders".into(),
                key: key.into(),
                ..layotto::GetStateRequest::default()
            };
            let status = layotto
                .get_state(request(get, through_tonic))
                .await
                .expect_err("Layotto GetState of a key with `||`");
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "Layotto GetState, {how}"
            );

            let delete = layotto::DeleteStateRequest {
                store_name: "orders".into(),
                key: key.into(),
                ..layotto::DeleteStateRequest::default()
            };
            let status = layotto
                .delete_state(request(delete, through_tonic))
                .await
                .expect_err("Layotto DeleteState of a key with `||`");
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "Layotto DeleteState, {how}"
            );
        }
        let bulk = layotto::DeleteBulkStateRequest {
            store_name: "orders".into(),
            states: vec![layotto::StateItem {
                key: key.into(),
                ..layotto::StateItem::default()
            }],
        };
        let status = layotto
            .delete_bulk_state(bulk)
            .await
            .expect_err("Layotto DeleteBulkState of a key with `||`");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "Layotto DeleteBulkState"
        );
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn grpc_save_state_of_a_key_with_the_separator_carries_dapr_error_details() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    for through_tonic in [false, true] {
        let how = if through_tonic { "tonic" } else { "hot path" };
        let save = SaveStateRequest {
            store_name: "orders".into(),
            states: vec![StateItem {
                key: "a||b".into(),
                value: b"1".to_vec(),
                ..StateItem::default()
            }],
        };
        let status = dapr
            .save_state(request(save, through_tonic))
            .await
            .expect_err("SaveState of a key with `||`");
        assert_eq!(status.code(), Code::InvalidArgument, "SaveState, {how}");
        illegal_key_details(&status, "a||b", &format!("SaveState, {how}"));
    }
    sidecar.stop().await;
}
