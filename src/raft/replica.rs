//! This member's replica: openraft and everything raftlock runs beside it —
//! the log store and state machine over this member's storage, the peer
//! network, the election timer with pre-vote, the proposer, the forwarder
//! of a follower's writes, the read floor and the peer gate — opened from
//! one [`ReplicaConfig`], and the background tasks that keep it going
//! ([`Replica::run`]).
//!
//! Invariant: nothing is proposed before [`Replica::run`] has started the
//! election timer; a new cluster is bootstrapped only by that task, once a
//! majority of the initial members answer (`cluster::bootstrap`).
//!
//! Caveat: openraft's own election timer is set out of reach
//! (`cluster::prevote` runs elections); its snapshot policy is the per-member
//! stretched count (`store::log_bound`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::base::shutdown::Stopping;
use crate::model::applied::AppliedState;
use crate::raft::cluster::bootstrap::bootstrap_when_a_majority_answers;
use crate::raft::cluster::prevote::{self, Elections};
use crate::raft::peer::client::PeerClients;
use crate::raft::peer::gate::PeerGate;
use crate::raft::peer::network::PeerNetwork;
use crate::raft::peer::server::{LeaseAuthority, PeerService};
use crate::raft::read_index::ReadFloor;
use crate::raft::store::log_bound::{bound_log, member_stretch, stretched};
use crate::raft::store::log_store::LogStore;
use crate::raft::store::state_machine::{AppliedConfiguration, StateMachine};
use crate::raft::types::{MemberNode, Raft, RaftConfig, RaftSettings};
use crate::raft::write::forward::Forwarder;
use crate::raft::write::forwarded::ForwardedAnswers;
use crate::raft::write::proposer::Proposer;
use crate::storage::StateStore;

/// What a member's replica is opened with (from its command line).
pub struct ReplicaConfig {
    pub id: u64,
    pub cluster_id: u64,
    pub data_dir: PathBuf,
    pub settings: RaftSettings,
    /// `--initial-cluster`'s members.
    pub initial_members: BTreeMap<u64, MemberNode>,
    /// `--initial-cluster-state new`: bootstrap if this member has no log
    /// and no vote yet.
    pub new_cluster: bool,
    pub election_timeout: Duration,
    /// Log entries kept in memory beyond the hot tail (`--experimental-log-memory-bytes`).
    pub log_memory_bytes: u64,
    /// How long a forwarded write may take in all, and how long a follower
    /// waits for a leader before it gives up on forwarding one.
    pub forward_timeout: Duration,
    pub forward_leader_wait: Duration,
}

/// This member's replica (see the module doc).
pub struct Replica {
    pub raft: Raft,
    pub proposer: Proposer,
    pub forwarder: Forwarder,
    pub elections: Arc<Elections>,
    /// The least read index this member hands out while it leads.
    pub read_floor: Arc<ReadFloor>,
    pub peers: PeerClients,
    /// Admits peer requests from this cluster's members only.
    pub peer_gate: PeerGate,
    /// The configuration as applied here: what the member list shows.
    pub configuration: AppliedConfiguration,
    log_store: LogStore,
    /// The initial configuration, while this member has a cluster to bootstrap.
    bootstrap: Option<BTreeMap<u64, MemberNode>>,
    heartbeat: Duration,
    cluster_token: String,
}

impl Replica {
    /// Open the log (the WAL under `data_dir/wal`) and the state machine
    /// over `state_store`, applying into `state`, and start openraft.
    pub async fn open(
        config: ReplicaConfig,
        peers: PeerClients,
        state_store: StateStore,
        state: Arc<AppliedState>,
    ) -> anyhow::Result<Replica> {
        let ReplicaConfig { id, cluster_id, data_dir, settings, initial_members, new_cluster, .. } = config;
        let log_store =
            LogStore::open(&data_dir.join("wal"), crate::base::limits::WAL_SEGMENT_BYTES, state_store.clone(), id)
                .map(|log| log.keeping_in_memory(config.log_memory_bytes))
                .context("opening the WAL")?;
        let forwarded = Arc::new(ForwardedAnswers::new(id, 0));
        let state_machine = StateMachine::open(state_store, state)
            .context("loading the state machine")?
            .spilling_history(&data_dir.join("spill"))?
            .staggering_checkpoints(id)
            .applying_only_durable(log_store.durable())
            .answering_forwarded(forwarded.clone());
        let configuration = state_machine.configuration();
        let network = PeerNetwork::new(log_store.clone(), peers.clone());
        let raft = start(id, &settings, log_store.clone(), state_machine, network).await?;

        // A member that already has a log or a vote (a restart) has nothing
        // to bootstrap: openraft would refuse, and log the refusal as an error.
        let bootstrap = if new_cluster && !raft.is_initialized().await? { Some(initial_members.clone()) } else { None };
        let heartbeat = Duration::from_millis(settings.heartbeat_ms);
        let elections = Arc::new(Elections::new(
            raft.clone(),
            log_store.clone(),
            peers.clone(),
            config.election_timeout,
            heartbeat,
        ));
        let proposer = Proposer::start(raft.clone(), elections.clone());
        let forwarder = Forwarder::start(peers.clone(), forwarded, config.forward_timeout, config.forward_leader_wait);
        let peer_gate = PeerGate::new(cluster_id, initial_members.keys().copied(), raft.clone(), peers.clone());
        Ok(Replica {
            raft,
            proposer,
            forwarder,
            elections,
            read_floor: Arc::default(),
            peers,
            peer_gate,
            configuration,
            log_store,
            bootstrap,
            heartbeat,
            cluster_token: settings.cluster_token,
        })
    }

    /// Start the replica's background tasks, each ending when `stopping`
    /// fires: the election timer, the bootstrap of a new cluster (once a
    /// majority of the initial members answer), and the log bound.
    pub fn run(&self, id: u64, state: Arc<AppliedState>, stopping: impl Fn() -> Stopping) {
        if let Some(nodes) = self.bootstrap.clone() {
            tokio::spawn(bootstrap_when_a_majority_answers(
                self.raft.clone(),
                self.peers.clone(),
                nodes,
                id,
                self.elections.clone(),
                self.heartbeat * 2,
                stopping(),
            ));
        }
        tokio::spawn(self.elections.clone().run(stopping()));
        tokio::spawn(bound_log(self.raft.clone(), self.log_store.clone(), state, member_stretch(id), stopping()));
    }

    /// The peer protocol's service: Raft's RPCs, and forwarded writes, read
    /// indexes, lease questions (answered by `leases`), membership changes
    /// and leader transfer. A stalled election is let wait at most
    /// `max_election_pause`.
    pub fn peer_service(
        &self,
        leases: Arc<dyn LeaseAuthority>,
        state: Arc<AppliedState>,
        stopping: Stopping,
        max_election_pause: Duration,
        downgrade: Arc<crate::storage::downgrade::Downgrade>,
    ) -> tonic::transport::server::Router {
        PeerService {
            raft: self.raft.clone(),
            proposer: self.proposer.clone(),
            leases,
            read_floor: self.read_floor.clone(),
            peers: self.peers.clone(),
            state,
            token: self.cluster_token.clone(),
            stopping,
            gate: self.peer_gate.clone(),
            max_election_pause,
            elections: self.elections.clone(),
            downgrade,
        }
        .router()
    }
}

/// Start Raft for this member.
pub async fn start(
    id: u64,
    settings: &RaftSettings,
    log_store: LogStore,
    state_machine: StateMachine,
    network: PeerNetwork,
) -> anyhow::Result<Raft> {
    // openraft's elections are off: `election` runs them (see its doc).
    let (election_timeout_min, election_timeout_max) = prevote::openraft_timeouts(settings.heartbeat_ms);
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
