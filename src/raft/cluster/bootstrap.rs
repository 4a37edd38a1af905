//! Bootstrapping a new cluster: a member with no log and no vote proposes
//! the initial configuration only once a majority of the initial members
//! answer, and none of them already counts on a leader (so that a member
//! restarted with an empty disk does not start a second cluster).

use crate::raft::types::{MemberNode, Raft};

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
    peers: &crate::raft::peer::client::PeerClients,
    members: &std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    timeout: std::time::Duration,
) -> LeaderAnswers {
    let ask = crate::raft::peer::messages::ControlRequest::HasLeader;
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
/// timer (`raft::cluster::prevote`) lets it grant the pre-votes of the next.
///
/// Caveats: a member that asks while the others are electing hears of no
/// leader and campaigns all the same; the answers are as old as the
/// slowest peer's (at most `ask_every`, a peer that drops packets).
pub async fn bootstrap_when_a_majority_answers(
    raft: Raft,
    peers: crate::raft::peer::client::PeerClients,
    members: std::collections::BTreeMap<u64, MemberNode>,
    id: u64,
    elections: std::sync::Arc<crate::raft::cluster::prevote::Elections>,
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
