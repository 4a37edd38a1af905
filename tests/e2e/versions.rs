//! Versions: every face of a member tells its release and the etcd API
//! level it implements (`raftlock --version`, `raftlockctl version`,
//! `/version`, `Maintenance.Status` as etcdctl shows it, the build-info
//! metrics), and a member refuses a data directory of a newer format,
//! naming both releases, before it reads a byte of it. A cluster is
//! upgraded from release 0.1.0 and downgraded back to it through
//! `raftlockctl downgrade`, whose answers are etcd's.

use std::process::Command;

use crate::common::cluster::built_binary;
use crate::common::{free_port, http_get, raftlockctl, text, Cluster, Etcdctl};
use raftlock::version::{ETCD_API, RAFTLOCK};

#[tokio::test]
async fn every_face_of_a_member_tells_its_release_and_the_etcd_api_level() {
    let cluster = Cluster::start(1).await;
    let endpoint = cluster.members[0].endpoint();

    let (status, body) = http_get(&endpoint, "/version").await;
    assert_eq!(status, 200);
    let version: serde_json::Value = serde_json::from_str(&body).unwrap();
    let expected = serde_json::json!({
        "etcdserver": ETCD_API, "etcdcluster": ETCD_API, "raftlock": RAFTLOCK, "raftlockcluster": RAFTLOCK,
        "raftlockdowngrade": null,
    });
    assert_eq!(version, expected);

    let metrics = http_get(&endpoint, "/metrics").await.1;
    assert!(metrics.contains(&format!("etcd_server_version{{server_version=\"{ETCD_API}\"}} 1")), "{metrics}");
    let build_info = metrics.lines().find(|l| l.starts_with("raftlock_build_info{")).expect("a build-info gauge");
    assert!(build_info.contains(&format!("version=\"{RAFTLOCK}\"")) && build_info.ends_with(" 1"), "{build_info}");

    // etcd's clients read Maintenance.Status.version and gate features on it.
    let out = Etcdctl::v35(&endpoint).run(&["endpoint", "status", "-w", "json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status[0]["Status"]["version"], ETCD_API);

    let server = Command::new(built_binary("raftlock")).arg("--version").output().unwrap();
    let printed = String::from_utf8_lossy(&server.stdout);
    assert!(printed.starts_with(&format!("raftlock {RAFTLOCK}\n")) && printed.contains(ETCD_API), "{printed}");
    let ctl = raftlockctl().arg("version").output().unwrap();
    assert!(ctl.status.success());
    assert_eq!(String::from_utf8_lossy(&ctl.stdout), format!("raftlockctl version: {RAFTLOCK}\nAPI version: 3.5\n"));
}

#[tokio::test]
async fn a_member_refuses_a_data_directory_of_a_newer_format_naming_both_releases() {
    // A member's data, then its format file as a later release left it.
    let mut cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    c.put("kept", "yes", None).await.unwrap();
    let data_dir = cluster.members[0].data_dir.clone();
    cluster.kill(0);
    let format = data_dir.join("format.json");
    let ours: serde_json::Value = serde_json::from_slice(&std::fs::read(&format).unwrap()).unwrap();
    assert_eq!(ours, serde_json::json!({"format": 1, "written_by": RAFTLOCK}));
    let newer = br#"{"format":2,"written_by":"7.3.0"}"#;
    std::fs::write(&format, newer).unwrap();

    let (client, peer) = (free_port(), free_port());
    let out = Command::new(built_binary("raftlock"))
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "it started on a newer format");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("data format 2") && said.contains("7.3.0") && said.contains(RAFTLOCK), "{said}");
    // Nothing of it was touched.
    assert_eq!(std::fs::read(&format).unwrap(), newer);
}

/// Release 0.1.0's `raftlock`, which `scripts/old-release.sh` builds from
/// git (commit 71620aa) and `scripts/test.sh` names in
/// RAFTLOCK_RELEASE_0_1_0.
fn release_0_1_0() -> std::path::PathBuf {
    let dir = std::env::var("RAFTLOCK_RELEASE_0_1_0")
        .expect("RAFTLOCK_RELEASE_0_1_0 is unset: run the tests through scripts/test.sh, which builds release 0.1.0");
    std::path::Path::new(&dir).join("raftlock")
}

/// `/version` of member `i`, once its `raftlockcluster` is `want` (the
/// members ask each other every 5 s).
async fn cluster_version_becomes(cluster: &Cluster, i: usize, want: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, body) = http_get(&cluster.members[i].endpoint(), "/version").await;
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if seen["raftlockcluster"] == want {
            return seen;
        }
        assert!(std::time::Instant::now() < deadline, "member {i}'s /version stayed {body}, not {want}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A grant of lock `name` with a lock-delay of `delay_ms` through member
/// `i`, held: its key, token and lease.
async fn hold_with_delay(cluster: &Cluster, i: usize, name: &str, delay_ms: u32) -> (Vec<u8>, i64, i64) {
    use raftlock::proto::raftlock::v1::{locks_client::LocksClient, AcquireRequest};
    let mut c = cluster.client(i).await;
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let mut locks = LocksClient::connect(cluster.members[i].endpoint()).await.unwrap();
    let req = AcquireRequest { name: name.into(), lease, lock_delay_ms: delay_ms, ..Default::default() };
    let granted = locks.acquire(req).await.unwrap().into_inner();
    assert!(granted.acquired);
    (granted.key, granted.token, lease)
}

/// A native acquire with a lock-delay through member `i`.
async fn acquire_with_delay(cluster: &Cluster, i: usize, name: &str) -> Result<(), tonic::Status> {
    use raftlock::proto::raftlock::v1::{locks_client::LocksClient, AcquireRequest};
    let mut c = cluster.client(i).await;
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let mut locks = LocksClient::connect(cluster.members[i].endpoint()).await.unwrap();
    let req = AcquireRequest { name: name.into(), lease, lock_delay_ms: 500, ..Default::default() };
    let granted = locks.acquire(req).await?.into_inner();
    assert!(granted.acquired);
    // Let it go (its delay, 0.5 s, starts and ends: no marker is left for
    // a member that is then replaced).
    c.lease_revoke(lease).await.unwrap();
    Ok(())
}

/// The leases' TTLs (granted) that Describe through member `i` gives the
/// two holders of a semaphore of two permits, held on leases of 30 and 31 s
/// and then let go. A member of 0.2.0 asks the leader about them in one
/// question, which 0.1.0 does not know; while any member runs 0.1.0 it asks
/// about each lease on its own.
async fn described_ttls(cluster: &Cluster, i: usize, name: &str) -> Vec<i64> {
    use raftlock::proto::raftlock::v1::{locks_client::LocksClient, AcquireRequest, DescribeRequest};
    let mut c = cluster.client(i).await;
    let mut locks = LocksClient::connect(cluster.members[i].endpoint()).await.unwrap();
    let mut leases = Vec::new();
    for ttl in [30, 31] {
        let lease = c.lease_grant(ttl, None).await.unwrap().id();
        let req = AcquireRequest { name: name.into(), lease, permits: 2, ..Default::default() };
        assert!(locks.acquire(req).await.unwrap().into_inner().acquired);
        leases.push(lease);
    }
    let req = DescribeRequest { name: name.into(), permits: 2, ..Default::default() };
    let described = tokio::time::timeout(std::time::Duration::from_secs(10), locks.describe(req))
        .await
        .expect("Describe answered within 10 s")
        .unwrap()
        .into_inner();
    for lease in leases {
        c.lease_revoke(lease).await.unwrap();
    }
    described.holders.iter().map(|h| h.granted_ttl).collect()
}

#[tokio::test]
async fn a_cluster_upgraded_from_0_1_0_and_back_serves_throughout_and_refuses_what_old_members_lack() {
    let (old, new) = (release_0_1_0(), built_binary("raftlock"));
    let mut cluster = Cluster::builder(3).binary(&old).spawn().expect("start release 0.1.0");
    cluster.wait_ready().await;
    let mut c = cluster.client(0).await;
    c.put("before", "0.1.0", None).await.unwrap();

    // One member upgraded: the cluster runs mixed.
    cluster.kill(0);
    cluster.set_binary(&new);
    cluster.restart(0).unwrap();
    cluster.wait_healthy(std::time::Duration::from_secs(30)).await.unwrap();
    let mixed = cluster_version_becomes(&cluster, 0, "0.1.0").await;
    assert_eq!((mixed["raftlock"].as_str(), mixed["etcdcluster"].as_str()), (Some(RAFTLOCK), Some(ETCD_API)));
    let endpoints = cluster.endpoints().join(",");
    let out = Etcdctl::v35(&endpoints).run(&["endpoint", "status", "-w", "json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let statuses: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(statuses.len(), 3);
    let leaders: std::collections::BTreeSet<u64> =
        statuses.iter().map(|s| s["Status"]["leader"].as_u64().unwrap()).collect();
    assert_eq!(leaders.len(), 1, "one leader seen by all: {statuses:?}");
    assert!(statuses.iter().all(|s| s["Status"]["version"] == ETCD_API), "{statuses:?}");
    // What the old members lack is refused, and says why.
    let refused = acquire_with_delay(&cluster, 0, "upgrading").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("0.2.0") && refused.message().contains("0.1.0"), "{}", refused.message());
    // Writes cross between releases both ways.
    let mut on_new = cluster.client(0).await;
    on_new.put("mixed", "yes", None).await.unwrap();
    let mut on_old = cluster.client(2).await;
    assert_eq!(on_old.get("mixed", None).await.unwrap().kvs()[0].value(), b"yes");
    assert_eq!(on_new.get("before", None).await.unwrap().kvs()[0].value(), b"0.1.0");
    // Describe through the new member, and an old one, with an old leader:
    // every holder's lease TTL.
    if cluster.leader().await == 0 {
        let to = format!("{:x}", cluster.member_id(1));
        let out = Etcdctl::v35(&cluster.members[0].endpoint()).run(&["move-leader", &to], None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    for i in [0, 2] {
        assert_eq!(described_ttls(&cluster, i, &format!("described-mixed-{i}")).await, [30, 31], "through member {i}");
    }

    // Every member upgraded: the feature is there.
    for i in 1..3 {
        cluster.kill(i);
        cluster.restart(i).unwrap();
        cluster.wait_healthy(std::time::Duration::from_secs(30)).await.unwrap();
    }
    cluster_version_becomes(&cluster, 0, RAFTLOCK).await;
    acquire_with_delay(&cluster, 0, "upgraded").await.unwrap();
    // Through a follower that knows every member's release: one question.
    let follower = cluster.follower().await;
    cluster_version_becomes(&cluster, follower, RAFTLOCK).await;
    assert_eq!(described_ttls(&cluster, follower, "described-upgraded").await, [30, 31]);

    // And back: a downgrade enabled first stops every member from using
    // what 0.1.0 lacks at once, before any binary is replaced.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let enabled = downgrade(&cluster, 1, &["enable", "0.1"]);
    assert!(enabled.status.success(), "{}", text(&enabled));
    for i in 0..3 {
        let seen = cluster_version_becomes(&cluster, i, "0.1.0").await;
        assert_eq!(seen["raftlockdowngrade"], "0.1.0", "member {i}: {seen}");
    }
    let refused = acquire_with_delay(&cluster, 0, "downgrading").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    // Then each member in turn runs 0.1.0 on its data, and serves.
    cluster.set_binary(&old);
    for i in [2, 1, 0] {
        cluster.kill(i);
        cluster.restart(i).unwrap();
        cluster.wait_healthy(std::time::Duration::from_secs(30)).await.unwrap();
        let mut on_old = cluster.client(i).await;
        assert_eq!(on_old.get("mixed", None).await.unwrap().kvs()[0].value(), b"yes");
        on_old.put("downgraded", i.to_string(), None).await.unwrap();
    }
    let mut c = cluster.client(0).await;
    assert_eq!(c.get("before", None).await.unwrap().kvs()[0].value(), b"0.1.0");
    assert_eq!(c.get("downgraded", None).await.unwrap().kvs()[0].value(), b"0");
}

/// `raftlockctl downgrade ARGS` through member `i`.
fn downgrade(cluster: &Cluster, i: usize, args: &[&str]) -> std::process::Output {
    let endpoint = cluster.members[i].endpoint();
    raftlockctl().args(["--endpoints", &endpoint, "downgrade"]).args(args).output().unwrap()
}

#[tokio::test]
async fn a_downgrade_is_validated_enabled_kept_across_restarts_and_cancelled_as_etcds() {
    let mut cluster = Cluster::start(3).await;
    cluster.wait_healthy(std::time::Duration::from_secs(30)).await.unwrap();
    cluster_version_becomes(&cluster, 0, RAFTLOCK).await;

    let validated = downgrade(&cluster, 0, &["validate", "0.1"]);
    assert!(validated.status.success(), "{}", text(&validated));
    assert_eq!(
        String::from_utf8_lossy(&validated.stdout),
        format!("Downgrade validate success, cluster version {RAFTLOCK}\n")
    );
    // etcd's refusals, word for word.
    for (args, error) in [
        (&["validate", "0.0"][..], "etcdserver: invalid downgrade target version"),
        (&["enable", "0.2"][..], "etcdserver: invalid downgrade target version"),
        (&["validate", "zero"][..], "etcdserver: wrong downgrade target version format"),
        (&["cancel"][..], "etcdserver: no inflight downgrade job"),
    ] {
        let out = downgrade(&cluster, 0, args);
        assert!(!out.status.success() && text(&out).contains(error), "{args:?}: {}", text(&out));
    }
    // A grant that holds a lock-delay setting, and a lock in its delay,
    // each keep the cluster from going back to a release without
    // lock-delays (it would apply their ends otherwise).
    let (key, token, _) = hold_with_delay(&cluster, 2, "held", 3000).await;
    let refused = downgrade(&cluster, 0, &["validate", "0.1"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("1 grant(s) hold a lock-delay setting") && text(&refused).contains("held/"),
        "{}",
        text(&refused)
    );
    let mut locks =
        raftlock::proto::raftlock::v1::locks_client::LocksClient::connect(cluster.members[2].endpoint()).await.unwrap();
    let release = raftlock::proto::raftlock::v1::ReleaseRequest { key, token, ..Default::default() };
    assert!(locks.release(release).await.unwrap().into_inner().released);
    let validated = downgrade(&cluster, 0, &["validate", "0.1"]);
    assert!(validated.status.success(), "a released grant leaves nothing behind: {}", text(&validated));
    let (_, _, lease) = hold_with_delay(&cluster, 2, "revoked", 3000).await;
    cluster.client(2).await.lease_revoke(lease).await.unwrap();
    let refused = downgrade(&cluster, 1, &["enable", "0.1"]);
    assert!(
        text(&refused).contains("1 lock(s) are in a lock-delay") && text(&refused).contains("revoked/.lock-delay"),
        "{}",
        text(&refused)
    );
    assert!(
        cluster_version_becomes(&cluster, 1, RAFTLOCK).await["raftlockdowngrade"].is_null(),
        "a refused enable leaves none"
    );
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;

    let enabled = downgrade(&cluster, 0, &["enable", "0.1.0"]);
    assert!(enabled.status.success(), "{}", text(&enabled));
    assert_eq!(String::from_utf8_lossy(&enabled.stdout), "Downgrade enable success, cluster version 0.1.0\n");
    // Every member holds it at once (it was given to each).
    for i in 0..3 {
        let (_, body) = http_get(&cluster.members[i].endpoint(), "/version").await;
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (seen["raftlockcluster"].as_str(), seen["raftlockdowngrade"].as_str()),
            (Some("0.1.0"), Some("0.1.0"))
        );
        let refused = acquire_with_delay(&cluster, i, &format!("during-{i}")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(refused.message().contains("0.1.0"), "{}", refused.message());
    }
    let again = downgrade(&cluster, 1, &["enable", "0.1"]);
    assert!(text(&again).contains("etcdserver: cluster has a downgrade job in progress"), "{}", text(&again));
    // A member restarted holds it (it kept it on disk).
    cluster.kill(2);
    cluster.restart(2).unwrap();
    cluster.wait_healthy(std::time::Duration::from_secs(30)).await.unwrap();
    let seen = cluster_version_becomes(&cluster, 2, "0.1.0").await;
    assert_eq!(seen["raftlockdowngrade"], "0.1.0");
    // Members all above the target are what enable leaves: it holds (one
    // round of asking later too).
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(cluster_version_becomes(&cluster, 0, "0.1.0").await["raftlockdowngrade"], "0.1.0");

    let cancelled = downgrade(&cluster, 2, &["cancel"]);
    assert!(cancelled.status.success(), "{}", text(&cancelled));
    assert_eq!(
        String::from_utf8_lossy(&cancelled.stdout),
        format!("Downgrade cancel success, cluster version {RAFTLOCK}\n")
    );
    for i in 0..3 {
        let seen = cluster_version_becomes(&cluster, i, RAFTLOCK).await;
        assert!(seen["raftlockdowngrade"].is_null(), "{seen}");
    }
    acquire_with_delay(&cluster, 0, "after").await.unwrap();
}
