//! Compiles the sidecar's protos with protox, so no system `protoc` is
//! needed, and keeps their descriptors (without comments) for the check
//! of a request's decoded size (`grpc::decoded`).

use std::path::PathBuf;

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dapr/proto/common/v1/common.proto",
        "proto/dapr/proto/runtime/v1/appcallback.proto",
        "proto/dapr/proto/runtime/v1/pubsub.proto",
        "proto/dapr/proto/runtime/v1/dapr.proto",
        "proto/rewire/lifecycle/v1/lifecycle.proto",
        "proto/layotto/runtime/v1/appcallback.proto",
        "proto/layotto/runtime/v1/runtime.proto",
        "proto/layotto/runtime/v1/lifecycle.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    let mut schemas = descriptors.clone();
    for file in &mut schemas.file {
        file.source_code_info = None;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("request_schemas.bin"), schemas.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_transport(false)
        .build_server(true)
        // prost's decoding, after the decoded-size check of a call's request.
        .codec_path("crate::grpc::checked_codec::CheckedCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
