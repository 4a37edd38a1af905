//! Leader transfer (etcd's MoveLeader) on openraft 0.9, which has no transfer
//! of its own.
//!
//! openraft's voters refuse to vote while their leader lease (two heartbeats
//! since they last heard from the leader, see `raft::cluster::prevote`) lasts, so the
//! transfer lets that lease run out and lets only the target campaign:
//! 1. the target must be a voter whose log matches the leader's, and the
//!    leader proposes nothing more and confirms no read (the heartbeats that
//!    confirm one would renew the followers' leases); callers are told it
//!    does not lead, and try the new leader;
//! 2. every other voter, the leader included, starts no election, and the
//!    leader stops sending heartbeats;
//! 3. the target is told to campaign (skipping pre-vote, as etcd's
//!    `TimeoutNow`), and again every [`CAMPAIGN_EVERY`] until it leads;
//! 4. everyone's elections and heartbeats are switched back on, whatever the
//!    outcome.
//!
//! Caveats: writes wait for the transfer (their callers retry with the new
//! leader, or with this one if the transfer fails); a transfer that runs out
//! of time is refused as timed out, and the old leader stays. Each campaign
//! that fails raises the target's term by one.

use std::time::Duration;

use tokio::time::Instant;

use crate::raft::cluster::prevote::Elections;
use crate::raft::peer::client::PeerClients;
use crate::raft::peer::messages::ControlRequest;
use crate::raft::types::Raft;

/// How often the target of a transfer campaigns until it leads.
const CAMPAIGN_EVERY: Duration = Duration::from_millis(50);

/// Run an admin request on this member. Elections are paused for at most
/// `max_pause` whatever the asker says: a transfer takes no longer than a
/// request, and no peer may silence this member for longer.
pub async fn admin(raft: &Raft, elections: &Elections, req: ControlRequest, max_pause: Duration) -> bool {
    match req {
        ControlRequest::PauseElections { ms } => {
            elections.pause(Duration::from_millis(ms).min(max_pause));
            true
        }
        ControlRequest::ResumeElections => {
            elections.resume();
            true
        }
        ControlRequest::Campaign => elections.campaign().await,
        ControlRequest::PreVote { last_log, .. } => elections.pre_vote(last_log),
        ControlRequest::HasLeader => elections.acting_leader().is_some(),
        ControlRequest::Published { .. } | ControlRequest::HashKv { .. } | ControlRequest::Status => false,
        ControlRequest::Removed { id } => {
            let m = raft.metrics().borrow().clone();
            m.current_leader == Some(m.id) && crate::raft::types::removal_applied(&m, id)
        }
        ControlRequest::IsMember { id } => {
            raft.metrics().borrow().membership_config.membership().get_node(&id).is_some()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("this member does not lead")]
    NotLeader,
    #[error("the target is not a voter")]
    BadTransferee,
    #[error("the transfer timed out")]
    TimedOut,
}

/// Make `target` the leader; this member must lead. Returns once `target`
/// leads, or fails by `deadline`. Run it to the end (in a task of its own):
/// stopping it halfway would leave this member without heartbeats.
pub async fn transfer(
    raft: &Raft,
    elections: &Elections,
    peers: &PeerClients,
    target: u64,
    deadline: Instant,
) -> Result<(), TransferError> {
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader != Some(metrics.id) {
        return Err(TransferError::NotLeader);
    }
    if target == metrics.id {
        return Ok(());
    }
    let membership = metrics.membership_config.membership().clone();
    if !membership.voter_ids().any(|id| id == target) {
        return Err(TransferError::BadTransferee);
    }
    let urls: Vec<(u64, String)> = membership
        .nodes()
        .filter(|(id, _)| membership.voter_ids().any(|v| v == **id))
        .map(|(id, n)| (*id, n.peer_url.clone()))
        .collect();
    let others: Vec<&(u64, String)> = urls.iter().filter(|(id, _)| *id != metrics.id && *id != target).collect();
    let target_url =
        urls.iter().find(|(id, _)| *id == target).map(|(_, u)| u.clone()).ok_or(TransferError::BadTransferee)?;

    // 1. The target must have everything the leader has: nothing new is
    //    proposed from now on (as etcd drops proposals during a transfer),
    //    else the leader's log runs ahead of the target's and keeps the
    //    followers' leases alive.
    let _transferring = Transferring::begin(elections);
    caught_up(raft, target, deadline).await?;

    // 2. Only the target may campaign; the leader stops renewing leases.
    elections.pause(deadline.saturating_duration_since(Instant::now()));
    raft.runtime_config().heartbeat(false);
    let pause =
        ControlRequest::PauseElections { ms: deadline.saturating_duration_since(Instant::now()).as_millis() as u64 };
    for (_, url) in &others {
        let _ = peers.admin(url, &pause, Duration::from_millis(500)).await;
    }
    // 3. Campaign until it leads.
    let outcome = async {
        let mut server = raft.server_metrics();
        loop {
            let _ = peers.admin(&target_url, &ControlRequest::Campaign, Duration::from_millis(500)).await;
            let until = Instant::now() + CAMPAIGN_EVERY;
            while Instant::now() < until {
                if server.borrow().current_leader == Some(target) {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(TransferError::TimedOut);
                }
                let _ = tokio::time::timeout_at(until.min(deadline), server.changed()).await;
            }
        }
    }
    .await;
    // 4. Back to normal, whatever happened.
    raft.runtime_config().heartbeat(true);
    elections.resume();
    for (_, url) in &others {
        let _ = peers.admin(url, &ControlRequest::ResumeElections, Duration::from_secs(1)).await;
    }
    outcome
}

/// While it lives, this member is handing leadership over (it proposes
/// nothing and confirms no read); however the transfer ends.
struct Transferring<'a>(&'a Elections);

impl<'a> Transferring<'a> {
    fn begin(elections: &'a Elections) -> Transferring<'a> {
        elections.set_transferring(true);
        Transferring(elections)
    }
}

impl Drop for Transferring<'_> {
    fn drop(&mut self) {
        self.0.set_transferring(false);
    }
}

/// Wait until `target`'s log matches the leader's.
async fn caught_up(raft: &Raft, target: u64, deadline: Instant) -> Result<(), TransferError> {
    let mut metrics = raft.metrics();
    loop {
        {
            let m = metrics.borrow();
            if m.current_leader != Some(m.id) {
                return Err(TransferError::NotLeader);
            }
            let matched = crate::raft::types::matched_index(&m, target);
            if matched.is_some() && matched == m.last_log_index {
                return Ok(());
            }
        }
        if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
            return Err(TransferError::TimedOut);
        }
    }
}
