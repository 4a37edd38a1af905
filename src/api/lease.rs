//! etcd's Lease service: Grant, Revoke, KeepAlive (a stream), TimeToLive, Leases.
//!
//! Grant and Revoke are replicated commands. KeepAlive and TimeToLive are
//! answered by the leader, which alone keeps lease time (a follower forwards
//! them). A granted TTL below the floor (1.5 election timeouts, rounded up to
//! a second) is raised to it, as etcd does; the lease ID is the client's, or a
//! random one the server picks.
//!
//! Auth: Grant needs nothing; Revoke needs WRITE on every attached key
//! (checked by apply); KeepAlive WRITE and TimeToLive READ on every
//! attached key (checked here).

use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{auth, error, header};
use crate::model::auth::PermKind;
use crate::model::lease::MAX_LEASE_TTL;
use crate::node::Node;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::lease_server::{Lease, LeaseServer};

pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    pub fn server(node: Arc<Node>) -> super::served::Served<LeaseServer<LeaseService>> {
        super::served::Served(
            LeaseServer::new(LeaseService { node })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

type KeepAliveStream = Pin<Box<dyn futures::Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        // Refused before proposing; apply checks again (`auth::checks`).
        self.node.state().auth().check_user(&caller).map_err(error::auth)?;
        let req = req.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(error::too_large_ttl());
        }
        let granted = self.node.grant_lease(req.id, req.ttl, Some(&caller)).await.map_err(error::write)?;
        let header = header(&self.node, granted.revision);
        Ok(Response::new(pb::LeaseGrantResponse { header, id: granted.id, ttl: granted.ttl, error: String::new() }))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let id = req.into_inner().id;
        let revision = self.node.revoke_lease(id, Some(&caller)).await.map_err(error::write)?;
        Ok(Response::new(pb::LeaseRevokeResponse { header: header(&self.node, revision) }))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let mut inbound = req.into_inner();
        let node = self.node.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut stopping = node.stopping();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = inbound.next() => m,
                    _ = stopping.stopped() => None,
                };
                let Some(Ok(msg)) = next else { return };
                // Keeping a lease alive keeps its keys: WRITE on each of them.
                if let Err(e) = auth::check_lease(&node, &caller, msg.id) {
                    let _ = tx.send(Err(error::auth(e))).await;
                    return;
                }
                let reply = match node.keep_alive(msg.id).await {
                    Ok(ttl) => {
                        let revision = node.revision();
                        Ok(pb::LeaseKeepAliveResponse { header: header(&node, revision), id: msg.id, ttl })
                    }
                    Err(e) => Err(error::server(e)),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        let status = self.node.time_to_live(req.id).await.map_err(error::server)?;
        // TimeToLive names the lease's keys: READ on each of them.
        if let Some(s) = &status {
            s.keys.iter().try_for_each(|k| auth::check(&self.node, &caller, k, &[], PermKind::Read))?;
        }
        let header = header(&self.node, self.node.revision());
        let resp = match status {
            Some(s) => pb::LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: s.remaining,
                granted_ttl: s.granted,
                keys: if req.keys { s.keys } else { Vec::new() },
            },
            // etcd answers an unknown lease with TTL -1, not an error.
            None => pb::LeaseTimeToLiveResponse { header, id: req.id, ttl: -1, granted_ttl: 0, keys: Vec::new() },
        };
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.node.read_barrier().await.map_err(error::server)?;
        let leases = self.node.state().leases().ids().map(|id| pb::LeaseStatus { id }).collect();
        Ok(Response::new(pb::LeaseLeasesResponse { header: header(&self.node, self.node.revision()), leases }))
    }
}
