//! Membership as the node sees it: changes (run on the leader, forwarded by
//! a follower), leader transfer, the member list, publishing this member's
//! client URLs, and the two ways a member learns it must not serve — it was
//! removed ([`Node::removed`]), or it starts empty although the cluster
//! knows it ([`refuse_if_bootstrapped`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::route::{Attempt, Route};
use super::{MemberInfo, MembershipFailure, Node, ServerError};
use crate::base::shutdown::Stopping;
use crate::model::applied::MemberAttrs;
use crate::raft::ControlRequest;
use crate::raft::PeerClients;
use crate::raft::{transfer, TransferError};
use crate::raft::{MembershipAnswer, MembershipChange, MembershipRefusal};

impl Node {
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
        let mut server = self.replica.raft.server_metrics();
        let ask = ControlRequest::Removed { id: self.id };
        loop {
            if server.wait_for(|m| crate::raft::leaving(m, self.id)).await.is_err() {
                std::future::pending::<()>().await;
            }
            let urls = crate::raft::other_peer_urls(&server.borrow(), self.id);
            for url in &urls {
                if let Ok(true) = self.replica.peers.admin(url, &ask, Duration::from_secs(1)).await {
                    tokio::time::sleep(GRACE).await;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Run a membership change on the leader (forwarded if we follow), and
    /// wait until this member has the new configuration; returns the ID of the
    /// member concerned.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<u64, MembershipFailure> {
        // Set once an attempt may have been appended without an answer (the
        // leader could not be reached, or lost the lead): a refusal of the
        // retry may then only mean the change was made.
        let uncertain = AtomicBool::new(false);
        let (answer, deadline) =
            self.routed(|route, deadline| self.membership_attempt(route, deadline, &change, &uncertain)).await?;
        match answer {
            // A member asked to remove itself may never apply its removal
            // (the leader stops replicating to it once it is committed), and
            // stops soon after: the leader's answer, committed, is the answer.
            MembershipAnswer::Changed { id, .. }
                if matches!(change, MembershipChange::Remove { .. }) && id == self.id =>
            {
                Ok(id)
            }
            MembershipAnswer::Changed { id, log_index } => {
                self.wait_applied(log_index, deadline).await?;
                Ok(id)
            }
            MembershipAnswer::Refused(refusal) => match (&change, refusal) {
                // An earlier attempt did add (or remove) it.
                (MembershipChange::Add { peer_urls, .. }, MembershipRefusal::PeerUrlExists)
                    if uncertain.load(Ordering::Relaxed) =>
                {
                    Ok(crate::base::ids::member_id(peer_urls, &self.cluster_token))
                }
                (MembershipChange::Remove { id }, MembershipRefusal::MemberNotFound)
                    if uncertain.load(Ordering::Relaxed) =>
                {
                    Ok(*id)
                }
                // An earlier attempt did promote it.
                (MembershipChange::Promote { id }, MembershipRefusal::NotLearner)
                    if uncertain.load(Ordering::Relaxed) =>
                {
                    Ok(*id)
                }
                (_, refusal) => Err(MembershipFailure::Refused(refusal)),
            },
            MembershipAnswer::NotLeader | MembershipAnswer::Uncertain => {
                unreachable!("an attempt that met no leader, or an uncertain one, is retried")
            }
        }
    }

    /// One attempt of [`Node::change_membership`]: the leader's answer (never
    /// `NotLeader`), and the request's deadline.
    async fn membership_attempt(
        &self,
        route: Route,
        deadline: Instant,
        change: &MembershipChange,
        uncertain: &AtomicBool,
    ) -> Attempt<(MembershipAnswer, Instant), ServerError> {
        let answer = match route {
            Route::Here => {
                let change = crate::raft::change_membership(
                    &self.replica.raft,
                    &self.replica.peers,
                    &self.cluster_token,
                    change.clone(),
                );
                match tokio::time::timeout_at(deadline, change).await {
                    Ok(answer) => answer,
                    Err(_) => return Attempt::Done(Err(ServerError::Timeout)),
                }
            }
            Route::Leader { url, .. } => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                match self.replica.peers.membership(&url, change, remaining).await {
                    Ok(answer) => answer,
                    // No connection could be made: nothing reached the leader.
                    Err(status) if crate::raft::never_sent(&status) => return Attempt::Retry,
                    Err(_) => {
                        uncertain.store(true, Ordering::Relaxed);
                        return Attempt::Retry;
                    }
                }
            }
        };
        match answer {
            MembershipAnswer::NotLeader => Attempt::Retry,
            MembershipAnswer::Uncertain => {
                uncertain.store(true, Ordering::Relaxed);
                Attempt::Retry
            }
            answer => Attempt::Done(Ok((answer, deadline))),
        }
    }

    /// Hand leadership to member `target` (Maintenance.MoveLeader); this
    /// member must lead. The transfer runs in a task of its own: it must not
    /// be stopped halfway if the caller goes away.
    pub async fn move_leader(&self, target: u64) -> Result<(), TransferError> {
        let deadline = Instant::now() + self.request_timeout;
        let (raft, elections, peers) =
            (self.replica.raft.clone(), self.replica.elections.clone(), self.replica.peers.clone());
        let task = tokio::spawn(async move { transfer(&raft, &elections, &peers, target, deadline).await });
        transfer_outcome(task.await)
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
                .filter(|id| *id != self.id && self.replica.peers.heard_within(*id, self.election_timeout))
                .filter_map(|id| Some((crate::raft::matched_index(&m, id)?, id)))
                .max()
                .map(|(_, id)| id)
        };
        let Some(target) = target else { return Ok(None) };
        let deadline = Instant::now() + self.election_timeout * 3;
        let (raft, elections, peers) =
            (self.replica.raft.clone(), self.replica.elections.clone(), self.replica.peers.clone());
        let task = tokio::spawn(async move { transfer(&raft, &elections, &peers, target, deadline).await });
        transfer_outcome(task.await)?;
        Ok(Some(target))
    }

    /// Every member, with the client URLs it published, as of the
    /// configuration this member has applied: a reader that waited for an
    /// index to be applied here (a linearizable read, a membership change)
    /// sees the configuration as of that index or later. A member that has
    /// applied none yet (just started, or just added) lists the newest it
    /// was sent.
    pub fn members(&self) -> Vec<MemberInfo> {
        let mut membership = self.replica.configuration.get();
        if membership.nodes().next().is_none() {
            membership = self.metrics().membership_config.membership().clone();
        }
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

    /// Every member and how it stands, all asked at once: this member's own
    /// status, and each other's answer to `ControlRequest::Status` over the
    /// peer port within `timeout` — or why there is none (down, cut off, or
    /// a release that does not know the question). The web console's
    /// cluster page shows it.
    pub async fn cluster_status(
        &self,
        timeout: Duration,
    ) -> Vec<(MemberInfo, Result<crate::raft::MemberStatus, String>)> {
        let ask = |member: MemberInfo| async move {
            if member.id == self.id {
                return (member, Ok(self.status()));
            }
            let Some(url) = member.peer_urls.first().cloned() else {
                return (member, Err("no peer URL".to_string()));
            };
            let answer = match tokio::time::timeout(timeout, self.replica.peers.status(&url, timeout)).await {
                Ok(Ok(status)) => Ok(status),
                Ok(Err(e)) => Err(e.message().to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            (member, answer)
        };
        futures::future::join_all(self.members().into_iter().map(ask)).await
    }

    /// Publish this member's attributes through the log until they are there.
    /// Until then the member list shows it `unstarted`; a publish still
    /// failing after a request timeout is logged as a warning.
    pub(super) async fn publish(self: Arc<Self>, attrs: MemberAttrs, mut stopping: Stopping) {
        let started = Instant::now();
        loop {
            if self.state.members().get(&self.id) == Some(&attrs) {
                return;
            }
            match self.publish_member(attrs.name.clone(), attrs.client_urls.clone()).await {
                Ok(()) => {
                    tracing::info!(took = ?started.elapsed(), client_urls = ?attrs.client_urls, "published this member");
                    return;
                }
                Err(e) if started.elapsed() > self.request_timeout => {
                    tracing::warn!(error = %e, since = ?started.elapsed(), "publishing this member; will retry")
                }
                Err(e) => tracing::debug!(error = %e, "publishing this member; will retry"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stopping.stopped() => return,
            }
        }
    }
}

/// The outcome of a transfer run in a task of its own: a panic in it is a
/// bug and goes on as one; a task cancelled (the runtime is stopping) did not
/// finish in time.
fn transfer_outcome(joined: Result<Result<(), TransferError>, tokio::task::JoinError>) -> Result<(), TransferError> {
    match joined {
        Ok(outcome) => outcome,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(TransferError::TimedOut),
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
pub(super) async fn refuse_if_bootstrapped(
    peers: &PeerClients,
    id: u64,
    name: &str,
    members: &BTreeMap<u64, crate::config::InitialMember>,
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let ask = ControlRequest::Published { id };
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
