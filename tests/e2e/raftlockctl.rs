//! `raftlockctl` as people and scripts use it, against a real 3-member
//! cluster: `lock NAME -- CMD` (environment, exit code, release on exit and on
//! signals), try-lock's exit code, describe/list, the key-value, lease, member
//! and endpoint commands, human and JSON output.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::Cluster;
use serde_json::Value;

fn ctl(endpoints: &str, args: &[&str]) -> Output {
    crate::common::raftlockctl().env("RAFTLOCK_ENDPOINTS", endpoints).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ok(endpoints: &str, args: &[&str]) -> String {
    let o = ctl(endpoints, args);
    assert!(o.status.success(), "raftlockctl {args:?}: {}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    stdout(&o)
}

fn json(endpoints: &str, args: &[&str]) -> Value {
    let mut all = vec!["-w", "json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(endpoints, &all)).unwrap()
}

/// Wait until lock `name` has `n` holders.
fn wait_holders(endpoints: &str, name: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = json(endpoints, &["describe", name]);
        if d["holders"].as_array().unwrap().len() == n {
            return d;
        }
        assert!(Instant::now() < deadline, "lock {name} never had {n} holders: {d}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn lock_runs_a_command_holding_the_lock_and_releases_it() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();

    // The command sees its key and token, and raftlockctl exits with its code.
    let script = r#"echo "$RAFTLOCK_LOCK_NAME $RAFTLOCK_LOCK_KEY $RAFTLOCK_FENCING_TOKEN $RAFTLOCK_LEASE_ID"; exit 7"#;
    let o = ctl(e, &["lock", "deploy", "--", "sh", "-c", script]);
    assert_eq!(o.status.code(), Some(7));
    let out = stdout(&o);
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{out}");
    assert_eq!(fields[0], "deploy");
    assert_eq!(fields[1], format!("deploy/{}", fields[3]));
    assert!(fields[2].parse::<i64>().unwrap() > 0);
    // Released and its lease revoked on exit.
    let d = json(e, &["describe", "deploy"]);
    assert!(d["holders"].as_array().unwrap().is_empty(), "{d}");
    let o = ctl(e, &["lease", "ttl", fields[3]]);
    assert!(stdout(&o).contains("already expired"), "{}", stdout(&o));

    // While one holds it, a try fails at once with exit code 75 and names the holder.
    let mut holder = crate::common::raftlockctl()
        .env("RAFTLOCK_ENDPOINTS", e)
        .args(["lock", "deploy", "--metadata", "release-42", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    let d = wait_holders(e, "deploy", 1);
    assert_eq!(d["holders"][0]["metadata"], "release-42");
    let o = ctl(e, &["lock", "deploy", "--try"]);
    assert_eq!(o.status.code(), Some(75));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lock deploy is held by deploy/") && err.contains("release-42"), "{err}");
    let started = Instant::now();
    let o = ctl(e, &["-w", "json", "lock", "deploy", "--wait", "300ms"]);
    assert_eq!(o.status.code(), Some(75));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((v["acquired"].as_bool(), v["holders"][0]["metadata"].as_str()), (Some(false), Some("release-42")));
    let list = json(e, &["list", "dep"]);
    assert_eq!(list["locks"][0]["name"], "deploy");
    assert_eq!(list["locks"][0]["waiters"], 0, "the failed attempts left no key: {list}");

    // SIGTERM to raftlockctl reaches the command; the lock is released and
    // raftlockctl exits with the command's status (killed by SIGTERM).
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let d = json(e, &["describe", "deploy"]);
    assert!(d["holders"].as_array().unwrap().is_empty(), "{d}");
    let o = ctl(e, &["lock", "deploy", "--try", "--", "true"]);
    assert_eq!(o.status.code(), Some(0));
}

#[tokio::test]
async fn lock_takes_several_names_together_and_validate_tells_current_grants() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();

    // A multi-lock: every name held while the command runs, one token for all.
    let script = r#"printf '%s|%s|%s' "$RAFTLOCK_LOCK_NAME" "$RAFTLOCK_LOCK_KEY" "$RAFTLOCK_FENCING_TOKEN""#;
    let o = ctl(e, &["lock", "db", "cache", "--", "sh", "-c", script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    let fields: Vec<&str> = out.split('|').collect();
    assert_eq!(fields[0], "db cache", "{out}");
    let keys: Vec<&str> = fields[1].lines().collect();
    assert!(keys[0].starts_with("db/") && keys[1].starts_with("cache/"), "{out}");
    let token: i64 = fields[2].parse().unwrap();
    assert!(token > 0);
    // Released on exit: the grant is no longer current (exit 1), and a
    // second multi-lock takes both at once.
    let o = ctl(e, &["validate", keys[0], "--token", &token.to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("no longer exists"), "{}", stdout(&o));

    // While one name of the set is held, a try fails with 75 naming it.
    let mut holder = crate::common::raftlockctl()
        .env("RAFTLOCK_ENDPOINTS", e)
        .args(["lock", "cache", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    let d = wait_holders(e, "cache", 1);
    let key = d["holders"][0]["key"].as_str().unwrap().to_string();
    let token = d["holders"][0]["token"].as_i64().unwrap().to_string();
    let o = ctl(e, &["lock", "db", "cache", "--try"]);
    assert_eq!(o.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lock cache is held by cache/"));
    assert!(json(e, &["describe", "db"])["holders"].as_array().unwrap().is_empty(), "db was given back");
    // The holder's grant is current (exit 0), with its lease's TTL.
    let v = json(e, &["validate", &key, "--token", &token]);
    assert_eq!(v["current"], true, "{v}");
    assert!(v["ttl"].as_i64().unwrap() > 0, "{v}");
    let o = ctl(e, &["validate", &key, "--token", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("later grant"), "{}", stdout(&o));
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    holder.wait().unwrap();

    // A queue longer than the server's page of 1,000 waiters: describe asks
    // for every page, or shows the first --limit waiters.
    let mut kv = cluster.client(0).await;
    for start in (0..1_205).step_by(100) {
        let puts: Vec<etcd_client::TxnOp> = (start..(start + 100).min(1_205))
            .map(|i| etcd_client::TxnOp::put(format!("long/{i:05x}"), "w", None))
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(puts)).await.unwrap();
    }
    let d = json(e, &["describe", "long"]);
    assert_eq!(d["holders"][0]["key"], "long/00000");
    let waiters = d["waiters"].as_array().unwrap();
    let keys: Vec<&str> = waiters.iter().map(|w| w["key"].as_str().unwrap()).collect();
    let want: Vec<String> = (1..1_205).map(|i| format!("long/{i:05x}")).collect();
    assert_eq!(keys, want);
    let d = json(e, &["describe", "long", "--limit", "5"]);
    assert_eq!(d["waiters"].as_array().unwrap().len(), 5);

    // More locks than the server's page of 1,000: list asks for every page,
    // or shows the first --limit locks. One lease owns a key in each.
    let lease = kv.lease_grant(60, None).await.unwrap().id();
    for start in (0..1_205).step_by(100) {
        let puts: Vec<etcd_client::TxnOp> = (start..(start + 100).min(1_205))
            .map(|i| {
                let owner = format!("many/{i:05}/{lease:x}");
                etcd_client::TxnOp::put(owner, "w", Some(etcd_client::PutOptions::new().with_lease(lease)))
            })
            .collect();
        kv.txn(etcd_client::Txn::new().and_then(puts)).await.unwrap();
    }
    let l = json(e, &["list", "many/"]);
    let names: Vec<&str> = l["locks"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..1_205).map(|i| format!("many/{i:05}")).collect();
    assert_eq!(names, want);
    let l = json(e, &["list", "many/", "--limit", "5"]);
    assert_eq!(l["locks"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn key_value_lease_member_and_endpoint_commands() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();

    assert_eq!(ok(e, &["put", "app/a", "1"]).trim(), "OK");
    let written = json(e, &["put", "app/b", "2"])["revision"].as_i64().unwrap();
    assert_eq!(ok(e, &["get", "app/a"]), "app/a\n1\n");
    assert_eq!(ok(e, &["get", "", "--prefix", "--keys-only"]), "app/a\napp/b\n");
    let v = json(e, &["get", "app/", "--prefix"]);
    assert_eq!(v["count"], 2);
    assert_eq!(v["kvs"][1]["value"], "2");

    // A watch started before a change prints it.
    let mut watch = crate::common::raftlockctl()
        .env("RAFTLOCK_ENDPOINTS", e)
        // From just after the puts above, which the member it reaches may not
        // have applied yet.
        .args(["-w", "json", "watch", "app/", "--prefix", "--rev", &(written + 1).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lease = json(e, &["lease", "grant", "30"]);
    let id = lease["id"].as_str().unwrap().to_string();
    assert_eq!(lease["ttl"], 30);
    ok(e, &["put", "app/c", "3", "--lease", &id]);
    let ttl = ok(e, &["lease", "ttl", &id, "--keys"]);
    assert!(ttl.contains("granted with TTL(30s)") && ttl.contains("app/c"), "{ttl}");
    assert!(ok(e, &["lease", "list"]).contains(&id));
    assert_eq!(ok(e, &["lease", "revoke", &id]).trim(), format!("lease {id} revoked"));
    assert_eq!(ok(e, &["del", "app/", "--prefix"]).trim(), "2");
    // Read the four events as they come (the member the watch reads from may
    // print them later than the writes were acknowledged), then interrupt it.
    let lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok).take(4) {
            let _ = tx.send(line);
        }
    });
    let events: Vec<Value> = (0..4)
        .map(|_| serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).expect("a watch event")).unwrap())
        .collect();
    unsafe { libc::kill(watch.id() as i32, libc::SIGINT) };
    assert!(watch.wait().unwrap().success());
    let seen: Vec<(&str, &str)> =
        events.iter().map(|e| (e["type"].as_str().unwrap(), e["kv"]["key"].as_str().unwrap())).collect();
    assert_eq!(seen, [("PUT", "app/c"), ("DELETE", "app/c"), ("DELETE", "app/a"), ("DELETE", "app/b")]);

    let members = json(e, &["member", "list"]);
    assert_eq!(members["members"].as_array().unwrap().len(), 3);
    let human = ok(e, &["member", "list"]);
    assert_eq!(human.lines().count(), 3);
    assert!(human.lines().all(|l| l.contains(", started, ")), "{human}");

    let status = ok(e, &["-w", "json", "endpoint", "status"]);
    let statuses: Vec<Value> = status.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(statuses.len(), 3);
    assert_eq!(statuses.iter().filter(|s| s["is_leader"] == true).count(), 1, "{status}");

    // Bad input: a clear error and a failing exit code; the cluster keeps serving.
    let o = ctl(e, &["put", "", "x"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("etcdserver: key is not provided"));
    let o = ctl("127.0.0.1:1", &["get", "x"]);
    assert!(!o.status.success());
    assert_eq!(ok(e, &["get", "app/", "--prefix", "--count-only"]).trim(), "0");
}

#[tokio::test]
async fn lock_stops_the_command_when_the_lease_is_lost_and_reports_a_command_that_cannot_start() {
    let mut cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();

    // A command that does not exist: 127, and the lock is free again.
    let o = ctl(e, &["lock", "job", "--", "/nonexistent/command"]);
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    assert!(json(e, &["describe", "job"])["holders"].as_array().unwrap().is_empty());

    // The whole cluster goes away while the command runs: within the TTL the
    // lock must be considered lost, the command stopped, and the exit code 1.
    let mut holder = crate::common::raftlockctl()
        .env("RAFTLOCK_ENDPOINTS", e)
        .args(["--command-timeout", "1s", "lock", "job", "--ttl", "2", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_holders(e, "job", 1);
    for i in 0..3 {
        cluster.kill(i);
    }
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "raftlockctl kept running its command without the lock");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(1));
    // Lost within the TTL (2 s) of the last renewal, plus the revoke attempt.
    assert!(killed.elapsed() < Duration::from_secs(2 + 1 + 2), "took {:?}", killed.elapsed());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("lock job lost"), "{err}");
}

/// `raftlockctl bench` with both drivers (its own gRPC client and the
/// etcd-client crate, balanced over every member): every request is counted
/// and succeeds, the writes land, and the lock workload's leases are revoked
/// at the end; a workload the etcd-client driver cannot run is refused. A
/// raftlockctl built without that driver (feature `bench-etcd-client` off)
/// refuses it, saying how to build it.
#[tokio::test]
async fn bench_runs_with_both_drivers() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    let base = ["bench", "--clients", "8", "--conns", "2", "--total", "200", "--key-space", "50", "--sequential"];
    let with_etcd_client = cfg!(feature = "bench-etcd-client");
    if !with_etcd_client {
        let o = ctl(e, &["bench", "put", "--driver", "etcd-client", "--total", "10"]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--features bench-etcd-client"), "{o:?}");
    }
    let drivers: &[&str] = if with_etcd_client { &["raftlockctl", "etcd-client"] } else { &["raftlockctl"] };
    for &driver in drivers {
        for workload in ["put", "txn", "get", "lock"] {
            let mut args = base.to_vec();
            args.insert(1, workload);
            args.extend(["--driver", driver, "--lock-names", "3"]);
            let r = json(e, &args);
            assert_eq!(r["driver"], driver, "{r}");
            assert_eq!(r["total"], 200, "{workload} with {driver}: {r}");
            assert_eq!(r["errors"], 0, "{workload} with {driver}: {r}");
            assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0 && r["p99_ms"].as_f64().unwrap() > 0.0, "{r}");
        }
        // Sequential puts and txns wrote every key of the key space.
        assert_eq!(ok(e, &["get", "bench/", "--prefix", "--count-only"]).trim(), "50");
        assert_eq!(ok(e, &["del", "bench/", "--prefix"]).trim(), "50");
        // Each lock client's lease is revoked when the run ends: no lease, no lock key left.
        assert_eq!(ok(e, &["lease", "list"]).trim(), "found 0 leases", "{driver}");
        assert_eq!(ok(e, &["get", "bench-lock/", "--prefix", "--count-only"]).trim(), "0", "{driver}");
    }
    if with_etcd_client {
        let o = ctl(e, &["bench", "native-lock", "--driver", "etcd-client", "--total", "10"]);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stderr).contains("--driver etcd-client runs put"), "{o:?}");
    }
}
