//! A cluster of real `raftlock` processes on this machine: the one harness
//! of the integration tests (`tests/`) and of the fault and hostile suites
//! (`faults/`).
//!
//! Each member is an OS process started from a built binary, with its own
//! ports, data directory and log file, so kill -9, SIGSTOP and restarts are
//! the real thing. Two ways to address members ([`Addressing`]):
//! - [`Addressing::Ports`] (the tests'): every member on 127.0.0.1, each with
//!   its own client and peer port from [`free_port`], so that clusters of
//!   tests running at once do not collide; plain or TLS on both ports;
//! - [`Addressing::Loopback`] (the fault suite's): member `i` on 127.0.0.(11+i),
//!   client port 2379 and peer port 2380, so that every packet between two
//!   members carries both members' addresses and nftables can cut any link
//!   without touching the suite's own clients (which connect from 127.0.0.1).
//!   The fixed ports mean one such cluster at a time per machine.
//!
//! A cluster may also run every member under libfaketime ([`Clocks`]: wall
//! clocks the suite can move; the monotonic clock, which lease time and
//! elections run on, is left alone) or under an address-space ceiling
//! (`ulimit -v`). Every member is killed when the cluster is dropped; a
//! cluster built in a temporary directory keeps it, and says where, when
//! the test that owns it panics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

pub use crate::builder::Builder;
use crate::certs::Certs;
pub use crate::clocks::Clocks;
use crate::free_port;

/// The members' `--initial-cluster-token` (raftlock's default).
const TOKEN: &str = "raftlock-cluster";

/// How members are addressed (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    Ports,
    Loopback,
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// The member's address: 127.0.0.1, or its own loopback address.
    pub ip: String,
    pub data_dir: PathBuf,
    child: Option<Child>,
    paused: AtomicBool,
    log: PathBuf,
    /// Set for a member that joins a running cluster: its `--initial-cluster`
    /// (and it starts with `--initial-cluster-state existing`).
    joins: Option<String>,
    /// "http", or "https" on both ports.
    scheme: &'static str,
    /// The binary this member runs, when not the cluster's (a member
    /// replaced in a rolling upgrade).
    binary: Option<PathBuf>,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.ip, self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.ip, self.peer_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// What one member said of the cluster: its ID, the leader it knows (0:
/// none) and its Raft term.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub member_id: u64,
    pub leader: u64,
    pub term: u64,
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub(crate) binary: PathBuf,
    pub(crate) dir: PathBuf,
    /// Kept (and printed) when a test fails, for the post-mortem.
    pub(crate) temp: Option<tempfile::TempDir>,
    pub(crate) addressing: Addressing,
    pub(crate) scheme: &'static str,
    pub(crate) initial_cluster: String,
    /// Flags every member gets on top of the cluster's own.
    pub(crate) extra_args: Vec<String>,
    pub(crate) heartbeat_ms: u64,
    pub(crate) election_ms: u64,
    pub(crate) clocks: Option<Clocks>,
    /// Each member's address-space ceiling (`ulimit -v`), if any.
    pub(crate) memory_limit: Option<u64>,
    /// How the harness's clients connect (TLS, a user).
    pub(crate) connect: Option<ConnectOptions>,
    /// Environment variables every member is started with.
    pub env: Vec<(String, String)>,
}

/// The `raftlock` binary cargo built beside the running test binary
/// (`target/<profile>/deps/<test>` runs, `target/<profile>/raftlock` is it).
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    profile_dir.join(name)
}

impl Cluster {
    /// A cluster of `n` members to be configured; by default the tests'
    /// shape: ports on 127.0.0.1, a temporary directory, a 50 ms heartbeat
    /// and a 500 ms election timeout (fast failover, still well above
    /// loopback round trips).
    pub fn builder(n: usize) -> Builder {
        Builder {
            n,
            binary: built_binary("raftlock"),
            dir: None,
            temp: None,
            addressing: Addressing::Ports,
            scheme: "http",
            args: Vec::new(),
            heartbeat_ms: crate::HEARTBEAT_MS,
            election_ms: crate::ELECTION_MS,
            clocks: None,
            memory_limit: None,
            connect: None,
        }
    }

    /// Start `n` members and wait until the cluster has a leader and serves.
    pub async fn start(n: usize) -> Cluster {
        Self::start_with(n, &[]).await
    }

    /// As [`Cluster::start`], with extra flags for every member.
    pub async fn start_with(n: usize, extra_args: &[&str]) -> Cluster {
        let cluster = Cluster::builder(n).args(extra_args).spawn().expect("start raftlock");
        cluster.wait_ready().await;
        cluster
    }

    /// As [`Cluster::start`], with mTLS on both ports of every member
    /// (certificates from `certs`); the harness connects as `alice`.
    pub async fn start_tls(dir: tempfile::TempDir, n: usize, certs: &Certs, extra_args: &[&str]) -> Cluster {
        let builder = Cluster::builder(n).temp_dir(dir).tls(certs).args(extra_args);
        let cluster = builder.spawn().expect("start raftlock");
        cluster.wait_ready().await;
        cluster
    }

    /// `n` members with their ports and data directories chosen, none
    /// started: for a test that prepares their data directories first.
    pub fn unstarted(n: usize) -> Cluster {
        Cluster::builder(n).unstarted().expect("a temporary directory")
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Flags every member of an [`Cluster::unstarted`] cluster gets.
    pub fn add_args(&mut self, args: &[&str]) {
        self.extra_args.extend(args.iter().map(|a| a.to_string()));
    }

    /// Start every member of an [`Cluster::unstarted`] cluster, and wait
    /// until it serves.
    pub async fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.spawn(i).expect("start raftlock");
        }
        self.wait_ready().await;
    }

    /// A member that is not started yet (address and data directory
    /// chosen); returns its index. Add it to the cluster, then
    /// [`Cluster::join`] it.
    pub fn new_member(&mut self) -> usize {
        let i = self.members.len();
        let name = format!("m{i}");
        let (ip, client_port, peer_port) = match self.addressing {
            Addressing::Ports => ("127.0.0.1".to_string(), free_port(), free_port()),
            Addressing::Loopback => (format!("127.0.0.{}", 11 + i), 2379, 2380),
        };
        self.members.push(Member {
            data_dir: self.dir.join(format!("{name}.raftlock")),
            log: self.dir.join(format!("{name}.log")),
            name,
            ip,
            client_port,
            peer_port,
            child: None,
            paused: AtomicBool::new(false),
            joins: None,
            scheme: self.scheme,
            binary: None,
        });
        i
    }

    /// Start member `i` with `--initial-cluster-state existing`: it joins the
    /// running cluster that added it.
    pub fn join(&mut self, i: usize, initial_cluster: &str) {
        self.members[i].joins = Some(initial_cluster.to_string());
        self.spawn(i).expect("start raftlock");
    }

    pub fn peer_url(&self, i: usize) -> String {
        self.members[i].peer_url()
    }

    /// The `--initial-cluster` the members started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// The member ID of member `i`, as raftlock derives it.
    pub fn member_id(&self, i: usize) -> u64 {
        raftlock::ids::member_id(&[self.peer_url(i)], TOKEN)
    }

    pub(crate) fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
        let (initial_cluster, state) = match &m.joins {
            Some(c) => (c.as_str(), "existing"),
            None => (self.initial_cluster.as_str(), "new"),
        };
        let binary = m.binary.clone().unwrap_or_else(|| self.binary.clone());
        let mut command = Command::new(&binary);
        if let Some(clocks) = &self.clocks {
            command
                .env("LD_PRELOAD", &clocks.library)
                .env("FAKETIME_TIMESTAMP_FILE", clocks.file(i))
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        if let Some(limit) = self.memory_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, and nothing else runs
            // between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                    if libc::setrlimit(libc::RLIMIT_AS, &rlimit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
        let child = command
            .args(["--name", &m.name])
            .args(["--data-dir", &m.data_dir.to_string_lossy()])
            .args(["--listen-client-urls", &m.endpoint()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--heartbeat-interval", &self.heartbeat_ms.to_string()])
            .args(["--election-timeout", &self.election_ms.to_string()])
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", binary.display()))?;
        m.child = Some(child);
        m.paused.store(false, Ordering::Relaxed);
        Ok(())
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// A client talking to member `i` only (panics if it cannot connect).
    pub async fn client(&self, i: usize) -> Client {
        self.try_client(i).await.expect("connect")
    }

    /// A client talking to member `i` only, that notices a dead connection
    /// within a few seconds (see [`crate::connect`]).
    pub async fn try_client(&self, i: usize) -> anyhow::Result<Client> {
        match &self.connect {
            Some(options) => Ok(Client::connect([self.members[i].endpoint()], Some(options.clone())).await?),
            None => crate::connect(&[self.members[i].endpoint()]).await,
        }
    }

    /// From now on the harness's clients log in as `user` (auth is on).
    pub fn log_in_as(&mut self, user: &str, password: &str) {
        self.connect = Some(self.connect.clone().unwrap_or_default().with_user(user, password));
    }

    /// Wait until every running member reports the same leader, answers a
    /// linearizable read and has published its client URLs (30 s at most,
    /// then panic with the members' logs).
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ready(false).await {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ready in 30 s; logs:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait (at most `within`) until every member runs, agrees on one leader
    /// and answers a linearizable read.
    pub async fn wait_healthy(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if self.ready(true).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!("the cluster was not healthy within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the running members (with `all`, every member, running and
    /// not paused) agree on a leader, each answers a linearizable read and
    /// each has published its client URLs.
    async fn ready(&self, all: bool) -> bool {
        let mut leaders = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if !m.is_running() && !all {
                continue;
            }
            let Some(view) = self.view(i).await else { return false };
            if view.leader == 0 {
                return false;
            }
            leaders.push(view.leader);
            // A linearizable read, and this member's own entry in the member
            // list with its client URLs: it has published itself (etcd's
            // ready), so a member list taken now shows every member started.
            let published = async {
                let mut c = self.try_client(i).await.ok()?;
                c.get("ready-probe", None).await.ok()?;
                let members = c.member_list().await.ok()?;
                members.members().iter().any(|m| m.id() == view.member_id && !m.client_urls().is_empty()).then_some(())
            };
            if tokio::time::timeout(Duration::from_secs(2), published).await.ok().flatten().is_none() {
                return false;
            }
        }
        !leaders.is_empty() && leaders.iter().all(|l| *l == leaders[0])
    }

    /// What member `i` says of itself and its leader (within a second;
    /// `None` from a stopped or paused member, or one that does not answer).
    pub async fn view(&self, i: usize) -> Option<View> {
        let m = &self.members[i];
        if !m.is_running() || m.paused.load(Ordering::Relaxed) {
            return None;
        }
        let ask = async {
            let mut c = self.try_client(i).await.ok()?;
            let s = c.status().await.ok()?;
            Some(View { member_id: s.header()?.member_id(), leader: s.leader(), term: s.raft_term() })
        };
        tokio::time::timeout(Duration::from_secs(1), ask).await.ok().flatten()
    }

    /// The index of the member that leads, as the members that run see it
    /// (a majority of them must agree), if any; no waiting.
    pub async fn current_leader(&self) -> Option<usize> {
        let mut views = Vec::new();
        for i in 0..self.len() {
            if let Some(v) = self.view(i).await {
                views.push((i, v));
            }
        }
        let leader =
            views.iter().find(|(_, v)| v.leader != 0 && v.leader == v.member_id).map(|(i, v)| (*i, v.leader))?;
        let agree = views.iter().filter(|(_, v)| v.leader == leader.1).count();
        (agree * 2 > self.len()).then_some(leader.0)
    }

    /// The index of the current leader (waits until the cluster is ready).
    pub async fn leader(&self) -> usize {
        self.wait_ready().await;
        for i in 0..self.len() {
            if let Some(v) = self.view(i).await {
                if v.leader == v.member_id {
                    return i;
                }
            }
        }
        panic!("no member is the leader; logs:\n{}", self.logs());
    }

    /// A member that is not the leader.
    pub async fn follower(&self) -> usize {
        let leader = self.leader().await;
        (0..self.members.len()).find(|&i| i != leader && self.members[i].is_running()).unwrap()
    }

    /// kill -9 member `i` (a paused one too).
    pub fn kill(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        m.paused.store(false, Ordering::Relaxed);
    }

    /// Member `i`'s process ID, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].pid()
    }

    /// SIGSTOP: the member's process is frozen (its sockets stay open).
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.members[i].paused.store(true, Ordering::Relaxed);
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.members[i].paused.store(false, Ordering::Relaxed);
    }

    fn signal(&self, i: usize, signal: i32) {
        if let Some(child) = &self.members[i].child {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// The `raftlock` binary members started from now on run: a rolling
    /// upgrade kills a member, sets the new binary and restarts it.
    pub fn set_binary(&mut self, binary: &std::path::Path) {
        self.binary = binary.to_path_buf();
    }

    /// The `raftlock` binary member `i` runs from its next start on,
    /// whatever the cluster's: one member of a rolling upgrade.
    pub fn set_member_binary(&mut self, i: usize, binary: &std::path::Path) {
        self.members[i].binary = Some(binary.to_path_buf());
    }

    /// Start a stopped member again with the same flags and data (a running
    /// one is left alone).
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        if self.members[i].child.is_none() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// Kill member `i`, delete its data directory, and start it again with
    /// the same flags.
    pub fn wipe_and_restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
        self.spawn(i)
    }

    /// Start member `i` (stopped, data directory emptied) to join the
    /// cluster that added it back.
    pub fn rejoin(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
        self.members[i].joins = Some(self.initial_cluster.clone());
        self.spawn(i)
    }

    /// Whether member `i` was started and has exited since (by itself: a
    /// crash, an abort, or a refusal to start).
    pub fn has_exited(&mut self, i: usize) -> bool {
        matches!(self.members[i].child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    }

    /// Wait (at most `within`) for member `i` to exit by itself; its exit
    /// status, or `None` if it still runs.
    pub fn wait_exit(&mut self, i: usize, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let child = self.members[i].child.as_mut().expect("running");
            if let Some(status) = child.try_wait().unwrap() {
                self.members[i].child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait (at most `within`, without blocking the runtime) for member `i`
    /// to exit by itself; whether it did (or was not running).
    pub async fn exited(&mut self, i: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            match self.members[i].child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => {
                    self.members[i].child = None;
                    return true;
                }
            }
        }
        false
    }

    /// SIGTERM, and wait for a clean exit; returns the exit status.
    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        let mut c = self.members[i].child.take().expect("running");
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }

    /// Move member `i`'s wall clock to `offset_secs` from the true time
    /// (it follows within a second).
    pub fn set_clock(&mut self, i: usize, offset_secs: i64) -> anyhow::Result<()> {
        let clocks = self.clocks.as_ref().ok_or_else(|| anyhow::anyhow!("the cluster was started without clocks"))?;
        clocks.set(i, offset_secs)
    }

    /// Resume every paused member, restart every killed one, and set every
    /// wall clock true again.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        for i in 0..self.len() {
            // The clock first, so that a member restarted here starts true.
            if let Some(clocks) = &self.clocks {
                clocks.set(i, 0)?;
            }
            if self.members[i].paused.load(Ordering::Relaxed) {
                self.resume(i);
            }
            self.restart(i)?;
        }
        Ok(())
    }

    /// Everything member `i` has logged (all its runs).
    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }

    /// The last 30 lines each member logged.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let text = std::fs::read_to_string(&m.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!("--- {} ---\n{}", m.name, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Wait (20 s at most) until member `member` holds exactly `n` keys under
    /// `prefix`, read serializably there: what it has applied itself.
    pub async fn wait_for_keys(&self, member: usize, prefix: &str, n: usize) {
        let mut c = self.client(member).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let opts = etcd_client::GetOptions::new().with_prefix().with_serializable().with_count_only();
            if let Ok(r) = c.get(prefix, Some(opts)).await {
                if r.count() as usize == n {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "member {member} never had {n} keys under {prefix}:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            if let Some(dir) = self.temp.take() {
                eprintln!("test failed: cluster data and logs kept in {}", dir.keep().display());
            }
        }
    }
}
