//! raftlock's test toolkit, shared by the integration tests (`tests/`) and
//! the fault and hostile suites (`faults/`): the one harness that runs a
//! cluster of real `raftlock` processes ([`cluster`]), certificates made in
//! the test ([`certs`]), etcd's recorded answers ([`golden`]), the
//! command-line tools the tests drive ([`tools`]), small client helpers, and
//! the in-process tier ([`inprocess`]): members inside the test's own
//! process, for protocol tests that need no process fault.
//!
//! Caveat: the harness runs the binaries cargo built (found beside the
//! running test binary, [`cluster::built_binary`]) or the one it is given;
//! it builds nothing.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

pub mod builder;
pub mod certs;
pub mod clocks;
pub mod cluster;
pub mod golden;
pub mod inprocess;
pub mod tools;

pub use cluster::{Addressing, Clocks, Cluster, Member, View};
pub use tools::{etcd_dir, etcdctls, raftlockctl, text, Etcdctl};

/// Raft timing of the tests' clusters: fast failover, still well above
/// loopback round trips.
pub const HEARTBEAT_MS: u64 = 50;
pub const ELECTION_MS: u64 = 500;

/// A port for a member to listen on. Not the OS's "any free port": it may
/// hand out the same port twice in a row (before the first member has bound
/// it), and an ephemeral port can be taken by an outgoing connection meanwhile.
/// Instead each test process walks its own sequence below the kernel's
/// ephemeral range (32768 and up), so no port is given twice in a process and
/// no connection takes one; a port that is busy now is skipped (a socket
/// bound but not yet listening, as a starting member's is, does not show as
/// busy: `Builder::spawn` checks again and chooses anew). Test
/// processes that run at once (two `cargo test` runs, or a test binary and
/// the fault suite's tools) could still pick one port between the check and
/// the member's bind, so each port handed out is also claimed machine-wide
/// for the life of the process: an exclusive lock on a file named after it
/// ([`PORT_CLAIMS`]), which the kernel drops when the process ends, however
/// it ends.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    // Where this process's walk starts: random, not derived from the
    // process ID alone, which processes in separate PID namespaces (CI jobs
    // in containers sharing a network) may have in common.
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        (hasher.finish() % u64::from(SPAN)) as u32
    });
    loop {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if claim(port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Where test processes claim the ports they hand out (see [`free_port`]).
pub const PORT_CLAIMS: &str = "/tmp/raftlock-test-ports";

/// Claim `port` for this process (false: another process holds it). The
/// claim is an flock on `PORT_CLAIMS/<port>`, its file kept open until the
/// process ends.
fn claim(port: u16) -> bool {
    use std::os::fd::AsRawFd;
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let _ = std::fs::create_dir_all(PORT_CLAIMS);
    let Ok(file) =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(format!("{PORT_CLAIMS}/{port}"))
    else {
        // No place to claim in: the in-process sequence alone, as before.
        return true;
    };
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false;
    }
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
    true
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
