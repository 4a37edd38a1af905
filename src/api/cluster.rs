//! etcd's Cluster service: MemberList, and the membership changes MemberAdd,
//! MemberRemove, MemberUpdate and MemberPromote (run by the leader, see
//! `raft::cluster::membership`). A change answers once this member has the new
//! configuration, so the member list in the response includes it.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{auth, error, header};
use crate::node::{MemberInfo, MembershipChange, Node};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::cluster_server::{Cluster, ClusterServer};

pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    pub fn server(node: Arc<Node>) -> super::served::Served<ClusterServer<ClusterService>> {
        super::served::Served(
            ClusterServer::new(ClusterService { node })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
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

impl ClusterService {
    fn members(&self) -> Vec<pb::Member> {
        self.node.members().into_iter().map(member).collect()
    }

    async fn change(&self, change: MembershipChange) -> Result<u64, Status> {
        self.node.change_membership(change).await.map_err(error::membership)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(&self, req: Request<pb::MemberAddRequest>) -> Result<Response<pb::MemberAddResponse>, Status> {
        auth::admin(&self.node, &req).await?;
        let req = req.into_inner();
        let change = MembershipChange::Add { peer_urls: req.peer_ur_ls.clone(), is_learner: req.is_learner };
        let id = self.change(change).await?;
        let members = self.members();
        let added = members.iter().find(|m| m.id == id).cloned().unwrap_or(pb::Member {
            id,
            name: String::new(),
            peer_ur_ls: req.peer_ur_ls,
            client_ur_ls: vec![],
            is_learner: req.is_learner,
        });
        let header = header(&self.node, self.node.revision());
        Ok(Response::new(pb::MemberAddResponse { header, member: Some(added), members }))
    }

    async fn member_remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        auth::admin(&self.node, &req).await?;
        let id = req.into_inner().id;
        self.change(MembershipChange::Remove { id }).await?;
        let header = header(&self.node, self.node.revision());
        // Without the removed member even where it has not applied its
        // removal yet (the member removed, asked to remove itself).
        let members = self.members().into_iter().filter(|m| m.id != id).collect();
        Ok(Response::new(pb::MemberRemoveResponse { header, members }))
    }

    async fn member_update(
        &self,
        req: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        auth::admin(&self.node, &req).await?;
        let req = req.into_inner();
        self.change(MembershipChange::Update { id: req.id, peer_urls: req.peer_ur_ls }).await?;
        let header = header(&self.node, self.node.revision());
        Ok(Response::new(pb::MemberUpdateResponse { header, members: self.members() }))
    }

    async fn member_list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        if req.into_inner().linearizable {
            self.node.read_barrier().await.map_err(error::server)?;
        }
        Ok(Response::new(pb::MemberListResponse {
            header: header(&self.node, self.node.revision()),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        auth::admin(&self.node, &req).await?;
        self.change(MembershipChange::Promote { id: req.into_inner().id }).await?;
        let header = header(&self.node, self.node.revision());
        Ok(Response::new(pb::MemberPromoteResponse { header, members: self.members() }))
    }
}
