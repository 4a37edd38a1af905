//! The server side of the peer protocol, served on the peer URL only.
//!
//! Raft RPCs are decoded and handed to openraft; the reply (including a Raft
//! refusal) goes back encoded. `Forward` is a follower's stream of write
//! batches (`peer::forward`): each batch runs through the leader's proposer
//! (so it is batched with the leader's own writes) while later ones are
//! read, and is answered with its ID as soon as it is applied. The sender's
//! membership is checked again for each batch, since the stream outlives
//! configurations. `ReadIndex` confirms leadership with a quorum and returns the index a
//! follower must apply before it reads; `Lease` and `Membership` carry the
//! lease questions and membership changes only the leader can answer; `Admin`
//! what a leader handing over leadership asks of the others.
//!
//! `Replicate` is a leader's replication pipe (`raft::pipeline`): its
//! AppendEntries requests are handed to openraft in the order they arrive,
//! those that arrived together as one (one append, one sync), and each is
//! answered in order. It ends when the leader closes it or this member stops.
//!
//! Every RPC first passes the [`PeerGate`]: a request from another cluster,
//! or from an ID that is not a member, is refused before anything is decoded.
//! The only exception is a member's question about itself (has it been
//! removed, has it published), which a removed member must be able to ask.
//!
//! A payload that does not decode is `InvalidArgument`: it is a peer of another
//! version or not a peer at all, and nothing is applied. Decoding is bounded
//! (`raft::decode`): a nested txn deeper than the API accepts is refused, not
//! recursed into.

use futures::StreamExt;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use super::client::{PeerClients, PEER_KEEPALIVE};
use super::gate::PeerGate;
use super::messages::{
    ControlRequest, ForwardBatch, ForwardError, ForwardReply, LeaseAnswer, LeaseQuery, MembershipChange,
};
use crate::command::{Command, CommandResult};
use crate::proto::raftlock::peer::peer_server::{Peer, PeerServer};
use crate::proto::raftlock::peer::{RaftPayload, ReadIndexRequest, ReadIndexResponse};
use crate::raft::election::Elections;
use crate::raft::pipeline;
use crate::raft::proposer::{ProposeError, Proposer};
use crate::raft::read_index::{read_index, ReadFloor, ReadIndexError};
use crate::raft::{decode, encode, membership, transfer, Raft, TypeConfig};
use crate::shutdown::Stopping;

/// The leader's side of [`LeaseQuery`], implemented by the node.
#[tonic::async_trait]
pub trait LeaseAuthority: Send + Sync + 'static {
    async fn answer(&self, query: LeaseQuery) -> LeaseAnswer;
}

/// The answering side; the node builds it with its parts at start-up.
pub struct PeerService {
    pub raft: Raft,
    pub proposer: Proposer,
    pub leases: std::sync::Arc<dyn LeaseAuthority>,
    pub read_floor: std::sync::Arc<ReadFloor>,
    /// This member's own peer clients: who has answered it lately.
    pub peers: PeerClients,
    /// The applied state: which members have published themselves.
    pub state: std::sync::Arc<crate::applied::AppliedState>,
    /// The cluster token, from which members' IDs are derived.
    pub token: String,
    /// Fires when the member begins to stop (ends replication streams).
    pub stopping: Stopping,
    /// Who may ask (see the module doc).
    pub gate: PeerGate,
    /// The longest a peer may pause this member's elections.
    pub max_election_pause: std::time::Duration,
    /// This member's election timer: told when a leader is heard from.
    pub elections: std::sync::Arc<Elections>,
}

impl PeerService {
    /// The peer service, ready to serve: HTTP/2 keepalive on, so that a
    /// leader that vanished without closing its connections (a partition, a
    /// power loss) does not hold its replication streams open here.
    pub fn router(self) -> Router {
        let service = PeerServer::new(self)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        Server::builder()
            .http2_keepalive_interval(Some(PEER_KEEPALIVE))
            .http2_keepalive_timeout(Some(PEER_KEEPALIVE))
            .add_service(service)
    }
}

/// The largest peer message accepted or sent: far above any AppendEntries
/// batch or snapshot chunk a member sends, and a bound on what a peer can
/// make this member buffer.
pub const MAX_PEER_MESSAGE_BYTES: usize = 1 << 30;

fn payload<T: for<'de> Deserialize<'de>>(req: Request<RaftPayload>) -> Result<T, Status> {
    decoded(&req.into_inner())
}

/// A received payload decoded, or the status that refuses it.
fn decoded<T: for<'de> Deserialize<'de>>(payload: &RaftPayload) -> Result<T, Status> {
    decode(&payload.data).map_err(|e| Status::invalid_argument(format!("peer payload: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    Ok(Response::new(RaftPayload { data: encode(value) }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.gate.admit(&req).await?;
        let rpc: AppendEntriesRequest<TypeConfig> = payload(req)?;
        let answer = self.raft.append_entries(rpc).await;
        if from_leader(&answer) {
            self.elections.heard_from_leader();
        }
        reply(&answer)
    }

    type ReplicateStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftPayload, Status>> + Send>>;

    async fn replicate(&self, req: Request<Streaming<RaftPayload>>) -> Result<Response<Self::ReplicateStream>, Status> {
        self.gate.admit(&req).await?;
        let mut incoming = req.into_inner();
        let raft = self.raft.clone();
        let elections = self.elections.clone();
        let mut stopping = self.stopping.clone();
        let (answers, outgoing) = mpsc::channel(pipeline::MAX_IN_FLIGHT);
        tokio::spawn(async move {
            loop {
                let first = tokio::select! {
                    first = incoming.next() => first,
                    _ = stopping.stopped() => return,
                };
                let Some(first) = first else { return };
                let mut arrived = vec![first];
                pipeline::ready_now(&mut incoming, &mut arrived, pipeline::MAX_IN_FLIGHT);
                let mut requests = Vec::with_capacity(arrived.len());
                for item in arrived {
                    match item.and_then(|payload| decoded::<AppendEntriesRequest<TypeConfig>>(&payload)) {
                        Ok(request) => requests.push(request),
                        Err(status) => {
                            let _ = answers.send(Err(status)).await;
                            return;
                        }
                    }
                }
                for (request, count) in pipeline::merge(requests) {
                    let answer = raft.append_entries(request).await;
                    if from_leader(&answer) {
                        elections.heard_from_leader();
                    }
                    let answer = RaftPayload { data: encode(&answer) };
                    for _ in 0..count {
                        if answers.send(Ok(answer.clone())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(outgoing))))
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.gate.admit(&req).await?;
        let rpc: VoteRequest<u64> = payload(req)?;
        let answer = self.raft.vote(rpc).await;
        if answer.as_ref().is_ok_and(|a| a.vote_granted) {
            self.elections.heard_from_leader();
        }
        reply(&answer)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.gate.admit(&req).await?;
        let rpc: InstallSnapshotRequest<TypeConfig> = payload(req)?;
        let answer = self.raft.install_snapshot(rpc).await;
        if answer.is_ok() {
            self.elections.heard_from_leader();
        }
        reply(&answer)
    }

    type ForwardStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftPayload, Status>> + Send>>;

    async fn forward(&self, req: Request<Streaming<RaftPayload>>) -> Result<Response<Self::ForwardStream>, Status> {
        let sender = self.gate.admit(&req).await?;
        let mut incoming = req.into_inner();
        let (proposer, gate, mut stopping) = (self.proposer.clone(), self.gate.clone(), self.stopping.clone());
        let (answers, outgoing) = mpsc::channel(FORWARD_ANSWERS_QUEUED);
        tokio::spawn(async move {
            let mut running = futures::stream::FuturesUnordered::<tokio::task::JoinHandle<RaftPayload>>::new();
            // Once this member stops: no more batches are read, those
            // running are still answered, and then the follower is told
            // which batch was the last read: those after it never ran, and
            // it may send them elsewhere.
            let mut draining = false;
            let mut last_read: Option<u64> = None;
            loop {
                tokio::select! {
                    Some(answer) = running.next(), if !running.is_empty() => {
                        let answer = answer.map_err(|e| Status::internal(format!("forwarded batch: {e}")));
                        let failed = answer.is_err();
                        if answers.send(answer).await.is_err() || failed {
                            return;
                        }
                    }
                    batch = incoming.next(), if !draining => {
                        let Some(batch) = batch else { return };
                        match forwarded_batch(&gate, sender, batch).await {
                            // A task of its own, so that it moves on (and
                            // frees its proposer slot) while this loop waits.
                            Ok(batch) => {
                                last_read = Some(batch.id);
                                running.push(tokio::spawn(run_forwarded(proposer.clone(), batch)));
                            }
                            Err(status) => {
                                let _ = answers.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                    _ = stopping.stopped(), if !draining => draining = true,
                }
                if draining && running.is_empty() {
                    let closing = RaftPayload { data: encode(&ForwardReply::Closing { last_read }) };
                    let _ = answers.send(Ok(closing)).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(outgoing))))
    }

    async fn lease(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.gate.admit(&req).await?;
        let query: LeaseQuery = payload(req)?;
        reply(&self.leases.answer(query).await)
    }

    async fn membership(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.gate.admit(&req).await?;
        let change: MembershipChange = payload(req)?;
        reply(&membership::change(&self.raft, &self.peers, &self.token, change).await)
    }

    async fn admin(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let sender = self.gate.admit_cluster(&req)?;
        let control: ControlRequest = payload(req)?;
        match &control {
            // About itself: a removed member asks, and must hear the answer.
            ControlRequest::Removed { id } | ControlRequest::Published { id } if *id == sender => {}
            // The vouching question: from a known member only, so it never cascades.
            ControlRequest::IsMember { .. } => {
                self.gate.admit_known(sender)?;
            }
            _ => {
                self.gate.admit_member(sender).await?;
            }
        }
        match control {
            ControlRequest::Published { id } => {
                let leads = {
                    let m = self.raft.metrics();
                    let m = m.borrow();
                    m.current_leader == Some(m.id)
                };
                reply(&(leads && self.state.members().contains_key(&id)))
            }
            ControlRequest::HashKv { revision } => {
                let state = self.state.clone();
                let hashed = tokio::task::spawn_blocking(move || state.mvcc().hash_kv(revision))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))?;
                reply(&hashed.map_err(|e| e.to_string()))
            }
            admin => reply(&transfer::admin(&self.raft, &self.elections, admin, self.max_election_pause).await),
        }
    }

    async fn read_index(&self, req: Request<ReadIndexRequest>) -> Result<Response<ReadIndexResponse>, Status> {
        self.gate.admit(&req).await?;
        match read_index(&self.raft, &self.read_floor, &self.elections).await {
            Ok(index) => Ok(Response::new(ReadIndexResponse { index })),
            Err(ReadIndexError::NotLeader) => Err(Status::failed_precondition("not leader")),
            Err(e) => Err(Status::unavailable(e.to_string())),
        }
    }
}

/// Answers on a forwarding stream that may wait for the follower to read
/// them; beyond this, the leader reads no more of its batches until it does.
const FORWARD_ANSWERS_QUEUED: usize = 16;

/// A batch received on a forwarding stream from `sender`, decoded, if
/// `sender` is still a member and the batch holds no batch; else the status
/// that ends the stream.
async fn forwarded_batch(
    gate: &PeerGate,
    sender: u64,
    received: Result<RaftPayload, Status>,
) -> Result<ForwardBatch, Status> {
    let payload = received?;
    gate.admit_member(sender).await?;
    let batch: ForwardBatch = decoded(&payload)?;
    if batch.commands.iter().any(|c| matches!(c, Command::Batch(_))) {
        return Err(Status::invalid_argument("peer: a forwarded command cannot be a batch"));
    }
    Ok(batch)
}

/// Run a forwarded batch through this member's proposer, which puts its
/// commands in one entry, and encode its answer.
async fn run_forwarded(proposer: Proposer, batch: ForwardBatch) -> RaftPayload {
    let results: Vec<Result<CommandResult, ForwardError>> = proposer
        .propose_all(batch.commands)
        .await
        .into_iter()
        .map(|r| match r {
            Ok(r) => Ok(r),
            Err(ProposeError::NotLeader { leader }) => Err(ForwardError::NotLeader { leader }),
            Err(ProposeError::Stopped) => Err(ForwardError::Failed("raft stopped".into())),
            Err(ProposeError::Overloaded) => Err(ForwardError::Overloaded),
        })
        .collect();
    RaftPayload { data: encode(&ForwardReply::Answer { id: batch.id, results }) }
}

/// Whether an AppendEntries answered so came from the leader this member
/// follows: any answer but "my vote is newer" (see `raft::election`).
fn from_leader(answer: &Result<AppendEntriesResponse<u64>, openraft::error::RaftError<u64>>) -> bool {
    matches!(answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_)))
}
