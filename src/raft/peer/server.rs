//! The server side of the peer protocol, served on the peer URL only.
//!
//! Raft RPCs are decoded and handed to openraft; the reply (including a Raft
//! refusal) goes back encoded. `Forward` is a follower's stream of write
//! batches (`peer::forward`): each batch runs through the leader's proposer
//! (so it is batched with the leader's own writes) while later ones are
//! read, each command as a `Command::Forwarded` that its sender answers from
//! its own apply (`raft::write::forwarded`); the leader answers a batch (with its
//! ID) only for the commands that failed. The sender's
//! membership is checked again for each batch, since the stream outlives
//! configurations. `ReadIndex` confirms leadership with a quorum and returns the index a
//! follower must apply before it reads; `Lease` and `Membership` carry the
//! lease questions and membership changes only the leader can answer; `Admin`
//! what a leader handing over leadership asks of the others.
//!
//! `Replicate` is a leader's replication pipe (`raft::peer::pipeline`): its
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
//! (`base::codec::decode`): a nested txn deeper than the API accepts is refused, not
//! recursed into.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::StreamExt;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

use crate::base::codec::{decode, encode};
use crate::base::limits::MAX_PEER_MESSAGE_BYTES;
use crate::base::shutdown::Stopping;
use crate::model::command::Command;
use crate::proto::raftlock::peer::peer_server::{Peer, PeerServer};
use crate::proto::raftlock::peer::{
    DowngradeSetting, RaftPayload, ReadIndexRequest, ReadIndexResponse, VersionRequest, VersionResponse,
};
use crate::raft::cluster::prevote::Elections;
use crate::raft::cluster::{membership, transfer};
use crate::raft::peer::client::{setting_from_wire, setting_to_wire, PeerClients, PEER_KEEPALIVE};
use crate::raft::peer::gate::PeerGate;
use crate::raft::peer::messages::{
    ControlRequest, ForwardBatch, ForwardError, ForwardReply, LeaseAnswer, LeaseQuery, MemberStatus, MembershipChange,
    UntaggedForwardBatch,
};
use crate::raft::peer::pipeline;
use crate::raft::read_index::{read_index, ReadFloor, ReadIndexError};
use crate::raft::types::{Raft, TypeConfig};
use crate::raft::write::proposer::{ProposeError, Proposer};
use crate::storage::downgrade::Downgrade;

/// The leader's side of [`LeaseQuery`], implemented by the node.
#[tonic::async_trait]
pub trait LeaseAuthority: Send + Sync + 'static {
    async fn answer(&self, query: LeaseQuery) -> LeaseAnswer;
}

/// The answering side; the node builds it with its parts at start-up.
pub struct PeerService {
    pub raft: Raft,
    pub proposer: Proposer,
    pub leases: Arc<dyn LeaseAuthority>,
    pub read_floor: Arc<ReadFloor>,
    /// This member's own peer clients: who has answered it lately.
    pub peers: PeerClients,
    /// The applied state: which members have published themselves.
    pub state: Arc<crate::model::applied::AppliedState>,
    /// The cluster token, from which members' IDs are derived.
    pub token: String,
    /// Fires when the member begins to stop (ends replication streams).
    pub stopping: Stopping,
    /// Who may ask (see the module doc).
    pub gate: PeerGate,
    /// The longest a peer may pause this member's elections.
    pub max_election_pause: std::time::Duration,
    /// This member's election timer: told when a leader is heard from.
    pub elections: Arc<Elections>,
    /// The cluster's downgrade setting as this member holds it.
    pub downgrade: Arc<Downgrade>,
}

/// How this member stands, from its Raft metrics, its election timer and
/// its applied state: what `ControlRequest::Status` answers, and what
/// `Node::status` returns.
pub fn own_status(raft: &Raft, elections: &Elections, state: &crate::model::applied::AppliedState) -> MemberStatus {
    // Read under the metrics' lock, without copying them, and let go at once.
    let (raft_term, raft_index, applied_index, is_learner) = {
        let metrics = raft.metrics();
        let m = metrics.borrow();
        let learner = m.state == openraft::ServerState::Learner;
        (m.current_term, m.last_log_index.unwrap_or(0), m.last_applied.map_or(0, |l| l.index), learner)
    };
    MemberStatus {
        leader: elections.acting_leader().unwrap_or(0),
        raft_term,
        raft_index,
        applied_index,
        is_learner,
        db_size: state.size_bytes(),
        release: crate::base::version::RAFTLOCK.to_string(),
    }
}

impl PeerService {
    /// This member's answer to `Status`.
    fn status(&self) -> MemberStatus {
        own_status(&self.raft, &self.elections, &self.state)
    }

    /// This member's answer to `Version`.
    fn version_answer(&self) -> VersionResponse {
        VersionResponse {
            raftlock: crate::base::version::RAFTLOCK.to_string(),
            data_format: crate::storage::format::CURRENT,
            downgrade: Some(setting_to_wire(self.downgrade.get())),
        }
    }

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
        let serving = Replicating {
            incoming: req.into_inner(),
            raft: self.raft.clone(),
            elections: self.elections.clone(),
            stopping: self.stopping.clone(),
            merged: VecDeque::new(),
            answers: VecDeque::new(),
            ended: false,
        };
        Ok(Response::new(Box::pin(futures::stream::unfold(serving, Replicating::next))))
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
            // A batch holds one of these from when it is read until its
            // answer is queued: at most this many run or wait to queue.
            let slots = Arc::new(Semaphore::new(FORWARD_ANSWERS_QUEUED));
            // The last batch read: once this member stops, no more are
            // read, those running are still answered, and then the follower
            // is told which was the last, so that it may send those after it
            // elsewhere (they never ran).
            let mut last_read: Option<u64> = None;
            loop {
                let batch = tokio::select! {
                    batch = incoming.next() => batch,
                    _ = stopping.stopped() => break,
                };
                let Some(batch) = batch else { return };
                match forwarded_batch(&gate, sender, batch).await {
                    // A task of its own, so that it moves on (and frees its
                    // proposer slot) while later batches are read and the
                    // follower reads its answer; it queues the answer itself.
                    Ok(batch) => {
                        let Ok(slot) = slots.clone().acquire_owned().await else { return };
                        last_read = Some(batch.id);
                        tokio::spawn(run_forwarded(proposer.clone(), sender, batch, answers.clone(), slot));
                    }
                    Err(status) => {
                        let _ = answers.send(Err(status)).await;
                        return;
                    }
                }
            }
            // Every slot back: every batch read has queued its answer.
            let Ok(_all) = slots.acquire_many(FORWARD_ANSWERS_QUEUED as u32).await else { return };
            let closing = RaftPayload { data: encode(&ForwardReply::Closing { last_read }) };
            let _ = answers.send(Ok(closing)).await;
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
            ControlRequest::Status => reply(&self.status()),
            admin => reply(&transfer::admin(&self.raft, &self.elections, admin, self.max_election_pause).await),
        }
    }

    async fn version(&self, req: Request<VersionRequest>) -> Result<Response<VersionResponse>, Status> {
        self.gate.admit(&req).await?;
        Ok(Response::new(self.version_answer()))
    }

    async fn set_downgrade(&self, req: Request<DowngradeSetting>) -> Result<Response<VersionResponse>, Status> {
        self.gate.admit(&req).await?;
        let setting = setting_from_wire(req.into_inner());
        self.downgrade.adopt(&setting).map_err(|e| Status::internal(format!("{e:#}")))?;
        Ok(Response::new(self.version_answer()))
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

/// A `Peer.Replicate` stream being served: its answers are the stream the
/// transport sends, and taking the next one does the work that makes it.
/// So the requests are read, appended and answered in the transport's own
/// task, polled as it sends, instead of in a task of their own that would
/// hand each answer over (one thread wake-up fewer per answer; an append
/// waits on nothing else either way, and at most `crate::base::limits::APPENDS_IN_FLIGHT`
/// requests are unanswered on a pipe). Dropped with the stream, an append
/// already handed to openraft still completes there; only its answer goes.
struct Replicating {
    incoming: Streaming<RaftPayload>,
    raft: Raft,
    elections: Arc<Elections>,
    stopping: Stopping,
    /// Requests read and merged, not yet handed to openraft, each with the
    /// number of requests it stands for (each is answered).
    merged: VecDeque<(AppendEntriesRequest<TypeConfig>, usize)>,
    /// Answers made and not yet taken by the transport.
    answers: VecDeque<Result<RaftPayload, Status>>,
    /// Nothing more is read: the stream ends once `answers` are taken.
    ended: bool,
}

impl Replicating {
    /// The next answer, once made; None when the leader closed the stream,
    /// this member stops, or a request did not decode (after its error).
    async fn next(mut self) -> Option<(Result<RaftPayload, Status>, Replicating)> {
        loop {
            if let Some(answer) = self.answers.pop_front() {
                return Some((answer, self));
            }
            if self.ended {
                return None;
            }
            if let Some((request, count)) = self.merged.pop_front() {
                let answer = self.raft.append_entries(request).await;
                if from_leader(&answer) {
                    self.elections.heard_from_leader();
                }
                let answer = RaftPayload { data: encode(&answer) };
                self.answers.extend(std::iter::repeat_n(Ok(answer), count));
                continue;
            }
            let first = tokio::select! {
                first = self.incoming.next() => first,
                _ = self.stopping.stopped() => None,
            };
            let first = first?;
            let mut arrived = vec![first];
            pipeline::ready_now(&mut self.incoming, &mut arrived, crate::base::limits::APPENDS_IN_FLIGHT);
            let mut requests = Vec::with_capacity(arrived.len());
            for item in arrived {
                match item.and_then(|payload| decoded::<AppendEntriesRequest<TypeConfig>>(&payload)) {
                    Ok(request) => requests.push(request),
                    Err(status) => {
                        self.answers.push_back(Err(status));
                        self.ended = true;
                        break;
                    }
                }
            }
            if !self.ended {
                self.merged.extend(pipeline::merge(requests));
            }
        }
    }
}

/// Forwarded batches on one stream that may run, or wait to queue their
/// answers, at once; and answers queued for the follower to read. Beyond
/// these, the leader reads no more of its batches until the follower reads.
const FORWARD_ANSWERS_QUEUED: usize = 16;

/// A batch as read from a forwarding stream: its commands' tags start at
/// `first_tag`, or it has none (a follower of an earlier raftlock, answered
/// with every result).
struct ReadBatch {
    id: u64,
    commands: Vec<Command>,
    first_tag: Option<u64>,
}

/// A batch received on a forwarding stream from `sender`, decoded, if
/// `sender` is still a member and the batch holds no batch; else the status
/// that ends the stream.
async fn forwarded_batch(
    gate: &PeerGate,
    sender: u64,
    received: Result<RaftPayload, Status>,
) -> Result<ReadBatch, Status> {
    let payload = received?;
    gate.admit_member(sender).await?;
    let batch = match decoded::<ForwardBatch>(&payload) {
        Ok(ForwardBatch { id, commands, first_tag }) => ReadBatch { id, commands, first_tag: Some(first_tag) },
        Err(_) => {
            let UntaggedForwardBatch { id, commands } = decoded(&payload)?;
            ReadBatch { id, commands, first_tag: None }
        }
    };
    if let Some(refused) = batch.commands.iter().find(|c| !forwardable(c)) {
        return Err(Status::invalid_argument(format!("peer: a follower does not forward {}", refused.kind_name())));
    }
    Ok(batch)
}

/// Whether a follower ever forwards `command`: what its clients' writes
/// become (`node::write`), and nothing else. Refused: batches and
/// forwarded writes (a forwarded write is one command), an auth change
/// not wrapped in its caller's `AsUser` (followers always wrap them, so
/// that apply checks the caller: a bare one is an auth change nobody was
/// checked for), and lease expiries (only a leader decides them, and
/// proposes them itself).
fn forwardable(command: &Command) -> bool {
    match command {
        Command::Put(_)
        | Command::DeleteRange(_)
        | Command::Txn(_)
        | Command::Compact { .. }
        | Command::PublishMember { .. }
        | Command::LeaseGrant { .. }
        | Command::LeaseRevoke { .. }
        | Command::AsUser { .. }
        | Command::Alarm { .. } => true,
        Command::Batch(_) | Command::Forwarded { .. } | Command::Auth(_) | Command::LeaseExpire { .. } => false,
    }
}

/// Run a forwarded batch from member `sender` through this member's
/// proposer, which puts its commands in one entry; `slot` is given back once
/// the batch is done. A tagged batch's commands are proposed each as a
/// `Command::Forwarded` with `sender` and its tag, so that `sender` answers
/// them from its own apply (`raft::write::forwarded`), and an answer is queued on
/// `answers` only for the commands that failed; an untagged one is answered
/// with every result. A batch whose run ended without being done (it
/// panicked, or the runtime is shutting down) is answered with an internal
/// error if there is room (the follower treats it as unknown).
async fn run_forwarded(
    proposer: Proposer,
    sender: u64,
    batch: ReadBatch,
    answers: mpsc::Sender<Result<RaftPayload, Status>>,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let unanswered = Unanswered(&answers);
    let ReadBatch { id, commands, first_tag } = batch;
    let proposed = match first_tag {
        Some(first_tag) => commands
            .into_iter()
            .enumerate()
            .map(|(i, command)| Command::Forwarded {
                origin: sender,
                tag: first_tag.wrapping_add(i as u64),
                command: Box::new(command),
            })
            .collect(),
        None => commands,
    };
    let results = proposer.propose_all(proposed).await.into_iter().map(|r| {
        r.map_err(|e| match e {
            ProposeError::NotLeader { leader } => ForwardError::NotLeader { leader },
            ProposeError::LeaderChanged => ForwardError::Failed("etcdserver: leader changed".into()),
            ProposeError::Stopped => ForwardError::Failed("raft stopped".into()),
            ProposeError::Overloaded => ForwardError::Overloaded,
            // Only a lease expiry, which raftlock's followers never forward.
            ProposeError::Superseded => ForwardError::Failed("lease expiry superseded by a grant".into()),
        })
    });
    let answer = if first_tag.is_some() {
        let failed: Vec<(u32, ForwardError)> =
            results.enumerate().filter_map(|(i, r)| Some((i as u32, r.err()?))).collect();
        (!failed.is_empty()).then_some(ForwardReply::Failed { id, failed })
    } else {
        Some(ForwardReply::Answer { id, results: results.collect() })
    };
    std::mem::forget(unanswered);
    if let Some(answer) = answer {
        let _ = answers.send(Ok(RaftPayload { data: encode(&answer) })).await;
    }
    drop(slot);
}

/// Dropped while a forwarded batch runs: only by a panic (or the runtime's
/// end), which ends the stream with an internal error.
struct Unanswered<'a>(&'a mpsc::Sender<Result<RaftPayload, Status>>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let _ = self.0.try_send(Err(Status::internal("forwarded batch: its run ended without an answer")));
    }
}

/// Whether an AppendEntries answered so came from the leader this member
/// follows: any answer but "my vote is newer" (see `raft::cluster::prevote`).
fn from_leader(answer: &Result<AppendEntriesResponse<u64>, openraft::error::RaftError<u64>>) -> bool {
    matches!(answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_)))
}
