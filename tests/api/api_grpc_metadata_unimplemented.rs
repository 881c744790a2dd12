//! `GetMetadata` lists the app id and the running components with
//! Dapr-style types; a Dapr method outside the served subset
//! (`InvokeService`) answers `UNIMPLEMENTED`.

use crate::support::grpc;
use crate::support::sidecar;

use grpc::dapr::{GetMetadataRequest, GetMetadataResponse};
use rewire::sidecar::ApiOptions;
use sidecar::Sidecar;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::Code;
use tonic_prost::ProstCodec;

const CONFIG: &str = r#"{"appId": "shop", "components": {
    "state": {"orders": {"type": "memory"}},
    "lock": {"locks": {"type": "memory"}},
    "config_store": {"config": {"type": "memory"}}
}}"#;

#[tokio::test]
async fn metadata_lists_the_app_and_its_components() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut client = grpc::dapr_client(sidecar.grpc_url()).await;
    let metadata = client
        .get_metadata(GetMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(metadata.id, "shop");
    let mut components: Vec<(String, String, String)> = metadata
        .registered_components
        .into_iter()
        .map(|c| (c.name, c.r#type, c.version))
        .collect();
    components.sort();
    let expected = [
        ("config", "configuration.memory"),
        ("locks", "lock.memory"),
        ("orders", "state.memory"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string(), "v1".to_string()))
        .collect();
    assert_eq!(components, expected);
    assert_eq!(
        metadata
            .extended_metadata
            .get("rewire.generation")
            .map(String::as_str),
        Some("1")
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn methods_outside_the_subset_are_unimplemented() {
    let sidecar = Sidecar::start(CONFIG, ApiOptions::default()).await;
    let mut raw = tonic::client::Grpc::new(grpc::channel(sidecar.grpc_url()).await);
    let codec: ProstCodec<GetMetadataRequest, GetMetadataResponse> = ProstCodec::default();
    for method in ["InvokeService", "InvokeBinding"] {
        let path = PathAndQuery::try_from(format!("/dapr.proto.runtime.v1.Dapr/{method}")).unwrap();
        raw.ready().await.expect("not ready");
        let status = raw
            .unary(
                tonic::Request::new(GetMetadataRequest {}),
                path,
                codec.clone(),
            )
            .await
            .expect_err("not served");
        assert_eq!(status.code(), Code::Unimplemented, "{method}: {status:?}");
    }
    sidecar.stop().await;
}
