//! Code generated from `proto/` by `build.rs`: etcd's v3 API (wire-compatible
//! with etcd v3.5), raftlock's native lock API (`raftlock.v1`) and its
//! internal peer protocol.
#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}
pub mod raftlock {
    pub mod peer {
        tonic::include_proto!("raftlock.peer");
    }
    pub mod v1 {
        tonic::include_proto!("raftlock.v1");
    }
}
