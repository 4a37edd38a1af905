//! Generates the gRPC code from `proto/` with protox (pure Rust, no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
        "proto/raftlock/peer.proto",
        "proto/raftlock/v1/lock.proto",
    ];
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
