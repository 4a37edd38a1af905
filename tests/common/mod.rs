//! Test harness: a real cluster of `raftlock` processes on loopback.
//!
//! Each member is a separate OS process started from the binary cargo built,
//! with its own client and peer port and data directory, so that kill -9,
//! SIGSTOP and restarts are the real thing. Clients are the independent
//! `etcd-client` crate. Ports come from a per-process sequence below the
//! ephemeral range (see [`free_port`]), so clusters of concurrently running
//! tests do not collide.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use etcd_client::Client;

pub mod certs;
pub mod golden;
mod tools;
#[allow(unused_imports)] // each test binary uses some of them
pub use tools::{etcd_dir, etcdctls, raftlockctl, text, Etcdctl};

/// Raft timing used by the tests: fast failover, still well above loopback RTT.
pub const HEARTBEAT_MS: u64 = 50;
pub const ELECTION_MS: u64 = 500;

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    /// Set for a member that joins a running cluster: its `--initial-cluster`
    /// (and it starts with `--initial-cluster-state existing`).
    joins: Option<String>,
    /// "http", or "https" on both ports.
    scheme: &'static str,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.peer_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

pub struct Cluster {
    pub members: Vec<Member>,
    initial_cluster: String,
    /// Flags every member gets on top of the cluster's own.
    extra_args: Vec<String>,
    /// Kept (and printed) when a test fails, for the post-mortem.
    dir: Option<tempfile::TempDir>,
    /// How the harness's clients connect (TLS for an https cluster).
    connect: Option<etcd_client::ConnectOptions>,
    scheme: &'static str,
    /// Environment variables every member is started with.
    pub env: Vec<(String, String)>,
}

/// A port for a member to listen on. Not the OS's "any free port": it may
/// hand out the same port twice in a row (before the first member has bound
/// it), and an ephemeral port can be taken by an outgoing connection meanwhile.
/// Instead each test process walks its own sequence below the kernel's
/// ephemeral range (32768 and up), so no port is given twice in a process and
/// no connection takes one; a port that is busy now is skipped.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl Cluster {
    /// Start `n` members and wait until the cluster has a leader and serves.
    pub async fn start(n: usize) -> Cluster {
        Self::start_with(n, &[]).await
    }

    /// As [`Cluster::start`], with extra flags for every member.
    pub async fn start_with(n: usize, extra_args: &[&str]) -> Cluster {
        Self::start_in(tempfile::tempdir().unwrap(), n, extra_args, "http", None).await
    }

    /// As [`Cluster::start`], with mTLS on both ports of every member
    /// (certificates from `certs`); the harness connects as `alice`.
    pub async fn start_tls(dir: tempfile::TempDir, n: usize, certs: &certs::Certs, extra_args: &[&str]) -> Cluster {
        let mut args = certs.member_flags();
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_in(dir, n, &args, "https", Some(certs.client_options(&certs.alice))).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        n: usize,
        extra_args: &[&str],
        scheme: &'static str,
        connect: Option<etcd_client::ConnectOptions>,
    ) -> Cluster {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let name = format!("m{i}");
                Member {
                    data_dir: dir.path().join(format!("{name}.raftlock")),
                    log: dir.path().join(format!("{name}.log")),
                    name,
                    client_port: free_port(),
                    peer_port: free_port(),
                    child: None,
                    joins: None,
                    scheme,
                }
            })
            .collect();
        let initial_cluster =
            members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",");
        let extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        let mut cluster =
            Cluster { members, initial_cluster, extra_args, dir: Some(dir), connect, scheme, env: Vec::new() };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster.wait_ready().await;
        cluster
    }

    /// `n` members with their ports and data directories chosen, none
    /// started: for a test that prepares their data directories first.
    pub fn unstarted(n: usize) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster {
            members: Vec::new(),
            initial_cluster: String::new(),
            extra_args: Vec::new(),
            dir: Some(dir),
            connect: None,
            scheme: "http",
            env: Vec::new(),
        };
        for _ in 0..n {
            cluster.new_member();
        }
        cluster.initial_cluster =
            cluster.members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",");
        cluster
    }

    /// Flags every member of an [`Cluster::unstarted`] cluster gets.
    pub fn add_args(&mut self, args: &[&str]) {
        self.extra_args.extend(args.iter().map(|a| a.to_string()));
    }

    /// Start every member of an [`Cluster::unstarted`] cluster.
    pub async fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.spawn(i);
        }
        self.wait_ready().await;
    }

    /// A member that is not started yet (ports and data directory chosen);
    /// returns its index. Add it to the cluster, then [`Cluster::join`] it.
    pub fn new_member(&mut self) -> usize {
        let dir = self.dir.as_ref().unwrap().path().to_path_buf();
        let name = format!("m{}", self.members.len());
        self.members.push(Member {
            data_dir: dir.join(format!("{name}.raftlock")),
            log: dir.join(format!("{name}.log")),
            name,
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
            joins: None,
            scheme: self.scheme,
        });
        self.members.len() - 1
    }

    /// Start member `i` with `--initial-cluster-state existing`: it joins the
    /// running cluster that added it.
    pub fn join(&mut self, i: usize, initial_cluster: &str) {
        self.members[i].joins = Some(initial_cluster.to_string());
        self.spawn(i);
    }

    pub fn peer_url(&self, i: usize) -> String {
        self.members[i].peer_url()
    }

    /// The `--initial-cluster` the members started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    fn spawn(&mut self, i: usize) {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log).unwrap();
        let (initial_cluster, state) = match &m.joins {
            Some(c) => (c.as_str(), "existing"),
            None => (self.initial_cluster.as_str(), "new"),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_raftlock"))
            .args(["--name", &m.name])
            .args(["--data-dir", m.data_dir.to_str().unwrap()])
            .args(["--listen-client-urls", &m.endpoint()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start raftlock");
        m.child = Some(child);
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// A client talking to member `i` only.
    pub async fn client(&self, i: usize) -> Client {
        Client::connect([self.members[i].endpoint()], self.connect.clone()).await.expect("connect")
    }

    /// From now on the harness's clients log in as `user` (auth is on).
    pub fn log_in_as(&mut self, user: &str, password: &str) {
        self.connect = Some(self.connect.clone().unwrap_or_default().with_user(user, password));
    }

    /// Wait until every running member reports the same leader and answers a
    /// linearizable read.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.try_ready().await {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not ready in 30 s; logs:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_ready(&self) -> bool {
        let mut leaders = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let Ok(Ok(mut c)) =
                tokio::time::timeout(Duration::from_secs(1), Client::connect([m.endpoint()], self.connect.clone()))
                    .await
            else {
                return false;
            };
            match tokio::time::timeout(Duration::from_secs(2), c.status()).await {
                Ok(Ok(s)) if s.leader() != 0 => leaders.push(s.leader()),
                _ => return false,
            }
            if !matches!(tokio::time::timeout(Duration::from_secs(2), c.get("ready-probe", None)).await, Ok(Ok(_))) {
                return false;
            }
            let _ = i;
        }
        !leaders.is_empty() && leaders.iter().all(|l| *l == leaders[0])
    }

    /// The index of the current leader (waits for one).
    pub async fn leader(&self) -> usize {
        self.wait_ready().await;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let mut c = self.client(i).await;
            let s = c.status().await.unwrap();
            if s.leader() == s.header().unwrap().member_id() {
                return i;
            }
        }
        panic!("no member is the leader");
    }

    /// A member that is not the leader.
    pub async fn follower(&self) -> usize {
        let leader = self.leader().await;
        (0..self.members.len()).find(|&i| i != leader && self.members[i].child.is_some()).unwrap()
    }

    /// kill -9.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGSTOP: the member's process is frozen (its sockets stay open).
    pub fn pause(&self, i: usize) {
        let pid = self.members[i].pid().expect("running") as i32;
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, i: usize) {
        let pid = self.members[i].pid().expect("running") as i32;
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }

    /// Start a stopped member again with the same flags and data.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(i);
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

    /// SIGTERM, and wait for a clean exit; returns the exit status.
    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        let mut c = self.members[i].child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }

    /// Everything member `i` has logged (all its runs).
    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }

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
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("test failed: cluster data and logs kept in {}", dir.keep().display());
            }
        }
    }
}

impl Cluster {
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

/// Wait (linearizable reads, 10 s at most) until `key` exists: for a test to
/// know that a waiter has queued before it goes on.
pub async fn wait_for_key(c: &mut Client, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.get(key, None).await.map_or(true, |r| r.kvs().is_empty()) {
        assert!(Instant::now() < deadline, "{key} never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The gRPC code and message of a failed etcd-client call.
pub fn grpc_error(e: etcd_client::Error) -> (tonic::Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

/// A plain HTTP/1.1 GET; the status code and the body.
pub async fn http_get(endpoint: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint.trim_start_matches("http://");
    // (A member just restarted may not listen yet.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => panic!("connecting to {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("answer: {answer}"));
    assert!(!head.to_ascii_lowercase().contains("chunked"), "a whole body: {head}");
    (status, body.to_string())
}

/// The value of the unlabelled metric `name` in a member's `/metrics`
/// (0 if it has no sample yet).
pub async fn metric(endpoint: &str, name: &str) -> f64 {
    let (status, text) = http_get(endpoint, "/metrics").await;
    assert_eq!(status, 200, "/metrics: {text}");
    let sample = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' '));
    sample.map_or(0.0, |v| v.parse().unwrap_or_else(|_| panic!("{name}: {v}")))
}
