//! Replication: the only module that names openraft, behind one face.
//!
//! Its parts, by what they do:
//! - [`replica`]: opens everything below for one member
//!   (`Replica::open(ReplicaConfig)`) and runs its tasks (`Replica::run`);
//! - `store/`: what openraft stores through raftlock — the log
//!   (`store::log_store`, over the WAL) and the state machine
//!   (`store::state_machine`: apply, its journal and checkpoints, snapshot
//!   images), when the log is cut back (`store::log_bound`), a restored
//!   backup (`store::restore`);
//! - `write/`: the write path inside raft — a follower's forwarded batches
//!   (`write::forward`), the leader's proposer (`write::proposer`), the order
//!   of a lease's grants and expiries (`write::lease_order`), the answers to
//!   forwarded writes (`write::forwarded`);
//! - [`read_index`]: the read path's read index and applied waits;
//! - `cluster/`: bootstrap, membership changes, pre-vote elections
//!   (`cluster::prevote`, which replace openraft's timer), leader transfer;
//! - `peer/`: the peer protocol — messages, the asking and answering sides,
//!   the peer gate, openraft's network adapter and the replication pipes;
//! - [`types`]: the types raftlock gives openraft.
//!
//! Submodules are private: what the node uses is re-exported below, and
//! nothing else leaves this folder.
//!
//! ## What openraft requires, and what raftlock chose
//! openraft (0.9, storage-v2) drives the protocol and asks the application for
//! three things:
//! - a **log store** (`store::log_store::LogStore`): entries and the vote,
//!   durable before they are acknowledged. raftlock keeps them in its own WAL
//!   (`storage::wal`) with group commit, plus an in-memory copy of the entries
//!   that are not yet purged, which replication reads from;
//! - a **state machine** (`store::state_machine::StateMachine`): applies
//!   committed entries in log order. raftlock's is the MVCC store
//!   (`crate::model::mvcc`), its persistent copy in sled, written in one
//!   atomic batch per apply call together with the last applied log id and
//!   the membership;
//! - a **network** (`peer::network::PeerNetwork`): Raft RPCs over gRPC on the
//!   peer URL, with one cached channel per peer. They are part of the peer
//!   protocol (`peer`), whose server side also serves follower-to-leader
//!   forwarding, ReadIndex, lease questions, membership changes and
//!   leader-transfer steps. openraft 0.9 sends one AppendEntries per follower
//!   at a time; raftlock streams the log to each follower underneath it and
//!   answers openraft's calls from what the follower acknowledged
//!   (`peer::pipeline` says why that is sound).
//!
//! ## A write, traced
//! 1. A client's Put reaches any node's API (`crate::api::kv`), which validates it
//!    and calls the node (`Node::put`, `crate::node::write`), which makes it a
//!    [`crate::model::command::Command`].
//! 2. On the leader, the command goes to its proposer (`write::proposer`,
//!    batched with other commands into one `Raft::client_write`); on a
//!    follower, it goes over the peer protocol (`write::forward`, in a batch
//!    on the follower's `Peer.Forward` stream) to the leader's proposer.
//! 3. openraft appends the entry to the leader's WAL; meanwhile each follower's
//!    replication pipe (`peer::pipeline`) streams it to that follower without
//!    waiting for earlier requests to be answered; each member reports it
//!    durable only after `fdatasync`.
//! 4. Once a quorum has it, it is committed and applied on every member in log
//!    order. The leader's apply result becomes the client's response.
//!
//! ## A read, traced
//! - Linearizable (the default): the leader confirms it still leads with a round
//!   of heartbeats to a quorum (`Raft::get_read_log_id`) and hands out the
//!   commit index as the read index. A follower asks the leader for it over
//!   `Peer.ReadIndex`, waits until it has applied that far, and serves locally.
//! - Serializable: served at once from the node's applied state; may be stale.
//!
//! ## Caveats
//! - Log entries are kept in the WAL until purged, and the newest of them in
//!   memory too (`crate::base::limits::HOT_LOG_BYTES`). Purging follows
//!   snapshots, taken when the log since the last one is large
//!   (`store::log_bound`).
//! - Peer requests carry their cluster and member IDs (`peer::gate`); without
//!   peer mTLS (`--peer-client-cert-auth`) those are claims anyone who
//!   reaches the peer port can make, so the peer URL must then only be
//!   reachable by members.

mod cluster;
mod peer;
mod read_index;
mod replica;
mod store;
mod types;
mod write;

// The face: everything the node uses of raft/, and nothing else.
pub(crate) use cluster::membership::{change as change_membership, MembershipAnswer};
pub use cluster::membership::{MembershipChange, MembershipRefusal};
pub(crate) use cluster::transfer::transfer;
pub use cluster::transfer::TransferError;
pub(crate) use peer::client::{never_sent, ForwardFailure, PeerClients};
pub(crate) use peer::identity::PeerIdentity;
#[cfg(fuzzing)]
pub(crate) use peer::messages::fuzz_decode;
pub use peer::messages::MemberStatus;
pub(crate) use peer::messages::{ControlRequest, LeaseAnswer, LeaseQuery};
pub(crate) use peer::server::{own_status, LeaseAuthority};
pub(crate) use read_index::{read_index, wait_applied, ReadIndexError, WaitError};
pub(crate) use replica::{Replica, ReplicaConfig};
pub(crate) use store::restore::restore_member;
pub(crate) use store::state_machine::{encode_state, RevisionBump};
#[cfg(fuzzing)]
pub(crate) use store::state_machine::{fuzz_apply, fuzz_image, fuzz_journal, fuzz_state};
pub(crate) use types::{leaving, matched_index, other_peer_urls, MemberNode, RaftMetrics, RaftSettings, ServerMetrics};
pub(crate) use write::lease_order::Mark;
pub(crate) use write::proposer::ProposeError;
