//! raftlock's native lock API, `raftlock.v1.Locks` (Acquire, Release,
//! Describe, List), as an adapter over `crate::locks::fenced`.
//!
//! Errors keep etcd's codes where etcd has the case (a missing lease is
//! NotFound "etcdserver: requested lease not found"; availability is
//! Unavailable) and are InvalidArgument with a `raftlock:` message for what
//! only this API can get wrong.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::{auth, error, header};
use crate::base::limits::MAX_PERMITS;
use crate::locks;
use crate::locks::fenced::{self, Acquired, Owner, Wait};
use crate::model::auth::PermKind;
use crate::node::Node;
use crate::proto::raftlock::v1 as pb;
use crate::proto::raftlock::v1::locks_server::{Locks, LocksServer};

fn permits(n: u32) -> Result<usize, Status> {
    match n {
        0 => Ok(1),
        n if n <= MAX_PERMITS => Ok(n as usize),
        _ => Err(error::too_many_permits(MAX_PERMITS)),
    }
}

fn name(name: &[u8]) -> Result<(), Status> {
    if name.is_empty() {
        return Err(error::no_lock_name());
    }
    Ok(())
}

fn mode(m: locks::Mode) -> pb::Mode {
    match m {
        locks::Mode::Write => pb::Mode::Write,
        locks::Mode::Read => pb::Mode::Read,
    }
}

fn owner(o: Owner) -> pb::Owner {
    pb::Owner {
        mode: mode(o.mode).into(),
        holds: o.holds,
        token: o.kv.create_revision,
        lease: o.kv.lease,
        ttl: o.ttl,
        granted_ttl: o.granted_ttl,
        metadata: o.kv.value,
        key: o.kv.key,
    }
}

pub struct LocksService {
    node: Arc<Node>,
    grants: Arc<crate::locks::stats::Grants>,
}

impl LocksService {
    pub fn server(
        node: Arc<Node>,
        grants: Arc<crate::locks::stats::Grants>,
    ) -> super::served::Served<LocksServer<LocksService>> {
        super::served::Served(
            LocksServer::new(LocksService { node, grants })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

#[tonic::async_trait]
impl Locks for LocksService {
    async fn acquire(&self, req: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let arrived = std::time::Instant::now();
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        name(&req.name)?;
        auth::check_prefix(&self.node, &caller, &locks::queue_prefix(&req.name)).map_err(error::auth)?;
        auth::check_lease(&self.node, &caller, req.lease).map_err(error::auth)?;
        if req.lease == 0 {
            return Err(error::lease_required());
        }
        let permits = permits(req.permits)?;
        let mode = match pb::Mode::try_from(req.mode) {
            Ok(pb::Mode::Write) => locks::Mode::Write,
            Ok(pb::Mode::Read) if permits == 1 => locks::Mode::Read,
            Ok(pb::Mode::Read) => return Err(error::read_lock_permits()),
            Err(_) => return Err(error::unknown_lock_mode(req.mode)),
        };
        let wait = match req.wait_ms {
            0 => Wait::Never,
            ms if ms < 0 => Wait::Forever,
            ms => Wait::For(Duration::from_millis(ms as u64)),
        };
        let request = fenced::Request {
            name: &req.name,
            lease: req.lease,
            metadata: &req.metadata,
            permits,
            mode,
            reentrant: req.reentrant,
        };
        let outcome = fenced::acquire(self.node.clone(), request, wait).await.map_err(error::native_recipe)?;
        let response = match outcome {
            Acquired::Granted { kv, revision, holds } => {
                super::lock::granted(&self.grants, &self.node, "native", arrived, &kv.key, kv.create_revision);
                pb::AcquireResponse {
                    header: header(&self.node, revision),
                    acquired: true,
                    token: kv.create_revision,
                    key: kv.key,
                    holders: vec![],
                    holds,
                }
            }
            Acquired::Refused { holders, revision } => pb::AcquireResponse {
                header: header(&self.node, revision),
                acquired: false,
                key: vec![],
                token: 0,
                holders: holders.into_iter().map(owner).collect(),
                holds: 0,
            },
        };
        Ok(Response::new(response))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        if req.key.is_empty() {
            return Err(error::empty_key());
        }
        auth::check_read_write(&self.node, &caller, &req.key, &[]).map_err(error::auth)?;
        // A release may change the grant's hold count too.
        auth::check_read_write(&self.node, &caller, &locks::hold_count_key(&req.key), &[]).map_err(error::auth)?;
        if req.token <= 0 {
            return Err(error::release_needs_token());
        }
        let r = fenced::release(&self.node, &req.key, req.token).await.map_err(error::native_recipe)?;
        Ok(Response::new(pb::ReleaseResponse {
            header: header(&self.node, r.revision),
            released: r.released,
            current_token: r.current_token,
            holds: r.holds,
        }))
    }

    async fn describe(&self, req: Request<pb::DescribeRequest>) -> Result<Response<pb::DescribeResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        name(&req.name)?;
        let prefix = locks::queue_prefix(&req.name);
        auth::check(&self.node, &caller, &prefix, &locks::prefix_end(&prefix), PermKind::Read)?;
        let d = fenced::describe(&self.node, &req.name, permits(req.permits)?).await.map_err(error::native_recipe)?;
        Ok(Response::new(pb::DescribeResponse {
            header: header(&self.node, d.revision),
            holders: d.holders.into_iter().map(owner).collect(),
            waiters: d.waiters.into_iter().map(owner).collect(),
        }))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        match req.prefix.is_empty() {
            true => auth::check(&self.node, &caller, &[0], &[0], PermKind::Read)?,
            false => auth::check(&self.node, &caller, &req.prefix, &locks::prefix_end(&req.prefix), PermKind::Read)?,
        }
        let (locks, revision) =
            fenced::list(&self.node, &req.prefix, permits(req.permits)?).await.map_err(error::native_recipe)?;
        let locks = locks
            .into_iter()
            .map(|s| pb::LockSummary {
                name: s.name,
                holders: s.holders.into_iter().map(owner).collect(),
                waiters: s.waiters as i64,
            })
            .collect();
        Ok(Response::new(pb::ListResponse { header: header(&self.node, revision), locks }))
    }
}
