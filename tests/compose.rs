//! The docker-compose cluster, for real: `docker compose up` of the top-level
//! docker-compose.yml (members that name each other by host name, resolved by
//! Docker's DNS from the empty image), clients on the published ports, the
//! leader's container stopped, the leader cut off from the network (the
//! majority elects a new leader and serves; the old leader cannot commit),
//! reconnected under its name, perhaps at another address (it catches up),
//! and `docker compose down -v`.
//!
//! The TLS variant (docker-compose.tls.yml over it, certificates made by
//! scripts/compose-certs.sh): mTLS clients served on every member, writes
//! forwarded over TLS peers, clients without a certificate and plaintext
//! refused, and the members' processes not running as root.
//!
//! Ignored by `cargo test`: it needs Docker and the raftlock image.
//! `scripts/compose-test.sh` builds the image and runs it (CI does).

use raftlock_testkit as common;

use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

const PROJECT: &str = "raftlock-compose-test";
const NETWORK: &str = "raftlock-compose-test_raftlock";
/// Service, published client port, name on the cluster network (its peer
/// URLs' host, resolved by Docker's DNS).
const MEMBERS: [(&str, u16, &str); 3] = [("n1", 12379, "n1"), ("n2", 22379, "n2"), ("n3", 32379, "n3")];

/// `docker compose` (v2) where it exists, else `docker-compose` (v1), for
/// `project` with `files`.
fn compose_for(project: &str, files: &[&str]) -> Command {
    let v2 = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
    let mut c = if v2 {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    } else {
        Command::new("docker-compose")
    };
    c.current_dir(env!("CARGO_MANIFEST_DIR")).args(["-p", project]);
    for f in files {
        c.args(["-f", f]);
    }
    c
}

fn compose() -> Command {
    compose_for(PROJECT, &["docker-compose.yml"])
}

/// The TLS variant: its own project, docker-compose.tls.yml over the cluster.
fn compose_tls() -> Command {
    compose_for("raftlock-compose-tls", &["docker-compose.yml", "docker-compose.tls.yml"])
}

fn run(mut c: Command) -> String {
    let out = c.output().expect("run docker");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{c:?} failed: {text}");
    text
}

fn docker(args: &[&str]) -> String {
    let mut c = Command::new("docker");
    c.args(args);
    run(c)
}

fn container(service: &str) -> String {
    let mut c = compose();
    c.args(["ps", "-q", service]);
    run(c).trim().to_string()
}

/// Take the cluster down (with its volumes) when the test ends, pass or fail.
struct Down(fn() -> Command);

impl Drop for Down {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut logs = (self.0)();
            logs.args(["logs", "--no-color", "--tail", "40"]);
            eprintln!("{}", String::from_utf8_lossy(&logs.output().map(|o| o.stdout).unwrap_or_default()));
        }
        let mut c = (self.0)();
        c.args(["down", "-v", "--remove-orphans"]);
        let _ = c.output();
    }
}

async fn client(port: u16) -> Option<Client> {
    let connect = Client::connect([format!("http://127.0.0.1:{port}")], None);
    tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()
}

/// The member that leads, as the given members see it (waits for agreement).
async fn leader(members: &[(&'static str, u16, &'static str)]) -> (&'static str, u16, &'static str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut seen = Vec::new();
        for &(name, port, ip) in members {
            if let Some(mut c) = client(port).await {
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await {
                    seen.push((s.leader(), s.header().map_or(0, |h| h.member_id()), (name, port, ip)));
                }
            }
        }
        if seen.len() == members.len() && seen[0].0 != 0 && seen.iter().all(|s| s.0 == seen[0].0) {
            if let Some(l) = seen.iter().find(|s| s.0 == s.1) {
                return l.2;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader among {members:?}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Put through `port` until it succeeds.
async fn put_eventually(port: u16, key: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(mut c) = client(port).await {
            if tokio::time::timeout(Duration::from_secs(5), c.put(key, value, None)).await.is_ok_and(|r| r.is_ok()) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "no write through {port} in 30 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// raftlockctl inside a member's container, against that member alone.
fn ctl_in(service: &str, args: &[&str]) -> std::process::Output {
    let id = container(service);
    let mut all = vec!["exec", id.as_str(), "/raftlockctl", "--endpoints", "127.0.0.1:2379", "--command-timeout", "3s"];
    all.extend_from_slice(args);
    Command::new("docker").args(&all).output().unwrap()
}

#[tokio::test]
#[ignore = "needs Docker and the raftlock image: run scripts/compose-test.sh"]
async fn compose_cluster_survives_a_stopped_and_a_partitioned_leader() {
    let mut up = compose();
    up.args(["up", "-d"]);
    let _down = Down(compose);
    run(up);
    let first = leader(&MEMBERS).await;

    // Real clients on the published ports: etcd-client and etcdctl.
    put_eventually(12379, "compose/greeting", "hello").await;
    for (_, port, _) in MEMBERS {
        let mut c = client(port).await.unwrap();
        assert_eq!(c.get("compose/greeting", None).await.unwrap().kvs()[0].value(), b"hello");
    }
    let mut etcdctl = Command::new(common::etcd_dir().join("etcdctl"));
    etcdctl.args(["--endpoints=127.0.0.1:12379,127.0.0.1:22379,127.0.0.1:32379", "member", "list"]);
    let list = run(etcdctl);
    assert_eq!(list.lines().count(), 3, "{list}");
    for name in ["n1", "n2", "n3"] {
        assert!(list.contains(&format!(", {name}, ")), "{list}");
    }

    // The leader's container stops: the other two elect a leader and serve.
    docker(&["stop", &container(first.0)]);
    let rest: Vec<_> = MEMBERS.iter().copied().filter(|m| m.0 != first.0).collect();
    put_eventually(rest[0].1, "compose/after-stop", "1").await;
    let second = leader(&rest).await;
    assert_ne!(second.0, first.0);
    docker(&["start", &container(first.0)]);
    leader(&MEMBERS).await;
    let mut back = client(first.1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while back.get("compose/after-stop", None).await.map_or(true, |r| r.kvs().is_empty()) {
        assert!(Instant::now() < deadline, "the restarted member never caught up");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The leader is cut off from the network: the majority elects a new leader
    // and serves; the old leader cannot commit.
    let cut = leader(&MEMBERS).await;
    docker(&["network", "disconnect", NETWORK, &container(cut.0)]);
    let majority: Vec<_> = MEMBERS.iter().copied().filter(|m| m.0 != cut.0).collect();
    put_eventually(majority[0].1, "compose/during-partition", "majority").await;
    let new_leader = leader(&majority).await;
    assert_ne!(new_leader.0, cut.0);
    let stale = ctl_in(cut.0, &["put", "compose/from-old-leader", "lost"]);
    assert!(!stale.status.success(), "the cut-off leader committed a write: {stale:?}");

    // Reconnected under its name (Docker may give it another address: its
    // peers find it by name again), it rejoins and catches up.
    docker(&["network", "connect", "--alias", cut.2, NETWORK, &container(cut.0)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = ctl_in(cut.0, &["get", "compose/during-partition"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("majority") {
            break;
        }
        assert!(Instant::now() < deadline, "the reconnected member never caught up: {out:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut any = client(majority[0].1).await.unwrap();
    let r = any.get("compose/", Some(GetOptions::new().with_prefix())).await.unwrap();
    let keys: Vec<&str> = r.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["compose/after-stop", "compose/during-partition", "compose/greeting"]);
    let health = ctl_in(cut.0, &["endpoint", "health"]);
    assert!(health.status.success(), "{health:?}");
}

#[tokio::test]
#[ignore = "needs Docker and the raftlock image: run scripts/compose-test.sh"]
async fn compose_tls_cluster_serves_mtls_clients_only_and_runs_unprivileged() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let certs = root.join(".compose-certs");
    run({
        let mut c = Command::new(root.join("scripts/compose-certs.sh"));
        c.arg(&certs);
        c
    });
    let mut up = compose_tls();
    up.args(["up", "-d"]);
    let _down = Down(compose_tls);
    run(up);

    let pem = |f: &str| std::fs::read(certs.join(f)).unwrap();
    let tls = || {
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(pem("ca.pem")))
            .identity(etcd_client::Identity::from_pem(pem("client.pem"), pem("client.key")))
    };
    let connect = |port: u16, options: etcd_client::ConnectOptions| async move {
        let options = options.with_timeout(Duration::from_secs(3)).with_connect_timeout(Duration::from_secs(2));
        Client::connect([format!("https://127.0.0.1:{port}")], Some(options)).await
    };
    // Every member serves an mTLS client, a write through each (forwarded
    // over the TLS peer port when it follows) is read back on the next.
    for (i, &(name, port, _)) in MEMBERS.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let key = format!("tls/{name}");
        loop {
            if let Ok(mut c) = connect(port, etcd_client::ConnectOptions::new().with_tls(tls())).await {
                if c.put(key.as_str(), name, None).await.is_ok() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "no mTLS write through {name} in 60 s");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The next member may not serve yet: a write needs only a quorum
        // (seen in CI: its published port reset the connection).
        let (next_name, next, _) = MEMBERS[(i + 1) % MEMBERS.len()];
        let got = loop {
            if let Ok(mut c) = connect(next, etcd_client::ConnectOptions::new().with_tls(tls())).await {
                if let Ok(got) = c.get(key.as_str(), None).await {
                    break got;
                }
            }
            assert!(Instant::now() < deadline, "no mTLS read through {next_name} in 60 s");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert_eq!(got.kvs()[0].value(), name.as_bytes());
    }
    // Without a client certificate, or in plaintext: refused.
    let ca_only = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem("ca.pem")));
    let refused = match connect(12379, etcd_client::ConnectOptions::new().with_tls(ca_only)).await {
        Err(_) => true,
        Ok(mut c) => c.get("tls/n1", None).await.is_err(),
    };
    assert!(refused, "a client without a certificate was served");
    let plaintext_refused = match client(12379).await {
        None => true,
        Some(mut c) => c.get("tls/n1", None).await.is_err(),
    };
    assert!(plaintext_refused, "plaintext was served on an https port");
    // The members run as the image's unprivileged user.
    for (name, _, _) in MEMBERS {
        let id = {
            let mut c = compose_tls();
            c.args(["ps", "-q", name]);
            run(c).trim().to_string()
        };
        let processes = docker(&["top", &id, "-eo", "pid,uid"]);
        let uids: Vec<&str> = processes.lines().skip(1).filter_map(|l| l.split_whitespace().nth(1)).collect();
        assert!(!uids.is_empty() && uids.iter().all(|uid| *uid == "65532"), "{name}'s processes: {processes}");
    }
}
