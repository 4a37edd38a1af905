//! etcd's Go client, for real: `clientv3` and its `concurrency` recipes
//! (Mutex, Election, STM) and a watch, from Debian's `golang-etcd-server-dev`
//! (etcd 3.4.23's Go source), against a 3-member raftlock cluster. The Go
//! program (`tests/interop/go/clientv3_recipes.go`) is built offline in GOPATH
//! mode from Debian's Go packages; `scripts/test.sh` installs them (`golang-go`,
//! `golang-etcd-server-dev`). Each recipe checks its own outcome and prints
//! "ok"; the election also has the leader killed while a candidate waits.
//!
//! Caveat: Debian's clientv3 is 3.4's, whose Mutex has no TryLock (3.5 added
//! it); raftlock's try-lock is covered by the native API's tests.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::common::Cluster;

/// Where Debian installs Go packages' source (GOPATH layout).
const DEBIAN_GOPATH: &str = "/usr/share/gocode";

/// Build the Go program once per test binary; its path.
fn recipes() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let clientv3 = Path::new(DEBIAN_GOPATH).join("src/go.etcd.io/etcd/clientv3");
        assert!(
            clientv3.is_dir(),
            "{} is missing: run the tests with scripts/test.sh, which installs golang-etcd-server-dev",
            clientv3.display()
        );
        let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let binary = out_dir.join("clientv3_recipes");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg(root.join("tests/interop/go/clientv3_recipes.go"))
            .env("GO111MODULE", "off")
            .env("GOPATH", DEBIAN_GOPATH)
            .env("GOCACHE", out_dir.join("go-cache"))
            .env("GOFLAGS", "")
            .output()
            .expect("running go: run the tests with scripts/test.sh, which installs golang-go");
        assert!(out.status.success(), "go build failed:\n{}", String::from_utf8_lossy(&out.stderr));
        binary
    })
}

/// Run one recipe against every member; its combined output, which must end in "ok".
fn run(recipe: &str, cluster: &Cluster) {
    let out = Command::new(recipes()).args([recipe, &cluster.endpoints().join(",")]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.trim_end().ends_with("ok"), "{recipe} failed:\n{text}");
}

/// Run one recipe against a fresh 3-member cluster.
async fn run_on_a_new_cluster(recipe: &'static str) {
    let cluster = Cluster::start(3).await;
    tokio::task::spawn_blocking(move || run(recipe, &cluster)).await.unwrap();
}

#[tokio::test]
async fn go_mutex_guards_a_shared_counter() {
    run_on_a_new_cluster("mutex").await;
}

#[tokio::test]
async fn go_stm_transfers_conserve_the_total() {
    run_on_a_new_cluster("stm").await;
}

#[tokio::test]
async fn go_watch_sees_changes_in_order_and_replays_them() {
    run_on_a_new_cluster("watch").await;
}

#[tokio::test]
async fn go_election_campaign_observe_resign_with_the_leader_killed() {
    let mut cluster = Cluster::start(3).await;
    let mut child = Command::new(recipes())
        .args(["election", &cluster.endpoints().join(",")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.by_ref().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // a leads and b waits: kill the Raft leader, then let the recipe go on.
    let said = rx.recv_timeout(std::time::Duration::from_secs(60));
    if said.as_deref() != Ok("kill") {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("the election recipe did not get to the kill ({said:?}):\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let leader = cluster.leader().await;
    cluster.kill(leader);
    writeln!(stdin, "killed").unwrap();
    let rest: Vec<String> = rx.iter().collect();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && rest.last().map(String::as_str) == Some("ok"),
        "election failed after the leader was killed: {rest:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A clientv3 Mutex taking `name` once, as a child: its "queued" and
/// "locked" lines, each with when it came.
struct GoLock {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<(String, std::time::Instant)>,
}

impl GoLock {
    fn start(cluster: &Cluster, name: &str) -> GoLock {
        let mut child = Command::new(recipes())
            .args(["lock-once", &cluster.endpoints().join(","), name])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send((line, std::time::Instant::now()));
            }
        });
        GoLock { child, lines }
    }

    /// When line `what` came (within 60 s).
    fn said(&mut self, what: &str) -> std::time::Instant {
        match self.lines.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok((line, at)) if line == what => at,
            other => {
                let _ = self.child.kill();
                let mut err = String::new();
                std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("expected {what:?}, got {other:?}:\n{err}");
            }
        }
    }
}

/// Lock-delay and clientv3's Mutex (client-side: it compares create
/// revisions): one that queues after a delayed native grant ended
/// involuntarily sees the delay's marker ahead of it and waits for it to
/// go; one that was already queued when the grant ended does not, and
/// takes the lock at once. As docs/native-locks.md says.
#[tokio::test(flavor = "multi_thread")]
async fn go_mutex_honours_a_lock_delay_only_if_it_queued_after_the_end() {
    use raftlock::client::{Acquisition, Client, LockOptions};
    use std::time::{Duration, Instant};
    const DELAY: Duration = Duration::from_millis(3000);
    let cluster = Cluster::start(3).await;
    let native = Client::connect(cluster.endpoints()).await.unwrap();
    let delayed = LockOptions { lock_delay: DELAY, wait: Some(Duration::ZERO), ..Default::default() };
    for queued_before in [true, false] {
        let name = if queued_before { "gd-before" } else { "gd-after" };
        let session = native.session(30).await.unwrap();
        let Acquisition::Held(_guard) = session.lock(name, delayed.clone()).await.unwrap() else { panic!("busy") };
        let mut early = queued_before.then(|| GoLock::start(&cluster, name));
        if let Some(go) = early.as_mut() {
            tokio::task::block_in_place(|| go.said("queued"));
        }
        // The holder's lease is revoked: an involuntary end.
        let ended = Instant::now();
        session.close().await.unwrap();
        let mut go = early.unwrap_or_else(|| GoLock::start(&cluster, name));
        let locked = tokio::task::block_in_place(|| {
            if !queued_before {
                go.said("queued");
            }
            go.said("locked")
        });
        let waited = locked - ended;
        if queued_before {
            assert!(waited < DELAY, "a Mutex queued before the end waited {waited:?}");
        } else {
            assert!(waited >= DELAY, "a Mutex queued after the end locked {waited:?} after it");
        }
        tokio::task::block_in_place(|| {
            go.said("ok");
            assert!(go.child.wait().unwrap().success());
        });
    }
}
