//! The client side of the peer protocol: one cached channel per peer, and a
//! method per question a member asks another (read index, lease questions,
//! membership changes, admin steps). Forwarded writes have a stream of their
//! own per leader (`peer::forward`).
//!
//! One gRPC channel per peer URL is created lazily and cached for the life of
//! the process ([`PeerClients`]); a tonic channel multiplexes concurrent calls
//! over one HTTP/2 connection and reconnects by itself, so a peer that restarts
//! is reached again without a new channel. Raft's own RPCs use the same
//! channels (`raft::peer::network`).
//!
//! Every request carries this member's [`PeerIdentity`] (cluster and member
//! ID), which the answering member checks (`peer::gate`).
//!
//! Retry safety: a call that failed before its connection was made
//! ([`never_sent`]) can be sent elsewhere; any other failure of a write may
//! have been applied and is reported as unknown.
//!
//! Each channel's connections are made by this module's connector, which
//! keeps the socket of the connection in use ([`PeerSocket`]), so that a
//! caller can ask the kernel whether the peer has closed it (a process that
//! died closes its connections) before HTTP/2 has read the end of it.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::base::codec::{decode, encode};
use crate::base::limits::MAX_PEER_MESSAGE_BYTES;
use crate::proto::raftlock::peer::peer_client::PeerClient;
use crate::proto::raftlock::peer::{DowngradeSetting, RaftPayload, ReadIndexRequest, VersionRequest, VersionResponse};
use crate::raft::peer::identity::PeerIdentity;
use crate::raft::peer::messages::{
    ControlRequest, LeaseAnswer, LeaseQuery, MemberStatus, MembershipAnswer, MembershipChange,
};
use crate::storage::downgrade::Setting;

/// A client of one peer: its cached channel, stamping this member's identity.
/// A peer URL's channel, and the socket of the connection it holds.
type PeerChannel = (Channel, Arc<PeerSocket>);

pub type PeerStub = PeerClient<InterceptedService<Channel, PeerIdentity>>;

/// Cached channels to peers, by peer URL.
#[derive(Clone)]
pub struct PeerClients {
    /// Who this member is, on every request.
    identity: PeerIdentity,
    /// Each peer URL's channel, and the socket of its connection. std
    /// Mutex: held only to look up or insert a channel, never across I/O.
    channels: Arc<Mutex<HashMap<String, PeerChannel>>>,
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
            Some((c, _)) => c.clone(),
            None => {
                let socket = Arc::new(PeerSocket::default());
                let c = if crate::base::ids::is_https(url) {
                    self.tls_channel(url, socket.clone())?
                } else {
                    self.plain_channel(url, socket.clone())?
                };
                channels.insert(url.to_string(), (c.clone(), socket));
                c
            }
        };
        Ok(PeerClient::with_interceptor(channel, self.identity)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES))
    }

    /// Whether this member's kernel has seen the peer at `url` close the
    /// connection its channel holds (a FIN or a reset: the peer's process
    /// ended, or closed it), though HTTP/2 may not have read that yet. False
    /// without a connection, or while it is established.
    pub fn closed_by_peer(&self, url: &str) -> bool {
        let socket = self.channels.lock().expect("peer channel lock poisoned").get(url).map(|(_, s)| s.clone());
        socket.is_some_and(|s| s.closed_by_peer())
    }

    /// A channel to an `http://` peer: this member's own connector makes the
    /// TCP connection (from `source`).
    fn plain_channel(&self, url: &str, socket: Arc<PeerSocket>) -> Result<Channel, tonic::transport::Error> {
        let hostport = url.trim_start_matches("http://").trim_end_matches('/').to_string();
        let source = self.source;
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let (hostport, socket) = (hostport.clone(), socket.clone());
            async move {
                let tcp = connect_any(&hostport, source).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Tracked::new(tcp, socket)))
            }
        });
        let endpoint = Endpoint::from_shared(url.to_string())?
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE);
        Ok(endpoint.connect_with_connector_lazy(connector))
    }

    /// A channel to an `https://` peer: this member's own connector makes the
    /// TCP connection (from `source`) and the TLS handshake (with `tls`: its
    /// certificate, the peer CA, the peer's host as the name to verify).
    /// Without peer TLS every connection attempt fails, as unreachable.
    fn tls_channel(&self, url: &str, socket: Arc<PeerSocket>) -> Result<Channel, tonic::transport::Error> {
        let hostport = url.trim_start_matches("https://").trim_end_matches('/').to_string();
        let name = crate::base::ids::url_host(url)
            .map_err(|e| e.to_string())
            .and_then(|h| crate::base::tls::server_name(h).map_err(|e| e.to_string()));
        let (tls, source) = (self.tls.clone(), self.source);
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let (hostport, name, tls, socket) = (hostport.clone(), name.clone(), tls.clone(), socket.clone());
            async move {
                let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
                let tls = tls.ok_or_else(|| invalid("an https:// peer URL needs peer TLS flags".into()))?;
                let name = name.map_err(invalid)?;
                let tcp = Tracked::new(connect_any(&hostport, source).await?, socket);
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

    /// Ask the member at `url` how it stands (see `ControlRequest::Status`).
    pub async fn status(&self, url: &str, timeout: Duration) -> Result<MemberStatus, tonic::Status> {
        reply(self.connect(url)?.admin(request(&ControlRequest::Status, timeout)).await?)
    }

    /// The client for `url`, failing as an RPC would.
    fn connect(&self, url: &str) -> Result<PeerStub, tonic::Status> {
        self.client(url).map_err(|e| tonic::Status::unavailable(e.to_string()))
    }

    /// The release the member at `url` runs, and the downgrade setting it
    /// holds; `None` from a member of release 0.1.0, which has no such
    /// question (it answers Unimplemented).
    pub async fn version(&self, url: &str, timeout: Duration) -> Result<Option<MemberVersion>, tonic::Status> {
        let mut client = self.connect(url)?;
        let mut req = tonic::Request::new(VersionRequest {});
        req.set_timeout(timeout);
        match client.version(req).await {
            Ok(answer) => Ok(Some(MemberVersion::from(answer.into_inner()))),
            Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// Give the member at `url` a downgrade setting (it keeps the newest it
    /// has seen); what it runs and holds after.
    pub async fn set_downgrade(
        &self,
        url: &str,
        setting: &Setting,
        timeout: Duration,
    ) -> Result<MemberVersion, tonic::Status> {
        let mut client = self.connect(url)?;
        let mut req = tonic::Request::new(setting_to_wire(setting.clone()));
        req.set_timeout(timeout);
        Ok(MemberVersion::from(client.set_downgrade(req).await?.into_inner()))
    }

    /// Ask the leader at `url` for a read index.
    pub async fn read_index(&self, url: &str, timeout: Duration) -> Result<u64, tonic::Status> {
        let mut client = self.connect(url)?;
        let mut req = tonic::Request::new(ReadIndexRequest {});
        req.set_timeout(timeout);
        Ok(client.read_index(req).await?.into_inner().index)
    }
}

/// What a member told of its release (`Peer.Version`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberVersion {
    /// Its release, major.minor.patch.
    pub release: String,
    /// The downgrade setting it holds.
    pub downgrade: Setting,
}

impl From<VersionResponse> for MemberVersion {
    fn from(answer: VersionResponse) -> MemberVersion {
        MemberVersion {
            release: answer.raftlock,
            downgrade: answer.downgrade.map(setting_from_wire).unwrap_or_default(),
        }
    }
}

/// A downgrade setting as the peer protocol carries it.
pub(crate) fn setting_to_wire(s: Setting) -> DowngradeSetting {
    DowngradeSetting { generation: s.generation, target: s.target.unwrap_or_default(), started: s.started }
}

/// A downgrade setting as the peer protocol carried it (an empty target is none).
pub(crate) fn setting_from_wire(s: DowngradeSetting) -> Setting {
    Setting { generation: s.generation, target: (!s.target.is_empty()).then_some(s.target), started: s.started }
}

/// The socket of the connection a peer channel holds now, if any: a
/// connection's [`Tracked`] stream sets it when made and clears it when
/// dropped, before its socket is closed.
#[derive(Default)]
pub struct PeerSocket {
    /// The connection's number and its socket. std Mutex: held while the
    /// kernel is asked about the socket, so that it is not closed (and its
    /// number reused) meanwhile.
    current: Mutex<Option<(u64, RawFd)>>,
    connections: AtomicU64,
}

impl PeerSocket {
    /// See [`PeerClients::closed_by_peer`].
    fn closed_by_peer(&self) -> bool {
        let current = self.current.lock().expect("peer socket lock poisoned");
        current.is_some_and(|(_, fd)| tcp_state(fd).is_some_and(|state| state != TCP_ESTABLISHED))
    }
}

/// `tcpi_state` of an established connection (Linux's `TCP_ESTABLISHED`).
const TCP_ESTABLISHED: u8 = 1;

/// The kernel's state of the TCP socket `fd` (`TCP_INFO`'s `tcpi_state`).
fn tcp_state(fd: RawFd) -> Option<u8> {
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable tcp_info of `len` bytes; the caller keeps `fd` open.
    let rc = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len)
    };
    (rc == 0).then_some(info.tcpi_state)
}

/// A peer connection's TCP stream, registered in its channel's
/// [`PeerSocket`] while it is open.
struct Tracked {
    tcp: tokio::net::TcpStream,
    socket: Arc<PeerSocket>,
    connection: u64,
}

impl Tracked {
    fn new(tcp: tokio::net::TcpStream, socket: Arc<PeerSocket>) -> Tracked {
        let connection = socket.connections.fetch_add(1, Ordering::Relaxed);
        *socket.current.lock().expect("peer socket lock poisoned") = Some((connection, tcp.as_raw_fd()));
        Tracked { tcp, socket, connection }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // Before `tcp` is closed (fields drop after this).
        let mut current = self.socket.current.lock().expect("peer socket lock poisoned");
        if current.is_some_and(|(connection, _)| connection == self.connection) {
            *current = None;
        }
    }
}

impl tokio::io::AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// How long a connection to a peer may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A TCP connection to `host:port` (its name resolved: [`crate::base::resolve`]),
/// to each of its addresses in turn until one answers.
async fn connect_any(hostport: &str, source: Option<std::net::IpAddr>) -> std::io::Result<tokio::net::TcpStream> {
    let mut last = None;
    for target in crate::base::resolve::resolve(hostport).await? {
        // A source address of one family cannot reach the other.
        if source.is_some_and(|ip| ip.is_ipv4() != target.is_ipv4()) {
            continue;
        }
        match connect_tcp(target, source).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, format!("{hostport}: no address to reach"))
    }))
}

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
pub(crate) fn never_sent(status: &tonic::Status) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel tells a connection the peer closed (its process died)
    /// before anything reads from it; a connection dropped here is
    /// forgotten.
    #[tokio::test]
    async fn a_connection_the_peer_closed_is_seen_before_it_is_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = Arc::new(PeerSocket::default());
        assert!(!socket.closed_by_peer(), "no connection yet");
        let tracked = Tracked::new(connect_tcp(listener.local_addr().unwrap(), None).await.unwrap(), socket.clone());
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(!socket.closed_by_peer(), "established");
        drop(accepted);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket.closed_by_peer() {
            assert!(Instant::now() < deadline, "the peer's close was never seen");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A newer connection replaces it; the older one's drop leaves it be.
        let newer = Tracked::new(connect_tcp(listener.local_addr().unwrap(), None).await.unwrap(), socket.clone());
        let _accepted = listener.accept().await.unwrap();
        drop(tracked);
        assert!(!socket.closed_by_peer(), "the newer connection is established");
        drop(newer);
        assert!(socket.current.lock().unwrap().is_none());
    }
}
