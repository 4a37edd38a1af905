//! Generates the gRPC code from `proto/` with protox (pure Rust, no `protoc`),
//! and names the compiler for `raftlock --version`.

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
    let encoded = prost::Message::encode_to_vec(&descriptors);
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    // serde for the HTTP/JSON gateway, in etcd's gateway's encoding: proto
    // field names, defaults left out, unknown fields ignored.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[".mvccpb", ".authpb", ".etcdserverpb", ".v3lockpb", ".v3electionpb", ".raftlock.v1"])?;
    println!("cargo:rerun-if-changed=proto");
    // The compiler that built raftlock, for `raftlock --version`. The commit
    // comes from RAFTLOCK_GIT_SHA when the build sets it (scripts/release.sh
    // does): read here, not from .git, so that a commit alone rebuilds nothing.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown".to_string(), |v| v.trim().to_string());
    println!("cargo:rustc-env=RAFTLOCK_RUSTC_VERSION={version}");
    println!("cargo:rerun-if-env-changed=RAFTLOCK_GIT_SHA");
    Ok(())
}
