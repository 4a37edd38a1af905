//! openraft's network: Raft RPCs (AppendEntries, Vote, InstallSnapshot) to
//! other members over the peer protocol's cached channels
//! (`raft::peer::client`).
//!
//! Error mapping for openraft: a peer that cannot be reached is `Unreachable`
//! (openraft backs off before retrying); any other transport failure is a
//! `Network` error; a Raft-level refusal by the peer is a `RemoteError`.
//!
//! AppendEntries to a follower go through a replication pipe
//! (`raft::peer::pipeline`) once the follower has confirmed where its log matches;
//! calls the pipe cannot answer are sent as single requests, as all other
//! Raft RPCs are.

use std::io;
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::base::codec::{decode, encode};
use crate::proto::raftlock::peer::RaftPayload;
use crate::raft::peer::client::PeerClients;
use crate::raft::peer::pipeline::{Pipe, Stopped};
use crate::raft::store::log_store::LogStore;
use crate::raft::types::{MemberNode, TypeConfig};
use crate::storage::wal::Durable;

/// openraft's network factory: one [`PeerConnection`] per target.
#[derive(Clone)]
pub struct PeerNetwork {
    pub clients: PeerClients,
    /// The local log: replication pipes send from it, and AppendEntries waits
    /// for its commit index to be durable in it (see `raft::store::log_store`).
    log: LogStore,
}

impl PeerNetwork {
    /// Raft RPCs over `clients`, sending from `log`.
    pub fn new(log: LogStore, clients: PeerClients) -> PeerNetwork {
        PeerNetwork { clients, log }
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
    /// The replication pipe to this follower (see `raft::peer::pipeline`).
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
        let data = encode(req);
        let to = format!("{:x}", self.target);
        let m = crate::base::metrics::metrics();
        m.peer_sent_bytes.with_label_values(&[&to]).inc_by(data.len() as u64);
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(option.hard_ttl());
        let sent_at = Instant::now();
        let response = match rpc {
            RaftRpc::AppendEntries => client.append_entries(request).await,
            RaftRpc::Vote => client.vote(request).await,
            RaftRpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        m.peer_round_trip.with_label_values(&[&to]).observe(sent_at.elapsed().as_secs_f64());
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
                    self.target,
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
        // commit index travels only once it is (see `raft::store::log_store`).
        if let Some(committed) = rpc.leader_commit {
            self.durable_log.wait_for(committed.index).await.map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        }
        // A request alone may carry many entries (openraft's own batch): one
        // over the peers' message limit would be refused by the follower
        // every time, so openraft is told to send fewer, down to one (which
        // always fits: an entry is one proposal batch).
        if rpc.entries.len() > 1 {
            let size = bincode::serialized_size(&rpc).unwrap_or(u64::MAX);
            if size > crate::base::limits::MAX_PEER_MESSAGE_BYTES as u64 / 2 {
                let hint = (rpc.entries.len() / 2).max(1) as u64;
                return Err(RPCError::PayloadTooLarge(openraft::error::PayloadTooLarge::new_entries_hint(hint)));
            }
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
