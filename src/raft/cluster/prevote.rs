//! When a member starts an election, and whether a leader still counts as
//! one: pre-vote, the election timer and check-quorum, which openraft 0.9
//! does not have.
//!
//! ## Why not openraft's timer
//! openraft 0.9 lets a follower campaign once its leader lease (the maximum
//! election timeout) *and* its own random election timeout have both passed
//! since it last heard from the leader, and its voters refuse to vote for a
//! whole leader lease. With `--election-timeout 1000` that was 3-4 s without
//! writes after a leader died (etcd: 1-2 s). And it has no pre-vote: a member
//! cut off from the others raises its term at every timeout, and once the
//! link heals, its higher term deposes a healthy leader.
//!
//! ## How
//! openraft's own elections are switched off at start; [`Elections::run`]
//! decides instead:
//! - A voter that has heard nothing from a leader for its election timeout
//!   (drawn at random in `[E, 1.25 E)`, `E` = `--election-timeout`, anew
//!   after each election it starts) asks the other voters for a *pre-vote*
//!   ([`Elections::pre_vote`]): "would you vote for me?", which changes
//!   nothing on either side. Only once a majority of every configuration
//!   (itself included) says yes does it ask openraft for an election, which
//!   raises its term. A refused pre-vote is asked again a heartbeat later.
//! - A member grants a pre-vote when it has not heard from a leader for
//!   `E - heartbeat` itself (a leader: when no quorum has acknowledged it for
//!   `E`) and the asker's log is at least as long as its own (by last log
//!   id, as a vote is judged). So while a majority hears from a leader,
//!   nobody's term moves: a member cut off and healed does not disturb a
//!   healthy leader. The asker's term is not judged (see `pre_vote`: judging
//!   it could leave no member able to win).
//! - openraft's follower lease, which refuses real votes, is made two
//!   heartbeats long: pre-vote already kept everyone from campaigning while
//!   a leader lives, and a short lease lets a leader transfer finish in a
//!   few heartbeats.
//! - Check-quorum ([`Elections::acting_leader`]): a leader that no quorum
//!   has acknowledged for `E` stops acting as leader: it routes no request
//!   to itself and proposes nothing, so its clients are told there is no
//!   leader and go elsewhere. openraft keeps its leader state until it hears
//!   of a newer term, and it takes up again if the quorum comes back first.
//!   Likewise a follower that has heard nothing from its leader for `E`
//!   counts on no leader (it reports none, and routes nothing to it).
//!
//! ## Invariants
//! - Only [`Elections::run`] and a leader transfer (`raft::cluster::transfer`, whose
//!   target campaigns at once, as etcd's `TimeoutNow`) start elections.
//! - Safety never depends on these timers: a vote is still judged by
//!   openraft (terms and logs), reads confirm leadership with a quorum, and
//!   lease expiry is confirmed by a quorum (`node::lease::keeper`).
//!
//! ## Caveats
//! - Two voters whose timers fire within a round trip of each other split the
//!   vote; each tries again after a new random timeout (rare: the timers are
//!   spread over a quarter of `E`).
//! - Members of an older version answer a pre-vote with an error, counted as
//!   a refusal: finish a rolling upgrade before relying on elections.

use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::base::shutdown::Stopping;
use crate::raft::peer::client::PeerClients;
use crate::raft::peer::messages::ControlRequest;
use crate::raft::store::log_store::LogStore;
use crate::raft::types::{LogId, Raft};

/// openraft's timing for `heartbeat`: its elections are off, so its election
/// timeout only sets how long a vote request may take (the minimum) and the
/// follower lease in which votes are refused (the maximum).
pub fn openraft_timeouts(heartbeat_ms: u64) -> (u64, u64) {
    (heartbeat_ms * 3 / 2, heartbeat_ms * 2)
}

/// A member's election timer, its pre-vote answers and its check-quorum.
pub struct Elections {
    raft: Raft,
    log: LogStore,
    peers: PeerClients,
    id: u64,
    /// `--election-timeout`.
    timeout: Duration,
    /// `--heartbeat-interval`.
    heartbeat: Duration,
    /// std Mutex: held only to read or set an instant.
    clock: Mutex<Clock>,
    /// This member leads and is handing leadership over: it proposes nothing
    /// meanwhile (see `raft::cluster::transfer`).
    transferring: std::sync::atomic::AtomicBool,
}

struct Clock {
    /// When this member last heard from a leader it follows (or led, or
    /// started an election, or started).
    heard: Instant,
    /// No election is started before this (a leader transfer in progress).
    paused_until: Option<Instant>,
}

impl Elections {
    pub fn new(raft: Raft, log: LogStore, peers: PeerClients, timeout: Duration, heartbeat: Duration) -> Elections {
        let id = raft.metrics().borrow().id;
        // openraft must not start elections of its own (see the module doc).
        raft.runtime_config().elect(false);
        let clock = Mutex::new(Clock { heard: Instant::now(), paused_until: None });
        Elections { raft, log, peers, id, timeout, heartbeat, clock, transferring: Default::default() }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().expect("election clock lock poisoned")
    }

    /// A leader's AppendEntries or snapshot was accepted here, or this
    /// member granted a vote: the election timer starts over (as etcd's).
    pub fn heard_from_leader(&self) {
        self.clock().heard = Instant::now();
    }

    /// Start no election for `pause` (a leader transfer; it ends by itself,
    /// so that a transfer cut short cannot leave this member mute).
    pub fn pause(&self, pause: Duration) {
        self.clock().paused_until = Some(Instant::now() + pause);
    }

    pub fn resume(&self) {
        self.clock().paused_until = None;
    }

    /// A leader transfer from this member begins (`true`) or ends.
    pub fn set_transferring(&self, transferring: bool) {
        self.transferring.store(transferring, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether this member is handing leadership over: it neither proposes
    /// nor hands out read indexes meanwhile, since the heartbeats that confirm
    /// a read index would renew the followers' leases and keep the target
    /// from winning.
    pub fn transferring(&self) -> bool {
        self.transferring.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether this member may propose: openraft has it lead, a quorum has
    /// acknowledged it within an election timeout (check-quorum), and it is
    /// not handing leadership over.
    pub fn may_propose(&self) -> bool {
        let (leader, quiet) = self.leader_view();
        leader == Some(self.id) && !self.transferring() && quiet < self.timeout
    }

    /// Campaign now, skipping pre-vote (the target of a leader transfer).
    pub async fn campaign(&self) -> bool {
        self.heard_from_leader();
        self.raft.trigger().elect().await.is_ok()
    }

    /// The leader openraft knows, and how long this member has gone without
    /// proof of a leader: for itself, since a quorum acknowledged it; else
    /// since it heard from a leader (or voted, or campaigned).
    fn leader_view(&self) -> (Option<u64>, Duration) {
        let (leader, quorum_ms) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.millis_since_quorum_ack)
        };
        let quiet = if leader == Some(self.id) {
            Duration::from_millis(quorum_ms.unwrap_or(0))
        } else {
            self.clock().heard.elapsed()
        };
        (leader, quiet)
    }

    fn paused(&self) -> bool {
        self.clock().paused_until.is_some_and(|t| Instant::now() < t)
    }

    /// The leader this member counts on: openraft's, except that a leader no
    /// quorum has acknowledged for an election timeout does not count itself
    /// (check-quorum, see the module doc), and a follower that has not heard
    /// from its leader for an election timeout counts on none (as etcd's
    /// follower, which then looks for a new leader).
    pub fn acting_leader(&self) -> Option<u64> {
        let (leader, quiet) = self.leader_view();
        leader.filter(|_| quiet < self.timeout)
    }

    /// Whether to grant a pre-vote to a voter whose log ends at `last_log`
    /// (see the module doc). The asker's term, which the request carries
    /// too, is not judged: one behind a higher term would be refused by
    /// everyone whose log it matches, and one with a higher term and a
    /// shorter log by everyone else — no one could win. Let it campaign: a
    /// real vote at too low a term fails, and openraft takes the higher term
    /// from the refusal for its next try.
    pub fn pre_vote(&self, last_log: Option<LogId>) -> bool {
        if self.paused() {
            return false;
        }
        let (leader, quiet) = self.leader_view();
        // A follower grants a heartbeat early: the asker's timer and its own
        // ran from about the same last heartbeat.
        let lease = if leader == Some(self.id) { self.timeout } else { self.timeout.saturating_sub(self.heartbeat) };
        quiet >= lease && last_log >= self.log.last_log_id()
    }

    /// A random election timeout in `[E, 1.25 E)`.
    fn next_timeout(&self) -> Duration {
        let e = self.timeout.as_millis() as u64;
        Duration::from_millis(rand::thread_rng().gen_range(e..e + e / 4 + 1))
    }

    /// The election timer, until the member stops (see the module doc).
    pub async fn run(self: std::sync::Arc<Self>, mut stopping: Stopping) {
        let mut timeout = self.next_timeout();
        loop {
            let due = self.clock().heard + timeout;
            tokio::select! {
                _ = stopping.stopped() => return,
                _ = tokio::time::sleep_until(due.min(Instant::now() + self.heartbeat)) => {}
            }
            let m = self.raft.metrics().borrow().clone();
            if m.running_state.is_err() {
                return;
            }
            let membership = m.membership_config.membership().clone();
            let voter = membership.voter_ids().any(|v| v == self.id);
            if !voter && m.membership_config.log_id().is_none() {
                // No configuration yet: a member of a new cluster waiting to
                // bootstrap, or one that voted in a first campaign that
                // failed. It never campaigns, but its clock runs on, so that
                // it grants pre-votes as any member does: else the first
                // leader could never be elected once such a campaign failed.
                continue;
            }
            if m.current_leader == Some(self.id) || !voter || self.paused() {
                // A leader's timer starts afresh when it stops leading.
                self.heard_from_leader();
                continue;
            }
            if membership.voter_ids().count() == 1 {
                // The only voter: no one to ask.
                let _ = self.raft.trigger().elect().await;
                self.heard_from_leader();
                continue;
            }
            if Instant::now() < self.clock().heard + timeout {
                continue;
            }
            let asked_at = Instant::now();
            let granted = self.ask_pre_votes(&m).await;
            // Heard from a leader or voted meanwhile: an election is under
            // way or over, and this one would only disturb it.
            let overtaken =
                self.clock().heard > asked_at || self.raft.metrics().borrow().current_term != m.current_term;
            if granted && !overtaken {
                tracing::info!(
                    term = m.current_term + 1,
                    "no leader heard from; a majority granted a pre-vote: campaigning"
                );
                self.heard_from_leader();
                timeout = self.next_timeout();
                let _ = self.raft.trigger().elect().await;
            } else {
                // Ask again a heartbeat later at the earliest (the loop
                // sleeps at most a heartbeat), the term unchanged meanwhile.
                tracing::debug!(granted, overtaken, "no election started");
            }
        }
    }

    /// Ask every other voter for a pre-vote; whether a majority of every
    /// configuration (this member included) granted it. Decided as soon as
    /// the answers so far settle it: a voter that cannot be reached does not
    /// hold the election up.
    async fn ask_pre_votes(&self, m: &openraft::RaftMetrics<u64, crate::raft::types::MemberNode>) -> bool {
        use futures::StreamExt;
        let membership = m.membership_config.membership();
        let configs = membership.get_joint_config();
        let ask = ControlRequest::PreVote { term: m.current_term, last_log: self.log.last_log_id() };
        let mut answers: futures::stream::FuturesUnordered<_> = membership
            .voter_ids()
            .filter(|id| *id != self.id)
            .filter_map(|id| {
                let url = membership.get_node(&id)?.peer_url.clone();
                let ask = ask.clone();
                Some(async move { (id, self.peers.admin(&url, &ask, self.heartbeat * 2).await.unwrap_or(false)) })
            })
            .collect();
        let (mut granted, mut refused) =
            (std::collections::BTreeSet::from([self.id]), std::collections::BTreeSet::new());
        loop {
            let majority = |set: &std::collections::BTreeSet<u64>| {
                configs.iter().all(|c| c.iter().filter(|id| set.contains(id)).count() * 2 > c.len())
            };
            if majority(&granted) {
                return true;
            }
            // Lost once some configuration can no longer reach a majority.
            if configs.iter().any(|c| c.iter().filter(|id| refused.contains(*id)).count() * 2 >= c.len()) {
                return false;
            }
            match answers.next().await {
                Some((id, true)) => granted.insert(id),
                Some((id, false)) => refused.insert(id),
                None => return false,
            };
        }
    }
}
