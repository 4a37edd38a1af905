//! The server side of the peer protocol, served on the peer URL only.
//!
//! Raft RPCs are decoded and handed to openraft; the reply (including a Raft
//! refusal) goes back encoded. `Forward` runs a follower's write through the
//! leader's proposer (so it is batched with the leader's own writes);
//! `ReadIndex` confirms leadership with a quorum and returns the index a
//! follower must apply before it reads; `Lease` and `Membership` carry the
//! lease questions and membership changes only the leader can answer; `Admin`
//! what a leader handing over leadership asks of the others.
//!
//! A payload that does not decode is `InvalidArgument`: it is a peer of another
//! version or not a peer at all, and nothing is applied.

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use super::membership::MembershipChange;
use super::proposer::{ProposeError, Proposer};
use super::read_index::{read_index, ReadFloor};
use super::{decode, encode, Raft, TypeConfig};
use crate::command::{Command, CommandResult};
use crate::proto::raftlock::peer::peer_server::{Peer, PeerServer};
use crate::proto::raftlock::peer::{RaftPayload, ReadIndexRequest, ReadIndexResponse};

/// Why the leader could not run a forwarded write.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardError {
    NotLeader { leader: Option<u64> },
    Failed(String),
}

/// A lease question only the leader can answer: lease time is the leader's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LeaseQuery {
    KeepAlive(i64),
    TimeToLive(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Whole seconds left.
    pub remaining: i64,
    pub granted: i64,
    pub keys: Vec<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseAnswer {
    NotLeader,
    /// The lease's TTL after the keepalive; 0 when it is unknown or expired.
    KeptAlive {
        ttl: i64,
    },
    TimeToLive(Option<LeaseStatus>),
}

/// The leader's side of [`LeaseQuery`], implemented by the node.
#[tonic::async_trait]
pub trait LeaseAuthority: Send + Sync + 'static {
    async fn answer(&self, query: LeaseQuery) -> LeaseAnswer;
}

pub struct PeerService {
    raft: Raft,
    proposer: Proposer,
    leases: std::sync::Arc<dyn LeaseAuthority>,
    read_floor: std::sync::Arc<ReadFloor>,
    /// The cluster token, from which members' IDs are derived.
    token: String,
}

impl PeerService {
    pub fn server(
        raft: Raft,
        proposer: Proposer,
        leases: std::sync::Arc<dyn LeaseAuthority>,
        read_floor: std::sync::Arc<ReadFloor>,
        token: String,
    ) -> PeerServer<PeerService> {
        PeerServer::new(PeerService { raft, proposer, leases, read_floor, token })
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

fn payload<T: for<'de> Deserialize<'de>>(req: Request<RaftPayload>) -> Result<T, Status> {
    decode(&req.into_inner().data).map_err(|e| Status::invalid_argument(format!("peer payload: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    Ok(Response::new(RaftPayload { data: encode(value) }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = payload(req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<u64> = payload(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = payload(req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }

    async fn forward(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let cmds: Vec<Command> = payload(req)?;
        if cmds.iter().any(|c| matches!(c, Command::Batch(_))) {
            return Err(Status::invalid_argument("peer: a forwarded command cannot be a batch"));
        }
        // Queued together, so the proposer puts them in one entry.
        let results: Vec<Result<CommandResult, ForwardError>> =
            futures::future::join_all(cmds.into_iter().map(|cmd| self.proposer.propose(cmd)))
                .await
                .into_iter()
                .map(|r| match r {
                    Ok(r) => Ok(r),
                    Err(ProposeError::NotLeader { leader }) => Err(ForwardError::NotLeader { leader }),
                    Err(ProposeError::Stopped) => Err(ForwardError::Failed("raft stopped".into())),
                })
                .collect();
        reply(&results)
    }

    async fn lease(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let query: LeaseQuery = payload(req)?;
        reply(&self.leases.answer(query).await)
    }

    async fn membership(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let change: MembershipChange = payload(req)?;
        reply(&super::membership::change(&self.raft, &self.token, change).await)
    }

    async fn admin(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let admin: super::transfer::AdminRequest = payload(req)?;
        reply(&super::transfer::admin(&self.raft, admin).await)
    }

    async fn read_index(&self, _req: Request<ReadIndexRequest>) -> Result<Response<ReadIndexResponse>, Status> {
        match read_index(&self.raft, &self.read_floor).await {
            Ok(index) => Ok(Response::new(ReadIndexResponse { index })),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
                Err(Status::failed_precondition("not leader"))
            }
            Err(e) => Err(Status::unavailable(e.to_string())),
        }
    }
}
