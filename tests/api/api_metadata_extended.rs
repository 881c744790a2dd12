//! Dapr's extended metadata: gRPC `SetMetadata` answers `Empty` and
//! `PUT /v1.0/metadata/{key}` 204 (the body is the value); both APIs'
//! `GetMetadata` then show every entry set by either, beside the
//! sidecar's own `rewire.generation` and `daprRuntimeVersion` (rewire's
//! version, the `runtimeVersion`, as Dapr gives its own in both). An empty
//! key changes nothing, as Dapr; the table is bounded (64 entries, keys of
//! 1 KiB, values of 4 KiB): past a bound is `INVALID_ARGUMENT` / 400
//! `ERR_MALFORMED_REQUEST`, and an existing key can still be changed.
//!
//! What Dapr always sends beside: `actorRuntime` (no actors: `DISABLED`,
//! as Dapr without a placement service) and `appConnectionProperties`
//! (without an app, Dapr's defaults: `http` on `127.0.0.1`, `maxConcurrency`
//! -1, no limit).

use crate::support::grpc;
use crate::support::sidecar;

use std::collections::HashMap;

use grpc::dapr::actor_runtime::ActorRuntimeStatus;
use grpc::dapr::{ActorRuntime, AppConnectionProperties, GetMetadataRequest, SetMetadataRequest};
use reqwest::{Client, StatusCode};
use rewire::sidecar::ApiOptions;
use serde_json::{json, Value};
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
        (
            "daprRuntimeVersion".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
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
    assert_eq!(
        extended.len(),
        66,
        "64 set, rewire.generation and daprRuntimeVersion"
    );
    assert_eq!(extended.get("k0").map(String::as_str), Some("changed"));
    sidecar.stop().await;
}

#[tokio::test]
async fn metadata_always_has_the_runtime_version_actor_runtime_and_app_connection() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    // The sidecar's own entry wins over one a client set, as in Dapr.
    client
        .set_metadata(set("daprRuntimeVersion", "forged"))
        .await
        .expect("SetMetadata failed");

    let http_view: Value = Client::new()
        .get(format!("{}/v1.0/metadata", sidecar.http_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(http_view["runtimeVersion"], version, "{http_view}");
    assert_eq!(
        http_view["extended"]["daprRuntimeVersion"], version,
        "{http_view}"
    );
    assert_eq!(
        http_view["actorRuntime"],
        json!({"runtimeStatus": "DISABLED", "hostReady": false,
               "placement": "placement: disconnected"}),
        "{http_view}"
    );
    assert_eq!(
        http_view["appConnectionProperties"],
        json!({"protocol": "http", "channelAddress": "127.0.0.1", "maxConcurrency": -1}),
        "{http_view}"
    );

    let grpc_view = client
        .get_metadata(GetMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_view.runtime_version, version);
    assert_eq!(
        grpc_view
            .extended_metadata
            .get("daprRuntimeVersion")
            .map(String::as_str),
        Some(version)
    );
    assert_eq!(
        grpc_view.actor_runtime,
        Some(ActorRuntime {
            runtime_status: ActorRuntimeStatus::Disabled.into(),
            active_actors: Vec::new(),
            host_ready: false,
            placement: "placement: disconnected".into(),
        })
    );
    assert_eq!(
        grpc_view.app_connection_properties,
        Some(AppConnectionProperties {
            port: 0,
            protocol: "http".into(),
            channel_address: "127.0.0.1".into(),
            // Dapr's `--app-max-concurrency` default: no limit.
            max_concurrency: -1,
            health: None,
        })
    );
    sidecar.stop().await;
}
