//! etcd's `v3lockpb.Lock` (Lock, Unlock) and `v3electionpb.Election`
//! (Campaign, Proclaim, Leader, Observe, Resign), as adapters over the
//! server-side recipes in `crate::locks`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use super::{auth, error, header};
use crate::locks::election::{self, LeaderKey};
use crate::locks::queue_prefix;
use crate::locks::stats::Grants;
use crate::locks::{self, mutex};
use crate::model::auth::PermKind;
use crate::node::Node;
use crate::proto::v3electionpb as epb;
use crate::proto::v3electionpb::election_server::{Election, ElectionServer};
use crate::proto::v3lockpb as lpb;
use crate::proto::v3lockpb::lock_server::{Lock, LockServer};

pub struct LockService {
    node: Arc<Node>,
    grants: Arc<Grants>,
}

impl LockService {
    pub fn server(node: Arc<Node>, grants: Arc<Grants>) -> super::served::Served<LockServer<LockService>> {
        super::served::Served(
            LockServer::new(LockService { node, grants })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, req: Request<lpb::LockRequest>) -> Result<Response<lpb::LockResponse>, Status> {
        let arrived = Instant::now();
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        auth::check_prefix(&self.node, &caller, &queue_prefix(&req.name)).map_err(denied)?;
        auth::check_lease(&self.node, &caller, req.lease).map_err(denied)?;
        let (held, revision) = mutex::lock(self.node.clone(), &req.name, req.lease).await.map_err(error::v3_recipe)?;
        granted(&self.grants, &self.node, "v3lock", arrived, &held.key, held.create_revision);
        Ok(Response::new(lpb::LockResponse { header: header(&self.node, revision), key: held.key }))
    }

    async fn unlock(&self, req: Request<lpb::UnlockRequest>) -> Result<Response<lpb::UnlockResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let key = req.into_inner().key;
        self.node.state().auth().check(&caller, &key, &[], PermKind::Write).map_err(denied)?;
        let revision = locks::turn::delete(&self.node, &key).await.map_err(error::v3_recipe)?;
        Ok(Response::new(lpb::UnlockResponse { header: header(&self.node, revision) }))
    }
}

/// etcd runs its lock and election services through a client of its own,
/// which hands auth's refusals on as gRPC code Unknown with the message.
fn denied(e: crate::model::auth::AuthError) -> Status {
    error::v3_recipe(locks::RecipeError::Denied(e))
}

/// Proclaim and Resign compare and write the leader's key.
fn check_leader_key(node: &Node, caller: &crate::model::auth::Caller, key: &[u8]) -> Result<(), Status> {
    auth::check_read_write(node, caller, key, &[]).map_err(denied)
}

/// Leader and Observe read the election's keys.
fn check_read_prefix(node: &Node, caller: &crate::model::auth::Caller, name: &[u8]) -> Result<(), Status> {
    let prefix = queue_prefix(name);
    node.state().auth().check(caller, &prefix, &locks::prefix_end(&prefix), PermKind::Read).map_err(denied)
}

pub struct ElectionService {
    node: Arc<Node>,
    grants: Arc<Grants>,
}

impl ElectionService {
    pub fn server(node: Arc<Node>, grants: Arc<Grants>) -> super::served::Served<ElectionServer<ElectionService>> {
        super::served::Served(
            ElectionServer::new(ElectionService { node, grants })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

fn leader_key(k: Option<epb::LeaderKey>) -> Result<LeaderKey, Status> {
    let k = k.ok_or_else(error::no_leader_key)?;
    Ok(LeaderKey { name: k.name, key: k.key, rev: k.rev, lease: k.lease })
}

type ObserveStream = Pin<Box<dyn futures::Stream<Item = Result<epb::LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(&self, req: Request<epb::CampaignRequest>) -> Result<Response<epb::CampaignResponse>, Status> {
        let arrived = Instant::now();
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        auth::check_prefix(&self.node, &caller, &queue_prefix(&req.name)).map_err(denied)?;
        auth::check_lease(&self.node, &caller, req.lease).map_err(denied)?;
        let (l, revision) =
            election::campaign(self.node.clone(), &req.name, req.lease, &req.value).await.map_err(error::v3_recipe)?;
        granted(&self.grants, &self.node, "election", arrived, &l.key, l.rev);
        let leader = epb::LeaderKey { name: l.name, key: l.key, rev: l.rev, lease: l.lease };
        Ok(Response::new(epb::CampaignResponse { header: header(&self.node, revision), leader: Some(leader) }))
    }

    async fn proclaim(&self, req: Request<epb::ProclaimRequest>) -> Result<Response<epb::ProclaimResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        let leader = leader_key(req.leader)?;
        check_leader_key(&self.node, &caller, &leader.key)?;
        let revision = election::proclaim(&self.node, &leader, &req.value).await.map_err(error::v3_recipe)?;
        Ok(Response::new(epb::ProclaimResponse { header: header(&self.node, revision) }))
    }

    async fn leader(&self, req: Request<epb::LeaderRequest>) -> Result<Response<epb::LeaderResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let name = req.into_inner().name;
        check_read_prefix(&self.node, &caller, &name)?;
        let kv = election::leader(&self.node, &name).await.map_err(error::v3_recipe)?;
        let kv = Some(super::kv::key_value(kv));
        Ok(Response::new(epb::LeaderResponse { header: header(&self.node, self.node.revision()), kv }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(&self, req: Request<epb::LeaderRequest>) -> Result<Response<ObserveStream>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let name = req.into_inner().name;
        check_read_prefix(&self.node, &caller, &name)?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let node = self.node.clone();
        tokio::spawn(async move {
            let outcome = election::observe(&node, &name, &tx, |kv| {
                let revision = node.revision();
                Ok(epb::LeaderResponse { header: header(&node, revision), kv: Some(super::kv::key_value(kv)) })
            })
            .await;
            if let Err(e) = outcome {
                let _ = tx.send(Err(error::v3_recipe(e))).await;
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn resign(&self, req: Request<epb::ResignRequest>) -> Result<Response<epb::ResignResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let leader = leader_key(req.into_inner().leader)?;
        check_leader_key(&self.node, &caller, &leader.key)?;
        let revision = election::resign(&self.node, &leader).await.map_err(error::v3_recipe)?;
        Ok(Response::new(epb::ResignResponse { header: header(&self.node, revision) }))
    }
}

/// Count a grant made by `api` for a request that arrived at `arrived`: the
/// grant latency, and the grant among this member's holders.
pub(super) fn granted(grants: &Grants, node: &Node, api: &str, arrived: Instant, key: &[u8], token: i64) {
    crate::base::metrics::metrics().lock_grant.with_label_values(&[api]).observe(arrived.elapsed().as_secs_f64());
    grants.granted(key, token, node.state());
}
