//! The in-process tier: protocol behaviour on three members running inside
//! this test process (`raftlock_testkit::inprocess`) — forwarding and read
//! indexes, lease expiry, a member stopped and started again — with no
//! process to spawn per member. Process faults (kill -9, SIGSTOP) are the
//! other modules' business.

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use raftlock_testkit::inprocess::InProcessCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_through_every_member_are_read_linearizably_at_every_member() {
    let cluster = InProcessCluster::start(3).await;
    for i in 0..3 {
        let mut c = cluster.client(i).await;
        c.put(format!("k{i}"), format!("from {i}"), None).await.unwrap();
        // Each member reads every write acknowledged so far, at once.
        for j in 0..3 {
            let mut r = cluster.client(j).await;
            let got = r.get("k", Some(GetOptions::new().with_prefix())).await.unwrap();
            let values: Vec<&str> = got.kvs().iter().map(|kv| kv.value_str().unwrap()).collect();
            let expected: Vec<String> = (0..=i).map(|w| format!("from {w}")).collect();
            assert_eq!(values, expected, "member {j} after the write through member {i}");
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_left_without_keepalives_expires_and_takes_its_keys() {
    let cluster = InProcessCluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    // The smallest TTL granted is 1.5 election timeouts, rounded up: 1 s here.
    let lease = c.lease_grant(1, None).await.unwrap().id();
    c.put("leased", "v", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    assert_eq!(c.get("leased", None).await.unwrap().kvs().len(), 1);
    let granted = Instant::now();
    while !c.get("leased", None).await.unwrap().kvs().is_empty() {
        assert!(granted.elapsed() < Duration::from_secs(10), "the key outlived its lease by far");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(granted.elapsed() >= Duration::from_millis(900), "the lease ended before its TTL");
    assert_eq!(c.lease_time_to_live(lease, None).await.unwrap().ttl(), -1, "the lease is gone");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_stopped_and_started_again_catches_up_and_serves() {
    let mut cluster = InProcessCluster::start(3).await;
    let stopped = cluster.follower().await;
    cluster.stop_member(stopped).await;
    let leader = cluster.leader().await;
    let mut c = cluster.client(leader).await;
    for n in 0..100 {
        c.put(format!("while-down/{n:03}"), "v", None).await.unwrap();
    }
    cluster.start_member(stopped).await.unwrap();
    cluster.wait_ready().await;
    // A linearizable read there waits until it has applied everything.
    let mut r = cluster.client(stopped).await;
    let got = r.get("while-down/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!(got.count(), 100);
    cluster.shutdown().await;
}
