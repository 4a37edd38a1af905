//! A cluster of real `raftlock` processes, one per loopback address.
//!
//! Member `i` listens on 127.0.0.(11+i), client port 2379 and peer port
//! 2380, and — since it listens for peers on one address — its peer
//! connections leave from that address too. So every packet between two
//! members carries both members' addresses, and `net::Partition` can cut any
//! link, one way or both, without touching the suite's own clients (which
//! connect from 127.0.0.1).
//!
//! Faults here are process faults: kill -9, SIGSTOP/SIGCONT, restart, a
//! restart with an empty data directory, and — in a cluster started with
//! [`Clocks`] — jumps of a member's wall clock. Every member is killed when
//! the cluster is dropped.
//!
//! Wall clocks: each member then runs under libfaketime (`LD_PRELOAD`),
//! which offsets what `CLOCK_REALTIME` tells it by the offset written in
//! its own clock file, read again at most once a second. Its monotonic
//! clock (`DONT_FAKE_MONOTONIC`) is left alone: that is the clock lease
//! time and elections run on, and the point of the fault is that jumps of
//! the other one change nothing they decide.
//!
//! Caveat: the fixed ports mean one suite at a time per machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

/// The members' `--initial-cluster-token` (raftlock's default).
const TOKEN: &str = "raftlock-cluster";

/// Raft timing of the members under test: etcd's defaults.
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_MS: u64 = 1000;
/// `--experimental-log-memory-bytes` of every member (the default is 32 MiB).
const LOG_MEMORY_BYTES: u64 = 64 << 10;

pub struct Member {
    pub name: String,
    pub ip: String,
    pub data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// Starts with `--initial-cluster-state existing` (it was added back).
    joins: bool,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("http://{}:2379", self.ip)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

pub struct Cluster {
    pub members: Vec<Member>,
    binary: PathBuf,
    initial_cluster: String,
    clocks: Option<Clocks>,
    /// Each member's address-space ceiling (`ulimit -v`), if any.
    memory_limit: Option<u64>,
}

/// Wall clocks the cluster can move (see the module doc): libfaketime's
/// library, and the directory of the members' clock files.
#[derive(Clone, Debug)]
pub struct Clocks {
    library: PathBuf,
    dir: PathBuf,
}

impl Clocks {
    /// Clock files under `dir`, with Debian's libfaketime (package
    /// `libfaketime`), found wherever its multiarch directory is.
    pub fn new(dir: &Path) -> anyhow::Result<Clocks> {
        let library = std::fs::read_dir("/usr/lib")?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
            .find(|p| p.exists())
            .ok_or_else(|| anyhow::anyhow!("no libfaketime under /usr/lib/*/faketime (Debian's libfaketime)"))?;
        Ok(Clocks { library, dir: dir.to_path_buf() })
    }

    fn file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("m{i}.clock"))
    }

    /// Member `i`'s wall clock `offset_secs` from the true one: written
    /// aside and renamed, so that libfaketime never reads half of it.
    fn set(&self, i: usize, offset_secs: i64) -> anyhow::Result<()> {
        let file = self.file(i);
        let aside = file.with_extension("next");
        std::fs::write(&aside, format!("{offset_secs:+}\n"))?;
        std::fs::rename(&aside, &file)?;
        Ok(())
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

impl Cluster {
    /// Start `n` members with data and logs under `dir`; with `clocks`,
    /// under libfaketime, their wall clocks true until moved.
    pub fn start(binary: &Path, dir: &Path, n: usize, clocks: Option<Clocks>) -> anyhow::Result<Cluster> {
        Cluster::start_with(binary, dir, n, clocks, None)
    }

    /// [`Cluster::start`], each member (and each restart of it) under an
    /// address-space ceiling of `memory_limit` bytes, as `ulimit -v` sets
    /// it: an allocation past it fails in the member, which aborts.
    pub fn start_limited(binary: &Path, dir: &Path, n: usize, memory_limit: u64) -> anyhow::Result<Cluster> {
        Cluster::start_with(binary, dir, n, None, Some(memory_limit))
    }

    fn start_with(
        binary: &Path,
        dir: &Path,
        n: usize,
        clocks: Option<Clocks>,
        memory_limit: Option<u64>,
    ) -> anyhow::Result<Cluster> {
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                ip: format!("127.0.0.{}", 11 + i),
                data_dir: dir.join(format!("m{i}.raftlock")),
                log: dir.join(format!("m{i}.log")),
                child: None,
                paused: false,
                joins: false,
            })
            .collect();
        let initial_cluster =
            members.iter().map(|m| format!("{}=http://{}:2380", m.name, m.ip)).collect::<Vec<_>>().join(",");
        if let Some(clocks) = &clocks {
            for i in 0..n {
                clocks.set(i, 0)?;
            }
        }
        let mut cluster = Cluster { members, binary: binary.to_path_buf(), initial_cluster, clocks, memory_limit };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
        let mut command = Command::new(&self.binary);
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
            .args(["--listen-peer-urls", &format!("http://{}:2380", m.ip)])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", if m.joins { "existing" } else { "new" }])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            // Keep little of the log in memory, so that every member catching
            // up after a fault is sent entries read back from the WAL.
            .args(["--experimental-log-memory-bytes", &LOG_MEMORY_BYTES.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// kill -9 member `i` (a paused one too).
    pub fn kill(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        m.paused = false;
    }

    /// Member `i`'s process ID, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Whether member `i` was started and has exited since (by itself: a
    /// crash, an abort, or a refusal to start).
    pub fn has_exited(&mut self, i: usize) -> bool {
        matches!(self.members[i].child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    }

    /// Start a killed member again with its data.
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

    /// Start member `i` (stopped, data directory empty) to join the cluster
    /// that added it back.
    pub fn rejoin(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        let _ = std::fs::remove_dir_all(&self.members[i].data_dir);
        self.members[i].joins = true;
        self.spawn(i)
    }

    /// Wait (at most `within`) for member `i` to exit by itself; whether it did.
    pub async fn exited(&mut self, i: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
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

    /// The member ID of member `i`, as raftlock derives it.
    pub fn member_id(&self, i: usize) -> u64 {
        raftlock::config::member_id(&[self.peer_url(i)], TOKEN)
    }

    pub fn peer_url(&self, i: usize) -> String {
        format!("http://{}:2380", self.members[i].ip)
    }

    /// Everything member `i` has logged.
    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }

    pub fn pause(&mut self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.members[i].paused = true;
    }

    pub fn resume(&mut self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.members[i].paused = false;
    }

    fn signal(&self, i: usize, signal: i32) {
        if let Some(child) = &self.members[i].child {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
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
            if self.members[i].paused {
                self.resume(i);
            }
            self.restart(i)?;
        }
        Ok(())
    }

    /// A client of member `i` alone.
    pub async fn client(&self, i: usize) -> anyhow::Result<Client> {
        connect(&[self.members[i].endpoint()]).await
    }

    /// What member `i` says of itself and its leader (within a second).
    pub async fn view(&self, i: usize) -> Option<View> {
        let m = &self.members[i];
        if !m.is_running() || m.paused {
            return None;
        }
        let ask = async {
            let mut c = self.client(i).await.ok()?;
            let s = c.status().await.ok()?;
            Some(View { member_id: s.header()?.member_id(), leader: s.leader(), term: s.raft_term() })
        };
        tokio::time::timeout(Duration::from_secs(1), ask).await.ok().flatten()
    }

    /// The index of the member that leads, as the members that run see it
    /// (a majority of them must agree), if any.
    pub async fn leader(&self) -> Option<usize> {
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

    /// Wait (at most `within`) until every member runs, agrees on one leader
    /// and answers a linearizable read.
    pub async fn wait_healthy(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.healthy().await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!("the cluster was not healthy within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn healthy(&self) -> bool {
        let mut leaders = Vec::new();
        for i in 0..self.len() {
            let Some(v) = self.view(i).await else { return false };
            leaders.push(v.leader);
            let read = async { self.client(i).await.ok()?.get("health-probe", None).await.ok() };
            if tokio::time::timeout(Duration::from_secs(2), read).await.ok().flatten().is_none() {
                return false;
            }
        }
        leaders[0] != 0 && leaders.iter().all(|l| *l == leaders[0])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.len() {
            self.kill(i);
        }
    }
}

/// An etcd client of `endpoints` that notices a dead connection within a
/// few seconds. Requests carry no deadline of their own (a deadline would
/// also cut watch and keepalive streams): callers bound each call.
pub async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
    Ok(Client::connect(endpoints, Some(options)).await?)
}
