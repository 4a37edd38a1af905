//! The types raftlock gives openraft, and the few readings of openraft's
//! metrics the rest of raft/ and the node need: what a member is
//! ([`MemberNode`]), the type configuration ([`TypeConfig`]: commands in,
//! results out, u64 member IDs), and aliases for openraft's generic types.
//!
//! Invariant: `MemberNode` is part of the log (membership entries) and of
//! snapshots; its encoding changes only with a new format version.

use serde::{Deserialize, Serialize};

use crate::model::command::{Command, CommandResult};

/// What a member is to Raft: its name and where its peers reach it. Client URLs
/// are state-machine data (published through the log), not membership.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    pub name: String,
    pub peer_url: String,
}

impl std::fmt::Display for MemberNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.peer_url)
    }
}

openraft::declare_raft_types!(
    /// raftlock's Raft types: member ids are etcd-style u64 member IDs.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = MemberNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<u64>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type RaftMetrics = openraft::RaftMetrics<u64, MemberNode>;
/// The part of openraft's metrics that changes only with a vote, a role, a
/// leader or a configuration (`Raft::server_metrics`). Tasks that wait for
/// such news watch this, never `Raft::metrics()`: openraft publishes its full
/// metrics at every step of its core (each append, acknowledgement, commit
/// and apply), waking every watcher each time — thousands of times a second
/// under load, on every member. The channel closes when openraft's core ends.
pub type ServerMetrics = tokio::sync::watch::Receiver<ServerMetricsView>;
/// One reading of [`ServerMetrics`].
pub type ServerMetricsView = openraft::metrics::RaftServerMetrics<u64, MemberNode>;

/// Whether the configuration `metrics` holds (as its log ends) leaves member
/// `id` out, or is a joint one that moves `id`'s vote away.
pub fn leaving(metrics: &ServerMetricsView, id: u64) -> bool {
    let membership = metrics.membership_config.membership();
    let joint = membership.get_joint_config();
    let voter_leaving = joint.iter().any(|c| c.contains(&id)) && joint.last().is_some_and(|c| !c.contains(&id));
    metrics.membership_config.log_id().is_some() && (membership.get_node(&id).is_none() || voter_leaving)
}

/// The peer URLs of the members other than `id` in the configuration
/// `metrics` holds.
pub fn other_peer_urls(metrics: &ServerMetricsView, id: u64) -> Vec<String> {
    let membership = metrics.membership_config.membership();
    membership.nodes().filter(|(m, _)| **m != id).map(|(_, n)| n.peer_url.clone()).collect()
}

/// How far member `id`'s log matches the leader's, as the leader's metrics
/// know it (`None` if this member does not lead or has no news of `id`).
pub fn matched_index(metrics: &RaftMetrics, id: u64) -> Option<u64> {
    metrics.replication.as_ref()?.get(&id)?.as_ref().map(|log_id| log_id.index)
}
/// Whether `metrics`' member has applied a configuration that leaves member
/// `id` out (so its removal is committed).
pub fn removal_applied(metrics: &RaftMetrics, id: u64) -> bool {
    let config = &metrics.membership_config;
    let applied = match (config.log_id(), metrics.last_applied) {
        (Some(config), Some(applied)) => config.index <= applied.index,
        _ => false,
    };
    applied && config.membership().get_node(&id).is_none()
}
pub use openraft::Config as RaftConfig;

/// What a member's Raft is configured with (from its command line).
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// `--initial-cluster-token`.
    pub cluster_token: String,
    pub heartbeat_ms: u64,
    /// A snapshot is taken every this many applied entries, stretched by up
    /// to half on each member ([`member_stretch`]).
    pub snapshot_count: u64,
    /// Entries kept in the log behind a snapshot for slow followers.
    pub snapshot_catchup_entries: u64,
}
