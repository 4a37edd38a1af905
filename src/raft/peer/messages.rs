//! The peer protocol's messages: what travels, bincode-encoded
//! (`base::codec::encode`), inside the `RaftPayload` of each `Peer` RPC.
//!
//! Compatibility: like the log's `Command`, these are numbered by position
//! on the wire, so variants are only appended; a member of another version
//! that sends what does not decode is answered `InvalidArgument`.

use serde::{Deserialize, Serialize};

use crate::model::command::{Command, CommandResult};

pub use crate::model::lease::{LeaseStatus, LeaseTimes};

/// Why the leader could not run a forwarded write.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardError {
    NotLeader {
        leader: Option<u64>,
    },
    Failed(String),
    /// The leader's proposal queue is full: nothing was proposed.
    Overloaded,
}

/// A batch of writes a follower hands the leader on its forwarding stream
/// (`Peer.Forward`). The leader proposes each as a `Command::Forwarded`
/// with its tag, and tells the follower only what failed
/// ([`ForwardReply::Failed`]); the follower answers the others from its own
/// apply (`raft::write::forwarded`). IDs rise by one per batch, in the order sent.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardBatch {
    /// Unique on its stream.
    pub id: u64,
    pub commands: Vec<Command>,
    /// The first command's tag; each next command's is one more.
    pub first_tag: u64,
}

/// A batch as followers of raftlocks before tags sent it: its commands are
/// proposed as they are, and it is answered with every result
/// ([`ForwardReply::Answer`]). A [`ForwardBatch`] that does not decode is
/// read as one of these, so such a follower keeps forwarding to a leader
/// of this version.
#[derive(Debug, Serialize, Deserialize)]
pub struct UntaggedForwardBatch {
    pub id: u64,
    pub commands: Vec<Command>,
}

/// What the leader sends on a forwarding stream.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    /// The results of the batch `id`: one per command, in the batch's
    /// order. The answer to an [`UntaggedForwardBatch`] (and all that
    /// raftlock's leaders sent before [`ForwardReply::Failed`]).
    Answer { id: u64, results: Vec<Result<CommandResult, ForwardError>> },
    /// The leader stops: the last thing it sends. It read no batch after
    /// `last_read` (none at all if None), so those never ran; every batch
    /// it read has been run, and answered if it was to be.
    Closing { last_read: Option<u64> },
    /// The commands of the [`ForwardBatch`] `id` that failed, by their
    /// place in it; the others were applied. Sent only if one failed.
    Failed { id: u64, failed: Vec<(u32, ForwardError)> },
}

/// A lease question only the leader can answer: lease time is the leader's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LeaseQuery {
    KeepAlive(i64),
    TimeToLive(i64),
    /// The time left and the TTL granted of each lease, keys left out: one
    /// question for a page of lock owners (`Describe`) instead of one per
    /// owner. A member asks it only of a cluster whose every member runs
    /// 0.2.0 or later (0.1.0 does not decode it); see `Node::times_left`.
    TimesLeft(Vec<i64>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseAnswer {
    NotLeader,
    /// The lease's TTL after the keepalive; 0 when it is unknown or expired.
    KeptAlive {
        ttl: i64,
    },
    TimeToLive(Option<LeaseStatus>),
    /// One per lease of [`LeaseQuery::TimesLeft`], in its order: `None` for
    /// a lease that does not exist.
    TimesLeft(Vec<Option<LeaseTimes>>),
}

/// The control requests members send each other outside Raft's own RPCs
/// (the peer `Admin` RPC, named so on the wire for compatibility): the steps
/// of a leader transfer (pause or resume elections, campaign), and questions
/// about a member's standing (has it published itself, been removed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Start no election for this long (then start them again by itself, so
    /// that a transfer that is cut short cannot leave a member mute).
    PauseElections {
        ms: u64,
    },
    ResumeElections,
    /// Start an election now.
    Campaign,
    /// Has member `id` published its attributes through the log since it was
    /// last added (so it ran in this cluster before)? Asked by a member that
    /// starts with an empty data directory; only a leader answers yes, from
    /// its applied state (the peer service does, not `admin`): a follower
    /// may not have applied a removal yet.
    Published {
        id: u64,
    },
    /// Has member `id` been removed? Only a leader answers yes: from the
    /// configuration it has applied (another member may lag behind a later
    /// addition). Asked by a member that may never see its removal
    /// committed (see `Node::removed`).
    Removed {
        id: u64,
    },
    /// Does the configuration you hold name member `id`? Asked by a member
    /// that lags behind, about a sender it does not know yet (see
    /// `peer::gate`); any member answers, from its own configuration.
    IsMember {
        id: u64,
    },
    /// etcd's HashKV of your key-value history up to `revision`: answered
    /// with `Result<(hash, compact revision), error text>` (not a bool), by
    /// any member from its own state. Asked by a member checking itself
    /// against its peers at start (`--experimental-initial-corrupt-check`).
    HashKv {
        revision: i64,
    },
    /// Would you vote for me, a voter at `term` whose log ends at
    /// `last_log`? Changes nothing on either side; asked before an election
    /// (see `raft::cluster::prevote`).
    PreVote {
        term: u64,
        last_log: Option<crate::raft::types::LogId>,
    },
    /// Do you count on a leader (`Elections::acting_leader`)? Asked by a
    /// member of a new cluster before it bootstraps (see
    /// `raft::cluster::bootstrap`).
    HasLeader,
    /// How do you stand? Answered with a [`MemberStatus`] (not a bool), by
    /// any member from its own state. Asked by the member whose web console
    /// shows the cluster (`api::console`).
    Status,
}

/// A member's own view of itself, as Maintenance.Status tells it, with the
/// release it runs: the answer to [`ControlRequest::Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// The leader this member counts on (0: none).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub applied_index: u64,
    pub is_learner: bool,
    /// What the state weighs, as the space quota counts it.
    pub db_size: u64,
    /// The raftlock release it runs.
    pub release: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    Add { peer_urls: Vec<String>, is_learner: bool },
    Remove { id: u64 },
    Update { id: u64, peer_urls: Vec<String> },
    Promote { id: u64 },
}

/// Why a change was refused (etcd's messages for them: `api::error`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MembershipRefusal {
    #[error("peer URL already in use")]
    PeerUrlExists,
    #[error("member not found")]
    MemberNotFound,
    #[error("invalid member URLs")]
    BadUrls,
    #[error("only a learner can be promoted")]
    NotLearner,
    #[error("the learner has not caught up with the leader")]
    LearnerNotReady,
    /// Another change is in progress, or the cluster cannot commit one.
    #[error("the cluster cannot take a change now")]
    Unhealthy,
    #[error("too few started members for the change")]
    NotEnoughMembers,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipAnswer {
    NotLeader,
    /// Committed: the member concerned, and the log index of the new
    /// configuration (a member has it once it has applied that far).
    Changed {
        id: u64,
        log_index: u64,
    },
    Refused(MembershipRefusal),
    /// openraft took the change, then answered that another member leads:
    /// it refused to append it, or truncated it after it was appended, and a
    /// later leader may still commit it (see `raft::write::proposer`).
    Uncertain,
}

/// Decode `bytes` as every message the peer protocol carries (the fuzz
/// targets' entry, `crate::fuzz`).
#[cfg(fuzzing)]
pub fn fuzz_decode(bytes: &[u8]) {
    use crate::base::codec::decode;
    use crate::raft::types::TypeConfig;
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    let _ = decode::<ForwardBatch>(bytes);
    let _ = decode::<UntaggedForwardBatch>(bytes);
    let _ = decode::<ForwardReply>(bytes);
    let _ = decode::<AppendEntriesRequest<TypeConfig>>(bytes);
    let _ = decode::<VoteRequest<u64>>(bytes);
    let _ = decode::<InstallSnapshotRequest<TypeConfig>>(bytes);
    let _ = decode::<LeaseQuery>(bytes);
    let _ = decode::<LeaseAnswer>(bytes);
    let _ = decode::<MembershipChange>(bytes);
    let _ = decode::<ControlRequest>(bytes);
}
