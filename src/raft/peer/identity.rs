//! Who sends a peer request: the cluster and member ID every peer RPC
//! carries in its metadata, stamped by [`PeerIdentity`] on the asking side
//! and checked by `gate::PeerGate` on the answering side.
//!
//! Invariant: the keys and their hex encoding are part of the peer
//! protocol; members of different versions must agree on them.

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The metadata key carrying the sender's cluster ID (hex).
pub const CLUSTER_ID_KEY: &str = "raftlock-cluster-id";
/// The metadata key carrying the sender's member ID (hex).
pub const MEMBER_ID_KEY: &str = "raftlock-member-id";

/// Who this member is, stamped on every peer request it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    pub cluster_id: u64,
    pub member_id: u64,
}

impl tonic::service::Interceptor for PeerIdentity {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let md = req.metadata_mut();
        md.insert(CLUSTER_ID_KEY, hex_value(self.cluster_id));
        md.insert(MEMBER_ID_KEY, hex_value(self.member_id));
        Ok(req)
    }
}

fn hex_value(id: u64) -> MetadataValue<tonic::metadata::Ascii> {
    format!("{id:x}").parse().expect("hex digits are valid metadata")
}
