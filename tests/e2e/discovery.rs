//! etcd's DNS discovery (`--discovery-srv`) and host-name peer URLs, for
//! real: dnsmasq (Debian's `dnsmasq-base`, which scripts/test.sh installs)
//! on 127.0.0.61:53 serves the SRV and A records of members on
//! 127.0.0.31-34, and each member runs in a mount namespace of its own whose
//! `/etc/resolv.conf` names that server (`unshare`; needs root, as CI runs).
//! Three members bootstrap from the records alone and name each other by
//! host; one is lost and a replacement joins by host name; a member the
//! records do not name is refused with etcd's kind of error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

const DNS: &str = "127.0.0.61";
const DOMAIN: &str = "raftlock.test";

/// Processes killed when the test ends, however it ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn member_ip(i: usize) -> String {
    format!("127.0.0.{}", 30 + i)
}

fn host(i: usize) -> String {
    format!("m{i}.{DOMAIN}")
}

/// dnsmasq serving `_etcd-server._tcp.raftlock.test` and
/// `_etcd-client._tcp.raftlock.test` for members 1-3 and the addresses of
/// members 1-4.
fn dnsmasq(dir: &Path) -> Child {
    let mut args = vec![
        "--keep-in-foreground".to_string(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        format!("--listen-address={DNS}"),
        "--bind-interfaces".into(),
        "--port=53".into(),
        format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
        format!("--log-facility={}", dir.join("dnsmasq.log").display()),
    ];
    for i in 1..=3 {
        args.push(format!("--srv-host=_etcd-server._tcp.{DOMAIN},{},2380", host(i)));
        args.push(format!("--srv-host=_etcd-client._tcp.{DOMAIN},{},2379", host(i)));
    }
    for i in 1..=4 {
        args.push(format!("--host-record={},{}", host(i), member_ip(i)));
    }
    Command::new("dnsmasq")
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("running dnsmasq: scripts/test.sh installs it (Debian's dnsmasq-base)")
}

/// `binary` in a mount namespace whose /etc/resolv.conf is `resolv`.
fn with_dns(resolv: &Path, binary: &str) -> Command {
    let mut command = Command::new("unshare");
    command.args(["--mount", "--", "sh", "-c", r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#]);
    command.arg(resolv).arg(binary);
    command
}

/// `raftlock` member `i` (`args` after its addresses), with the test's DNS.
fn member(dir: &Path, resolv: &Path, i: usize, args: &[String]) -> Child {
    let ip = member_ip(i);
    let log = std::fs::File::create(dir.join(format!("m{i}.log"))).unwrap();
    with_dns(resolv, env!("CARGO_BIN_EXE_raftlock"))
        .args(["--name", &format!("m{i}")])
        .arg("--data-dir")
        .arg(dir.join(format!("m{i}.raftlock")))
        .args(["--listen-client-urls", &format!("http://{ip}:2379")])
        .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
        .args(["--initial-advertise-peer-urls", &format!("http://{}:2380", host(i))])
        .args(["--initial-cluster-token", "discovery-test"])
        .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("running unshare")
}

async fn put_eventually(ip: &str, key: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut c) = Client::connect([format!("{ip}:2379")], None).await {
            if c.put(key, "v", None).await.is_ok() {
                return c;
            }
        }
        assert!(Instant::now() < deadline, "member {ip} never served a write");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn members_bootstrap_from_dns_srv_records_and_a_replacement_joins_by_name() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "DNS on port 53 and mount namespaces need root (CI runs as root)");
    let dir = tempfile::tempdir().unwrap();
    let dir: PathBuf = dir.path().to_path_buf();
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {DNS}\n")).unwrap();
    let mut processes = Processes(vec![dnsmasq(&dir)]);
    std::thread::sleep(Duration::from_millis(300));

    // A member the records do not name is refused.
    let discovery = vec!["--discovery-srv".to_string(), DOMAIN.to_string()];
    let out = member(&dir, &resolv, 4, &discovery).wait_with_output().unwrap();
    assert!(!out.status.success());
    let log = std::fs::read_to_string(dir.join("m4.log")).unwrap();
    assert!(log.contains("cannot find this member (m4, http://m4.raftlock.test:2380)"), "{log}");
    std::fs::remove_dir_all(dir.join("m4.raftlock")).ok();

    // Three members from the SRV records alone.
    for i in 1..=3 {
        processes.0.push(member(&dir, &resolv, i, &discovery));
    }
    let mut c = put_eventually(&member_ip(1), "discovery/a").await;
    let list = c.member_list().await.unwrap();
    let mut peers: Vec<String> = list.members().iter().flat_map(|m| m.peer_urls().to_vec()).collect();
    peers.sort();
    assert_eq!(peers, (1..=3).map(|i| format!("http://{}:2380", host(i))).collect::<Vec<_>>());
    // Once each has published its name, the names are the members' own.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut names: Vec<String> =
            c.member_list().await.unwrap().members().iter().map(|m| m.name().to_string()).collect();
        names.sort();
        if names == ["m1", "m2", "m3"] {
            break;
        }
        assert!(Instant::now() < deadline, "member names: {names:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // raftlockctl finds the members in the client SRV records.
    let out = with_dns(&resolv, env!("CARGO_BIN_EXE_raftlockctl"))
        .args(["--discovery-srv", DOMAIN, "get", "discovery/a"])
        .output()
        .unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("discovery/a"), "{out:?}");

    // m3 is lost for good; m4 replaces it, added and joining by host name.
    let m3 = processes.0.remove(3);
    drop(Processes(vec![m3]));
    let id3 = c.member_list().await.unwrap().members().iter().find(|m| m.name() == "m3").unwrap().id();
    c.member_remove(id3).await.unwrap();
    let url4 = format!("http://{}:2380", host(4));
    c.member_add([url4.clone()], None).await.unwrap();
    let initial = format!("m1=http://{}:2380,m2=http://{}:2380,m4={url4}", host(1), host(2));
    let join = vec!["--initial-cluster".to_string(), initial, "--initial-cluster-state".into(), "existing".into()];
    processes.0.push(member(&dir, &resolv, 4, &join));
    let mut c4 = put_eventually(&member_ip(4), "discovery/b").await;
    let got = c4.get("discovery/", Some(GetOptions::new().with_prefix())).await.unwrap();
    let keys: Vec<&str> = got.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(keys, ["discovery/a", "discovery/b"]);
}
