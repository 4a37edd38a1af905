//! The node facade: what the API layer (and the lock recipes) call, in terms
//! of raftlock's own types. Nothing above this module names Raft, the peer
//! protocol or storage.
//!
//! - Writes ([`write`]): one typed method per operation (`put`, `txn`,
//!   `grant_lease`, ...). On the leader they are proposed directly; on a
//!   follower they are forwarded to the leader over the peer protocol.
//! - Reads ([`read`]): [`Node::read_barrier`] makes the next local read
//!   linearizable (ReadIndex); reads then look at [`Node::state`].
//! - Lease time ([`leases`], [`lease::keeper`]): keepalives and TimeToLive go
//!   to the leader, which alone keeps deadlines and proposes expiries.
//! - Membership ([`members`]): changes, leader transfer, the member list.
//! - Every request that only the leader can answer goes through one routing
//!   loop ([`route`]).
//! - [`Node::start`] opens storage, starts Raft, bootstraps a new cluster
//!   (in a task, once a majority of its members answer), and publishes this
//!   member's client URLs through the log; [`Node::serve_peers`] serves the
//!   peer protocol.
//!
//! Every long-lived task and stream holds a [`Node::stopping`] handle and
//! ends when it fires; [`Node::shutdown`] waits for them (see `crate::base::shutdown`).
//!
//! Caveat: a request is given `request_timeout` in all; a write still in
//! flight at that point may yet be applied (the client sees a timeout).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

mod auth;
mod compactor;
mod corruption;
pub mod disk;
pub mod lease;
mod members;
pub mod passwords;
mod read;
mod route;
pub mod versions;
mod write;

pub use crate::raft::TransferError;
pub use crate::raft::{MembershipChange, MembershipRefusal};
pub use write::WriteError;

use crate::base::batcher::Batcher;
use crate::base::listen;
use crate::base::shutdown::{Shutdown, Stopping};
use crate::config::{ClusterState, Config};
use crate::model::applied::{AppliedState, MemberAttrs};
use crate::raft::LeaseAuthority;
use crate::raft::PeerClients;
use crate::raft::PeerIdentity;
use crate::raft::{MemberNode, RaftMetrics, RaftSettings, ServerMetrics};
use crate::raft::{Replica, ReplicaConfig};
use crate::storage::StateStore;
use lease::keeper::LeaseKeeper;

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
    /// A queue this request would wait in is full (etcd's "too many requests").
    #[error("too many requests")]
    TooManyRequests,
    /// The request asks for what an older member's release lacks
    /// (`versions`): says which release, and which members.
    #[error("{0}")]
    NeedsRelease(String),
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

/// Read barriers: one round covers every read queued before it began; at
/// most [`crate::base::limits::MAX_QUEUED_COMMANDS`] reads wait for one.
const READ_BARRIER_LIMITS: crate::base::batcher::Limits = crate::base::batcher::Limits {
    max_batch: usize::MAX,
    max_batch_weight: u64::MAX,
    max_in_flight: 1,
    max_queued: crate::base::limits::MAX_QUEUED_COMMANDS,
    max_queued_weight: u64::MAX,
};

/// Count leader changes (`etcd_server_leader_changes_seen_total`): every
/// time the leader this member knows becomes another one.
async fn count_leader_changes(mut server_metrics: ServerMetrics, mut stopping: Stopping) {
    let mut known = None;
    loop {
        let leader = server_metrics.borrow_and_update().current_leader;
        if leader.is_some() && leader != known {
            crate::base::metrics::metrics().leader_changes.inc();
            known = leader;
        }
        tokio::select! {
            changed = server_metrics.changed() => if changed.is_err() { return },
            _ = stopping.stopped() => return,
        }
    }
}

/// How long a stop waits for tasks and streams to end (see `crate::base::shutdown`).
const STOP_WAIT: Duration = Duration::from_secs(5);

pub struct Node {
    pub id: u64,
    pub cluster_id: u64,
    /// `--initial-cluster-token`: member IDs are derived from it.
    pub cluster_token: String,
    pub name: String,
    /// This member's replica: Raft and what runs beside it (`raft::Replica`).
    replica: Replica,
    /// Lease deadlines, kept while this member leads.
    lease_keeper: LeaseKeeper,
    /// The smallest TTL granted, in seconds (etcd: 1.5 election timeouts, rounded up).
    pub min_lease_ttl: i64,
    /// The space quota in bytes (`None`: none), checked by [`write`].
    quota: Option<u64>,
    /// This member's disk has less free space than its reserve (see
    /// [`disk`]): writes that add data are refused here at once.
    disk_low: std::sync::atomic::AtomicBool,
    /// Linearizable reads that arrive together share one ReadIndex round.
    read_barriers: Batcher<(), Result<(), ServerError>>,
    state: Arc<AppliedState>,
    state_store: StateStore,
    request_timeout: Duration,
    /// `--election-timeout`: bounds a leadership hand-over at stop.
    election_timeout: Duration,
    /// True while this member has been without a leader for three election
    /// timeouts in a row, as sampled every 100 ms (so it may lag a leader's
    /// return by a sample): one task decides it (`watch_for_a_leader`) for
    /// every stream that requires a leader.
    leaderless: tokio::sync::watch::Sender<bool>,
    /// bcrypt's slots, lockouts and `--bcrypt-cost` (`passwords`).
    passwords: passwords::PasswordGate,
    /// The other members' releases, as they told them (`versions`).
    releases: versions::Releases,
    /// The cluster's downgrade setting as this member holds it (`versions`).
    downgrade: Arc<crate::storage::downgrade::Downgrade>,
    /// `--client-cert-auth`: a verified client certificate names the user.
    client_cert_auth: bool,
    shutdown: Shutdown,
}

impl Node {
    /// Open storage, start Raft, and (in a task, once a majority of the
    /// initial members answer) bootstrap the cluster if this is a new one.
    /// The caller serves the peer protocol ([`Node::serve_peers`]) and the
    /// client API.
    pub async fn start(config: &Config) -> anyhow::Result<Arc<Node>> {
        config.validate()?;
        // --auth-token is checked here, where its model is known (the config
        // layer sits below the model), before anything is written.
        let tokens = crate::model::auth::TokenConfig::parse(&config.auth_token, config.auth_token_ttl)?;
        let id = config.member_id();
        let members = config.initial_members()?;
        let cluster_id = crate::base::ids::cluster_id(&config.initial_cluster_token);
        let data_dir = config.data_dir();
        let identity = PeerIdentity { cluster_id, member_id: id };
        let peers = PeerClients::new(identity, config.peer_source_address()?, config.peer_client_tls()?);
        let fresh = !crate::storage::data_dir::holds_member_data(&data_dir);
        if fresh && members.len() > 1 {
            members::refuse_if_bootstrapped(&peers, id, &config.name, &members, &data_dir).await?;
        }
        disk::wait_for_space(&data_dir, config.disk_space_reserve_bytes / 2).await;
        if crate::storage::format::make_first_release_private(&data_dir, !fresh)? {
            tracing::info!(data_dir = %data_dir.display(), "made private (0700) the data directory release 0.1.0 left open");
        }
        crate::storage::data_dir::prepare(&data_dir)?;
        let format = crate::storage::format::open(&data_dir, !fresh)?;
        if format.written_by.as_deref().is_some_and(|v| v != crate::base::version::RAFTLOCK) {
            tracing::info!(
                written_by = format.written_by.as_deref().unwrap_or_default(),
                format = format.format,
                "data directory written by another raftlock release"
            );
        }

        let downgrade = Arc::new(crate::storage::downgrade::Downgrade::open(&data_dir)?);
        let state_store =
            StateStore::open(&data_dir.join("state"), &data_dir.join("images")).context("opening the state store")?;
        let state = Arc::new(AppliedState::with_tokens(crate::model::auth::Tokens::new(tokens)));
        let request_timeout = Duration::from_secs(5) + config.election_timeout() * 2;
        let replica_config = ReplicaConfig {
            id,
            cluster_id,
            data_dir: data_dir.clone(),
            settings: RaftSettings {
                cluster_token: config.initial_cluster_token.clone(),
                heartbeat_ms: config.heartbeat_interval,
                snapshot_count: config.snapshot_count,
                snapshot_catchup_entries: config.snapshot_catchup_entries,
            },
            initial_members: members
                .values()
                .map(|m| (m.id, MemberNode { name: m.name.clone(), peer_url: m.peer_urls[0].clone() }))
                .collect(),
            new_cluster: config.initial_cluster_state == ClusterState::New,
            election_timeout: config.election_timeout(),
            log_memory_bytes: config.experimental_log_memory_bytes,
            forward_timeout: request_timeout,
            forward_leader_wait: config.election_timeout() * 2,
        };
        let replica = Replica::open(replica_config, peers, state_store.clone(), state.clone()).await?;
        let shutdown = Shutdown::new();
        let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| {
            let me = me.clone();
            // One barrier per batch covers every read queued before it began.
            let read_barriers =
                Batcher::start(READ_BARRIER_LIMITS, crate::base::batcher::unweighed, move |reads: Vec<()>| {
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
                replica,
                read_barriers,
                lease_keeper: LeaseKeeper::with_rate(config.lease_expiry_rate as usize),
                min_lease_ttl: (config.election_timeout * 3).div_ceil(2 * 1000).max(1) as i64,
                quota: config.quota_bytes(),
                disk_low: Default::default(),
                state,
                state_store,
                request_timeout,
                election_timeout: config.election_timeout(),
                leaderless: tokio::sync::watch::Sender::new(false),
                passwords: passwords::PasswordGate::per_core(config.bcrypt_cost),
                releases: versions::Releases::default(),
                downgrade,
                client_cert_auth: config.client_cert_auth,
                shutdown,
            }
        });
        let attrs = MemberAttrs { name: config.name.clone(), client_urls: config.advertise_client_urls() };
        node.replica.run(node.id, node.state.clone(), || node.stopping());
        tokio::spawn(node.clone().publish(attrs, node.stopping()));
        tokio::spawn(versions::keep_asking(node.clone(), node.stopping()));
        tokio::spawn(node.clone().watch_for_a_leader(node.stopping()));
        tokio::spawn(lease::keeper::run(node.clone(), node.stopping()));
        tokio::spawn(compactor::sweep(node.clone(), node.stopping()));
        tokio::spawn(count_leader_changes(node.replica.raft.server_metrics(), node.stopping()));
        tokio::spawn(disk::watch(node.clone(), data_dir, config.disk_space_reserve_bytes, node.stopping()));
        if let Some(policy) = config.auto_compaction()? {
            tokio::spawn(compactor::run(node.clone(), policy, node.stopping()));
        }
        Ok(node)
    }

    /// Serve the peer protocol on `listeners` (bound by [`listen::bind`])
    /// until the node shuts down.
    pub async fn serve_peers(self: Arc<Self>, listeners: Vec<listen::Bound>) -> anyhow::Result<()> {
        let make = || {
            let leases: Arc<dyn LeaseAuthority> = self.clone();
            self.replica.peer_service(
                leases,
                self.state.clone(),
                self.stopping(),
                self.request_timeout,
                self.downgrade.clone(),
            )
        };
        listen::serve(listeners, make, self.stopping()).await
    }

    /// The space quota in bytes (`None`: none).
    pub fn quota_bytes(&self) -> Option<u64> {
        self.quota
    }

    /// Resolves if Raft stops for good (a storage failure: a WAL write or
    /// sync failed), with why: the member must stop serving, rather than
    /// answer reads from a state that no longer moves.
    ///
    /// Waits on the server metrics (see [`ServerMetrics`]): openraft's full
    /// metrics change with every append and apply, and a task waiting on
    /// them would be woken thousands of times a second. openraft's core
    /// records a fatal error in its full metrics, then ends, which closes
    /// the server metrics channel.
    pub async fn failed(&self) -> String {
        let mut server = self.replica.raft.server_metrics();
        loop {
            if let Err(fatal) = &self.replica.raft.metrics().borrow().running_state {
                return fatal.to_string();
            }
            if server.changed().await.is_err() {
                return match &self.replica.raft.metrics().borrow().running_state {
                    Err(fatal) => fatal.to_string(),
                    Ok(()) => "raft stopped".to_string(),
                };
            }
        }
    }

    /// Client commands waiting for a proposal batch on this member.
    pub fn pending_proposals(&self) -> usize {
        self.replica.proposer.queued()
    }

    pub fn state(&self) -> &AppliedState {
        &self.state
    }

    /// The store's current revision (for response headers).
    pub fn revision(&self) -> i64 {
        self.state.mvcc().revision()
    }

    /// A handle for a long-lived task or stream: it resolves when the node
    /// begins to stop, and the stop waits until it is dropped.
    pub fn stopping(&self) -> Stopping {
        self.shutdown.subscribe()
    }

    fn metrics(&self) -> RaftMetrics {
        self.replica.raft.metrics().borrow().clone()
    }

    /// The current term, for response headers.
    pub fn raft_term(&self) -> u64 {
        self.replica.raft.metrics().borrow().current_term
    }

    pub fn is_leader(&self) -> bool {
        self.leading_term().is_some()
    }

    /// The term this member leads, if it leads.
    /// A leader that no quorum has acknowledged for an election timeout does
    /// not count (check-quorum, see `raft::cluster::prevote`).
    pub fn leading_term(&self) -> Option<u64> {
        let term = self.replica.raft.metrics().borrow().current_term;
        (self.replica.elections.acting_leader() == Some(self.id)).then_some(term)
    }

    /// Whether this member knows a leader it can count on: another member
    /// it has heard from within an election timeout, or itself while a
    /// quorum keeps acknowledging it (see `raft::cluster::prevote`).
    pub fn has_leader(&self) -> bool {
        self.replica.elections.acting_leader().is_some()
    }

    /// Resolves once this member has been without a leader (see
    /// [`Node::has_leader`]) for three election timeouts in a row, as etcd
    /// decides for streams that require a leader: at once if it has been
    /// already.
    pub async fn leaderless(&self) {
        let mut leaderless = self.leaderless.subscribe();
        // The flag is sampled every 100 ms: a leader found since the last
        // sample is not "leaderless" for a stream opened in between. An error
        // only if the sender is gone, with the node: nothing to wait for.
        let _ = leaderless.wait_for(|&without| without && !self.has_leader()).await;
    }

    /// The one task that decides [`Node::leaderless`], looking every 100 ms
    /// (a task per stream did the same before: 5,000 streams that required
    /// a leader cost an idle member 15% of a core in wake-ups).
    async fn watch_for_a_leader(self: Arc<Self>, mut stopping: Stopping) {
        let mut since: Option<Instant> = None;
        let mut ticks = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stopping.stopped() => return,
            }
            let without = if self.has_leader() {
                since = None;
                false
            } else {
                since.get_or_insert_with(Instant::now).elapsed() >= self.election_timeout * 3
            };
            self.leaderless.send_if_modified(|was| std::mem::replace(was, without) != without);
        }
    }

    /// This member's applied state, encoded (a backup), and its revision.
    pub fn snapshot(&self) -> (Vec<u8>, i64) {
        crate::raft::encode_state(&self.state)
    }

    /// Wait until this member has applied the compaction at `revision` (or
    /// a later one; any, with `None`) and holds no version a compaction made
    /// unreadable: a `physical` compaction waits for it, and Defragment.
    pub async fn compaction_swept(&self, revision: Option<crate::model::mvcc::Revision>) {
        compactor::swept(self, revision).await
    }

    /// Push the state store to disk (Maintenance.Defragment).
    pub fn sync_state(&self) -> std::io::Result<()> {
        self.state_store.sync()
    }

    /// How this member stands: what Maintenance.Status reports, and what it
    /// answers another member's `ControlRequest::Status` with (see
    /// [`Node::cluster_status`]).
    pub fn status(&self) -> crate::raft::MemberStatus {
        crate::raft::own_status(&self.replica.raft, &self.replica.elections, &self.state)
    }

    /// The state store's files on disk (`etcd_mvcc_db_total_size_in_bytes`).
    pub fn disk_size(&self) -> u64 {
        self.state_store.size_on_disk()
    }

    /// Stop: signal every task and stream and wait until they have ended
    /// (requests in flight are answered meanwhile), then stop Raft, push
    /// the state store to disk and close it (its files are released once
    /// the node is dropped).
    pub async fn shutdown(&self) {
        let running = self.shutdown.stop(STOP_WAIT).await;
        if running > 0 {
            tracing::warn!(running, "tasks or streams still running after {STOP_WAIT:?}; stopping anyway");
        }
        if let Err(e) = self.replica.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        if let Err(e) = self.state_store.sync() {
            tracing::warn!(error = %e, "syncing the state store at shutdown");
        }
        self.state_store.close();
    }
}
