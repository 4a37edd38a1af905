//! Membership changes (etcd's MemberAdd, MemberRemove, MemberUpdate,
//! MemberPromote), run on the leader with openraft's joint consensus.
//!
//! - Add: a voter is added at once, as etcd does: the cluster's quorum grows
//!   before the new member has started (so adding a voter to a single-member
//!   cluster cannot commit until the new member runs; the request times out
//!   meanwhile). A learner only receives the log. The
//!   new member's ID is derived from its peer URLs and the cluster token, as
//!   the member computes it itself from its flags, so that the member started
//!   with `--initial-cluster-state existing` is the one that was added.
//! - Remove: a voter leaves the quorum, a learner the replication. Removing
//!   the leader is allowed; it steps down once the new configuration commits.
//! - Promote: a learner becomes a voter only when it has caught up with the
//!   leader's log (etcd's "in sync" rule: within 10% of the leader's index).
//! - Update: a member's peer URL changes.
//!
//! Every change is refused with etcd's error when it cannot apply (unknown
//! member, peer URL in use, promoting a voter, a learner not in sync), and
//! while another change is still in progress. As etcd's strict
//! reconfiguration check, a change that could leave the cluster unable to
//! commit is refused too: a new voter while any voter is down ("unhealthy
//! cluster"), or one that leaves fewer voters up than a quorum ("not enough
//! started members"). A voter counts as up if it answered the leader within
//! [`HEALTH_INTERVAL`].
//!
//! A removed member learns of its removal and stops (`Node::removed`).
//!
//! Caveat: a member has one peer URL: of several given, the first is used.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;

use std::time::Duration;

use crate::raft::peer::client::PeerClients;
pub use crate::raft::peer::messages::{MembershipAnswer, MembershipChange, MembershipRefusal};
use crate::raft::types::{MemberNode, Raft};

/// A peer URL etcd would accept: `http(s)://host:port`, no path.
fn valid_url(url: &str) -> bool {
    let Some(authority) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return false;
    };
    match authority.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !authority.contains('/') && port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// Membership changes on this member, one at a time (see [`change`]).
static ONE_CHANGE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Run `change` on this member, which must lead.
///
/// Changes run one at a time, and each waits for the configuration before
/// it to be applied here. openraft only checks that it is committed, and the
/// leader counts an entry as committed before its own copy is synced (see
/// `raft::store::log_store`); joint consensus needs the previous configuration
/// durable on a quorum before the next one starts.
pub async fn change(raft: &Raft, peers: &PeerClients, token: &str, change: MembershipChange) -> MembershipAnswer {
    let _one = ONE_CHANGE_AT_A_TIME.lock().await;
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader != Some(metrics.id) {
        return MembershipAnswer::NotLeader;
    }
    if let Some(previous) = metrics.membership_config.log_id() {
        if raft.wait(None).applied_index_at_least(Some(previous.index), "previous configuration applied").await.is_err()
        {
            return MembershipAnswer::NotLeader;
        }
    }
    // openraft changes voters in two steps, through a joint configuration; a
    // leader that lost the lead between them left the configuration joint.
    // It is made uniform first, to its newer half (what that change was for).
    let halves = metrics.membership_config.membership().get_joint_config().clone();
    if let [_, .., newer] = halves.as_slice() {
        tracing::warn!(?halves, "an earlier change left the configuration joint: it is completed first");
        match raft.change_membership(ChangeMembers::ReplaceAllVoters(newer.clone()), false).await {
            Ok(_) => {}
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => return MembershipAnswer::NotLeader,
            Err(e) => {
                tracing::warn!(error = %e, "completing a joint configuration");
                return MembershipAnswer::Refused(MembershipRefusal::Unhealthy);
            }
        }
    }
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader != Some(metrics.id) {
        return MembershipAnswer::NotLeader;
    }
    let membership = metrics.membership_config.membership().clone();
    let nodes: BTreeMap<u64, MemberNode> = membership.nodes().map(|(id, n)| (*id, n.clone())).collect();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let url_taken = |urls: &[String], except: Option<u64>| {
        nodes.iter().any(|(id, n)| Some(*id) != except && urls.contains(&n.peer_url))
    };
    // A leader that has just been elected has not heard from everyone yet:
    // give the voters a moment (a few heartbeats) to answer before judging.
    let settle = tokio::time::Instant::now() + SETTLE;
    while voters.iter().any(|id| *id != metrics.id && !peers.heard_within(*id, HEALTH_INTERVAL))
        && tokio::time::Instant::now() < settle
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = |id: u64| id == metrics.id || peers.heard_within(id, HEALTH_INTERVAL);
    let (id, result) = match change {
        MembershipChange::Add { peer_urls, is_learner } => {
            if peer_urls.is_empty() || !peer_urls.iter().all(|u| valid_url(u)) {
                return MembershipAnswer::Refused(MembershipRefusal::BadUrls);
            }
            if url_taken(&peer_urls, None) {
                return MembershipAnswer::Refused(MembershipRefusal::PeerUrlExists);
            }
            if !is_learner {
                if let Err(refusal) = ready_to_add_voter(&voters, started) {
                    tracing::warn!(%refusal, "a new voter is refused: too few voters are up");
                    return MembershipAnswer::Refused(refusal);
                }
            }
            let id = crate::base::ids::member_id(&peer_urls, token);
            let node = MemberNode { name: String::new(), peer_url: peer_urls[0].clone() };
            let result = if is_learner {
                raft.add_learner(id, node, false).await
            } else {
                raft.change_membership(ChangeMembers::AddVoters(BTreeMap::from([(id, node)])), false).await
            };
            (id, result)
        }
        MembershipChange::Remove { id } => {
            if !nodes.contains_key(&id) {
                return MembershipAnswer::Refused(MembershipRefusal::MemberNotFound);
            }
            let change = if voters.contains(&id) {
                if let Err(refusal) = ready_to_remove_voter(&voters, id, started) {
                    let up: Vec<String> = voters.iter().filter(|v| started(**v)).map(|v| format!("{v:x}")).collect();
                    tracing::warn!(%refusal, member = format!("{id:x}"), ?up, "removing a voter is refused: too few voters would be up");
                    return MembershipAnswer::Refused(refusal);
                }
                ChangeMembers::RemoveVoters(BTreeSet::from([id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([id]))
            };
            (id, raft.change_membership(change, false).await)
        }
        MembershipChange::Update { id, peer_urls } => {
            let Some(node) = nodes.get(&id) else {
                return MembershipAnswer::Refused(MembershipRefusal::MemberNotFound);
            };
            if peer_urls.is_empty() || !peer_urls.iter().all(|u| valid_url(u)) {
                return MembershipAnswer::Refused(MembershipRefusal::BadUrls);
            }
            if url_taken(&peer_urls, Some(id)) {
                return MembershipAnswer::Refused(MembershipRefusal::PeerUrlExists);
            }
            let node = MemberNode { name: node.name.clone(), peer_url: peer_urls[0].clone() };
            (id, raft.change_membership(ChangeMembers::SetNodes(BTreeMap::from([(id, node)])), false).await)
        }
        MembershipChange::Promote { id } => {
            if !nodes.contains_key(&id) {
                return MembershipAnswer::Refused(MembershipRefusal::MemberNotFound);
            }
            if voters.contains(&id) {
                return MembershipAnswer::Refused(MembershipRefusal::NotLearner);
            }
            if let Err(refusal) = ready_to_add_voter(&voters, started) {
                tracing::warn!(%refusal, "promoting a learner is refused: too few voters are up");
                return MembershipAnswer::Refused(refusal);
            }
            let leader_index = metrics.last_log_index.unwrap_or(0);
            let matched = crate::raft::types::matched_index(&metrics, id).unwrap_or(0);
            // etcd's rule: the learner's match is at least 90% of the leader's.
            if (matched as f64) < leader_index as f64 * 0.9 {
                return MembershipAnswer::Refused(MembershipRefusal::LearnerNotReady);
            }
            (id, raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await)
        }
    };
    match result {
        Ok(response) => MembershipAnswer::Changed { id, log_index: response.log_id.index },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => MembershipAnswer::Uncertain,
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            tracing::warn!(error = %e, "membership change refused");
            match e {
                ChangeMembershipError::LearnerNotFound(_) => {
                    MembershipAnswer::Refused(MembershipRefusal::MemberNotFound)
                }
                ChangeMembershipError::EmptyMembership(_) => {
                    MembershipAnswer::Refused(MembershipRefusal::NotEnoughMembers)
                }
                _ => MembershipAnswer::Refused(MembershipRefusal::Unhealthy),
            }
        }
        Err(RaftError::Fatal(e)) => {
            tracing::error!(error = %e, "membership change");
            MembershipAnswer::Refused(MembershipRefusal::Unhealthy)
        }
    }
}

/// How recently a voter must have answered the leader to count as started
/// (etcd's `HealthInterval`).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How long a change waits for voters not heard from yet (a new leader's
/// first heartbeats) before it judges who is up.
const SETTLE: Duration = Duration::from_secs(1);

/// etcd's strict reconfiguration check for a new voter (an added member or a
/// promoted learner): the voters that are up must still be a quorum of the
/// larger cluster (a single member may always add a second: that is how a
/// cluster is rebuilt from a backup), and every voter must be up, or the
/// change could leave the cluster unable to commit.
fn ready_to_add_voter(voters: &BTreeSet<u64>, started: impl Fn(u64) -> bool) -> Result<(), MembershipRefusal> {
    let up = voters.iter().filter(|id| started(**id)).count();
    let after = voters.len() + 1;
    if !(up == 1 && after == 2) && up < after / 2 + 1 {
        return Err(MembershipRefusal::NotEnoughMembers);
    }
    if up < voters.len() {
        return Err(MembershipRefusal::Unhealthy);
    }
    Ok(())
}

/// etcd's strict reconfiguration check for removing voter `id` (up or down,
/// the leader too): the voters left that are up must be a quorum of the
/// smaller cluster.
fn ready_to_remove_voter(
    voters: &BTreeSet<u64>,
    id: u64,
    started: impl Fn(u64) -> bool,
) -> Result<(), MembershipRefusal> {
    let left = voters.len() - 1;
    let up_left = voters.iter().filter(|v| **v != id && started(**v)).count();
    if left == 0 || up_left < left / 2 + 1 {
        return Err(MembershipRefusal::NotEnoughMembers);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_voter_is_added_only_while_every_voter_is_up() {
        let all_up = |_| true;
        assert_eq!(ready_to_add_voter(&voters(&[1]), all_up), Ok(()), "one member may add a second");
        assert_eq!(ready_to_add_voter(&voters(&[1, 2, 3]), all_up), Ok(()));
        // Three voters, one down: two of four would be up (etcd says "not
        // enough started members"); five, one down: four of six, but one
        // voter is down ("unhealthy cluster").
        let three_down = |id| id != 3;
        assert_eq!(ready_to_add_voter(&voters(&[1, 2, 3]), three_down), Err(MembershipRefusal::NotEnoughMembers));
        let five = voters(&[1, 2, 3, 4, 5]);
        assert_eq!(ready_to_add_voter(&five, |id| id != 5), Err(MembershipRefusal::Unhealthy));
        let only_one = |id| id == 1;
        assert_eq!(ready_to_add_voter(&voters(&[1, 2, 3]), only_one), Err(MembershipRefusal::NotEnoughMembers));
        assert_eq!(ready_to_add_voter(&voters(&[1, 2]), only_one), Err(MembershipRefusal::NotEnoughMembers));
    }

    #[test]
    fn a_voter_is_removed_only_if_a_quorum_of_the_rest_is_up() {
        let three_down = |id| id != 3;
        // The member that is down may go; one that is up may not.
        assert_eq!(ready_to_remove_voter(&voters(&[1, 2, 3]), 3, three_down), Ok(()));
        assert_eq!(ready_to_remove_voter(&voters(&[1, 2, 3]), 2, three_down), Err(MembershipRefusal::NotEnoughMembers));
        let all_up = |_| true;
        assert_eq!(ready_to_remove_voter(&voters(&[1, 2, 3]), 2, all_up), Ok(()));
        assert_eq!(ready_to_remove_voter(&voters(&[1, 2, 3]), 1, all_up), Ok(()), "even the leader");
        assert_eq!(ready_to_remove_voter(&voters(&[1]), 1, all_up), Err(MembershipRefusal::NotEnoughMembers));
        // Five members, two down: removing a live one would leave two of four up.
        let two_down = |id| id <= 3;
        let five = voters(&[1, 2, 3, 4, 5]);
        assert_eq!(ready_to_remove_voter(&five, 2, two_down), Err(MembershipRefusal::NotEnoughMembers));
        assert_eq!(ready_to_remove_voter(&five, 5, two_down), Ok(()));
    }

    #[test]
    fn peer_urls_are_checked_as_etcd_does() {
        assert!(valid_url("http://127.0.0.1:2380"));
        assert!(valid_url("https://n4.example:2380"));
        assert!(!valid_url("http://h:2380/"));
        assert!(!valid_url("127.0.0.1:2380"));
        assert!(!valid_url("http://127.0.0.1"));
        assert!(!valid_url("http://:2380"));
        assert!(!valid_url("http://h:2380/path"));
    }
}
