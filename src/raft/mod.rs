//! Replication: the only module that names openraft.
//!
//! ## What openraft requires, and what raftlock chose
//! openraft (0.9, storage-v2) drives the protocol and asks the application for
//! three things:
//! - a **log store** ([`log_store::LogStore`]): entries and the vote, durable
//!   before they are acknowledged. raftlock keeps them in its own WAL
//!   (`storage::wal`) with group commit, plus an in-memory copy of the entries
//!   that are not yet purged, which replication reads from;
//! - a **state machine** ([`state_machine::StateMachine`]): applies committed
//!   entries in log order. raftlock's is the MVCC store (`crate::model::mvcc`), its
//!   persistent copy in sled, written in one atomic batch per apply call together
//!   with the last applied log id and the membership;
//! - a **network** ([`network::PeerNetwork`]): Raft RPCs over gRPC on the peer
//!   URL, with one cached channel per peer. They are part of the peer
//!   protocol ([`peer`]), whose server side also serves follower-to-leader
//!   forwarding, ReadIndex, lease questions, membership changes and
//!   leader-transfer steps. openraft 0.9
//!   sends one AppendEntries per follower at a time; raftlock streams the log
//!   to each follower underneath it and answers openraft's calls from what
//!   the follower acknowledged ([`pipeline`] says why that is sound).
//!
//! ## A write, traced
//! 1. A client's Put reaches any node's API (`crate::api::kv`), which validates it
//!    and calls the node (`Node::put`, `crate::node::write`), which makes it a
//!    [`crate::model::command::Command`].
//! 2. On the leader, the command goes to its proposer ([`proposer`], batched
//!    with other commands into one `Raft::client_write`); on a follower, it
//!    goes over the peer protocol ([`peer::forward`], in a batch on the
//!    follower's `Peer.Forward` stream) to the leader's proposer.
//! 3. openraft appends the entry to the leader's WAL; meanwhile each follower's
//!    replication pipe ([`pipeline`]) streams it to that follower without
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
//!   memory too (`crate::base::limits::HOT_LOG_BYTES`). Purging follows snapshots,
//!   taken when the log since the last one is large ([`bound_log`]).
//! - Peer RPCs are not authenticated: the peer URL must only be reachable by
//!   members.

pub mod election;
pub mod forwarded;
pub mod lease_order;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod peer;
pub mod pipeline;
pub mod proposer;
pub mod read_index;
pub mod state_machine;
pub mod transfer;

use serde::{Deserialize, Serialize};

use crate::base::limits::{CATCHUP_LOG_BYTES, SNAPSHOT_LOG_BYTES};
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
pub use openraft::{Config as RaftConfig, ServerState};

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

/// Start Raft for this member.
pub async fn start(
    id: u64,
    settings: &RaftSettings,
    log_store: log_store::LogStore,
    state_machine: state_machine::StateMachine,
    network: network::PeerNetwork,
) -> anyhow::Result<Raft> {
    // openraft's elections are off: `election` runs them (see its doc).
    let (election_timeout_min, election_timeout_max) = election::openraft_timeouts(settings.heartbeat_ms);
    let config = RaftConfig {
        cluster_name: settings.cluster_token.clone(),
        heartbeat_interval: settings.heartbeat_ms,
        election_timeout_min,
        election_timeout_max,
        // Stretched per member as the byte rule is (`bound_log`): the
        // members apply the same entries, and with one count for all they
        // wrote their images at once, which stalled writes cluster-wide.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(stretched(
            settings.snapshot_count,
            member_stretch(id),
        )),
        max_in_snapshot_log_to_keep: settings.snapshot_catchup_entries,
        ..Default::default()
    };
    let config = std::sync::Arc::new(config.validate()?);
    Ok(openraft::Raft::new(id, config, network, log_store, state_machine).await?)
}

/// What the other initial members said when asked whether they count on a
/// leader ([`ask_for_leader`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeaderAnswers {
    /// Members that answered (this one not counted).
    answered: usize,
    /// Whether one of them counts on a leader.
    leader: bool,
}

/// Ask the other `members` (this member is `id`) whether they count on a
/// leader; a peer that does not answer within `timeout` is not counted.
async fn ask_for_leader(
    peers: &peer::client::PeerClients,
    members: &std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    timeout: std::time::Duration,
) -> LeaderAnswers {
    let ask = peer::messages::ControlRequest::HasLeader;
    let asks =
        members.iter().filter(|(member, _)| **member != id).map(|(_, node)| peers.admin(&node.peer_url, &ask, timeout));
    let answers = futures::future::join_all(asks).await;
    LeaderAnswers {
        answered: answers.iter().filter(|a| a.is_ok()).count(),
        leader: answers.iter().any(|a| matches!(a, Ok(true))),
    }
}

/// Bootstrap a new cluster of `members` on this member (`id`) once it is
/// safe to: when, with this member, a majority of them answer the peer
/// protocol and none counts on a leader. If one does, this member does not
/// bootstrap: the leader sends it the log, membership first. Spawned by
/// `Node::start`, whose caller then serves the peer port (so that the peers
/// can ask this member the same question); it asks again `ask_every` after
/// each round, and ends once bootstrapped, joined (a log received or a vote
/// granted), or `stopping`.
///
/// Why both conditions: openraft's `initialize` campaigns at once, in term
/// 1, outside pre-vote, and openraft 0.9 orders the votes of one term by
/// node ID. A member that campaigned in term 1 and lost to a member with a
/// smaller ID holds a "higher" vote, answers the leader's first
/// AppendEntries with it, and the leader steps down (a second or more
/// without a leader, until pre-vote elects another). That happened to a
/// member that started after the others had elected a leader (hence the
/// question), and to members that started together but campaigned while
/// their peers did not listen yet, so that their vote requests failed
/// (hence the majority). Members that campaign while they reach each other
/// vote for the largest ID among them, and no loser holds a higher vote.
///
/// A member that granted a vote before it had a configuration (a first
/// campaign) joins that candidate; if the campaign failed, the election
/// timer (`raft::election`) lets it grant the pre-votes of the next.
///
/// Caveats: a member that asks while the others are electing hears of no
/// leader and campaigns all the same; the answers are as old as the
/// slowest peer's (at most `ask_every`, a peer that drops packets).
pub async fn bootstrap_when_a_majority_answers(
    raft: Raft,
    peers: peer::client::PeerClients,
    members: std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    elections: std::sync::Arc<election::Elections>,
    ask_every: std::time::Duration,
    mut stopping: crate::base::shutdown::Stopping,
) {
    let majority = members.len() / 2 + 1;
    let mut asked = 0u64;
    // `Node::start` spawns this only on a member with no log and no vote.
    loop {
        let answers = ask_for_leader(&peers, &members, id, ask_every).await;
        // A vote granted or a log received meanwhile (or raft stopped): not
        // new any more.
        if raft.is_initialized().await.unwrap_or(true) {
            return;
        }
        if answers.leader {
            tracing::info!("the other members already have a leader: joining it instead of bootstrapping");
            return;
        }
        if answers.answered + 1 >= majority {
            // The election timer starts from the bootstrap's own campaign,
            // as from any campaign: no pre-vote on top of it.
            elections.heard_from_leader();
            match bootstrap(&raft, members.clone()).await {
                Ok(true) => tracing::info!(members = members.len(), "bootstrapped a new cluster"),
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "bootstrapping a new cluster"),
            }
            return;
        }
        asked += 1;
        if asked % 50 == 1 {
            tracing::info!(
                answered = answers.answered + 1,
                needed = majority,
                "waiting for a majority of the initial cluster to answer before bootstrapping"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(ask_every) => {}
            _ = stopping.stopped() => return,
        }
    }
}

/// Bootstrap a new cluster of `members` on this member. Every member of a new
/// cluster does it with the same membership (unless a leader already leads
/// it: [`bootstrap_when_a_majority_answers`]); on a member that already has a log or a
/// vote it is refused (returns false), which callers avoid by asking
/// `Raft::is_initialized` first, since openraft logs the refusal as an error.
pub async fn bootstrap(raft: &Raft, members: std::collections::BTreeMap<u64, MemberNode>) -> anyhow::Result<bool> {
    use openraft::error::{InitializeError, RaftError};
    match raft.initialize(members).await {
        Ok(()) => Ok(true),
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How a restore moves the backup's revision (see `crate::restore`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RevisionBump {
    /// Added to the backup's revision.
    pub by: crate::model::mvcc::Revision,
    /// The new revision is also the compaction revision.
    pub mark_compacted: bool,
}

/// Make a new member's data directory `data_dir` (state store and empty
/// WAL) hold a backup `image` as applied at the start of a new cluster of
/// `members` (see `crate::restore`); returns the image's revision.
pub async fn restore_member(
    data_dir: &std::path::Path,
    image: &[u8],
    members: std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    bump: RevisionBump,
) -> anyhow::Result<crate::model::mvcc::Revision> {
    use anyhow::Context;
    crate::storage::data_dir::prepare(data_dir)?;
    let db = crate::storage::StateStore::open(&data_dir.join("state"), &data_dir.join("images"))
        .context("creating the state store")?;
    // One position for every restored member: index 1, before any term
    // (as openraft's own bootstrap entry is), so any leader's term is later.
    let applied = LogId::new(openraft::CommittedLeaderId::new(0, 0), 1);
    let revision = state_machine::restore_backup(db.clone(), image, applied, members, bump)?;
    db.sync().context("syncing the state store")?;
    let log = log_store::LogStore::open(&data_dir.join("wal"), crate::base::limits::WAL_SEGMENT_BYTES, db, id)
        .context("creating the WAL")?;
    drop(log);
    Ok(revision)
}

/// How long a snapshot asked for may take before it is asked for again.
const SNAPSHOT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// How much `member_id` stretches the intervals of its whole-state writes
/// (snapshots here, checkpoints in `state_machine::layout`), in 1/2048ths:
/// spread over `[0, 1024)` (up to half again) by a multiplicative hash, since
/// member ids are random but need not be uniform in their low bits. Members
/// apply the same entries, so without it they would all write their image at
/// the same moment, and while one member writes, the others should still
/// make a quorum at full speed.
pub fn member_stretch(member_id: u64) -> u64 {
    (member_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 1024
}

/// `base` stretched by `stretch` 2048ths (see [`member_stretch`]), at most
/// half of `u64::MAX` (openraft adds a snapshot count to a log index).
pub fn stretched(base: u64, stretch: u64) -> u64 {
    base.saturating_add(base.saturating_mul(stretch) / 2048).min(u64::MAX / 2)
}

/// Bound the log the WAL keeps in bytes, as openraft bounds it in entries
/// (`--snapshot-count`, `--snapshot-catchup-entries`): one entry is a whole
/// proposal batch (up to 2 MiB), so a count of entries alone lets a busy
/// member keep hundreds of MiB of log to replay. (What the log holds in
/// memory is bounded apart: see `log_store`.) Every half second: once the
/// entries applied since the last snapshot hold [`SNAPSHOT_LOG_BYTES`] or the
/// state's weight, whichever is more, stretched by `stretch` 2048ths
/// ([`member_stretch`]), ask for a snapshot (which is a checkpoint too); and
/// purge behind the last snapshot all but the newest entries holding
/// [`CATCHUP_LOG_BYTES`]. A
/// snapshot encodes the whole state, so waiting for as much log as the state
/// weighs keeps its cost per byte written bounded however large the state
/// (as checkpoints do, `state_machine::layout`); the WAL then keeps at most
/// about the state's weight of log. Runs until the node stops.
pub async fn bound_log(
    raft: Raft,
    log: log_store::LogStore,
    state: std::sync::Arc<crate::model::applied::AppliedState>,
    stretch: u64,
    mut stopping: crate::base::shutdown::Stopping,
) {
    let mut asked: Option<(u64, tokio::time::Instant)> = None;
    loop {
        tokio::select! {
            _ = stopping.stopped() => return,
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
        let (snapshot, applied, purged) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.snapshot.map(|l| l.index), m.last_applied.map(|l| l.index), m.purged.map(|l| l.index))
        };
        let Some(applied) = applied else { continue };
        let waiting = asked
            .is_some_and(|(at_index, at)| snapshot.is_none_or(|s| s < at_index) && at.elapsed() < SNAPSHOT_PATIENCE);
        let base = SNAPSHOT_LOG_BYTES.max(state.size_bytes());
        let due = stretched(base, stretch);
        if !waiting && log.bytes_between(snapshot, applied) >= due {
            tracing::debug!(applied, "the log since the last snapshot is large; snapshotting");
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            asked = Some((applied, tokio::time::Instant::now()));
        }
        if let Some(snapshot) = snapshot {
            let upto = log.keep_at_most(snapshot, CATCHUP_LOG_BYTES);
            if upto > 0 && purged.is_none_or(|p| upto > p) && raft.trigger().purge_log(upto).await.is_err() {
                return;
            }
        }
    }
}

/// Why a wait for this member to apply an index ended without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    Timeout,
    Stopped,
}

/// Wait until this member has applied log index `index`, at most `within`.
/// Watches openraft's data metrics, which change only when one of their
/// fields does, rather than its full metrics (see [`ServerMetrics`]).
pub async fn wait_applied(raft: &Raft, index: u64, within: std::time::Duration) -> Result<(), WaitError> {
    let mut data = raft.data_metrics();
    let applied = data.wait_for(|m| m.last_applied.map(|l| l.index) >= Some(index));
    let outcome = tokio::time::timeout(within, async { applied.await.map(drop) }).await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(WaitError::Stopped),
        Err(_) => Err(WaitError::Timeout),
    }
}
