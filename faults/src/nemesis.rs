//! Nemeses: the faults the suite injects, one cycle at a time.
//!
//! A cycle injects one fault, holds it for a while, heals everything
//! (resumes paused members, restarts killed ones, sets moved wall clocks
//! true, restores every link) and
//! lets the cluster settle. Durations are drawn around the timings in use:
//! the election timeout ([`ELECTION_MS`]) and the TTLs of the workloads'
//! leases (3 s), so that pauses and partitions come both shorter and longer
//! than each.
//!
//! Faults that target "the leader" ask the members who leads; if nobody does
//! at that moment, a random member stands in.

use std::time::Duration;

use crate::cluster::{connect, Cluster, ELECTION_MS};
use crate::net::Partition;
use crate::workload::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nemesis {
    /// kill -9 of a random member, restarted a few seconds later.
    KillRandom,
    /// kill -9 of the leader.
    KillLeader,
    /// kill -9 of every member at once.
    KillAll,
    /// SIGSTOP of the leader for less than the election timeout.
    PauseLeaderShort,
    /// SIGSTOP of the leader for longer than the election timeout and the TTLs.
    PauseLeaderLong,
    /// SIGSTOP of a follower.
    PauseFollower,
    /// The leader cut off from every other member.
    IsolateLeader,
    /// The members split into a majority and a minority at random.
    MajorityMinority,
    /// Two sides that cannot see each other, and one member that sees both.
    Bridge,
    /// The leader's packets to the others are lost; theirs reach it.
    OneWayFromLeader,
    /// A follower killed, its data directory deleted, and started again: it
    /// must refuse to start; then it is removed, added back as a learner,
    /// started empty to join, and promoted — a membership change under load.
    WipeFollower,
    /// The wall clock of one member (the leader half the time), or of two
    /// in opposite directions, jumps by minutes to a year, forward or
    /// back, and jumps back at the heal (libfaketime; see
    /// `cluster::Clocks`). Lease time and elections run on the monotonic
    /// clock: nothing may change.
    ClockJump,
    /// Any of the above, drawn at random each cycle.
    Mixed,
    /// Members started on the previous release and replaced one by one
    /// with the current one, then back, the leader last (`upgrade`).
    UpgradeLeaderLast,
    /// The same, the leader first.
    UpgradeLeaderFirst,
}

/// The wall-clock jumps [`Nemesis::ClockJump`] draws from, in seconds.
const CLOCK_JUMPS: [i64; 8] = [-86_400, -3_600, -300, -90, 90, 3_600, 86_400, 365 * 86_400];

const SINGLE: [Nemesis; 12] = [
    Nemesis::KillRandom,
    Nemesis::KillLeader,
    Nemesis::KillAll,
    Nemesis::PauseLeaderShort,
    Nemesis::PauseLeaderLong,
    Nemesis::PauseFollower,
    Nemesis::IsolateLeader,
    Nemesis::MajorityMinority,
    Nemesis::Bridge,
    Nemesis::OneWayFromLeader,
    Nemesis::WipeFollower,
    Nemesis::ClockJump,
];

impl Nemesis {
    /// Every nemesis, single ones first, then the mix.
    pub fn all() -> Vec<Nemesis> {
        let mut all = SINGLE.to_vec();
        all.push(Nemesis::Mixed);
        all
    }

    /// The rolling upgrades, which need the previous release's binary.
    pub fn upgrades() -> Vec<Nemesis> {
        vec![Nemesis::UpgradeLeaderLast, Nemesis::UpgradeLeaderFirst]
    }

    /// Whether it is one of [`Nemesis::upgrades`].
    pub fn upgrades_members(self) -> bool {
        matches!(self, Nemesis::UpgradeLeaderLast | Nemesis::UpgradeLeaderFirst)
    }

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::KillRandom => "kill-random",
            Nemesis::KillLeader => "kill-leader",
            Nemesis::KillAll => "kill-all",
            Nemesis::PauseLeaderShort => "pause-leader-short",
            Nemesis::PauseLeaderLong => "pause-leader-long",
            Nemesis::PauseFollower => "pause-follower",
            Nemesis::IsolateLeader => "isolate-leader",
            Nemesis::MajorityMinority => "majority-minority",
            Nemesis::Bridge => "bridge",
            Nemesis::OneWayFromLeader => "one-way-from-leader",
            Nemesis::WipeFollower => "wipe-follower",
            Nemesis::ClockJump => "clock-jump",
            Nemesis::Mixed => "mixed",
            Nemesis::UpgradeLeaderLast => "upgrade-leader-last",
            Nemesis::UpgradeLeaderFirst => "upgrade-leader-first",
        }
    }

    pub fn parse(name: &str) -> Option<Nemesis> {
        Nemesis::all().into_iter().chain(Nemesis::upgrades()).find(|n| n.name() == name)
    }

    /// Whether its cluster must run under libfaketime (`cluster::Clocks`).
    pub fn moves_clocks(self) -> bool {
        matches!(self, Nemesis::ClockJump | Nemesis::Mixed)
    }
}

/// Injects faults into one cluster; counts them.
pub struct Injector {
    rng: Rng,
    pub faults: u64,
}

/// The operator's way back for a member that lost its data: remove it,
/// add it back as a learner, start it empty to join, and promote it once it
/// has caught up (each step retried while the cluster settles).
async fn rejoin(cluster: &mut Cluster, i: usize) -> anyhow::Result<()> {
    let id = cluster.member_id(i);
    let others: Vec<String> = (0..cluster.len()).filter(|j| *j != i).map(|j| cluster.members[j].endpoint()).collect();
    let mut c = connect(&others).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let retry = |what: &str, e: etcd_client::Error| -> anyhow::Result<()> {
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("{what} m{i}: {e}");
        }
        Ok(())
    };
    loop {
        match c.member_remove(id).await {
            Ok(_) => break,
            Err(e) if e.to_string().contains("member not found") => break,
            Err(e) => retry("removing", e)?,
        }
        tokio::time::sleep(ms(500)).await;
    }
    loop {
        let options = etcd_client::MemberAddOptions::new().with_is_learner();
        match c.member_add([cluster.peer_url(i)], Some(options)).await {
            Ok(_) => break,
            Err(e) if e.to_string().contains("Peer URLs already exists") => break,
            Err(e) => retry("adding back", e)?,
        }
        tokio::time::sleep(ms(500)).await;
    }
    cluster.rejoin(i)?;
    loop {
        match c.member_promote(id).await {
            Ok(_) => return Ok(()),
            Err(e)
                if e.to_string().contains("can only promote a learner member")
                    && !e.to_string().contains("in sync") =>
            {
                return Ok(());
            }
            Err(e) => retry("promoting", e)?,
        }
        tokio::time::sleep(ms(500)).await;
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Injector {
    pub fn new(seed: u64) -> Injector {
        Injector { rng: Rng::new(seed), faults: 0 }
    }

    async fn leader_or_any(&mut self, cluster: &Cluster) -> usize {
        match cluster.current_leader().await {
            Some(l) => l,
            None => self.rng.below(cluster.len()),
        }
    }

    async fn follower(&mut self, cluster: &Cluster) -> usize {
        let leader = cluster.current_leader().await;
        let others: Vec<usize> = (0..cluster.len()).filter(|i| Some(*i) != leader).collect();
        others[self.rng.below(others.len())]
    }

    fn shuffled(&mut self, n: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, self.rng.below(i + 1));
        }
        order
    }

    /// One cycle of `nemesis`: inject, hold, heal. Returns what it did.
    pub async fn cycle(
        &mut self,
        nemesis: Nemesis,
        cluster: &mut Cluster,
        net: &mut Partition,
    ) -> anyhow::Result<String> {
        let nemesis = match nemesis {
            Nemesis::Mixed => SINGLE[self.rng.below(SINGLE.len())],
            n => n,
        };
        let election = ELECTION_MS;
        let ip = |c: &Cluster, i: usize| c.members[i].ip.clone();
        let (what, hold) = match nemesis {
            Nemesis::KillRandom | Nemesis::KillLeader => {
                let i = if nemesis == Nemesis::KillLeader {
                    self.leader_or_any(cluster).await
                } else {
                    self.rng.below(cluster.len())
                };
                cluster.kill(i);
                (format!("killed m{i}"), self.rng.between(ms(500), ms(4000)))
            }
            Nemesis::KillAll => {
                for i in 0..cluster.len() {
                    cluster.kill(i);
                }
                ("killed every member".to_string(), self.rng.between(ms(200), ms(2000)))
            }
            Nemesis::PauseLeaderShort | Nemesis::PauseLeaderLong => {
                let i = self.leader_or_any(cluster).await;
                cluster.pause(i);
                let hold = if nemesis == Nemesis::PauseLeaderShort {
                    self.rng.between(ms(election / 4), ms(election * 4 / 5))
                } else {
                    self.rng.between(ms(4000), ms(9000))
                };
                (format!("paused m{i}"), hold)
            }
            Nemesis::PauseFollower => {
                let i = self.follower(cluster).await;
                cluster.pause(i);
                (format!("paused m{i}"), self.rng.between(ms(500), ms(6000)))
            }
            Nemesis::IsolateLeader => {
                let l = self.leader_or_any(cluster).await;
                let others: Vec<String> = (0..cluster.len()).filter(|i| *i != l).map(|i| ip(cluster, i)).collect();
                let others: Vec<&str> = others.iter().map(String::as_str).collect();
                net.split(&[&ip(cluster, l)], &others)?;
                (format!("isolated m{l}"), self.rng.between(ms(1000), ms(6000)))
            }
            Nemesis::MajorityMinority => {
                let order = self.shuffled(cluster.len());
                let (minority, majority) = order.split_at(cluster.len() / 2);
                let side = |ids: &[usize]| ids.iter().map(|i| ip(cluster, *i)).collect::<Vec<_>>();
                let (a, b) = (side(minority), side(majority));
                net.split(
                    &a.iter().map(String::as_str).collect::<Vec<_>>(),
                    &b.iter().map(String::as_str).collect::<Vec<_>>(),
                )?;
                (format!("split {minority:?} from {majority:?}"), self.rng.between(ms(1000), ms(6000)))
            }
            Nemesis::Bridge => {
                let order = self.shuffled(cluster.len());
                let half = cluster.len() / 2;
                let (left, rest) = order.split_at(half);
                let (bridge, right) = rest.split_at(1);
                let side = |ids: &[usize]| ids.iter().map(|i| ip(cluster, *i)).collect::<Vec<_>>();
                let (a, b) = (side(left), side(right));
                net.split(
                    &a.iter().map(String::as_str).collect::<Vec<_>>(),
                    &b.iter().map(String::as_str).collect::<Vec<_>>(),
                )?;
                (format!("bridge m{} between {left:?} and {right:?}", bridge[0]), self.rng.between(ms(1000), ms(6000)))
            }
            Nemesis::OneWayFromLeader => {
                let l = self.leader_or_any(cluster).await;
                for i in (0..cluster.len()).filter(|i| *i != l) {
                    net.cut_one_way(&ip(cluster, l), &ip(cluster, i))?;
                }
                (format!("m{l}'s packets to the others lost"), self.rng.between(ms(1000), ms(6000)))
            }
            Nemesis::WipeFollower => {
                let i = self.follower(cluster).await;
                cluster.wipe_and_restart(i)?;
                if !cluster.exited(i, Duration::from_secs(15)).await {
                    anyhow::bail!("m{i} started with an empty data directory and was not refused");
                }
                if !cluster.log_of(i).contains("has already been bootstrapped") {
                    anyhow::bail!("m{i} stopped, but not because it was refused as already bootstrapped");
                }
                rejoin(cluster, i).await?;
                (format!("wiped m{i}: refused, removed, added back, rejoined and promoted"), Duration::ZERO)
            }
            Nemesis::ClockJump => {
                let i = if self.rng.below(2) == 0 {
                    self.leader_or_any(cluster).await
                } else {
                    self.rng.below(cluster.len())
                };
                let jump = CLOCK_JUMPS[self.rng.below(CLOCK_JUMPS.len())];
                cluster.set_clock(i, jump)?;
                let mut what = format!("m{i}'s wall clock {jump:+} s");
                if self.rng.below(2) == 0 {
                    let j = (i + 1 + self.rng.below(cluster.len() - 1)) % cluster.len();
                    cluster.set_clock(j, -jump)?;
                    what += &format!(", m{j}'s {:+} s", -jump);
                }
                // Held for up to twice the workloads' lease TTL, so that
                // deadlines fall due while the clocks disagree.
                (what, self.rng.between(ms(1000), ms(6000)))
            }
            Nemesis::Mixed => unreachable!("drawn above"),
            Nemesis::UpgradeLeaderLast | Nemesis::UpgradeLeaderFirst => {
                anyhow::bail!("{} replaces members through upgrade::Rolling, not in cycles", nemesis.name())
            }
        };
        self.faults += 1;
        tokio::time::sleep(hold).await;
        cluster.heal()?;
        net.heal()?;
        Ok(format!("{}: {what} for {} ms", nemesis.name(), hold.as_millis()))
    }
}
