//! etcd's own command-line client against a 3-member raftlock cluster:
//! etcdctl 3.4 (Debian's etcd-client) and 3.5.1 (installed by
//! `scripts/install-etcd.sh`). `scripts/test.sh` installs both.

use std::process::Command;
use std::time::Duration;

use crate::common::Cluster;

use crate::common::{etcdctls, Etcdctl as Ctl};

/// etcdctl's outcome, stdout and stderr.
fn run(ctl: &Ctl, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let out = ctl.run(args, stdin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn etcdctl_34_and_35_work_against_raftlock() {
    let cluster = Cluster::start(3).await;
    let with_scheme = cluster.endpoints().join(",");
    let bare = with_scheme.replace("http://", "");
    for (n, bin) in etcdctls().into_iter().enumerate() {
        // etcdctl 3.4 dials each endpoint of `endpoint status` with the whole
        // URL as HTTP/2 :authority, which raftlock's HTTP/2 stack refuses as
        // malformed (see README); 3.4 is used with host:port, 3.5 with URLs.
        let endpoints = if n == 0 { bare.clone() } else { with_scheme.clone() };
        let ctl = Ctl { bin, endpoints };
        let p = format!("ctl{n}/");
        assert_eq!(ctl.ok(&["put", &format!("{p}a"), "1"]).trim(), "OK");
        assert_eq!(ctl.ok(&["put", &format!("{p}b"), "2"]).trim(), "OK");
        assert_eq!(ctl.ok(&["get", &format!("{p}a")]), format!("{p}a\n1\n"));
        assert_eq!(ctl.ok(&["get", &p, "--prefix", "--keys-only"]).split_whitespace().count(), 2);
        let json = ctl.ok(&["get", &format!("{p}a"), "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["count"], 1);
        let rev = v["header"]["revision"].as_i64().unwrap();
        assert!(v["header"]["cluster_id"].as_u64().unwrap() != 0);

        // txn, interactive syntax on stdin.
        let txn = format!("value(\"{p}a\") = \"1\"\n\nput {p}c 3\nput {p}d 4\n\nput {p}failed 0\n\n");
        let (ok, out, err) = run(&ctl, &["txn"], Some(&txn));
        assert!(ok, "txn: {out}{err}");
        assert!(out.starts_with("SUCCESS"), "txn output: {out}");
        assert_eq!(ctl.ok(&["get", &format!("{p}d"), "--print-value-only"]).trim(), "4");

        assert_eq!(ctl.ok(&["del", &p, "--prefix"]).trim(), "4");
        assert!(ctl.ok(&["compact", &rev.to_string()]).contains(&format!("compacted revision {rev}")));
        let (ok, _, err) = run(&ctl, &["get", &format!("{p}a"), &format!("--rev={}", rev - 1)], None);
        assert!(!ok && err.contains("required revision has been compacted"), "{err}");

        let members = ctl.ok(&["member", "list"]);
        assert_eq!(members.lines().count(), 3, "{members}");
        for m in &cluster.members {
            assert!(members.contains(&format!("http://127.0.0.1:{}", m.peer_port)), "{members}");
        }
        let status = ctl.ok(&["endpoint", "status", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&status).unwrap();
        let leaders: Vec<u64> = v.as_array().unwrap().iter().map(|s| s["Status"]["leader"].as_u64().unwrap()).collect();
        assert_eq!(leaders.len(), 3);
        assert!(leaders.iter().all(|l| *l == leaders[0] && *l != 0), "{status}");
        let health = run(&ctl, &["endpoint", "health"], None);
        assert!(health.0, "{health:?}");
        assert_eq!(format!("{}{}", health.1, health.2).matches("is healthy").count(), 3, "{health:?}");
    }
}

/// etcdctl's `lock` and `elect` are clientv3's `concurrency` Mutex and
/// Election: this is the Go client recipe, run against raftlock, and seen by
/// the native API.
#[tokio::test]
async fn etcdctl_lock_and_elect_work_against_raftlock() {
    let cluster = Cluster::start(3).await;
    let with_scheme = cluster.endpoints().join(",");
    let bare = with_scheme.replace("http://", "");
    let kv = cluster.client(0).await;
    for (n, bin) in etcdctls().iter().enumerate() {
        let endpoints = if n == 0 { bare.clone() } else { with_scheme.clone() };
        let name = format!("ctl-lock-{n}");
        // Three `etcdctl lock NAME -- CMD` at once: the commands never overlap.
        let script = r#"echo "$ETCD_LOCK_KEY start $(date +%s%N)"; sleep 0.3; echo "end $(date +%s%N)""#;
        let holders: Vec<_> = (0..3)
            .map(|_| {
                Command::new(bin)
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={endpoints}"))
                    .args(["lock", &name, "--", "sh", "-c", script])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // While they queue, the native API sees an etcdctl holder and waiters.
        let native = raftlock::client::Client::connect([cluster.members[1].endpoint()]).await.unwrap();
        let req = raftlock::proto::raftlock::v1::DescribeRequest {
            name: name.clone().into_bytes(),
            permits: 1,
            ..Default::default()
        };
        let mut seen_holder = false;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let d = native.locks().describe(req.clone()).await.unwrap().into_inner();
            if d.holders.len() == 1 {
                seen_holder = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(seen_holder, "the native API does not see etcdctl's lock");
        let mut spans = Vec::new();
        for h in holders {
            let out = h.wait_with_output().unwrap();
            assert!(out.status.success());
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let words: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(words.len(), 5, "{text}");
            assert!(words[0].starts_with(&format!("{name}/")), "ETCD_LOCK_KEY: {text}");
            spans.push((words[2].parse::<u128>().unwrap(), words[4].parse::<u128>().unwrap()));
        }
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "two etcdctl lock holders at once: {spans:?}");

        // `etcdctl elect`: the first candidate leads; when it quits (SIGINT,
        // it resigns) the second takes over.
        let election = format!("ctl-elect-{n}");
        let candidate = |proposal: &str| {
            Command::new(bin)
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={endpoints}"))
                .args(["elect", &election, proposal])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let leader_value = || {
            let election = election.clone();
            let mut kv = kv.clone();
            async move { kv.leader(election).await.ok().and_then(|r| r.kv().map(|kv| kv.value().to_vec())) }
        };
        let mut first = candidate("alpha");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while leader_value().await.as_deref() != Some(b"alpha") {
            assert!(std::time::Instant::now() < deadline, "etcdctl elect alpha never led");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut second = candidate("beta");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(leader_value().await.as_deref(), Some(&b"alpha"[..]), "beta waits while alpha leads");
        unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
        first.wait().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while leader_value().await.as_deref() != Some(b"beta") {
            assert!(std::time::Instant::now() < deadline, "beta never took over");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        second.kill().unwrap();
        second.wait().unwrap();
    }
}
