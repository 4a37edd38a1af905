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
//! while another change is still in progress.
//!
//! Caveats: a removed member is not told to stop; stop its process. A member
//! has one peer URL: of several given, the first is used.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};

use super::{MemberNode, Raft};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    Add { peer_urls: Vec<String>, is_learner: bool },
    Remove { id: u64 },
    Update { id: u64, peer_urls: Vec<String> },
    Promote { id: u64 },
}

/// Why a change was refused; the messages are etcd's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MembershipRefusal {
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: given member URLs are invalid")]
    BadUrls,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    /// Another change is in progress, or the cluster cannot commit one.
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughMembers,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipAnswer {
    NotLeader,
    /// Committed: the member concerned, and the log index of the new
    /// configuration (a member has it once it has applied that far).
    Changed {
        id: u64,
        log_index: u64,
    },
    Refused(MembershipRefusal),
}

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
/// `raft::log_store`); joint consensus needs the previous configuration
/// durable on a quorum before the next one starts.
pub async fn change(raft: &Raft, token: &str, change: MembershipChange) -> MembershipAnswer {
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
    let (id, result) = match change {
        MembershipChange::Add { peer_urls, is_learner } => {
            if peer_urls.is_empty() || !peer_urls.iter().all(|u| valid_url(u)) {
                return MembershipAnswer::Refused(MembershipRefusal::BadUrls);
            }
            if url_taken(&peer_urls, None) {
                return MembershipAnswer::Refused(MembershipRefusal::PeerUrlExists);
            }
            let id = crate::config::member_id(&peer_urls, token);
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
                if voters.len() == 1 {
                    return MembershipAnswer::Refused(MembershipRefusal::NotEnoughMembers);
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
            let leader_index = metrics.last_log_index.unwrap_or(0);
            let matched = super::matched_index(&metrics, id).unwrap_or(0);
            // etcd's rule: the learner's match is at least 90% of the leader's.
            if (matched as f64) < leader_index as f64 * 0.9 {
                return MembershipAnswer::Refused(MembershipRefusal::LearnerNotReady);
            }
            (id, raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await)
        }
    };
    match result {
        Ok(response) => MembershipAnswer::Changed { id, log_index: response.log_id.index },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => MembershipAnswer::NotLeader,
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

#[cfg(test)]
mod tests {
    use super::valid_url;

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
