//! Election behaviour under partitions, checked directly rather than through
//! a workload's history: what each member reports of itself (its leader and
//! term, over the client API, from outside the partition) while links
//! between members are cut with nftables.
//!
//! - **pre-vote**: a follower cut off from the others for several election
//!   timeouts never campaigns (its term stays), and once healed it does not
//!   disturb the leader: same leader, same term everywhere.
//! - **check-quorum**: a leader cut off from both followers stops reporting
//!   itself as leader within two election timeouts, while the others elect a
//!   new one; healed, it follows the new leader.
//!
//! Both run on one fresh 3-member cluster, one after the other. A failure
//! names what a member reported, and keeps the members' logs.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::{Cluster, View, ELECTION_MS};
use crate::net::Partition;

const ELECTION: Duration = Duration::from_millis(ELECTION_MS);

/// Run both scenarios; `Err` says what went wrong.
pub async fn run(binary: &Path, dir: &Path) -> anyhow::Result<()> {
    let mut cluster = crate::cluster::start(binary, dir, 3, None)?;
    let outcome = async {
        cluster.wait_healthy(Duration::from_secs(60)).await?;
        pre_vote(&cluster).await?;
        println!("  pre-vote: a follower cut off for {:?} kept its term and left the leader alone", ELECTION * 5);
        let (took, from, to) = check_quorum(&cluster).await?;
        println!("  check-quorum: the cut-off leader m{from} stopped leading after {took:?}; m{to} leads, and m{from} follows it once healed");
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        for i in 0..cluster.len() {
            eprintln!("---- m{i}'s log (last 40 lines)");
            let log = cluster.log_of(i);
            let lines: Vec<&str> = log.lines().collect();
            for l in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{l}");
            }
        }
    }
    for i in 0..cluster.len() {
        cluster.kill(i);
    }
    outcome
}

async fn views(cluster: &Cluster) -> Vec<Option<View>> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        out.push(cluster.view(i).await);
    }
    out
}

async fn leader_and_term(cluster: &Cluster) -> anyhow::Result<(usize, View)> {
    let leader = cluster.current_leader().await.ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let view = cluster.view(leader).await.ok_or_else(|| anyhow::anyhow!("the leader did not answer"))?;
    Ok((leader, view))
}

async fn pre_vote(cluster: &Cluster) -> anyhow::Result<()> {
    let (leader, before) = leader_and_term(cluster).await?;
    let follower = (leader + 1) % cluster.len();
    let others: Vec<&str> =
        (0..cluster.len()).filter(|i| *i != follower).map(|i| cluster.members[i].ip.as_str()).collect();
    let mut partition = Partition::new()?;
    partition.split(&[cluster.members[follower].ip.as_str()], &others)?;
    tokio::time::sleep(ELECTION * 5).await;
    let cut = views(cluster).await;
    partition.heal()?;
    let cut_off = cut[follower].ok_or_else(|| anyhow::anyhow!("m{follower} did not answer while cut off"))?;
    anyhow::ensure!(
        cut_off.term == before.term,
        "m{follower}, cut off, moved from term {} to {}: it campaigned without a pre-vote",
        before.term,
        cut_off.term
    );
    tokio::time::sleep(ELECTION * 3).await;
    for (i, v) in views(cluster).await.into_iter().enumerate() {
        let v = v.ok_or_else(|| anyhow::anyhow!("m{i} did not answer after the heal"))?;
        anyhow::ensure!(
            v.leader == before.member_id && v.term == before.term,
            "after the heal m{i} reports leader {:x} in term {}; before: leader {:x} in term {}",
            v.leader,
            v.term,
            before.member_id,
            before.term
        );
    }
    Ok(())
}

/// Returns how long the cut-off leader took to stop leading, its index and
/// the new leader's.
async fn check_quorum(cluster: &Cluster) -> anyhow::Result<(Duration, usize, usize)> {
    let (leader, before) = leader_and_term(cluster).await?;
    let others: Vec<&str> =
        (0..cluster.len()).filter(|i| *i != leader).map(|i| cluster.members[i].ip.as_str()).collect();
    let mut partition = Partition::new()?;
    let cut_at = Instant::now();
    partition.split(&[cluster.members[leader].ip.as_str()], &others)?;
    let stepped_down = loop {
        if let Some(v) = cluster.view(leader).await {
            if v.leader != before.member_id {
                break cut_at.elapsed();
            }
        }
        if cut_at.elapsed() > ELECTION * 2 {
            anyhow::bail!(
                "m{leader}, cut off from both followers, still reports itself leader after {:?}",
                cut_at.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The others elect one of them, in a later term.
    let new_leader = loop {
        let vs = views(cluster).await;
        let found = (0..cluster.len()).filter(|i| *i != leader).find(|i| {
            vs[*i].is_some_and(|v| v.leader == v.member_id && v.term > before.term)
                && (0..cluster.len())
                    .filter(|j| *j != leader)
                    .all(|j| vs[j].is_some_and(|w| w.leader == vs[*i].unwrap().member_id))
        });
        if let Some(i) = found {
            break i;
        }
        if cut_at.elapsed() > ELECTION * 6 {
            anyhow::bail!("the two members left did not agree on a new leader: {vs:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    partition.heal()?;
    let new_id = cluster.view(new_leader).await.map(|v| v.member_id).unwrap_or_default();
    let healed_at = Instant::now();
    loop {
        if cluster.view(leader).await.is_some_and(|v| v.leader == new_id) {
            break;
        }
        if healed_at.elapsed() > ELECTION * 5 {
            anyhow::bail!(
                "healed, m{leader} does not follow the new leader m{new_leader}: {:?}",
                cluster.view(leader).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((stepped_down, leader, new_leader))
}
