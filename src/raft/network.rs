//! The client side of the peer protocol: Raft RPCs to other members, and the
//! forwarding of writes and read-index requests to the leader.
//!
//! One gRPC channel per peer URL is created lazily and cached for the life of
//! the process ([`PeerClients`]); a tonic channel multiplexes concurrent calls
//! over one HTTP/2 connection and reconnects by itself, so a peer that restarts
//! is reached again without a new channel.
//!
//! Error mapping for openraft: a peer that cannot be reached is `Unreachable`
//! (openraft backs off before retrying); any other transport failure is a
//! `Network` error; a Raft-level refusal by the peer is a `RemoteError`.
//!
//! AppendEntries to a follower go through a replication pipe
//! (`raft::pipeline`) once the follower has confirmed where its log matches;
//! calls the pipe cannot answer are sent as single requests, as all other
//! Raft RPCs are.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::log_store::LogStore;
use super::membership::{MembershipAnswer, MembershipChange};
use super::peer::{ForwardError, LeaseAnswer, LeaseQuery};
use super::pipeline::{Pipe, Stopped};
use super::transfer::AdminRequest;
use super::{decode, encode, MemberNode, TypeConfig};
use crate::batcher::Batcher;
use crate::command::{Command, CommandResult};
use crate::proto::raftlock::peer::peer_client::PeerClient;
use crate::proto::raftlock::peer::{RaftPayload, ReadIndexRequest};
use crate::storage::wal::Durable;

/// Cached channels to peers, by peer URL.
#[derive(Clone, Default)]
pub struct PeerClients {
    /// std Mutex: held only to look up or insert a channel, never across I/O.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The address peer connections leave from: the one this member listens
    /// on for peers, when it listens on one address. Peers then see every
    /// packet of this member come from its own address, so that a firewall
    /// (or the fault suite's partitions) can tell members apart.
    source: Option<std::net::IpAddr>,
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
}

/// The HTTP/2 keepalive interval, and how long a ping may go unanswered, on
/// peer connections (both ends): a peer that vanished without closing its
/// connections (a partition, a power loss) is noticed within twice this.
pub const PEER_KEEPALIVE: Duration = Duration::from_secs(5);

impl PeerClients {
    pub fn client(&self, url: &str) -> Result<PeerClient<Channel>, tonic::transport::Error> {
        let mut channels = self.channels.lock().expect("peer channel lock poisoned");
        let channel = match channels.get(url) {
            Some(c) => c.clone(),
            None => {
                let c = Endpoint::from_shared(url.to_string())?
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(PEER_KEEPALIVE)
                    .keep_alive_timeout(PEER_KEEPALIVE)
                    .local_address(self.source)
                    .connect_lazy();
                channels.insert(url.to_string(), c.clone());
                c
            }
        };
        Ok(PeerClient::new(channel).max_decoding_message_size(usize::MAX).max_encoding_message_size(usize::MAX))
    }

    fn heard_from(&self, member: u64) {
        self.heard.lock().expect("peer liveness lock poisoned").insert(member, Instant::now());
    }

    /// Whether `member` has answered a Raft request of this member within
    /// `within`.
    pub fn heard_within(&self, member: u64, within: Duration) -> bool {
        let heard = self.heard.lock().expect("peer liveness lock poisoned");
        heard.get(&member).is_some_and(|at| at.elapsed() <= within)
    }

    /// Hand writes to the leader at `url`; one answer per command, in order.
    pub async fn forward(
        &self,
        url: &str,
        cmds: &[Command],
        timeout: Duration,
    ) -> Vec<Result<CommandResult, ForwardFailure>> {
        let failed = |f: ForwardFailure| vec![Err(f); cmds.len()];
        let mut client = match self.client(url) {
            Ok(c) => c,
            Err(e) => return failed(ForwardFailure::Unreachable(e.to_string())),
        };
        let mut req = tonic::Request::new(RaftPayload { data: encode(&cmds) });
        req.set_timeout(timeout);
        let resp = match client.forward(req).await {
            Ok(r) => r,
            Err(s) if never_sent(&s) => return failed(ForwardFailure::Unreachable(s.to_string())),
            Err(s) => return failed(ForwardFailure::Unknown(s.to_string())),
        };
        let results: Vec<Result<CommandResult, ForwardError>> = match decode(&resp.into_inner().data) {
            Ok(r) => r,
            Err(e) => return failed(ForwardFailure::Unknown(e)),
        };
        if results.len() != cmds.len() {
            return failed(ForwardFailure::Unknown("forward: wrong number of results".into()));
        }
        results
            .into_iter()
            .map(|r| {
                r.map_err(|e| match e {
                    ForwardError::NotLeader { leader } => ForwardFailure::NotLeader { leader },
                    ForwardError::Failed(msg) => ForwardFailure::Unknown(msg),
                })
            })
            .collect()
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
    pub async fn admin(&self, url: &str, req: &AdminRequest, timeout: Duration) -> Result<bool, tonic::Status> {
        reply(self.connect(url)?.admin(request(req, timeout)).await?)
    }

    /// The client for `url`, failing as an RPC would.
    fn connect(&self, url: &str) -> Result<PeerClient<Channel>, tonic::Status> {
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

/// An encoded peer request with a deadline.
fn request<T: Serialize>(value: &T, timeout: Duration) -> tonic::Request<RaftPayload> {
    let mut req = tonic::Request::new(RaftPayload { data: encode(value) });
    req.set_timeout(timeout);
    req
}

/// The decoded answer of an encoded peer request.
fn reply<T: DeserializeOwned>(resp: tonic::Response<RaftPayload>) -> Result<T, tonic::Status> {
    decode(&resp.into_inner().data).map_err(tonic::Status::internal)
}

/// True when a failed call certainly did not reach the server (the connection
/// could not be made), so that sending it elsewhere cannot apply it twice.
fn never_sent(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if text.contains("tcp connect error") || text.contains("Connection refused") {
            return true;
        }
        source = e.source();
    }
    status.message().contains("tcp connect error")
}

/// Follower-side batching of forwarded writes: the writes that arrive while
/// earlier ones are on their way to the leader travel together in one
/// `Peer.Forward` call (see `crate::batcher`).
#[derive(Clone)]
pub struct Forwarder {
    batcher: Batcher<(String, Command), Result<CommandResult, ForwardFailure>>,
}

/// Forwarded batches on their way at once, at most.
const FORWARD_IN_FLIGHT: usize = 2;
/// The most commands in one forwarded batch.
const FORWARD_BATCH: usize = 512;

impl Forwarder {
    pub fn start(clients: PeerClients, timeout: Duration) -> Forwarder {
        let batcher = Batcher::start(FORWARD_BATCH, FORWARD_IN_FLIGHT, move |items: Vec<(String, Command)>| {
            let clients = clients.clone();
            async move {
                // Usually one leader URL; group by URL, keeping queue order.
                let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
                let mut cmds: Vec<Option<Command>> = Vec::with_capacity(items.len());
                for (i, (url, cmd)) in items.into_iter().enumerate() {
                    match groups.iter_mut().find(|(u, _)| *u == url) {
                        Some((_, idx)) => idx.push(i),
                        None => groups.push((url, vec![i])),
                    }
                    cmds.push(Some(cmd));
                }
                let mut results: Vec<Option<Result<CommandResult, ForwardFailure>>> = vec![None; cmds.len()];
                for (url, idx) in groups {
                    let group: Vec<Command> = idx.iter().map(|&i| cmds[i].take().expect("each command once")).collect();
                    for (i, r) in idx.into_iter().zip(clients.forward(&url, &group, timeout).await) {
                        results[i] = Some(r);
                    }
                }
                results.into_iter().map(|r| r.expect("every item forwarded")).collect()
            }
        });
        Forwarder { batcher }
    }

    /// Forward `cmd` to the leader at `url` and wait for its apply result.
    pub async fn forward(&self, url: String, cmd: Command) -> Result<CommandResult, ForwardFailure> {
        self.batcher.call((url, cmd)).await.unwrap_or(Err(ForwardFailure::Unknown("forwarder stopped".into())))
    }
}

/// openraft's network factory: one [`PeerConnection`] per target.
#[derive(Clone)]
pub struct PeerNetwork {
    pub clients: PeerClients,
    /// The local log: replication pipes send from it, and AppendEntries waits
    /// for its commit index to be durable in it (see `raft::log_store`).
    log: LogStore,
}

impl PeerNetwork {
    /// `source`: the address peer connections leave from (see [`PeerClients`]).
    pub fn new(log: LogStore, source: Option<std::net::IpAddr>) -> PeerNetwork {
        PeerNetwork { clients: PeerClients { source, ..PeerClients::default() }, log }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: u64, node: &MemberNode) -> PeerConnection {
        PeerConnection {
            target,
            url: node.peer_url.clone(),
            clients: self.clients.clone(),
            durable_log: self.log.durable(),
            log: self.log.clone(),
            pipe: None,
            matched: false,
            no_pipe_until: None,
        }
    }
}

pub struct PeerConnection {
    target: u64,
    url: String,
    clients: PeerClients,
    durable_log: Durable,
    log: LogStore,
    /// The replication pipe to this follower (see `raft::pipeline`).
    pipe: Option<Pipe>,
    /// The last AppendEntries answered succeeded: openraft's idea of where the
    /// follower's log matches is confirmed, not a guess of its search.
    matched: bool,
    /// The follower does not serve `Peer.Replicate`: no pipe before then.
    no_pipe_until: Option<Instant>,
}

/// How long a connection sends single requests to a follower that does not
/// serve `Peer.Replicate` before it tries a pipe again.
const NO_PIPE_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum RaftRpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl PeerConnection {
    async fn call<Req, Resp, E>(
        &self,
        rpc: RaftRpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, MemberNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let mut client = self.clients.client(&self.url).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let mut request = tonic::Request::new(RaftPayload { data: encode(req) });
        request.set_timeout(option.hard_ttl());
        let response = match rpc {
            RaftRpc::AppendEntries => client.append_entries(request).await,
            RaftRpc::Vote => client.vote(request).await,
            RaftRpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        let payload = response.map_err(|status| {
            if status.code() == tonic::Code::Unavailable {
                RPCError::Unreachable(Unreachable::new(&status))
            } else {
                RPCError::Network(NetworkError::new(&status))
            }
        })?;
        let result: Result<Resp, RaftError<u64, E>> = decode(&payload.into_inner().data)
            .map_err(|e| RPCError::Network(NetworkError::new(&io::Error::other(e))))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, MemberNode, RaftError<u64>>> {
        let serves = |pipe: &Option<Pipe>| pipe.as_ref().is_some_and(|p| p.serves(&rpc.vote));
        let pipe_allowed = self.matched && self.no_pipe_until.is_none_or(|t| Instant::now() >= t);
        if !rpc.entries.is_empty() && !serves(&self.pipe) && pipe_allowed {
            // Stream the log from where the follower's log is known to match.
            self.pipe = self.clients.client(&self.url).ok().map(|client| {
                Pipe::open(
                    client,
                    self.log.clone(),
                    self.durable_log.clone(),
                    rpc.vote,
                    rpc.prev_log_id,
                    rpc.leader_commit,
                )
            });
        }
        if let Some(pipe) = self.pipe.as_ref().filter(|p| p.serves(&rpc.vote)) {
            let answered = match rpc.entries.last() {
                Some(last) => pipe.replicated(Some(last.log_id), rpc.leader_commit).await,
                None => pipe.heartbeat(rpc.leader_commit, option.hard_ttl()).await,
            };
            match answered {
                Ok(()) => {
                    self.clients.heard_from(self.target);
                    return Ok(AppendEntriesResponse::Success);
                }
                Err(Stopped { reason, unsupported }) => {
                    tracing::debug!(target = self.target, %reason, "replication pipe stopped; sending alone");
                    self.pipe = None;
                    if unsupported {
                        self.no_pipe_until = Some(Instant::now() + NO_PIPE_RETRY);
                    }
                }
            }
        }
        // A follower may apply what it learns is committed: on the leader,
        // an entry counts as committed before it is synced here, so its
        // commit index travels only once it is (see `raft::log_store`).
        if let Some(committed) = rpc.leader_commit {
            self.durable_log.wait_for(committed.index).await.map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        }
        let has_entries = !rpc.entries.is_empty();
        let answer = self.call(RaftRpc::AppendEntries, &rpc, &option).await;
        if answer.is_ok() {
            self.clients.heard_from(self.target);
        }
        let succeeded = matches!(answer, Ok(AppendEntriesResponse::Success));
        // After entries succeed openraft continues from their end; after a
        // heartbeat, its next entries may still be a guess of its search.
        self.matched = succeeded && (has_entries || self.matched);
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, MemberNode, RaftError<u64, InstallSnapshotError>>> {
        self.call(RaftRpc::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, MemberNode, RaftError<u64>>> {
        self.call(RaftRpc::Vote, &rpc, &option).await
    }
}
