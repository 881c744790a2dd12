//! A gRPC request is bounded by what it would hold decoded, not only by
//! its bytes on the wire: prost decodes an empty element (2 bytes on the
//! wire) into a struct of ~100–150 bytes, so a request of empty items is
//! refused with `RESOURCE_EXHAUSTED` naming its decoded size before it is
//! decoded — on the hot path, through tonic's codec, and on a request
//! stream — while large values still pass.

use crate::support::grpc;
use crate::support::sidecar::Sidecar;

use rewire::sidecar::ApiOptions;
use serde_json::json;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::Code;

const MIB: usize = 1 << 20;

/// A message with no fields: 2 bytes on the wire as an element, nothing
/// in memory here (a zero-sized type), a whole struct in the sidecar.
#[derive(Clone, PartialEq, prost::Message)]
struct Nothing {}

/// A state request (`SaveState`, `DeleteBulkState`) of empty items.
#[derive(Clone, PartialEq, prost::Message)]
struct EmptyItems {
    #[prost(string, tag = "1")]
    store_name: String,
    #[prost(message, repeated, tag = "2")]
    states: Vec<Nothing>,
}

/// Layotto's `PutFile` first message with metadata of `entries` keys.
#[derive(Clone, PartialEq, prost::Message)]
struct PutFileMetadata {
    #[prost(string, tag = "1")]
    store_name: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(map = "string, string", tag = "4")]
    metadata: std::collections::HashMap<String, String>,
}

async fn unary<M: prost::Message + Clone + Send + Sync + 'static>(
    sidecar: &Sidecar,
    path: &'static str,
    message: M,
) -> Result<(), tonic::Status> {
    let mut client = tonic::client::Grpc::new(grpc::channel(sidecar.grpc_url()).await);
    client.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<M, ()>::default();
    client
        .unary(
            tonic::Request::new(message),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(|_| ())
}

fn assert_refused_decoded(result: Result<(), tonic::Status>, what: &str) {
    let refused = result.expect_err(what);
    assert_eq!(
        refused.code(),
        Code::ResourceExhausted,
        "{what}: {refused:?}"
    );
    assert!(
        refused.message().contains("once decoded"),
        "{what}: {}",
        refused.message()
    );
}

#[tokio::test]
async fn requests_are_refused_by_what_they_would_hold_decoded() {
    let config = json!({"appId": "shop", "components": {
        "state": {"orders": {"type": "memory"}},
        "file": {"files": {"type": "memory"}}
    }})
    .to_string();
    // 16 MiB of requests held at once, decoded or being read.
    let options = ApiOptions {
        max_request_bytes_in_flight: 16 * MIB,
        ..ApiOptions::default()
    };
    let sidecar = Sidecar::start(&config, options).await;
    // A million empty items: 2 MB on the wire, ~150 MB decoded.
    let empty = EmptyItems {
        store_name: "orders".into(),
        states: vec![Nothing {}; 1_000_000],
    };
    assert!(prost::Message::encoded_len(&empty) < 2 * MIB + 16);
    // On the hot path.
    let saved = unary(
        &sidecar,
        "/dapr.proto.runtime.v1.Dapr/SaveState",
        empty.clone(),
    )
    .await;
    assert_refused_decoded(saved, "SaveState");
    // Through tonic's codec.
    let deleted = unary(
        &sidecar,
        "/dapr.proto.runtime.v1.Dapr/DeleteBulkState",
        empty,
    )
    .await;
    assert_refused_decoded(deleted, "DeleteBulkState");
    // On a request stream: 400,000 metadata keys, ~4 MB on the wire.
    let put = PutFileMetadata {
        store_name: "files".into(),
        name: "a.bin".into(),
        metadata: (0..400_000)
            .map(|i| (format!("{i}"), String::new()))
            .collect(),
    };
    assert!(prost::Message::encoded_len(&put) < 4 * MIB);
    let mut uploader = tonic::client::Grpc::new(grpc::channel(sidecar.grpc_url()).await);
    uploader.ready().await.unwrap();
    let uploaded = uploader
        .client_streaming(
            tonic::Request::new(tokio_stream::iter([put])),
            PathAndQuery::from_static("/spec.proto.runtime.v1.Runtime/PutFile"),
            tonic_prost::ProstCodec::<PutFileMetadata, ()>::default(),
        )
        .await
        .map(|_| ());
    assert_refused_decoded(uploaded, "PutFile");

    // A large value is held at about its size, and passes; the refused
    // requests hold nothing.
    let mut dapr = grpc::dapr_client(sidecar.grpc_url()).await;
    for _ in 0..3 {
        let save = grpc::dapr::SaveStateRequest {
            store_name: "orders".into(),
            states: vec![grpc::common::StateItem {
                key: "big".into(),
                value: vec![7; 3 * MIB],
                ..Default::default()
            }],
        };
        dapr.save_state(save).await.expect("a 3 MiB value saves");
    }
}
