//! The node facade: what the API layer calls, in terms of raftlock's own types.
//!
//! - [`Node::write`] replicates a command and returns its apply result. On the
//!   leader it proposes directly; on a follower it forwards to the leader over
//!   the peer channel. It retries only what certainly was not applied (the
//!   target was not the leader, or could not be reached); anything ambiguous
//!   is reported to the client, as etcd does.
//! - [`Node::read_barrier`] makes the next local read linearizable (ReadIndex).
//! - [`Node::start`] opens storage, starts Raft and the peer service, bootstraps
//!   a new cluster, and publishes this member's client URLs through the log.
//!
//! Every long-lived task watches [`Node::shutdown_signal`].
//!
//! Caveat: a request is given `request_timeout` in all; a write still in
//! flight at that point may yet be applied (the client sees a timeout).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use openraft::error::{CheckIsLeaderError, InitializeError, RaftError};
use tokio::sync::watch;
use tokio::time::Instant;

pub mod lease_keeper;

use crate::batcher::Batcher;
use crate::command::{Command, CommandResult};
use crate::config::{ClusterState, Config};
use crate::raft::log_store::LogStore;
use crate::raft::membership::MembershipAnswer;
pub use crate::raft::membership::{MembershipChange, MembershipRefusal};
use crate::raft::network::{ForwardFailure, Forwarder, PeerClients, PeerNetwork};
use crate::raft::peer::{LeaseAnswer, LeaseAuthority, LeaseQuery, LeaseStatus};
use crate::raft::proposer::{ProposeError, Proposer};
use crate::raft::read_index::{read_index, ReadFloor};
use crate::raft::state_machine::StateMachine;
use crate::raft::transfer::transfer;
pub use crate::raft::transfer::TransferError;
use crate::raft::{MemberNode, Raft, RaftConfig, RaftMetrics, ServerState};
use crate::state::{AppliedState, MemberAttrs};
use crate::storage::wal::DEFAULT_SEGMENT_BYTES;
use crate::storage::StateDb;
use lease_keeper::LeaseKeeper;

/// Resolves once the node has begun to shut down (for `select!` in streams).
pub async fn shutdown_started(mut signal: watch::Receiver<bool>) {
    let _ = signal.wait_for(|stopping| *stopping).await;
}

/// Why a request could not be served; each maps to one of etcd's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    #[error("no leader")]
    NoLeader,
    #[error("leader changed")]
    LeaderChanged,
    #[error("request timed out")]
    Timeout,
    #[error("server stopped")]
    Stopped,
}

/// Why a membership change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipFailure {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Refused(MembershipRefusal),
}

/// A member as MemberList shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// What Maintenance.Status reports.
#[derive(Clone, Debug, Default)]
pub struct NodeStatus {
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub applied_index: u64,
    pub is_learner: bool,
    pub db_size: u64,
}

pub struct Node {
    pub id: u64,
    pub cluster_id: u64,
    /// `--initial-cluster-token`: member IDs are derived from it.
    pub cluster_token: String,
    pub name: String,
    raft: Raft,
    proposer: Proposer,
    forwarder: Forwarder,
    /// Lease deadlines, kept while this member leads.
    lease_keeper: LeaseKeeper,
    /// The smallest TTL granted, in seconds (etcd: 1.5 election timeouts, rounded up).
    pub min_lease_ttl: i64,
    /// How often watchers that asked for it get a progress notification.
    pub watch_progress_interval: Duration,
    /// The least read index this member hands out while it leads (see raft::read_index).
    read_floor: Arc<ReadFloor>,
    /// Linearizable reads that arrive together share one ReadIndex round.
    read_barriers: Batcher<(), Result<(), ServerError>>,
    state: Arc<AppliedState>,
    peers: PeerClients,
    state_db: StateDb,
    request_timeout: Duration,
    /// `--election-timeout`: bounds a leadership hand-over at stop.
    election_timeout: Duration,
    shutdown: watch::Sender<bool>,
}

impl Node {
    /// Open storage, start Raft, and bootstrap the cluster if this is a new one.
    /// The caller serves [`Node::raft`]'s peer service and the client API.
    pub async fn start(config: &Config) -> anyhow::Result<Arc<Node>> {
        config.validate()?;
        let id = config.member_id();
        let members = config.initial_members()?;
        let cluster_id = crate::config::cluster_id(&config.initial_cluster_token);
        let data_dir = config.data_dir();
        let fresh = !data_dir.join("wal").exists();
        if fresh && members.len() > 1 {
            refuse_if_bootstrapped(id, &config.name, &members, &data_dir).await?;
        }
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;

        let state_db = StateDb::open(&data_dir.join("state")).context("opening the state store")?;
        let log_store = LogStore::open(&data_dir.join("wal"), DEFAULT_SEGMENT_BYTES, state_db.clone(), id)
            .context("opening the WAL")?;
        let state = Arc::new(AppliedState::default());
        let state_machine = StateMachine::open(state_db.clone(), state.clone())
            .context("loading the state machine")?
            .staggering_checkpoints(id)
            .applying_only_durable(log_store.durable());
        let network = PeerNetwork::new(log_store.clone(), config.peer_source_address()?);
        let peers = network.clients.clone();

        let raft_config = RaftConfig {
            cluster_name: config.initial_cluster_token.clone(),
            heartbeat_interval: config.heartbeat_interval,
            election_timeout_min: config.election_timeout,
            election_timeout_max: config.election_timeout * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_count),
            max_in_snapshot_log_to_keep: config.snapshot_catchup_entries,
            ..Default::default()
        };
        let raft = crate::raft::start(id, raft_config, log_store.clone(), state_machine, network).await?;

        if config.initial_cluster_state == ClusterState::New {
            let nodes: BTreeMap<u64, MemberNode> = members
                .values()
                .map(|m| (m.id, MemberNode { name: m.name.clone(), peer_url: m.peer_urls[0].clone() }))
                .collect();
            // Every member initializes with the same membership; on a member
            // that already has a log this is refused, which is what we want.
            match raft.initialize(nodes).await {
                Ok(()) => tracing::info!(members = members.len(), "bootstrapped a new cluster"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(e.into()),
            }
        }

        let (shutdown, _) = watch::channel(false);
        let proposer = Proposer::start(raft.clone());
        let request_timeout = Duration::from_secs(5) + config.election_timeout() * 2;
        let forwarder = Forwarder::start(peers.clone(), request_timeout);
        let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| {
            let me = me.clone();
            // One barrier per batch covers every read queued before it began.
            let read_barriers = Batcher::start(usize::MAX, 1, move |reads: Vec<()>| {
                let me = me.clone();
                async move {
                    let outcome = match me.upgrade() {
                        Some(node) => node.read_index_round().await,
                        None => Err(ServerError::Stopped),
                    };
                    vec![outcome; reads.len()]
                }
            });
            Node {
                id,
                cluster_id,
                cluster_token: config.initial_cluster_token.clone(),
                name: config.name.clone(),
                raft,
                proposer,
                forwarder,
                read_barriers,
                read_floor: Arc::default(),
                lease_keeper: LeaseKeeper::default(),
                min_lease_ttl: (config.election_timeout * 3).div_ceil(2 * 1000).max(1) as i64,
                watch_progress_interval: Duration::from_millis(config.watch_progress_notify_interval),
                state,
                peers,
                state_db,
                request_timeout,
                election_timeout: config.election_timeout(),
                shutdown,
            }
        });
        let attrs = MemberAttrs { name: config.name.clone(), client_urls: config.advertise_client_urls() };
        tokio::spawn(node.clone().publish(attrs));
        tokio::spawn(lease_keeper::run(Arc::downgrade(&node)));
        Ok(node)
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub fn peer_clients(&self) -> &PeerClients {
        &self.peers
    }

    pub fn read_floor(&self) -> Arc<ReadFloor> {
        self.read_floor.clone()
    }

    pub fn applied_state(&self) -> Arc<AppliedState> {
        self.state.clone()
    }

    pub fn state(&self) -> &AppliedState {
        &self.state
    }

    /// The store's current revision (for response headers).
    pub fn revision(&self) -> i64 {
        self.state.mvcc().revision()
    }

    /// Resolves when the node begins to shut down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    fn metrics(&self) -> RaftMetrics {
        self.raft.metrics().borrow().clone()
    }

    /// The current term, for response headers.
    pub fn raft_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// The term this member leads, if it leads.
    pub fn leading_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.current_leader == Some(self.id)).then_some(m.current_term)
    }

    /// Whether this member knows a leader it can count on: another member
    /// it follows, or itself while a quorum keeps acknowledging it (a leader
    /// cut off from the others stops counting after an election timeout).
    pub fn has_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        match m.current_leader {
            None => false,
            Some(leader) if leader == self.id => {
                m.millis_since_quorum_ack.is_none_or(|ms| ms < self.election_timeout.as_millis() as u64)
            }
            Some(_) => true,
        }
    }

    /// Resolves once this member has been without a leader (see
    /// [`Node::has_leader`]) for three election timeouts in a row, as etcd
    /// decides for streams that require a leader.
    pub async fn leaderless(&self) {
        let mut since: Option<Instant> = None;
        let mut ticks = tokio::time::interval(Duration::from_millis(100));
        loop {
            ticks.tick().await;
            if self.has_leader() {
                since = None;
            } else if since.get_or_insert_with(Instant::now).elapsed() >= self.election_timeout * 3 {
                return;
            }
        }
    }

    /// Resolves once this member has been removed from the cluster: it must
    /// stop serving. It resolves a grace period later, so that requests in
    /// flight — the removal itself, when a leader removes itself — are
    /// answered first.
    ///
    /// A member's own log is no judge: while it catches up it can hold (and
    /// have applied) a configuration from before it was added, and a removed
    /// follower may never see its removal committed, as the leader stops
    /// replicating to it once it is. So once the configuration its log ends
    /// with leaves it out, or a joint one is moving its vote away, it asks
    /// the members every second; only the leader answers, from the
    /// configuration it has applied (as etcd's peers tell a removed member).
    pub async fn removed(&self) {
        const GRACE: Duration = Duration::from_secs(1);
        let mut metrics = self.raft.metrics();
        let ask = crate::raft::transfer::AdminRequest::Removed { id: self.id };
        loop {
            let leaving = |m: &RaftMetrics| {
                let membership = m.membership_config.membership();
                let joint = membership.get_joint_config();
                let voter_leaving =
                    joint.iter().any(|c| c.contains(&self.id)) && joint.last().is_some_and(|c| !c.contains(&self.id));
                m.membership_config.log_id().is_some() && (membership.get_node(&self.id).is_none() || voter_leaving)
            };
            if metrics.wait_for(leaving).await.is_err() {
                std::future::pending::<()>().await;
            }
            let urls: Vec<String> = {
                let m = metrics.borrow();
                let membership = m.membership_config.membership();
                membership.nodes().filter(|(id, _)| **id != self.id).map(|(_, n)| n.peer_url.clone()).collect()
            };
            for url in &urls {
                if let Ok(true) = self.peers.admin(url, &ask, Duration::from_secs(1)).await {
                    tokio::time::sleep(GRACE).await;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Expire leases whose deadlines passed while this member led `term`
    /// (see `lease_keeper`): only if a quorum confirms that it still leads
    /// `term`, proposed here and nowhere else, and never retried — the next
    /// tick decides again. Apply ignores the expiry if its entry is not of
    /// `term`.
    pub(crate) async fn expire_leases(&self, term: u64, ids: &[i64]) -> Result<(), ServerError> {
        let confirmed = tokio::time::timeout(self.request_timeout, read_index(&self.raft, &self.read_floor)).await;
        if !matches!(confirmed, Ok(Ok(_))) || self.leading_term() != Some(term) {
            return Err(ServerError::LeaderChanged);
        }
        let proposals = ids.iter().map(|&id| self.proposer.propose(Command::LeaseExpire { id, term }));
        let outcomes = tokio::time::timeout(self.request_timeout, futures::future::join_all(proposals))
            .await
            .map_err(|_| ServerError::Timeout)?;
        for (id, outcome) in ids.iter().zip(outcomes) {
            match outcome {
                Ok(CommandResult::LeaseRevoked { .. }) => tracing::debug!(lease = id, term, "lease expired"),
                Ok(other) => tracing::info!(lease = id, term, result = ?other, "lease expiry not applied"),
                Err(ProposeError::NotLeader { .. }) => return Err(ServerError::LeaderChanged),
                Err(ProposeError::Stopped) => return Err(ServerError::Stopped),
            }
        }
        Ok(())
    }

    /// Ask the leader a lease question (answered here if we lead).
    pub async fn lease_query(&self, query: LeaseQuery) -> Result<LeaseAnswer, ServerError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let leader = self.leader();
            match &leader {
                Some((id, _)) if *id == self.id => {
                    let answer = self.answer(query.clone()).await;
                    if answer != LeaseAnswer::NotLeader {
                        return Ok(answer);
                    }
                }
                Some((leader_id, url)) => {
                    // A lease question is safe to ask again: one that waits
                    // on a leader that has since been replaced (paused, cut
                    // off) is asked of the new one at once, so keepalives
                    // reach the leader whose deadlines count.
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    tokio::select! {
                        answer = self.peers.lease(url, &query, remaining) => match answer {
                            Ok(LeaseAnswer::NotLeader) | Err(_) => {}
                            Ok(answer) => return Ok(answer),
                        },
                        _ = self.leader_replaced(*leader_id) => continue,
                    }
                }
                None => {}
            }
            self.before_retry(leader.is_some(), deadline).await?;
        }
    }

    /// The leader's ID and peer URL, if there is a leader.
    fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader?;
        let url = m.membership_config.membership().get_node(&leader).map(|n| n.peer_url.clone())?;
        Some((leader, url))
    }

    /// Resolves once this member knows of a leader other than `leader` (or
    /// of an election under way); never, once Raft has stopped.
    async fn leader_replaced(&self, leader: u64) {
        let mut metrics = self.raft.metrics();
        if metrics.wait_for(|m| m.current_leader != Some(leader)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Between two attempts of a request: give up if the node is stopping or the
    /// deadline has passed (with "no leader" if none was known), else wait a
    /// moment for news of a leader.
    async fn before_retry(&self, had_leader: bool, deadline: Instant) -> Result<(), ServerError> {
        if *self.shutdown.borrow() {
            return Err(ServerError::Stopped);
        }
        if Instant::now() >= deadline {
            return Err(if had_leader { ServerError::Timeout } else { ServerError::NoLeader });
        }
        self.await_change(deadline).await;
        Ok(())
    }

    /// Wait (at most until `deadline`, and at most a moment) for news of a leader.
    async fn await_change(&self, deadline: Instant) {
        let mut metrics = self.raft.metrics();
        let until = deadline.min(Instant::now() + Duration::from_millis(100));
        let _ = tokio::time::timeout_at(until, metrics.changed()).await;
        // Do not spin when the metrics change for other reasons.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    /// Replicate `cmd` and return its apply result (see the module doc).
    pub async fn write(&self, cmd: Command) -> Result<CommandResult, ServerError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let leader = self.leader();
            match &leader {
                Some((leader_id, _)) if *leader_id == self.id => {
                    match tokio::time::timeout_at(deadline, self.proposer.propose(cmd.clone())).await {
                        Err(_) => return Err(ServerError::Timeout),
                        Ok(Ok(result)) => return Ok(result),
                        // Not appended (or truncated before commit): safe to retry.
                        Ok(Err(ProposeError::NotLeader { .. })) => {}
                        Ok(Err(ProposeError::Stopped)) => return Err(ServerError::Stopped),
                    }
                }
                Some((_, url)) => {
                    let forwarded = self.forwarder.forward(url.clone(), cmd.clone());
                    let Ok(outcome) = tokio::time::timeout_at(deadline, forwarded).await else {
                        return Err(ServerError::Timeout);
                    };
                    match outcome {
                        Ok(result) => return Ok(result),
                        Err(ForwardFailure::NotLeader { .. }) | Err(ForwardFailure::Unreachable(_)) => {}
                        Err(ForwardFailure::Unknown(e)) => {
                            tracing::debug!(error = %e, "forwarded write failed");
                            return Err(if Instant::now() >= deadline {
                                ServerError::Timeout
                            } else {
                                ServerError::LeaderChanged
                            });
                        }
                    }
                }
                None => {}
            }
            self.before_retry(leader.is_some(), deadline).await?;
        }
    }

    /// Make the local state fresh enough for a linearizable read: at least as
    /// new as everything committed when this call began. Concurrent callers
    /// share rounds: a round that starts after a caller arrived serves it.
    pub async fn read_barrier(&self) -> Result<(), ServerError> {
        self.read_barriers.call(()).await.unwrap_or(Err(ServerError::Stopped))
    }

    /// One ReadIndex round (see [`Node::read_barrier`]): get a read index from
    /// the leader (ourselves or over the peer channel), then wait until this
    /// member has applied that far.
    async fn read_index_round(&self) -> Result<(), ServerError> {
        let deadline = Instant::now() + self.request_timeout;
        let index = loop {
            let leader = self.leader();
            let remaining = deadline.saturating_duration_since(Instant::now());
            match &leader {
                Some((leader_id, _)) if *leader_id == self.id => {
                    match tokio::time::timeout_at(deadline, read_index(&self.raft, &self.read_floor)).await {
                        Err(_) => return Err(ServerError::Timeout),
                        Ok(Ok(index)) => break index,
                        Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {}
                        Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {}
                        Ok(Err(RaftError::Fatal(_))) => return Err(ServerError::Stopped),
                    }
                }
                Some((leader_id, url)) => {
                    // Safe to ask again, as lease questions are.
                    tokio::select! {
                        index = self.peers.read_index(url, remaining) => {
                            if let Ok(index) = index {
                                break index;
                            }
                        }
                        _ = self.leader_replaced(*leader_id) => continue,
                    }
                }
                None => {}
            }
            self.before_retry(leader.is_some(), deadline).await?;
        };
        self.wait_applied(index, deadline).await
    }

    /// Wait until this member has applied log index `index`, until `deadline`.
    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), ServerError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match self.raft.wait(Some(remaining)).applied_index_at_least(Some(index), "applied").await {
            Ok(_) => Ok(()),
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(ServerError::Timeout),
            Err(openraft::metrics::WaitError::ShuttingDown) => Err(ServerError::Stopped),
        }
    }

    /// Wait until this member's store has reached `revision` (for state that
    /// was written through another member), at most the request timeout.
    pub async fn wait_revision(&self, revision: i64) -> Result<(), ServerError> {
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let mut feed = self.state.subscribe();
        let shutdown = self.shutdown_signal();
        while self.revision() < revision {
            tokio::select! {
                batch = feed.recv() => {
                    if let Err(tokio::sync::broadcast::error::RecvError::Closed) = batch {
                        return Err(ServerError::Stopped);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Err(ServerError::Timeout),
                _ = shutdown_started(shutdown.clone()) => return Err(ServerError::Stopped),
            }
        }
        Ok(())
    }

    /// Run a membership change on the leader (forwarded if we follow), and
    /// wait until this member has the new configuration; returns the ID of the
    /// member concerned.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<u64, MembershipFailure> {
        let deadline = Instant::now() + self.request_timeout;
        // Set once an attempt may have reached the leader without an answer:
        // a refusal of the retry may then only mean the change was made.
        let mut uncertain = false;
        loop {
            let leader = self.leader();
            let answer = match &leader {
                Some((id, _)) if *id == self.id => {
                    let change =
                        crate::raft::membership::change(&self.raft, &self.peers, &self.cluster_token, change.clone());
                    match tokio::time::timeout_at(deadline, change).await {
                        Ok(answer) => Some(answer),
                        Err(_) => return Err(ServerError::Timeout.into()),
                    }
                }
                Some((_, url)) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let answer = self.peers.membership(url, &change, remaining).await.ok();
                    uncertain |= answer.is_none();
                    answer
                }
                None => None,
            };
            match answer {
                Some(MembershipAnswer::Changed { id, log_index }) => {
                    self.wait_applied(log_index, deadline).await?;
                    return Ok(id);
                }
                Some(MembershipAnswer::Refused(refusal)) => {
                    return match (&change, refusal) {
                        // An earlier attempt did add (or remove) it.
                        (MembershipChange::Add { peer_urls, .. }, MembershipRefusal::PeerUrlExists) if uncertain => {
                            Ok(crate::config::member_id(peer_urls, &self.cluster_token))
                        }
                        (MembershipChange::Remove { id }, MembershipRefusal::MemberNotFound) if uncertain => Ok(*id),
                        (_, refusal) => Err(MembershipFailure::Refused(refusal)),
                    };
                }
                Some(MembershipAnswer::NotLeader) | None => {}
            }
            self.before_retry(leader.is_some(), deadline).await?;
        }
    }

    /// Hand leadership to member `target` (Maintenance.MoveLeader); this
    /// member must lead. The transfer runs in a task of its own: it must not
    /// be stopped halfway if the caller goes away.
    pub async fn move_leader(&self, target: u64) -> Result<(), TransferError> {
        let deadline = Instant::now() + self.request_timeout;
        let (raft, peers) = (self.raft.clone(), self.peers.clone());
        let task = tokio::spawn(async move { transfer(&raft, &peers, target, deadline).await });
        task.await.unwrap_or(Err(TransferError::TimedOut))
    }

    /// Before a planned stop: if this member leads, hand leadership to the
    /// voter furthest along (as etcd does when it stops), so that writes
    /// wait for a transfer instead of for an election timeout and an
    /// election. Returns the member that leads now, if it was handed over.
    pub async fn hand_over_leadership(&self) -> Result<Option<u64>, TransferError> {
        let target = {
            let m = self.metrics();
            if m.current_leader != Some(self.id) {
                return Ok(None);
            }
            // Only a voter that has been answering: one that is down would
            // hold the stop up for nothing.
            m.membership_config
                .membership()
                .voter_ids()
                .filter(|id| *id != self.id && self.peers.heard_within(*id, self.election_timeout))
                .filter_map(|id| Some((crate::raft::matched_index(&m, id)?, id)))
                .max()
                .map(|(_, id)| id)
        };
        let Some(target) = target else { return Ok(None) };
        let deadline = Instant::now() + self.election_timeout * 3;
        let (raft, peers) = (self.raft.clone(), self.peers.clone());
        let task = tokio::spawn(async move { transfer(&raft, &peers, target, deadline).await });
        task.await.unwrap_or(Err(TransferError::TimedOut))?;
        Ok(Some(target))
    }

    /// This member's applied state, encoded (a backup), and its revision.
    pub fn snapshot(&self) -> (Vec<u8>, i64) {
        crate::raft::state_machine::encode_state(&self.state)
    }

    /// Push the state store to disk (Maintenance.Defragment).
    pub fn sync_state(&self) -> std::io::Result<()> {
        self.state_db.sync()
    }

    /// Every member, with the client URLs it published.
    pub fn members(&self) -> Vec<MemberInfo> {
        let m = self.metrics();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let attrs = self.state.members();
        membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                // A member added at run time is named by what it publishes.
                name: attrs.get(id).map_or_else(|| node.name.clone(), |a| a.name.clone()),
                peer_urls: vec![node.peer_url.clone()],
                client_urls: attrs.get(id).map(|a| a.client_urls.clone()).unwrap_or_default(),
                is_learner: !voters.contains(id),
            })
            .collect()
    }

    pub fn status(&self) -> NodeStatus {
        let m = self.metrics();
        NodeStatus {
            leader: m.current_leader.unwrap_or(0),
            raft_term: m.current_term,
            raft_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            is_learner: m.state == ServerState::Learner,
            db_size: self.state_db.size_on_disk(),
        }
    }

    /// Publish this member's attributes through the log until they are there.
    async fn publish(self: Arc<Self>, attrs: MemberAttrs) {
        let mut shutdown = self.shutdown_signal();
        loop {
            if self.state.members().get(&self.id) == Some(&attrs) {
                return;
            }
            let cmd = Command::PublishMember {
                id: self.id,
                name: attrs.name.clone(),
                client_urls: attrs.client_urls.clone(),
            };
            match self.write(cmd).await {
                Ok(_) => return,
                Err(e) => tracing::debug!(error = %e, "publishing member attributes; will retry"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Stop: signal every stream and task, stop Raft, and push the state store to disk.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Err(e) = self.state_db.sync() {
            tracing::warn!(error = %e, "syncing the state store at shutdown");
        }
    }
}

/// A member starting with an empty data directory must be starting for the
/// first time since it was (last) added. If a peer knows it ran before (it
/// published itself through the log, and was not removed since: removal
/// clears that), its data was lost: letting it in would give the others a
/// member that has forgotten its vote and the entries it acknowledged (and
/// openraft's leader stops on a follower whose log went back). Refused, as
/// etcd refuses it, with `new` and `existing` alike. Peers that cannot be
/// reached within a second are not asked.
async fn refuse_if_bootstrapped(
    id: u64,
    name: &str,
    members: &BTreeMap<u64, crate::config::InitialMember>,
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let peers = PeerClients::default();
    let ask = crate::raft::transfer::AdminRequest::Published { id };
    for member in members.values().filter(|m| m.id != id) {
        let Some(url) = member.peer_urls.first() else { continue };
        if let Ok(true) = peers.admin(url, &ask, Duration::from_secs(1)).await {
            anyhow::bail!(
                "member {name} ({id:x}) has already been bootstrapped: {} knows it, but its data directory {} is \
                 empty. Remove the member (etcdctl member remove {id:x}), add it again (etcdctl member add), and \
                 start it with --initial-cluster-state existing",
                member.name,
                data_dir.display()
            );
        }
    }
    Ok(())
}

#[tonic::async_trait]
impl LeaseAuthority for Node {
    async fn answer(&self, query: LeaseQuery) -> LeaseAnswer {
        if !self.is_leader() {
            return LeaseAnswer::NotLeader;
        }
        // The leader must have applied every grant it acknowledged.
        if self.read_barrier().await.is_err() || !self.is_leader() {
            return LeaseAnswer::NotLeader;
        }
        let table = self.state.leases();
        match query {
            LeaseQuery::KeepAlive(id) => {
                let Some(term) = self.leading_term() else { return LeaseAnswer::NotLeader };
                LeaseAnswer::KeptAlive { ttl: self.lease_keeper.renew(term, &table, id).unwrap_or(0) }
            }
            LeaseQuery::TimeToLive(id) => LeaseAnswer::TimeToLive(table.get(id).map(|l| LeaseStatus {
                remaining: self.lease_keeper.remaining(&table, id).unwrap_or(l.ttl),
                granted: l.ttl,
                keys: l.keys.iter().cloned().collect(),
            })),
        }
    }
}
