//! Cluster operations on real clusters of processes: snapshots and log
//! purging (a member that was down catches up by snapshot; restarts after a
//! purge).

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use etcd_client::GetOptions;

/// Every member snapshots every 50 entries and keeps only 10 behind it.
const SMALL_SNAPSHOTS: &[&str] = &["--snapshot-count", "50", "--snapshot-catchup-entries", "10"];

async fn wait_for_keys(cluster: &Cluster, member: usize, prefix: &str, n: usize) {
    let mut c = cluster.client(member).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let opts = GetOptions::new().with_prefix().with_serializable().with_count_only();
        if let Ok(r) = c.get(prefix, Some(opts)).await {
            if r.count() as usize == n {
                return;
            }
        }
        assert!(Instant::now() < deadline, "member {member} never had {n} keys under {prefix}:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_member_behind_the_purged_log_catches_up_by_snapshot_and_restarts_are_whole() {
    let mut cluster = Cluster::start_with(3, SMALL_SNAPSHOTS).await;
    let down = cluster.follower().await;
    cluster.kill(down);
    let up = (down + 1) % 3;
    let mut c = cluster.client(up).await;
    for i in 0..300 {
        c.put(format!("snap/{i:03}"), format!("v{i}"), None).await.unwrap();
    }
    c.delete("snap/000", None).await.unwrap();

    // The entries it missed are purged everywhere: only a snapshot brings it back.
    cluster.restart(down);
    wait_for_keys(&cluster, down, "snap/", 299).await;
    assert!(cluster.logs().contains("installed a snapshot from the leader"), "{}", cluster.logs());
    let mut d = cluster.client(down).await;
    let r = d.get("snap/299", Some(GetOptions::new().with_serializable())).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"v299");
    // History came with it: the deleted key's earlier version is still there.
    let deleted_at = c.get("snap/001", None).await.unwrap().header().unwrap().revision();
    let old = d.get("snap/000", Some(GetOptions::new().with_revision(2).with_serializable())).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"v0");
    assert!(deleted_at > 300);

    // It keeps up afterwards, and serves linearizable reads.
    c.put("snap/after", "1", None).await.unwrap();
    assert_eq!(d.get("snap/after", None).await.unwrap().kvs()[0].value(), b"1");

    // Every member restarted (its log purged, its state from the state store): all there.
    for i in 0..3 {
        cluster.terminate(i);
    }
    for i in 0..3 {
        cluster.restart(i);
    }
    cluster.wait_ready().await;
    for i in 0..3 {
        wait_for_keys(&cluster, i, "snap/", 300).await;
    }
}
