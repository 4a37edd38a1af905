//! A Rust client for raftlock: a connection to the cluster, sessions (a lease
//! kept alive in the background), fenced locks and semaphores, and elections.
//! `raftlockctl` is built on it. The etcd services are reachable through
//! [`Client::kv`] and its siblings as the generated gRPC clients.
//!
//! ```no_run
//! # async fn demo() -> Result<(), raftlock::client::ClientError> {
//! use raftlock::client::{Acquisition, Client, LockOptions};
//! let client = Client::connect(["http://127.0.0.1:2379"]).await?;
//! let session = client.session(10).await?;
//! match session.lock("jobs/nightly", LockOptions::default()).await? {
//!     Acquisition::Held(guard) => {
//!         // ... guard writes to the resource with guard.token() ...
//!         guard.release().await?;
//!     }
//!     Acquisition::Busy(holders) => println!("held by {:?}", holders[0].key),
//! }
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! Caveats: a [`Session`] keeps its lease alive from a background task; when it
//! cannot for a whole TTL it reports the session lost ([`Session::lost`]), and
//! from then on every lock taken under it must be treated as gone — which is
//! what fencing tokens are for. With several endpoints, requests are spread
//! over them and a dead endpoint is skipped once a request to it has failed
//! (the first request sent to it after it died fails with `Unavailable`).
//! Endpoint host names are resolved once, when connecting, by raftlock's own
//! resolver; every address a name has becomes an endpoint.
//!
//! With etcd's auth on, [`Client::authenticate`] logs in as a user and every
//! later request carries its token (a simple token lives while it is used;
//! a client idle for longer than the server's `--auth-token-ttl` must
//! authenticate again).

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::proto::etcdserverpb as etcd;
use crate::proto::etcdserverpb::cluster_client::ClusterClient;
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::raftlock::v1 as locks;
use crate::proto::raftlock::v1::locks_client::LocksClient;
use crate::proto::v3electionpb as election;
use crate::proto::v3electionpb::election_client::ElectionClient;

mod events;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid endpoint {0}: {1}")]
    Endpoint(String, tonic::transport::Error),
    #[error("connecting: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("{}", .0.message())]
    Status(#[from] tonic::Status),
    #[error("no endpoints given")]
    NoEndpoints,
}

/// A connection to a raftlock (or etcd) cluster; cheap to clone.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    token: TokenInterceptor,
}

/// Adds the auth token, once there is one, to every request.
#[derive(Clone, Default)]
pub struct TokenInterceptor(Option<tonic::metadata::AsciiMetadataValue>);

impl Client {
    /// What adds this client's auth token (none before
    /// [`Client::authenticate`]) to requests, for channels of one's own.
    pub fn token_interceptor(&self) -> TokenInterceptor {
        self.token.clone()
    }
}

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("token", token.clone());
        }
        Ok(req)
    }
}

/// The channel every service client of a [`Client`] sends through.
pub type Service = tonic::service::interceptor::InterceptedService<Channel, TokenInterceptor>;

/// `host:port` becomes `http://host:port`; URLs are kept as they are.
pub fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// TLS for client connections (PEM): the CA that signs the servers'
/// certificates, and this client's certificate and key for servers that
/// require one (`--client-cert-auth`).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub ca: Option<Vec<u8>>,
    pub cert: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
}

impl ClientTls {
    /// Read the files etcdctl's `--cacert`, `--cert` and `--key` name.
    pub fn from_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> std::io::Result<ClientTls> {
        let read = |p: Option<&std::path::Path>| {
            p.map(|p| std::fs::read(p).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))))
                .transpose()
        };
        Ok(ClientTls { ca: read(ca)?, cert: read(cert)?, key: read(key)? })
    }

    pub fn config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            config = config.ca_certificate(tonic::transport::Certificate::from_pem(ca));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }
}

/// While a stream is open on a connection, it is pinged this often, and
/// closed when a ping is not answered within [`PING_TIMEOUT`]: a member that
/// is frozen (or whose host is) answers nothing, but keeps its TCP
/// connections, and a lock-event stream on it would wait in silence. Not
/// under 5 s: etcd's servers refuse pings more frequent than that
/// (`--grpc-keepalive-min-time`), and raftlockctl talks to them too.
pub const PING_INTERVAL: Duration = Duration::from_secs(6);
/// See [`PING_INTERVAL`].
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// An endpoint for `url`, with TLS for `https://` URLs.
pub fn endpoint(url: &str, tls: Option<&ClientTls>) -> Result<Endpoint, ClientError> {
    let bad = |err| ClientError::Endpoint(url.to_string(), err);
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(bad)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_TIMEOUT);
    if url.starts_with("https://") {
        endpoint = endpoint.tls_config(tls.cloned().unwrap_or_default().config()).map_err(bad)?;
    }
    Ok(endpoint)
}

impl Client {
    /// Connect to the cluster at `endpoints` (client URLs or `host:port`).
    pub async fn connect<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Result<Client, ClientError> {
        Self::connect_with(endpoints, None).await
    }

    /// [`Client::connect`], with `tls` for `https://` endpoints.
    pub async fn connect_with<S: AsRef<str>>(
        endpoints: impl IntoIterator<Item = S>,
        tls: Option<&ClientTls>,
    ) -> Result<Client, ClientError> {
        let mut list = Vec::new();
        for e in endpoints {
            for (url, name) in crate::base::resolve::url_addresses(&endpoint_url(e.as_ref())).await {
                let mut endpoint = endpoint(&url, tls)?;
                if let Some(name) = name {
                    let config = tls.cloned().unwrap_or_default().config().domain_name(name);
                    endpoint = endpoint.tls_config(config).map_err(|err| ClientError::Endpoint(url.clone(), err))?;
                }
                list.push(endpoint);
            }
        }
        let channel = match list.len() {
            0 => return Err(ClientError::NoEndpoints),
            // One endpoint: connect now, so that a wrong address fails here.
            1 => list.pop().expect("one endpoint").connect().await?,
            _ => Channel::balance_list(list.into_iter()),
        };
        Ok(Client { channel, token: TokenInterceptor::default() })
    }

    pub fn kv(&self) -> KvClient<Service> {
        KvClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn lease(&self) -> LeaseClient<Service> {
        LeaseClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn watch(&self) -> WatchClient<Service> {
        WatchClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn cluster(&self) -> ClusterClient<Service> {
        ClusterClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn maintenance(&self) -> MaintenanceClient<Service> {
        MaintenanceClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn locks(&self) -> LocksClient<Service> {
        LocksClient::with_interceptor(self.channel.clone(), self.token.clone())
    }
    pub fn election(&self) -> ElectionClient<Service> {
        ElectionClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    /// Log in as `user` (etcd's Authenticate): every later request of this
    /// client, and of its clones made from now on, carries the token.
    pub async fn authenticate(&mut self, user: &str, password: &str) -> Result<(), ClientError> {
        let mut auth = crate::proto::etcdserverpb::auth_client::AuthClient::new(self.channel.clone());
        let req = etcd::AuthenticateRequest { name: user.to_string(), password: password.to_string() };
        let token = auth.authenticate(req).await?.into_inner().token;
        let token = token.parse().map_err(|_| tonic::Status::internal("the server sent a token that is not ASCII"))?;
        self.token = TokenInterceptor(Some(token));
        Ok(())
    }

    /// Grant a lease of `ttl` seconds and keep it alive until the session is
    /// closed or dropped.
    pub async fn session(&self, ttl: i64) -> Result<Session, ClientError> {
        let sent = Instant::now();
        let granted = self.lease().lease_grant(etcd::LeaseGrantRequest { ttl, id: 0 }).await?.into_inner();
        let (lost_tx, lost) = watch::channel(false);
        let keeper = tokio::spawn(keep_alive(self.clone(), granted.id, sent, granted.ttl, lost_tx));
        Ok(Session { client: self.clone(), lease: granted.id, ttl: granted.ttl, lost, keeper })
    }

    /// The current leader of election `name`.
    pub async fn leader(&self, name: &[u8]) -> Result<election::LeaderResponse, ClientError> {
        let req = election::LeaderRequest { name: name.to_vec() };
        Ok(self.election().leader(req).await?.into_inner())
    }

    /// Release a grant by key, fenced by its token; false if the key is gone or
    /// belongs to a later grant.
    pub async fn release(&self, key: &[u8], token: i64) -> Result<bool, ClientError> {
        let req = locks::ReleaseRequest { key: key.to_vec(), token, ..Default::default() };
        Ok(self.locks().release(req).await?.into_inner().released)
    }

    /// Whether the grant `key` made with `token` still holds its lock (of
    /// `permits`; 0 or 1 for a mutex), read linearizably, with its lease's
    /// seconds left: what a resource that cannot keep tokens asks before it
    /// acts on a request.
    pub async fn validate(&self, key: &[u8], token: i64, permits: u32) -> Result<locks::ValidateResponse, ClientError> {
        let req = locks::ValidateRequest { key: key.to_vec(), token, permits };
        Ok(self.locks().validate(req).await?.into_inner())
    }
}

/// Send a keepalive every third of the TTL; report the session lost when the
/// lease is gone or may have expired. The lease is known to live until one TTL
/// after the *sending* of the last keepalive that was answered (or of the
/// grant); every wait is cut off at that moment, so a hung endpoint cannot
/// hide the loss.
async fn keep_alive(client: Client, lease: i64, granted_at: Instant, ttl: i64, lost: watch::Sender<bool>) {
    let ttl = Duration::from_secs(ttl.max(1) as u64);
    let period = ttl / 3;
    let mut expires = granted_at + ttl;
    'connect: while Instant::now() < expires {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut leases = client.lease();
        let open = leases.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut stream = match tokio::time::timeout_at(expires.min(Instant::now() + period), open).await {
            Ok(Ok(stream)) => stream.into_inner(),
            _ => {
                // Unreachable for now: try again shortly (another endpoint, or later).
                tokio::select! {
                    _ = tokio::time::sleep_until(expires.min(Instant::now() + Duration::from_millis(200))) => {}
                    _ = lost.closed() => return,
                }
                continue;
            }
        };
        loop {
            let sent = Instant::now();
            if tx.send(etcd::LeaseKeepAliveRequest { id: lease }).await.is_err() {
                continue 'connect;
            }
            match tokio::time::timeout_at(expires.min(sent + period), stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl > 0 => expires = sent + Duration::from_secs(r.ttl as u64),
                // The lease no longer exists.
                Ok(Ok(Some(_))) => break 'connect,
                _ => continue 'connect,
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = lost.closed() => return,
            }
        }
    }
    let _ = lost.send(true);
}

/// A lease kept alive in the background: the owner identity of locks and
/// campaigns. Dropping it stops the keepalives (the lease then expires);
/// [`Session::close`] also revokes it, releasing everything at once.
pub struct Session {
    client: Client,
    lease: i64,
    ttl: i64,
    lost: watch::Receiver<bool>,
    keeper: JoinHandle<()>,
}

/// How to acquire a lock.
#[derive(Clone, Debug)]
pub struct LockOptions {
    /// How long to wait; `Some(Duration::ZERO)` tries once, `None` waits until granted.
    pub wait: Option<Duration>,
    /// How many owners may hold the lock at once (1: a mutex).
    pub permits: u32,
    /// Shown to others by Describe: who the owner is.
    pub metadata: Vec<u8>,
    /// Share the lock with other readers (a read lock) instead of holding it
    /// alone (a write lock, the default). Needs `permits` 1.
    pub read: bool,
    /// If the session holds the lock already: add a hold, which a release
    /// must give back (false, the default: answer with the grant as it is,
    /// so that retrying an acquire is safe).
    pub reentrant: bool,
    /// Lock-delay: if the grant ends involuntarily (the session's lease
    /// ends, or someone else deletes its key), nobody is granted the lock
    /// until this much time has passed (at most 60 s; whole milliseconds).
    /// Only for an exclusive lock (write, one permit); not for `lock_all`.
    pub lock_delay: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            wait: None,
            permits: 1,
            metadata: Vec::new(),
            read: false,
            reentrant: false,
            lock_delay: Duration::ZERO,
        }
    }
}

pub enum Acquisition {
    Held(Guard),
    /// Not granted within the wait; these hold the lock.
    Busy(Vec<locks::Owner>),
}

/// What [`Session::lock_all`] came to.
pub enum MultiAcquisition {
    Held(MultiGuard),
    /// Not all granted within the wait (and none kept): the first lock that
    /// was not held, and its holders.
    Busy {
        blocked_on: Vec<u8>,
        holders: Vec<locks::Owner>,
    },
}

/// Several locks held together ([`Session::lock_all`]): one grant (key and
/// token) per lock, released together.
pub struct MultiGuard {
    client: Client,
    grants: Vec<locks::Grant>,
}

impl MultiGuard {
    /// One grant per lock, in the order they were asked for.
    pub fn grants(&self) -> &[locks::Grant] {
        &self.grants
    }

    /// Resolves when any grant of the set ends without its release here,
    /// with how ([`Client::grant_ended`]).
    pub async fn lost(&self) -> Result<locks::lock_event::Kind, ClientError> {
        let ends = self.grants.iter().map(|g| Box::pin(self.client.grant_ended(&g.key, g.token)));
        futures::future::select_all(ends).await.0
    }

    /// Release every grant, each fenced by its token; true if all were
    /// still held and are now released.
    pub async fn release(self) -> Result<bool, ClientError> {
        // A release needs each grant's key and token, not its name.
        let grants = self.grants.into_iter().map(|g| locks::Grant { name: Vec::new(), ..g }).collect();
        let req = locks::ReleaseRequest { grants, ..Default::default() };
        Ok(self.client.locks().release(req).await?.into_inner().released)
    }
}

/// A granted lock. Dropping it does not release it (the session's end does).
/// Acquiring a lock the session holds (in the same mode) gives another guard
/// of the same grant: with `reentrant`, with one more hold, and each release
/// gives one back; without, with no more holds, so that releasing either
/// guard releases the lock.
pub struct Guard {
    client: Client,
    key: Vec<u8>,
    token: i64,
    holds: u32,
}

impl Guard {
    /// The owner key, `<name>/<lease hex>` (`<name>/read-<lease hex>` for a read lock).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The fencing token: strictly greater for every later holder of the lock.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// The session's holds on the grant when it was granted, this one's included.
    pub fn holds(&self) -> u32 {
        self.holds
    }

    /// Resolves when the grant ends without this guard's release: its lease
    /// ended, or its key was deleted by someone else ([`Client::grant_ended`]).
    /// A holder that selects on it learns of the loss as soon as a member
    /// it reaches has applied it.
    pub async fn lost(&self) -> Result<locks::lock_event::Kind, ClientError> {
        self.client.grant_ended(&self.key, self.token).await
    }

    /// Whether the grant still holds its lock (of `permits`), asked of the
    /// cluster ([`Client::validate`]).
    pub async fn is_current(&self, permits: u32) -> Result<bool, ClientError> {
        Ok(self.client.validate(&self.key, self.token, permits).await?.current)
    }

    /// Give back this hold, fenced by the token (the last release releases
    /// the lock); false if the grant had already ended.
    pub async fn release(self) -> Result<bool, ClientError> {
        self.client.release(&self.key, self.token).await
    }
}

/// Leadership won by [`Session::campaign`].
pub struct Leadership {
    client: Client,
    pub key: election::LeaderKey,
}

impl Leadership {
    /// Announce a new value, while still leader.
    pub async fn proclaim(&self, value: &[u8]) -> Result<(), ClientError> {
        let req = election::ProclaimRequest { leader: Some(self.key.clone()), value: value.to_vec() };
        self.client.election().proclaim(req).await?;
        Ok(())
    }

    /// Step down.
    pub async fn resign(self) -> Result<(), ClientError> {
        self.client.election().resign(election::ResignRequest { leader: Some(self.key) }).await?;
        Ok(())
    }
}

impl Session {
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// The lease's TTL as granted, in seconds.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }

    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the lease is known to be gone (expired, revoked, or not
    /// renewed for a whole TTL).
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|l| *l).await;
    }

    /// Acquire lock `name` under this session's lease.
    pub async fn lock(&self, name: impl AsRef<[u8]>, options: LockOptions) -> Result<Acquisition, ClientError> {
        let wait_ms = match options.wait {
            None => -1,
            Some(d) => d.as_millis().min(i64::MAX as u128) as i64,
        };
        let req = locks::AcquireRequest {
            name: name.as_ref().to_vec(),
            lease: self.lease,
            wait_ms,
            permits: options.permits,
            metadata: options.metadata,
            mode: if options.read { locks::Mode::Read } else { locks::Mode::Write }.into(),
            reentrant: options.reentrant,
            lock_delay_ms: options.lock_delay.as_millis().min(u32::MAX as u128) as u32,
            ..Default::default()
        };
        let r = self.client.locks().acquire(req).await?.into_inner();
        Ok(if r.acquired {
            Acquisition::Held(Guard { client: self.client.clone(), key: r.key, token: r.token, holds: r.holds })
        } else {
            Acquisition::Busy(r.holders)
        })
    }

    /// Acquire every lock of `names` together, all or none (a multi-lock):
    /// `options` apply to each of them (`reentrant` is refused). Nobody
    /// deadlocks, whatever sets other sessions ask for in whatever order.
    pub async fn lock_all<N: AsRef<[u8]>>(
        &self,
        names: impl IntoIterator<Item = N>,
        options: LockOptions,
    ) -> Result<MultiAcquisition, ClientError> {
        let mode = if options.read { locks::Mode::Read } else { locks::Mode::Write };
        let specs = names
            .into_iter()
            .map(|n| locks::LockSpec { name: n.as_ref().to_vec(), mode: mode.into(), permits: options.permits })
            .collect();
        let req = locks::AcquireRequest {
            lease: self.lease,
            wait_ms: options.wait.map_or(-1, |d| d.as_millis().min(i64::MAX as u128) as i64),
            metadata: options.metadata,
            reentrant: options.reentrant,
            lock_delay_ms: options.lock_delay.as_millis().min(u32::MAX as u128) as u32,
            locks: specs,
            ..Default::default()
        };
        let r = self.client.locks().acquire(req).await?.into_inner();
        Ok(if r.acquired {
            MultiAcquisition::Held(MultiGuard { client: self.client.clone(), grants: r.grants })
        } else {
            MultiAcquisition::Busy { blocked_on: r.blocked_on, holders: r.holders }
        })
    }

    /// Wait to become leader of election `name`, announcing `value`.
    pub async fn campaign(&self, name: impl AsRef<[u8]>, value: &[u8]) -> Result<Leadership, ClientError> {
        let req = election::CampaignRequest { name: name.as_ref().to_vec(), lease: self.lease, value: value.to_vec() };
        let r = self.client.election().campaign(req).await?.into_inner();
        let key = r.leader.ok_or_else(|| tonic::Status::internal("campaign answered without a leader key"))?;
        Ok(Leadership { client: self.client.clone(), key })
    }

    /// Stop the keepalives and revoke the lease: every lock and campaign of
    /// this session ends at once.
    pub async fn close(self) -> Result<(), ClientError> {
        self.keeper.abort();
        let req = etcd::LeaseRevokeRequest { id: self.lease };
        match self.client.lease().lease_revoke(req).await {
            Ok(_) => Ok(()),
            // Already gone: closed all the same.
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(s.into()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}
