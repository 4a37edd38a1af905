//! Code generated from `proto/` by `build.rs`: etcd's v3 API (wire-compatible
//! with etcd v3.5), raftlock's native lock API (`raftlock.v1`) and its
//! internal peer protocol; and for the public APIs, serde code in protobuf's
//! JSON mapping (pbjson) for the HTTP/JSON gateway.
#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
pub mod raftlock {
    pub mod peer {
        tonic::include_proto!("raftlock.peer");
    }
    pub mod v1 {
        tonic::include_proto!("raftlock.v1");
        include!(concat!(env!("OUT_DIR"), "/raftlock.v1.serde.rs"));
    }
}
