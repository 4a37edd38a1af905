//! raftlock's native lock API, `raftlock.v1.Locks` (Acquire, Release,
//! Describe, List, Validate, Observe), as an adapter over
//! `crate::locks::fenced`, `crate::locks::multi` (multi-locks) and
//! `crate::locks::observe` (lock events).
//!
//! The service is served as [`LocksRoutes`]: `Observe` by a route of its
//! own that sends the messages a lock's hub encoded once
//! (`super::observe_codec`), every other call by the generated server.
//!
//! Errors keep etcd's codes where etcd has the case (a missing lease is
//! NotFound "etcdserver: requested lease not found"; availability is
//! Unavailable) and are InvalidArgument with a `raftlock:` message for what
//! only this API can get wrong.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::codegen::{http, BoxFuture};
use tonic::{Request, Response, Status};

use super::{auth, error, header};
use crate::base::limits::{MAX_LOCKS_PER_ACQUIRE, MAX_MULTI_LOCK_NAME_BYTES, MAX_PERMITS};
use crate::locks;
use crate::locks::fenced::{self, Acquired, Owner, Wait};
use crate::locks::list;
use crate::locks::multi::{self, MultiAcquired, Spec};
use crate::locks::observe;
use crate::model::auth::PermKind;
use crate::model::lock_delay::MAX_LOCK_DELAY_MS;
use crate::node::Node;
use crate::proto::raftlock::v1 as pb;
use crate::proto::raftlock::v1::locks_server::{Locks, LocksServer};

use super::observe_codec::{EncodedObserve, EncodedStream, ObserveCodec, ObserveHubs};

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

/// The mode asked for, given the permits (a read lock has one).
fn lock_mode(mode: i32, permits: usize) -> Result<locks::Mode, Status> {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Write) => Ok(locks::Mode::Write),
        Ok(pb::Mode::Read) if permits == 1 => Ok(locks::Mode::Read),
        Ok(pb::Mode::Read) => Err(error::read_lock_permits()),
        Err(_) => Err(error::unknown_lock_mode(mode)),
    }
}

fn wait(ms: i64) -> Wait {
    match ms {
        0 => Wait::Never,
        ms if ms < 0 => Wait::Forever,
        ms => Wait::For(Duration::from_millis(ms as u64)),
    }
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
        lock_delay_ms: o.lock_delay_ms,
    }
}

/// The hubs of a member's `Observe` streams, each change's message
/// encoded once (`super::observe_codec`).
pub fn observe_hubs(node: Arc<Node>) -> Arc<ObserveHubs> {
    let make = |node: &Node, revision: i64, events: Vec<observe::LockEvent>| {
        EncodedObserve::encode(&pb::ObserveResponse {
            header: header(node, revision),
            events: events.into_iter().map(event).collect(),
        })
    };
    ObserveHubs::new(node, Arc::new(make))
}

pub struct LocksService {
    node: Arc<Node>,
    hubs: Arc<ObserveHubs>,
    grants: Arc<crate::locks::stats::Grants>,
    /// This member's lock-delay keeper's clock (what Describe says is left).
    delays: Arc<crate::locks::delay::DelayClock>,
}

impl LocksService {
    pub fn server(
        node: Arc<Node>,
        grants: Arc<crate::locks::stats::Grants>,
        delays: Arc<crate::locks::delay::DelayClock>,
        hubs: Arc<ObserveHubs>,
    ) -> super::served::Served<LocksRoutes> {
        super::served::Served(LocksRoutes::new(Arc::new(LocksService { node, hubs, grants, delays })))
    }

    /// `Observe`, its messages as the lock's hub encoded them (what
    /// [`LocksRoutes`] serves).
    pub async fn observe_encoded(&self, req: Request<pb::ObserveRequest>) -> Result<Response<EncodedStream>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        name(&req.name)?;
        let prefix = locks::queue_prefix(&req.name);
        auth::check(&self.node, &caller, &prefix, &locks::prefix_end(&prefix), PermKind::Read)?;
        let permits = permits(req.permits)?;
        if req.start_revision < 0 {
            return Err(error::negative_start_revision());
        }
        let observation =
            self.hubs.observe(&req.name, permits, req.start_revision).await.map_err(error::native_recipe)?;
        Ok(Response::new(Box::pin(observation.map(|message| message.map_err(error::native_recipe)))))
    }
}

type ObserveStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::ObserveResponse, Status>> + Send>>;

fn event(e: observe::LockEvent) -> pb::LockEvent {
    use observe::EventKind as K;
    use pb::lock_event::Kind;
    let kind = match e.kind {
        K::Holding => Kind::Holding,
        K::Waiting => Kind::Waiting,
        K::Queued => Kind::Queued,
        K::Granted => Kind::Granted,
        K::Released => Kind::Released,
        K::LeaseEnded => Kind::LeaseEnded,
        K::Ended => Kind::Ended,
        K::DelayStarted => Kind::DelayStarted,
        K::DelayEnded => Kind::DelayEnded,
    };
    let lock_delay_ms = match e.kind {
        K::DelayStarted => crate::model::lock_delay::parse_ms(&e.owner.value).unwrap_or(0),
        _ => 0,
    };
    let owner = Owner { kv: e.owner, ttl: -1, granted_ttl: 0, mode: e.mode, holds: 0, lock_delay_ms: 0 };
    pb::LockEvent {
        lock_delay_ms,
        kind: kind.into(),
        owner: Some(self::owner(owner)),
        revision: e.revision,
        position: e.position as i64,
        was_holding: e.was_holding,
    }
}

#[tonic::async_trait]
impl Locks for LocksService {
    type ObserveStream = ObserveStream;

    /// Reached only through the generated server, which [`LocksRoutes`]
    /// serves every other call with: each message decoded again.
    async fn observe(&self, req: Request<pb::ObserveRequest>) -> Result<Response<ObserveStream>, Status> {
        let encoded = self.observe_encoded(req).await?.into_inner();
        Ok(Response::new(Box::pin(encoded.map(|message| message.and_then(|m| m.decode())))))
    }

    async fn acquire(&self, req: Request<pb::AcquireRequest>) -> Result<Response<pb::AcquireResponse>, Status> {
        let arrived = std::time::Instant::now();
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        if !req.locks.is_empty() {
            return self.acquire_all(arrived, &caller, req).await;
        }
        name(&req.name)?;
        auth::check_prefix(&self.node, &caller, &locks::queue_prefix(&req.name)).map_err(error::auth)?;
        auth::check_lease(&self.node, &caller, req.lease).map_err(error::auth)?;
        if req.lease == 0 {
            return Err(error::lease_required());
        }
        let permits = permits(req.permits)?;
        let mode = lock_mode(req.mode, permits)?;
        if req.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(error::lock_delay_too_long(MAX_LOCK_DELAY_MS));
        }
        if req.lock_delay_ms > 0 && (mode != locks::Mode::Write || permits != 1) {
            return Err(error::lock_delay_not_exclusive());
        }
        if req.lock_delay_ms > 0 {
            // Older members apply a lock-delay's end without its marker.
            self.node.require_release("a lock-delay", locks::LOCK_DELAY_SINCE).await.map_err(error::server)?;
        }
        let wait = wait(req.wait_ms);
        let request = fenced::Request {
            lock_delay_ms: req.lock_delay_ms,
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
                    grants: vec![],
                    blocked_on: vec![],
                }
            }
            Acquired::Refused { holders, revision } => pb::AcquireResponse {
                header: header(&self.node, revision),
                acquired: false,
                key: vec![],
                token: 0,
                holders: holders.into_iter().map(owner).collect(),
                holds: 0,
                grants: vec![],
                blocked_on: vec![],
            },
        };
        Ok(Response::new(response))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        super::check_request_size(&req)?;
        if !req.grants.is_empty() {
            return self.release_all(&caller, req).await;
        }
        if req.key.is_empty() {
            return Err(error::empty_key());
        }
        check_release(&self.node, &caller, &req.key, req.token)?;
        let r = fenced::release(&self.node, &req.key, req.token).await.map_err(error::native_recipe)?;
        Ok(Response::new(pb::ReleaseResponse {
            header: header(&self.node, r.revision),
            released: r.released,
            current_token: r.current_token,
            holds: r.holds,
            results: vec![],
        }))
    }

    async fn describe(&self, req: Request<pb::DescribeRequest>) -> Result<Response<pb::DescribeResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        name(&req.name)?;
        let prefix = locks::queue_prefix(&req.name);
        auth::check(&self.node, &caller, &prefix, &locks::prefix_end(&prefix), PermKind::Read)?;
        let page = fenced::Page::of(req.limit, req.waiters_after, req.waiters_after_key);
        let d =
            fenced::describe(&self.node, &req.name, permits(req.permits)?, page).await.map_err(error::native_recipe)?;
        Ok(Response::new(pb::DescribeResponse {
            header: header(&self.node, d.revision),
            holders: d.holders.into_iter().map(owner).collect(),
            waiters: d.waiters.into_iter().map(owner).collect(),
            lock_delay: d.delay.map(|marker| pb::LockDelay {
                delay_ms: crate::model::lock_delay::parse_ms(&marker.value).unwrap_or(0),
                revision: marker.mod_revision,
                remaining_ms: self.delays.remaining(&marker.key).map_or(-1, |left| left.as_millis() as i64),
            }),
            more: d.more,
        }))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        match req.prefix.is_empty() {
            true => auth::check(&self.node, &caller, &[0], &[0], PermKind::Read)?,
            false => auth::check(&self.node, &caller, &req.prefix, &locks::prefix_end(&req.prefix), PermKind::Read)?,
        }
        let limit = match req.limit as usize {
            0 => list::DEFAULT_LIMIT,
            limit => limit.min(list::MAX_LIMIT),
        };
        let page = list::list(&self.node, &req.prefix, &req.page, limit, permits(req.permits)?)
            .await
            .map_err(error::native_recipe)?;
        let locks = page
            .locks
            .into_iter()
            .map(|s| pb::LockSummary {
                name: s.name,
                holders: s.holders.into_iter().map(owner).collect(),
                waiters: s.waiters as i64,
            })
            .collect();
        let next_page = page.next.unwrap_or_default();
        Ok(Response::new(pb::ListResponse { header: header(&self.node, page.revision), locks, next_page }))
    }

    async fn validate(&self, req: Request<pb::ValidateRequest>) -> Result<Response<pb::ValidateResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        if req.key.is_empty() {
            return Err(error::empty_key());
        }
        // It reads the key's queue: the lock's prefix must be readable.
        // (A key with no lock name is refused below, having read nothing.)
        if let Some(name) = locks::lock_name_of(&req.key) {
            let prefix = locks::queue_prefix(name);
            auth::check(&self.node, &caller, &prefix, &locks::prefix_end(&prefix), PermKind::Read)?;
        }
        let permits = permits(req.permits)?;
        let v = fenced::validate(&self.node, &req.key, req.token, permits).await.map_err(error::native_recipe)?;
        Ok(Response::new(pb::ValidateResponse {
            header: header(&self.node, v.revision),
            current: v.current,
            current_token: v.current_token,
            lease: v.lease,
            ttl: v.ttl,
        }))
    }
}

/// A release's checks: the caller may write the key and its hold count, and
/// names a token.
fn check_release(node: &Node, caller: &crate::model::auth::Caller, key: &[u8], token: i64) -> Result<(), Status> {
    auth::check_read_write(node, caller, key, &[]).map_err(error::auth)?;
    // A release may change the grant's hold count too.
    auth::check_read_write(node, caller, &locks::hold_count_key(key), &[]).map_err(error::auth)?;
    if token <= 0 {
        return Err(error::release_needs_token());
    }
    Ok(())
}

impl LocksService {
    /// A multi-lock ([`multi::acquire_all`]): `locks` set, the one-lock
    /// fields unset.
    async fn acquire_all(
        &self,
        arrived: std::time::Instant,
        caller: &crate::model::auth::Caller,
        req: pb::AcquireRequest,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        if !req.name.is_empty() || req.permits != 0 || req.mode != 0 {
            return Err(error::multi_lock_fields());
        }
        if req.reentrant {
            return Err(error::multi_lock_reentrant());
        }
        if req.lock_delay_ms != 0 {
            return Err(error::multi_lock_delay());
        }
        if req.locks.len() > MAX_LOCKS_PER_ACQUIRE {
            return Err(error::too_many_locks(MAX_LOCKS_PER_ACQUIRE));
        }
        if req.locks.iter().map(|l| l.name.len()).sum::<usize>() > MAX_MULTI_LOCK_NAME_BYTES {
            return Err(error::multi_lock_names_too_long(MAX_MULTI_LOCK_NAME_BYTES));
        }
        auth::check_lease(&self.node, caller, req.lease).map_err(error::auth)?;
        if req.lease == 0 {
            return Err(error::lease_required());
        }
        let mut specs = Vec::with_capacity(req.locks.len());
        for lock in req.locks {
            name(&lock.name)?;
            auth::check_prefix(&self.node, caller, &locks::queue_prefix(&lock.name)).map_err(error::auth)?;
            let permits = permits(lock.permits)?;
            specs.push(Spec { mode: lock_mode(lock.mode, permits)?, name: lock.name, permits });
        }
        if let Some(problem) = multi::set_problem(&specs) {
            return Err(error::bad_lock_set(&problem));
        }
        let outcome = multi::acquire_all(self.node.clone(), specs.clone(), req.lease, &req.metadata, wait(req.wait_ms))
            .await
            .map_err(error::native_recipe)?;
        let response = match outcome {
            MultiAcquired::Granted { grants, revision } => {
                for kv in &grants {
                    super::lock::granted(&self.grants, &self.node, "native", arrived, &kv.key, kv.create_revision);
                }
                let grants = specs
                    .into_iter()
                    .zip(grants)
                    .map(|(spec, kv)| pb::Grant { name: spec.name, token: kv.create_revision, key: kv.key })
                    .collect();
                pb::AcquireResponse {
                    header: header(&self.node, revision),
                    acquired: true,
                    grants,
                    ..Default::default()
                }
            }
            MultiAcquired::Refused { blocked_on, holders, revision } => pb::AcquireResponse {
                header: header(&self.node, revision),
                acquired: false,
                holders: holders.into_iter().map(owner).collect(),
                blocked_on,
                ..Default::default()
            },
        };
        Ok(Response::new(response))
    }

    /// A multi-lock's release: every grant released as one is, together.
    async fn release_all(
        &self,
        caller: &crate::model::auth::Caller,
        req: pb::ReleaseRequest,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        if !req.key.is_empty() || req.token != 0 {
            return Err(error::multi_lock_fields());
        }
        if req.grants.len() > MAX_LOCKS_PER_ACQUIRE {
            return Err(error::too_many_locks(MAX_LOCKS_PER_ACQUIRE));
        }
        for grant in &req.grants {
            if grant.key.is_empty() {
                return Err(error::empty_key());
            }
            check_release(&self.node, caller, &grant.key, grant.token)?;
        }
        let node = &self.node;
        let answers =
            futures::future::join_all(req.grants.iter().map(|g| fenced::release(node, &g.key, g.token))).await;
        let mut results = Vec::with_capacity(answers.len());
        let mut revision = 0;
        for (grant, answer) in req.grants.into_iter().zip(answers) {
            let r = answer.map_err(error::native_recipe)?;
            revision = revision.max(r.revision);
            results.push(pb::GrantReleased { key: grant.key, released: r.released, current_token: r.current_token });
        }
        Ok(Response::new(pb::ReleaseResponse {
            header: header(&self.node, revision),
            released: results.iter().all(|r| r.released),
            results,
            ..Default::default()
        }))
    }
}

/// The `Locks` service, its `Observe` answered from encoded messages.
#[derive(Clone)]
pub struct LocksRoutes {
    locks: Arc<LocksService>,
    generated: LocksServer<LocksService>,
}

impl LocksRoutes {
    pub fn new(locks: Arc<LocksService>) -> LocksRoutes {
        let generated =
            LocksServer::from_arc(locks.clone()).max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES);
        LocksRoutes { locks, generated }
    }
}

impl tonic::server::NamedService for LocksRoutes {
    const NAME: &'static str = <LocksServer<LocksService> as tonic::server::NamedService>::NAME;
}

const OBSERVE_PATH: &str = "/raftlock.v1.Locks/Observe";

impl tower::Service<http::Request<tonic::body::Body>> for LocksRoutes {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != OBSERVE_PATH {
            return self.generated.call(req);
        }
        let locks = self.locks.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ObserveCodec)
                .apply_max_message_size_config(Some(crate::base::limits::MAX_GRPC_MESSAGE_BYTES), None);
            Ok(grpc.server_streaming(Observe(locks), req).await)
        })
    }
}

struct Observe(Arc<LocksService>);

impl tonic::server::ServerStreamingService<pb::ObserveRequest> for Observe {
    type Response = EncodedObserve;
    type ResponseStream = EncodedStream;
    type Future = BoxFuture<Response<EncodedStream>, Status>;

    fn call(&mut self, req: Request<pb::ObserveRequest>) -> Self::Future {
        let locks = self.0.clone();
        Box::pin(async move { locks.observe_encoded(req).await })
    }
}
