//! Rolling upgrades and downgrades under load: the upgrade nemeses.
//!
//! A run starts its members on the previous release (0.1.0, built from git
//! by `scripts/old-release.sh`) and replaces them one at a time with the
//! current build, then back again, round after round until the run's time
//! is up — always at least up, down and up again (so that the end of a
//! downgrade is seen too). Each replacement is what an
//! operator does: SIGTERM, wait for the exit, start the other binary on the
//! same data directory, wait until every member serves again. The order is
//! the leader last (the leader's turn comes when it is the only member left
//! on the other release) or the leader first.
//!
//! Each way back begins as an operator's does: `downgrade enable` to the old
//! release (etcd's `Maintenance.Downgrade`), after which every member must
//! report the old release as the cluster version before any binary is
//! replaced.
//!
//! Besides the workloads (those both releases serve), the run checks:
//! - **a lock held across every replacement keeps its token**: a native
//!   mutex granted before the first replacement, its lease kept alive as
//!   the lock workload keeps its leases (`workload::locks::HeldLease`);
//!   after each replacement, Describe through the replaced member, and at
//!   the end through every member, must show the same holder with the same
//!   token;
//! - **the cluster version follows the members**: once every member runs
//!   the current release, each reports it as `raftlockcluster` in
//!   `/version`, and no downgrade in progress (the last one completed or
//!   was abandoned by itself); once one runs the old one again, the members
//!   on the current release report the old one — each within three rounds
//!   of asking (`node::versions`).
//!
//! And it reports, per replacement, the longest gap without a successful
//! register write from the moment the member was stopped to one second
//! after every member served again ([`longest_gaps`]).
//!
//! Caveat: the workloads are those both releases serve; multi-locks,
//! lock-delays, Validate and lock events came with the current release and
//! are not exercised across releases here (a Validate sent to an old member
//! is answered Unimplemented, and the workload goes on without an answer).

use std::path::{Path, PathBuf};
use std::time::Duration;

use raftlock::proto::raftlock::v1::{locks_client::LocksClient, AcquireRequest, DescribeRequest};
use raftlock_faults::history::{Anomaly, Time};
use tonic::transport::Endpoint;

use crate::cluster::{connect, Cluster};
use crate::workload::locks::HeldLease;
use crate::workload::{bounded, Clock, Context};

/// A run's report lists its replacements one by one up to this many.
const LISTED: usize = 12;
/// The lock held across the replacements.
const HELD: &str = "upgrade/held";
/// How long each member gets to report the cluster version (the members
/// ask each other every 5 s).
const VERSION_WITHIN: Duration = Duration::from_secs(20);

/// Which member goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    LeaderLast,
    LeaderFirst,
}

/// One member replaced.
#[derive(Clone, Debug)]
pub struct Replacement {
    pub member: usize,
    pub was_leader: bool,
    /// The release it runs now.
    pub to: &'static str,
    /// When it was sent SIGTERM, and when every member served again.
    pub stopped_at: Time,
    pub served_at: Time,
}

/// The releases a run moves between.
pub struct Releases {
    pub old: PathBuf,
    pub old_name: &'static str,
    pub new: PathBuf,
    pub new_name: &'static str,
}

/// The state of one upgrade run.
pub struct Rolling {
    releases: Releases,
    order: Order,
    /// Whether member `i` runs the new release.
    on_new: Vec<bool>,
    /// Moving every member to the new release (else back to the old).
    upward: bool,
    /// Ways back completed.
    downgrades: usize,
    pub replacements: Vec<Replacement>,
    pub anomalies: Vec<Anomaly>,
    held: Option<HeldLock>,
}

/// The lock held across the replacements.
struct HeldLock {
    key: Vec<u8>,
    token: i64,
    lease: HeldLease,
}

impl Rolling {
    /// A run whose `members` all run the old release now.
    pub fn new(releases: Releases, order: Order, members: usize) -> Rolling {
        Rolling {
            releases,
            order,
            on_new: vec![false; members],
            upward: true,
            downgrades: 0,
            replacements: Vec::new(),
            anomalies: Vec::new(),
            held: None,
        }
    }

    /// Take the lock that must survive every replacement (before the
    /// first), on a lease kept alive until `ctx` stops.
    pub async fn hold_lock(&mut self, cluster: &Cluster, ctx: &Context) -> anyhow::Result<()> {
        let endpoint = cluster.members[0].endpoint();
        let mut c = connect(std::slice::from_ref(&endpoint)).await?;
        let lease = HeldLease::grant(ctx, &mut c, 0).await.map_err(anyhow::Error::msg)?;
        let mut locks = LocksClient::new(Endpoint::from_shared(endpoint)?.connect_lazy());
        let req = AcquireRequest { name: HELD.into(), lease: lease.id, wait_ms: 5000, ..Default::default() };
        let granted = locks.acquire(req).await?.into_inner();
        anyhow::ensure!(granted.acquired, "the lock to hold across the upgrade was not granted");
        self.held = Some(HeldLock { key: granted.key, token: granted.token, lease });
        Ok(())
    }

    /// Whether every member runs the new release again after at least one
    /// way back.
    pub fn round_done(&self) -> bool {
        self.downgrades > 0 && self.on_new.iter().all(|n| *n)
    }

    /// Replace one member (turning round when every member runs the
    /// release it was moving to). Returns what it did.
    pub async fn step(&mut self, cluster: &mut Cluster, clock: &Clock) -> anyhow::Result<String> {
        let mut enabled = String::new();
        if self.on_new.iter().all(|n| *n == self.upward) {
            self.upward = !self.upward;
            if self.upward {
                self.downgrades += 1;
            } else {
                self.enable_downgrade(cluster).await;
                enabled = format!("downgrade to {} enabled; ", self.releases.old_name);
            }
        }
        let leader = cluster.current_leader().await;
        let pending: Vec<usize> = (0..self.on_new.len()).filter(|&i| self.on_new[i] != self.upward).collect();
        let followers: Vec<usize> = pending.iter().copied().filter(|&i| Some(i) != leader).collect();
        let i = match (self.order, leader) {
            (Order::LeaderFirst, Some(l)) if pending.contains(&l) => l,
            _ => followers.first().copied().unwrap_or(pending[0]),
        };
        let (binary, to) = if self.upward {
            (self.releases.new.clone(), self.releases.new_name)
        } else {
            (self.releases.old.clone(), self.releases.old_name)
        };
        let stopped_at = clock.now();
        let status = cluster.terminate(i);
        cluster.set_member_binary(i, &binary);
        cluster.restart(i)?;
        self.on_new[i] = self.upward;
        cluster.wait_healthy(Duration::from_secs(30)).await?;
        let served_at = clock.now();
        let was_leader = leader == Some(i);
        self.replacements.push(Replacement { member: i, was_leader, to, stopped_at, served_at });
        let role = if was_leader { "the leader" } else { "a follower" };
        let mut did = format!(
            "{enabled}m{i} ({role}) stopped ({status}), started on {to}; every member served {} ms later",
            (served_at - stopped_at) / 1_000_000
        );
        self.check_held(cluster, i).await;
        if self.on_new.iter().all(|n| *n) {
            self.cluster_version_is(cluster, self.releases.new_name).await;
            did += &format!("; every member reports cluster version {}", self.releases.new_name);
        } else if !self.upward && self.on_new.iter().filter(|n| !**n).count() == 1 {
            self.cluster_version_is(cluster, self.releases.old_name).await;
            did += &format!("; the others report cluster version {}", self.releases.old_name);
        }
        Ok(did)
    }

    /// `downgrade enable` to the old release through a random member; then
    /// every member reports the old release as the cluster version.
    async fn enable_downgrade(&mut self, cluster: &Cluster) {
        use raftlock::proto::etcdserverpb::{
            downgrade_request::DowngradeAction, maintenance_client::MaintenanceClient, DowngradeRequest,
        };
        let endpoints = cluster.endpoints();
        let mut last = String::new();
        for attempt in 0..10 {
            let endpoint = endpoints[attempt % endpoints.len()].clone();
            let Ok(channel) = Endpoint::from_shared(endpoint) else { break };
            let mut maintenance = MaintenanceClient::new(channel.connect_lazy());
            let req =
                DowngradeRequest { action: DowngradeAction::Enable as i32, version: self.releases.old_name.into() };
            match bounded(maintenance.downgrade(req)).await {
                Ok(answer) if answer.get_ref().version == self.releases.old_name => {
                    self.cluster_version_is(cluster, self.releases.old_name).await;
                    return;
                }
                Ok(answer) => last = format!("answered cluster version {}", answer.get_ref().version),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.anomalies.push(Anomaly::new(
            "upgrade",
            "downgrade",
            format!("enable to {}: {last}", self.releases.old_name),
        ));
    }

    /// Describe through member `i` shows the held lock's holder, same token.
    async fn check_held(&mut self, cluster: &Cluster, i: usize) {
        let Some(held) = &self.held else { return };
        let endpoint = cluster.members[i].endpoint();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            let Ok(channel) = Endpoint::from_shared(endpoint.clone()) else { break };
            let mut locks = LocksClient::new(channel.connect_lazy());
            match bounded(locks.describe(DescribeRequest { name: HELD.into(), permits: 0, ..Default::default() })).await
            {
                Ok(resp) => {
                    let holders = resp.into_inner().holders;
                    if holders.len() == 1 && holders[0].key == held.key && holders[0].token == held.token {
                        return;
                    }
                    let seen: Vec<_> =
                        holders.iter().map(|h| (String::from_utf8_lossy(&h.key).to_string(), h.token)).collect();
                    self.anomalies.push(Anomaly::new(
                        "upgrade",
                        HELD,
                        format!(
                            "after m{i} was replaced, its Describe shows holders {seen:?}, not {} with token {}",
                            String::from_utf8_lossy(&held.key),
                            held.token
                        ),
                    ));
                    return;
                }
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.anomalies.push(Anomaly::new(
            "upgrade",
            HELD,
            format!("m{i} could not Describe it after it was replaced: {last}"),
        ));
    }

    /// Every member on the new release reports `raftlockcluster` =
    /// `version` within [`VERSION_WITHIN`] (old members have no such field).
    async fn cluster_version_is(&mut self, cluster: &Cluster, version: &str) {
        for i in (0..self.on_new.len()).filter(|&i| self.on_new[i]) {
            let deadline = tokio::time::Instant::now() + VERSION_WITHIN;
            let endpoint = cluster.members[i].endpoint();
            loop {
                let (_, body) = raftlock_testkit::http_get(&endpoint, "/version").await;
                let seen: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                // At the current release, no downgrade may be left in progress.
                let settled = version != self.releases.new_name || seen["raftlockdowngrade"].is_null();
                if seen["raftlockcluster"] == version && settled {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    self.anomalies.push(Anomaly::new(
                        "upgrade",
                        format!("m{i}"),
                        format!(
                            "its /version stayed {body} for {} s, not cluster version {version}",
                            VERSION_WITHIN.as_secs()
                        ),
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }

    /// Once the last member is replaced, before the run stops: the held
    /// lock checked a last time (through every member), then let go.
    pub async fn finish(&mut self, cluster: &Cluster) {
        for i in 0..self.on_new.len() {
            self.check_held(cluster, i).await;
        }
        if let Some(held) = self.held.take() {
            if let Ok(mut c) = connect(&cluster.endpoints()).await {
                held.lease.give_up(&mut c).await;
            }
        }
    }

    /// Lines for the run's report: each replacement and its write gap
    /// (up to [`LISTED`] of them), or else a line per kind of replacement
    /// (the leader or a follower, to each release): how many, and the
    /// median and longest gaps and times to serve.
    pub fn report(&self, write_completions: &[Time]) -> Vec<String> {
        let windows: Vec<(Time, Time)> =
            self.replacements.iter().map(|r| (r.stopped_at, r.served_at + 1_000_000_000)).collect();
        let gaps = longest_gaps(write_completions, &windows);
        if self.replacements.len() > LISTED {
            let mut kinds: std::collections::BTreeMap<(bool, &str), (Vec<Time>, Vec<Time>)> = Default::default();
            for (r, gap) in self.replacements.iter().zip(&gaps) {
                let kind = kinds.entry((r.was_leader, r.to)).or_default();
                kind.0.push(*gap);
                kind.1.push(r.served_at - r.stopped_at);
            }
            let ms = |mut v: Vec<Time>| {
                v.sort_unstable();
                (v[v.len() / 2] / 1_000_000, v[v.len() - 1] / 1_000_000)
            };
            return kinds
                .into_iter()
                .map(|((leader, to), (gaps, served))| {
                    let n = gaps.len();
                    let ((gap_median, gap_max), (served_median, served_max)) = (ms(gaps), ms(served));
                    format!(
                        "{n} × {} to {to}: longest gap without a successful write {gap_median} ms median, {gap_max} ms \
                         at most; every member served {served_median} ms (median), {served_max} ms (at most) after \
                         the stop",
                        if leader { "the leader" } else { "a follower" }
                    )
                })
                .collect();
        }
        self.replacements
            .iter()
            .zip(gaps)
            .map(|(r, gap)| {
                let role = if r.was_leader { "leader" } else { "follower" };
                format!(
                    "m{} ({role}) to {}: every member served {} ms after the stop; longest gap without a successful \
                     write {} ms",
                    r.member,
                    r.to,
                    (r.served_at - r.stopped_at) / 1_000_000,
                    gap / 1_000_000
                )
            })
            .collect()
    }
}

/// For each window `(from, to)`: the longest time between two successive
/// completions of successful writes (`completions`, any order) that
/// overlaps the window, counting from the last completion before it to the
/// first after it (to the window's end if there is none: writes stopped).
pub fn longest_gaps(completions: &[Time], windows: &[(Time, Time)]) -> Vec<Time> {
    let mut sorted = completions.to_vec();
    sorted.sort_unstable();
    windows
        .iter()
        .map(|&(from, to)| {
            let first = sorted.partition_point(|&t| t <= from);
            let mut previous = if first == 0 { from } else { sorted[first - 1] };
            let mut longest = 0;
            for &t in &sorted[first..] {
                longest = longest.max(t - previous);
                previous = t;
                if t >= to {
                    return longest;
                }
            }
            longest.max(to.saturating_sub(previous))
        })
        .collect()
}

/// The old release's binary: `--old-raftlock`, else where
/// `scripts/old-release.sh` caches it.
pub fn old_binary(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("target/releases/0.1.0/raftlock"))
}

#[cfg(test)]
mod tests {
    use super::longest_gaps;

    #[test]
    fn a_gap_counts_from_the_last_write_before_the_window_to_the_first_after() {
        let writes = [10, 20, 30, 80, 90, 200];
        // A window from 25 to 85: 30 → 80 is the longest.
        assert_eq!(longest_gaps(&writes, &[(25, 85)]), vec![50]);
        // A window inside one gap: the whole gap.
        assert_eq!(longest_gaps(&writes, &[(40, 50)]), vec![50]);
        // Writes stopped: to the window's end.
        assert_eq!(longest_gaps(&writes, &[(195, 400)]), vec![200]);
        // None before the window: from its start.
        assert_eq!(longest_gaps(&[100], &[(0, 50)]), vec![100]);
        assert_eq!(longest_gaps(&[], &[(0, 50)]), vec![50]);
        // Unsorted input.
        assert_eq!(longest_gaps(&[90, 10, 30], &[(15, 95)]), vec![60]);
    }
}
