//! etcd's Cluster service. MemberList is served here; membership changes
//! (add, remove, update, promote) belong to the cluster-operations work and
//! answer `Unimplemented` until then, rather than pretend.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{error, header};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::cluster_server::{Cluster, ClusterServer};
use crate::server::{MemberInfo, Node};

pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn server(node: Arc<Node>) -> ClusterServer<ClusterService> {
        ClusterServer::new(ClusterService { node })
    }
}

pub fn member(m: MemberInfo) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("raftlock: {what} is not supported by this version"))
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(&self, _: Request<pb::MemberAddRequest>) -> Result<Response<pb::MemberAddResponse>, Status> {
        Err(not_yet("member add"))
    }

    async fn member_remove(
        &self,
        _: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        Err(not_yet("member remove"))
    }

    async fn member_update(
        &self,
        _: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        Err(not_yet("member update"))
    }

    async fn member_list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        if req.into_inner().linearizable {
            self.node.read_barrier().await.map_err(error::server)?;
        }
        let members = self.node.members().into_iter().map(member).collect();
        Ok(Response::new(pb::MemberListResponse { header: header(&self.node, self.node.revision()), members }))
    }

    async fn member_promote(
        &self,
        _: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        Err(not_yet("member promote"))
    }
}
