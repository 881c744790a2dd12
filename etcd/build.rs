//! Compiles etcd's v3 API protos with protox, so no system `protoc` is
//! needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/etcd/api/etcdserverpb/rpc.proto",
        "proto/etcd/api/mvccpb/kv.proto",
        "proto/etcd/api/authpb/auth.proto",
        "proto/etcd/api/versionpb/version.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
