//! etcd's Lease service: Grant, Revoke, KeepAlive (a stream), TimeToLive, Leases.
//!
//! Grant and Revoke are replicated commands. KeepAlive and TimeToLive are
//! answered by the leader, which alone keeps lease time (a follower forwards
//! them). A granted TTL below the floor (1.5 election timeouts, rounded up to
//! a second) is raised to it, as etcd does; the lease ID is the client's, or a
//! random one the server picks.

use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{error, header};
use crate::command::{Command, CommandResult};
use crate::lease::MAX_LEASE_TTL;
use crate::mvcc::MvccError;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::lease_server::{Lease, LeaseServer};
use crate::raft::peer::{LeaseAnswer, LeaseQuery};
use crate::server::Node;

pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    pub fn server(node: Arc<Node>) -> LeaseServer<LeaseService> {
        LeaseServer::new(LeaseService { node })
    }
}

/// A random positive lease ID (std's randomly keyed hasher as the source).
pub fn random_lease_id() -> i64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    (h.finish() & i64::MAX as u64).max(1) as i64
}

fn too_large_ttl() -> Status {
    Status::out_of_range("etcdserver: too large lease TTL")
}

type KeepAliveStream = Pin<Box<dyn futures::Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let req = req.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(too_large_ttl());
        }
        let ttl = req.ttl.max(self.node.min_lease_ttl);
        // A server-chosen ID that happens to be taken is drawn again.
        for _ in 0..8 {
            let id = if req.id != 0 { req.id } else { random_lease_id() };
            match self.node.write(Command::LeaseGrant { id, ttl }).await.map_err(error::server)? {
                CommandResult::LeaseGranted { id, ttl, revision } => {
                    let header = header(&self.node, revision);
                    return Ok(Response::new(pb::LeaseGrantResponse { header, id, ttl, error: String::new() }));
                }
                CommandResult::Rejected { error: MvccError::LeaseExists, .. } if req.id == 0 => continue,
                CommandResult::Rejected { error: e, .. } => return Err(error::mvcc(e)),
                other => return Err(Status::internal(format!("raftlock: unexpected apply result {other:?}"))),
            }
        }
        Err(Status::internal("raftlock: could not draw a free lease ID"))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let id = req.into_inner().id;
        match self.node.write(Command::LeaseRevoke { id }).await.map_err(error::server)? {
            CommandResult::LeaseRevoked { revision } => {
                Ok(Response::new(pb::LeaseRevokeResponse { header: header(&self.node, revision) }))
            }
            CommandResult::Rejected { error: e, .. } => Err(error::mvcc(e)),
            other => Err(Status::internal(format!("raftlock: unexpected apply result {other:?}"))),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let mut inbound = req.into_inner();
        let node = self.node.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let shutdown = node.shutdown_signal();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = inbound.next() => m,
                    _ = crate::server::shutdown_started(shutdown.clone()) => None,
                };
                let Some(Ok(msg)) = next else { return };
                let reply = match node.lease_query(LeaseQuery::KeepAlive(msg.id)).await {
                    Ok(LeaseAnswer::KeptAlive { ttl }) => {
                        let revision = node.revision();
                        Ok(pb::LeaseKeepAliveResponse { header: header(&node, revision), id: msg.id, ttl })
                    }
                    Ok(other) => Err(Status::internal(format!("raftlock: unexpected lease answer {other:?}"))),
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
        let req = req.into_inner();
        let answer = self.node.lease_query(LeaseQuery::TimeToLive(req.id)).await.map_err(error::server)?;
        let header = header(&self.node, self.node.revision());
        let resp = match answer {
            LeaseAnswer::TimeToLive(Some(s)) => pb::LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: s.remaining,
                granted_ttl: s.granted,
                keys: if req.keys { s.keys } else { Vec::new() },
            },
            // etcd answers an unknown lease with TTL -1, not an error.
            LeaseAnswer::TimeToLive(None) => {
                pb::LeaseTimeToLiveResponse { header, id: req.id, ttl: -1, granted_ttl: 0, keys: Vec::new() }
            }
            other => return Err(Status::internal(format!("raftlock: unexpected lease answer {other:?}"))),
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
