//! The client side of the peer protocol: one cached channel per peer, and a
//! method per question a member asks another (read index, lease questions,
//! membership changes, admin steps). Forwarded writes have a stream of their
//! own per leader (`peer::forward`).
//!
//! One gRPC channel per peer URL is created lazily and cached for the life of
//! the process ([`PeerClients`]); a tonic channel multiplexes concurrent calls
//! over one HTTP/2 connection and reconnects by itself, so a peer that restarts
//! is reached again without a new channel. Raft's own RPCs use the same
//! channels (`raft::network`).
//!
//! Every request carries this member's [`PeerIdentity`] (cluster and member
//! ID), which the answering member checks (`peer::gate`).
//!
//! Retry safety: a call that failed before its connection was made
//! ([`never_sent`]) can be sent elsewhere; any other failure of a write may
//! have been applied and is reported as unknown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::gate::PeerIdentity;
use super::messages::{ControlRequest, LeaseAnswer, LeaseQuery, MembershipAnswer, MembershipChange};
use super::server::MAX_PEER_MESSAGE_BYTES;
use crate::proto::raftlock::peer::peer_client::PeerClient;
use crate::proto::raftlock::peer::{RaftPayload, ReadIndexRequest};
use crate::raft::{decode, encode};

/// A client of one peer: its cached channel, stamping this member's identity.
pub type PeerStub = PeerClient<InterceptedService<Channel, PeerIdentity>>;

/// Cached channels to peers, by peer URL.
#[derive(Clone)]
pub struct PeerClients {
    /// Who this member is, on every request.
    identity: PeerIdentity,
    /// std Mutex: held only to look up or insert a channel, never across I/O.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The address peer connections leave from: the one this member listens
    /// on for peers, when it listens on one address. Peers then see every
    /// packet of this member come from its own address, so that a firewall
    /// (or the fault suite's partitions) can tell members apart.
    source: Option<std::net::IpAddr>,
    /// How `https://` peers are dialled (None: this member has no peer TLS).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// When each member last answered this member's Raft requests (as
    /// leader): who is up, for membership changes that need a quorum of
    /// started members. std Mutex: held only to read or set one time.
    heard: Arc<Mutex<HashMap<u64, Instant>>>,
}

/// Why a forwarded request did not produce a result.
#[derive(Clone, Debug)]
pub enum ForwardFailure {
    /// The target is not the leader (it may name the one it knows).
    NotLeader { leader: Option<u64> },
    /// The request never reached the target: safe to send elsewhere.
    Unreachable(String),
    /// The request may or may not have been applied.
    Unknown(String),
    /// A queue on the way (this member's or the leader's) is full: nothing
    /// was proposed.
    Overloaded,
}

/// The HTTP/2 keepalive interval, and how long a ping may go unanswered, on
/// peer connections (both ends): a peer that vanished without closing its
/// connections (a partition, a power loss) is noticed within twice this.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(5);

impl PeerClients {
    /// Clients for the member `identity` whose connections leave from
    /// `source` (any address if None), dialling `https://` peers with `tls`.
    pub fn new(
        identity: PeerIdentity,
        source: Option<std::net::IpAddr>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> PeerClients {
        PeerClients { identity, channels: Arc::default(), source, tls, heard: Arc::default() }
    }

    pub fn client(&self, url: &str) -> Result<PeerStub, tonic::transport::Error> {
        let mut channels = self.channels.lock().expect("peer channel lock poisoned");
        let channel = match channels.get(url) {
            Some(c) => c.clone(),
            None => {
                let c = if crate::config::is_https(url) { self.tls_channel(url)? } else { self.plain_channel(url)? };
                channels.insert(url.to_string(), c.clone());
                c
            }
        };
        Ok(PeerClient::with_interceptor(channel, self.identity)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES))
    }

    fn plain_channel(&self, url: &str) -> Result<Channel, tonic::transport::Error> {
        Ok(Endpoint::from_shared(url.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE)
            .local_address(self.source)
            .connect_lazy())
    }

    /// A channel to an `https://` peer: this member's own connector makes the
    /// TCP connection (from `source`) and the TLS handshake (with `tls`: its
    /// certificate, the peer CA, the peer's host as the name to verify).
    /// Without peer TLS every connection attempt fails, as unreachable.
    fn tls_channel(&self, url: &str) -> Result<Channel, tonic::transport::Error> {
        let target = crate::config::url_addr(url).map_err(|e| e.to_string());
        let name = crate::config::url_host(url)
            .map_err(|e| e.to_string())
            .and_then(|h| crate::tls::server_name(h).map_err(|e| e.to_string()));
        let (tls, source) = (self.tls.clone(), self.source);
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let (target, name, tls) = (target.clone(), name.clone(), tls.clone());
            async move {
                let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
                let tls = tls.ok_or_else(|| invalid("an https:// peer URL needs peer TLS flags".into()))?;
                let (target, name) = (target.map_err(invalid)?, name.map_err(invalid)?);
                let tcp = connect_tcp(target, source).await?;
                let stream = tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        // The connector speaks TLS; the channel itself sees a plain stream.
        let endpoint = Endpoint::from_shared(url.replacen("https://", "http://", 1))?
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE);
        Ok(endpoint.connect_with_connector_lazy(connector))
    }

    /// Note that `member` answered a Raft request of this member.
    pub(crate) fn heard_from(&self, member: u64) {
        self.heard.lock().expect("peer liveness lock poisoned").insert(member, Instant::now());
    }

    /// Whether `member` has answered a Raft request of this member within
    /// `within`.
    pub fn heard_within(&self, member: u64, within: Duration) -> bool {
        let heard = self.heard.lock().expect("peer liveness lock poisoned");
        heard.get(&member).is_some_and(|at| at.elapsed() <= within)
    }

    /// Ask the leader at `url` a lease question.
    pub async fn lease(&self, url: &str, query: &LeaseQuery, timeout: Duration) -> Result<LeaseAnswer, tonic::Status> {
        reply(self.connect(url)?.lease(request(query, timeout)).await?)
    }

    /// Have the leader at `url` run a membership change.
    pub async fn membership(
        &self,
        url: &str,
        change: &MembershipChange,
        timeout: Duration,
    ) -> Result<MembershipAnswer, tonic::Status> {
        reply(self.connect(url)?.membership(request(change, timeout)).await?)
    }

    /// Ask the member at `url` for a step of a leader transfer.
    pub async fn admin(&self, url: &str, req: &ControlRequest, timeout: Duration) -> Result<bool, tonic::Status> {
        reply(self.connect(url)?.admin(request(req, timeout)).await?)
    }

    /// Ask the member at `url` for its HashKV at `revision` (see
    /// `ControlRequest::HashKv`): its hash and compact revision, or why not.
    pub async fn hash_kv(
        &self,
        url: &str,
        revision: i64,
        timeout: Duration,
    ) -> Result<Result<(u32, i64), String>, tonic::Status> {
        reply(self.connect(url)?.admin(request(&ControlRequest::HashKv { revision }, timeout)).await?)
    }

    /// The client for `url`, failing as an RPC would.
    fn connect(&self, url: &str) -> Result<PeerStub, tonic::Status> {
        self.client(url).map_err(|e| tonic::Status::unavailable(e.to_string()))
    }

    /// Ask the leader at `url` for a read index.
    pub async fn read_index(&self, url: &str, timeout: Duration) -> Result<u64, tonic::Status> {
        let mut client = self.connect(url)?;
        let mut req = tonic::Request::new(ReadIndexRequest {});
        req.set_timeout(timeout);
        Ok(client.read_index(req).await?.into_inner().index)
    }
}

/// How long a connection to a peer may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A TCP connection to `target` from `source` (any address if None), without
/// Nagle's delay, within [`CONNECT_TIMEOUT`].
async fn connect_tcp(
    target: std::net::SocketAddr,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = if target.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    if let Some(ip) = source {
        socket.bind(std::net::SocketAddr::new(ip, 0))?;
    }
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting to a peer timed out"))??;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// An encoded peer request with a deadline.
fn request<T: Serialize>(value: &T, timeout: Duration) -> tonic::Request<RaftPayload> {
    let mut req = tonic::Request::new(RaftPayload { data: encode(value) });
    req.set_timeout(timeout);
    req
}

/// The decoded answer of an encoded peer request.
fn reply<T: DeserializeOwned>(resp: tonic::Response<RaftPayload>) -> Result<T, tonic::Status> {
    decode(&resp.into_inner().data).map_err(|e| tonic::Status::internal(e.to_string()))
}

/// True when a failed call certainly did not reach the server (the connection
/// could not be made), so that sending it elsewhere cannot apply it twice.
/// Decided by the I/O error under the transport error, not by its text.
pub(super) fn never_sent(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(io.kind(), ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable);
        }
        source = e.source();
    }
    false
}
