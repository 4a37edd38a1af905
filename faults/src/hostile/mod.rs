//! The hostile-client suite: a 3-member cluster of real `raftlock`
//! processes, each under an address-space ceiling (`ulimit -v`), attacked
//! one way after another by clients that mean harm or know no better —
//! oversized and deeply nested requests, garbage on both ports, requests
//! sent a byte at a time, floods of streams and of password guesses, slow
//! readers, forged peers.
//!
//! After every attack the suite asks the same of the cluster: every member
//! still runs as the same process (none crashed and none was restarted
//! but by the attack itself), each takes a put and answers a linearizable
//! get, and no member's peak resident memory passed the ceiling
//! ([`RSS_CEILING`]). The attacker must have got the answer etcd gives
//! (its code and message) where etcd has one.
//!
//! Prints one row per attack (what was sent, what came back) and fails if
//! any attack's expectation or any check after it failed.
//!
//! Caveats: it shares the fault suite's fixed addresses (127.0.0.11-13,
//! ports 2379/2380), so one suite at a time per machine; the timing checks
//! (the CPU an attack costs a member) have margins of ten times what a
//! fixed member uses, so a slow machine does not fail them.

mod attacks;
mod raw;

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

use crate::cluster::Cluster;

/// Each member's address-space ceiling (`ulimit -v`): the issue's
/// reproduction ran under 8 GB.
pub const ADDRESS_SPACE: u64 = 8 << 30;
/// The most resident memory any member may have used at its peak, at any
/// check: well above what the suite's data needs (a few hundred MiB per
/// member), far below what an unbounded attack takes.
pub const RSS_CEILING: u64 = 1536 << 20;

/// One attack's outcome.
pub struct Row {
    pub attack: &'static str,
    pub outcome: Result<String, String>,
    pub seconds: f64,
}

/// The cluster under attack and what the checks compare against.
pub struct Target {
    pub cluster: Cluster,
    /// Each member's process ID as last started on purpose.
    pids: Vec<u32>,
    /// One client per member for the checks (authenticated once auth is on).
    checkers: Vec<Client>,
    probes: u64,
}

impl Target {
    pub fn client_addr(&self, i: usize) -> String {
        format!("{}:2379", self.cluster.members[i].ip)
    }

    pub fn peer_addr(&self, i: usize) -> String {
        format!("{}:2380", self.cluster.members[i].ip)
    }

    /// Member `i`'s process ID.
    pub fn pid(&self, i: usize) -> u32 {
        self.pids[i]
    }

    /// A fresh client of member `i` alone.
    pub async fn client(&self, i: usize) -> anyhow::Result<Client> {
        self.cluster.try_client(i).await
    }

    /// A fresh client of member `i`'s native lock API.
    pub async fn locks_client(
        &self,
        i: usize,
    ) -> anyhow::Result<raftlock::proto::raftlock::v1::locks_client::LocksClient<tonic::transport::Channel>> {
        let endpoint = format!("http://{}", self.client_addr(i));
        let channel = tonic::transport::Endpoint::from_shared(endpoint)?.connect().await?;
        Ok(raftlock::proto::raftlock::v1::locks_client::LocksClient::new(channel))
    }

    /// Kill every member (-9) and start them all again with their data:
    /// the pids the checks expect become the new ones.
    pub async fn restart_all(&mut self) -> anyhow::Result<()> {
        for i in 0..self.cluster.len() {
            self.cluster.kill(i);
        }
        for i in 0..self.cluster.len() {
            self.cluster.restart(i)?;
        }
        self.cluster.wait_healthy(Duration::from_secs(60)).await?;
        self.pids = (0..self.cluster.len()).map(|i| self.cluster.pid(i).expect("started")).collect();
        self.checkers = connect_each(&self.cluster, None).await?;
        Ok(())
    }

    /// From now on the checks authenticate as `user`.
    pub async fn check_as(&mut self, user: (&str, &str)) -> anyhow::Result<()> {
        self.checkers = connect_each(&self.cluster, Some(user)).await?;
        Ok(())
    }

    /// The checks after every attack (see the module doc).
    pub async fn still_serving(&mut self) -> anyhow::Result<()> {
        for i in 0..self.cluster.len() {
            anyhow::ensure!(!self.cluster.has_exited(i), "member {i} exited: {}", last_lines(&self.cluster.log_of(i)));
            let pid = self.cluster.pid(i);
            anyhow::ensure!(pid == Some(self.pids[i]), "member {i} is another process now ({pid:?})");
            self.probes += 1;
            let key = format!("hostile/probe/{i}");
            let value = self.probes.to_string();
            let c = &mut self.checkers[i];
            let probe = async {
                c.put(key.as_str(), value.as_str(), None).await?;
                let got = c.get(key.as_str(), None).await?;
                Ok::<_, etcd_client::Error>(got.kvs().first().map(|kv| kv.value().to_vec()))
            };
            match tokio::time::timeout(Duration::from_secs(10), probe).await {
                Ok(Ok(Some(v))) if v == value.as_bytes() => {}
                Ok(Ok(other)) => anyhow::bail!("member {i} read back {other:?} for {key}"),
                Ok(Err(e)) => anyhow::bail!("member {i} did not take a put and a get: {e}"),
                Err(_) => anyhow::bail!("member {i} did not take a put and a get within 10 s"),
            }
            let rss = raw::peak_rss(self.pids[i]).unwrap_or(0);
            anyhow::ensure!(
                rss <= RSS_CEILING,
                "member {i}'s peak RSS {} MiB passed the ceiling ({} MiB)",
                rss >> 20,
                RSS_CEILING >> 20
            );
        }
        Ok(())
    }

    /// How many keys live under `prefix`, as member `i` answers linearizably.
    pub async fn count(&mut self, i: usize, prefix: &str) -> anyhow::Result<i64> {
        let options = GetOptions::new().with_prefix().with_count_only();
        Ok(self.checkers[i].get(prefix, Some(options)).await?.count())
    }

    /// The highest peak RSS among the members, in MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        self.pids.iter().filter_map(|p| raw::peak_rss(*p)).max().unwrap_or(0) >> 20
    }
}

async fn connect_each(cluster: &Cluster, user: Option<(&str, &str)>) -> anyhow::Result<Vec<Client>> {
    let mut clients = Vec::new();
    for m in &cluster.members {
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
        if let Some((name, password)) = user {
            options = options.with_user(name, password);
        }
        clients.push(Client::connect([m.endpoint()], Some(options)).await?);
    }
    Ok(clients)
}

impl Target {
    /// The last warnings and errors each member logged, one line each, for
    /// a failed attack's row.
    fn warnings(&self) -> String {
        let mut out = String::new();
        for i in 0..self.cluster.len() {
            let log = self.cluster.log_of(i);
            let lines: Vec<&str> =
                log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("panicked")).collect();
            for line in &lines[lines.len().saturating_sub(3)..] {
                out.push_str(&format!("\n      member {i}: {}", line.chars().take(300).collect::<String>()));
            }
        }
        out
    }
}

fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Run the attacks named in `only` (all when empty) against a fresh
/// cluster under `dir`; one row per attack.
pub async fn run(binary: &Path, dir: &Path, only: &[String]) -> anyhow::Result<Vec<Row>> {
    let names: Vec<&str> = attacks::ALL.iter().map(|(n, _)| *n).collect();
    for n in only {
        anyhow::ensure!(names.contains(&n.as_str()), "unknown attack {n} (attacks: {})", names.join(", "));
    }
    let cluster = crate::cluster::start_limited(binary, dir, 3, ADDRESS_SPACE)?;
    cluster.wait_healthy(Duration::from_secs(60)).await?;
    let pids = (0..cluster.len()).map(|i| cluster.pid(i).expect("started")).collect();
    let checkers = connect_each(&cluster, None).await?;
    let mut target = Target { cluster, pids, checkers, probes: 0 };
    target.still_serving().await?;
    let mut rows = Vec::new();
    for (name, attack) in attacks::ALL {
        if !only.is_empty() && !only.iter().any(|n| n == name) {
            continue;
        }
        let started = Instant::now();
        let outcome = match attack(&mut target).await {
            Ok(outcome) => match target.still_serving().await {
                Ok(()) => Ok(outcome),
                Err(e) => Err(format!("{outcome}; then: {e}")),
            },
            Err(e) => Err(format!("{e:#}{}", target.warnings())),
        };
        let row = Row { attack: name, outcome, seconds: started.elapsed().as_secs_f64() };
        match &row.outcome {
            Ok(o) => println!("  {:<22} ok    {o} ({:.1} s)", row.attack, row.seconds),
            Err(e) => println!("  {:<22} FAIL  {e} ({:.1} s)", row.attack, row.seconds),
        }
        rows.push(row);
    }
    println!("  peak RSS of any member: {} MiB (ceiling {} MiB)", target.peak_rss_mib(), RSS_CEILING >> 20);
    Ok(rows)
}
