//! Compiles the sidecar's protos with protox, so no system `protoc` is
//! needed.

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
    tonic_prost_build::configure()
        .build_client(true)
        .build_transport(false)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
