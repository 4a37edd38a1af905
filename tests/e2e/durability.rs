//! Faults: kill -9 of the leader under load, kill -9 of every member, a
//! follower paused and another killed under load, clean restarts. An
//! acknowledged write must never be lost.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::Cluster;
use etcd_client::GetOptions;

/// Write `d/<writer>/<n>` through member `via` until told to stop; record
/// every write that was acknowledged.
async fn writer(endpoint: String, id: usize, acked: Arc<Mutex<BTreeSet<String>>>, stop: Arc<tokio::sync::Notify>) {
    let mut client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    for n in 0.. {
        let key = format!("d/{id}/{n:06}");
        tokio::select! {
            r = client.put(key.clone(), "v", None) => {
                if r.is_ok() {
                    acked.lock().unwrap().insert(key);
                }
            }
            _ = stop.notified() => return,
        }
    }
}

async fn all_keys(cluster: &Cluster, via: usize) -> BTreeSet<String> {
    let mut c = cluster.client(via).await;
    let resp = c.get("d/", Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    resp.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn killing_the_leader_loses_no_acknowledged_write() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut writers = Vec::new();
    for (id, &via) in followers.iter().enumerate() {
        writers.push(tokio::spawn(writer(cluster.members[via].endpoint(), id, acked.clone(), stop.clone())));
    }
    // Writes through followers are acknowledged (some of them, before the kill).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while acked.lock().unwrap().len() < 10 {
        assert!(std::time::Instant::now() < deadline, "writes through followers are not acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.kill(leader);
    let at_kill = acked.lock().unwrap().len();
    // The survivors elect a leader and keep taking writes. (How soon depends on
    // the election timeout and on load; the property is that they resume.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < at_kill + 50 {
        assert!(std::time::Instant::now() < deadline, "writes did not resume after the leader died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.notify_waiters();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > at_kill);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    for &via in &followers {
        let present = all_keys(&cluster, via).await;
        let lost: Vec<_> = acked.difference(&present).collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    }
    // The old leader comes back and catches up.
    cluster.restart(leader).expect("restart");
    cluster.wait_ready().await;
    let mut c = cluster.client(leader).await;
    let mut tries = 0;
    loop {
        let present: BTreeSet<String> = c
            .get("d/", Some(GetOptions::new().with_prefix().with_keys_only().with_serializable()))
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .collect();
        if acked.is_subset(&present) {
            break;
        }
        tries += 1;
        assert!(tries < 200, "restarted member did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many writes `acked` gains over `period`; fails with `what` if none.
async fn progress_over(acked: &Mutex<BTreeSet<String>>, period: Duration, what: &str) -> usize {
    let before = acked.lock().unwrap().len();
    tokio::time::sleep(period).await;
    let gained = acked.lock().unwrap().len() - before;
    assert!(gained > 0, "{what}");
    gained
}

/// Replication to a follower is a stream of pipelined requests: it must
/// survive the follower stopping (SIGSTOP) mid-stream and resume once it runs
/// again, and start afresh for a follower that was killed and restarted.
/// Members keep only 16 KiB of log in memory, so the entries the two missed
/// are read back from the leader's WAL.
#[tokio::test]
async fn a_paused_and_a_killed_follower_under_load_catch_up_with_every_write() {
    let mut cluster = Cluster::start_with(3, &["--experimental-log-memory-bytes", "16384"]).await;
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (paused, killed) = (followers[0], followers[1]);
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let writers: Vec<_> = (0..4)
        .map(|id| tokio::spawn(writer(cluster.members[leader].endpoint(), id, acked.clone(), stop.clone())))
        .collect();
    progress_over(&acked, Duration::from_millis(500), "writes are not acknowledged").await;

    // Paused for two seconds, longer than an election timeout: the leader
    // and the other follower go on committing meanwhile.
    let pid = cluster.members[paused].pid().expect("running") as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    progress_over(&acked, Duration::from_secs(2), "writes stalled with one follower paused").await;
    unsafe { libc::kill(pid, libc::SIGCONT) };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The other follower dies: the quorum is now the leader and the follower
    // that was paused, so writes go on only if replication to it resumed.
    cluster.kill(killed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    progress_over(&acked, Duration::from_secs(2), "writes stalled: the resumed follower is not replicated").await;

    // The killed follower comes back and catches up while writes go on.
    cluster.restart(killed).expect("restart");
    cluster.wait_ready().await;
    progress_over(&acked, Duration::from_secs(1), "writes stalled after the restart").await;
    stop.notify_waiters();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    for via in 0..3 {
        let mut c = cluster.client(via).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let present: BTreeSet<String> = c
                .get("d/", Some(GetOptions::new().with_prefix().with_keys_only().with_serializable()))
                .await
                .unwrap()
                .kvs()
                .iter()
                .map(|kv| kv.key_str().unwrap().to_string())
                .collect();
            let missing = acked.difference(&present).count();
            if missing == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "member {via} is missing {missing} acknowledged writes");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn kill_every_member_and_restart_keeps_every_acknowledged_write() {
    let mut cluster = Cluster::start(3).await;
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut writers = Vec::new();
    for id in 0..3 {
        writers.push(tokio::spawn(writer(cluster.members[id].endpoint(), id, acked.clone(), stop.clone())));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // kill -9 everyone while writes are in flight.
    for i in 0..3 {
        cluster.kill(i);
    }
    stop.notify_waiters();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 10, "only {} writes acknowledged", acked.len());
    for i in 0..3 {
        cluster.restart(i).expect("restart");
    }
    cluster.wait_ready().await;
    for via in 0..3 {
        let present = all_keys(&cluster, via).await;
        let lost: Vec<_> = acked.difference(&present).collect();
        assert!(lost.is_empty(), "acknowledged writes lost after restart: {lost:?}");
    }
    // Revisions continue from where they were.
    let mut c = cluster.client(0).await;
    let rev = c.put("after-restart", "v", None).await.unwrap().header().unwrap().revision();
    assert!(rev as usize > acked.len());
}

#[tokio::test]
async fn a_clean_shutdown_and_restart_keeps_data_and_revisions() {
    let mut cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    for i in 0..50 {
        c.put(format!("d/{i:03}"), format!("v{i}"), None).await.unwrap();
    }
    c.delete("d/000", None).await.unwrap();
    let rev = c.get("d/", None).await.unwrap().header().unwrap().revision();
    drop(c);
    for i in 0..3 {
        let status = cluster.terminate(i);
        assert!(status.success(), "member {i} exited with {status} on SIGTERM");
    }
    for i in 0..3 {
        cluster.restart(i).expect("restart");
    }
    cluster.wait_ready().await;
    let mut c = cluster.client(1).await;
    let got = c.get("d/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(got.count(), 49);
    assert_eq!(got.kvs()[0].key(), b"d/001");
    assert_eq!(got.header().unwrap().revision(), rev);
    let old = c.get("d/000", Some(GetOptions::new().with_revision(rev - 1))).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"v0", "history survives a restart");
}
