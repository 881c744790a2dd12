//! Dapr's extended metadata: gRPC `SetMetadata` answers `Empty` and
//! `PUT /v1.0/metadata/{key}` 204 (the body is the value); both APIs'
//! `GetMetadata` then show every entry set by either, beside the
//! sidecar's own `rewire.generation`. An empty key changes nothing, as
//! Dapr; the table is bounded (64 entries, keys of 1 KiB, values of
//! 4 KiB): past a bound is `INVALID_ARGUMENT` / 400
//! `ERR_MALFORMED_REQUEST`, and an existing key can still be changed.

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use grpc::dapr::{GetMetadataRequest, SetMetadataRequest};
use reqwest::{Client, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::Value;
use sidecar::Sidecar;
use tonic::Code;

const CONFIG: &str =
    r#"{"appId": "shop", "components": {"state": {"orders": {"type": "memory"}}}}"#;

fn set(key: &str, value: &str) -> SetMetadataRequest {
    SetMetadataRequest {
        key: key.into(),
        value: value.into(),
    }
}

#[tokio::test]
async fn metadata_set_over_either_api_is_shown_by_both() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let http = Client::new();
    let base = sidecar.http_url();

    client
        .set_metadata(set("cliPID", "4242"))
        .await
        .expect("SetMetadata failed");
    client
        .set_metadata(set("", "ignored"))
        .await
        .expect("an empty key is a no-op");
    let response = http
        .put(format!("{base}/v1.0/metadata/appCommand"))
        .body("python3 app.py")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    let grpc_view = client
        .get_metadata(GetMetadataRequest {})
        .await
        .unwrap()
        .into_inner()
        .extended_metadata;
    let expected = HashMap::from([
        ("cliPID".to_string(), "4242".to_string()),
        ("appCommand".to_string(), "python3 app.py".to_string()),
        ("rewire.generation".to_string(), "1".to_string()),
    ]);
    assert_eq!(grpc_view, expected);
    let http_view: Value = http
        .get(format!("{base}/v1.0/metadata"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(http_view["extended"]["cliPID"], "4242", "{http_view}");
    assert_eq!(
        http_view["extended"]["appCommand"], "python3 app.py",
        "{http_view}"
    );
    assert_eq!(http_view["extended"]["rewire.generation"], "1");
    sidecar.stop().await;
}

#[tokio::test]
async fn extended_metadata_is_bounded() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let http = Client::new();
    let base = sidecar.http_url();

    let long_value = "v".repeat(4097);
    let status = client
        .set_metadata(set("big", &long_value))
        .await
        .expect_err("a value over 4 KiB");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("4096"), "{status:?}");
    let response = http
        .put(format!("{base}/v1.0/metadata/big"))
        .body(long_value)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_MALFORMED_REQUEST", "{body}");

    let status = client
        .set_metadata(set(&"k".repeat(1025), "v"))
        .await
        .expect_err("a key over 1 KiB");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    for i in 0..64 {
        client
            .set_metadata(set(&format!("k{i}"), "v"))
            .await
            .expect("under the entry limit");
    }
    let status = client
        .set_metadata(set("k64", "v"))
        .await
        .expect_err("a 65th entry");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("64"), "{status:?}");
    let response = http
        .put(format!("{base}/v1.0/metadata/k65"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // An existing key can still change.
    let response = http
        .put(format!("{base}/v1.0/metadata/k0"))
        .body("changed")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let extended = client
        .get_metadata(GetMetadataRequest {})
        .await
        .unwrap()
        .into_inner()
        .extended_metadata;
    assert_eq!(extended.len(), 65, "64 set and rewire.generation");
    assert_eq!(extended.get("k0").map(String::as_str), Some("changed"));
    sidecar.stop().await;
}
