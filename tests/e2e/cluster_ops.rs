//! Cluster operations on real clusters of processes: snapshots and log
//! purging (a member that was down catches up by snapshot; restarts after a
//! purge); membership changes with etcdctl (add a voter and a learner that
//! join with `existing`, promote, remove a member and the leader); five
//! members losing two; a follower's forwarding stream to a leader that was
//! killed and leads again; HashKV equal on every member, and different on one
//! whose state store was damaged on disk, which the start-up corruption check
//! also finds; the gRPC health service.

use std::time::{Duration, Instant};

use crate::common::Cluster;
use etcd_client::{Client, GetOptions};

/// Every member snapshots every 50-75 entries (stretched per member) and
/// keeps only 10 behind it.
const SMALL_SNAPSHOTS: &[&str] = &["--snapshot-count", "50", "--snapshot-catchup-entries", "10"];

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

    // Once the leader has purged the entries it missed (it was killed a few
    // entries in), only a snapshot brings it back. The leader purges when no
    // replication to it is under way, e.g. when a call to the down member
    // fails, which it keeps retrying.
    let leader = cluster.leader().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(leader).contains("purged the log") {
        assert!(Instant::now() < deadline, "the leader did not purge its log:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restart(down).expect("restart");
    cluster.wait_for_keys(down, "snap/", 299).await;
    // (The log line follows the install by a moment.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.logs().contains("installed a snapshot from the leader") {
        assert!(Instant::now() < deadline, "no snapshot was installed:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        cluster.restart(i).expect("restart");
    }
    cluster.wait_ready().await;
    for i in 0..3 {
        cluster.wait_for_keys(i, "snap/", 300).await;
    }
}

/// etcdctl 3.5 at `endpoints`, which must succeed; its stdout and stderr.
fn etcdctl(endpoints: &str, args: &[&str]) -> String {
    let out = etcdctl_unchecked(endpoints, args);
    assert!(out.status.success(), "etcdctl {args:?}: {}", crate::common::text(&out));
    crate::common::text(&out)
}

/// `etcdctl member add` (as a learner if `learner`); returns the
/// `--initial-cluster` it prints for the new member.
fn member_add(endpoints: &str, name: &str, peer_url: &str, learner: bool) -> String {
    let peer_urls = format!("--peer-urls={peer_url}");
    let mut args = vec!["member", "add", name, &peer_urls];
    if learner {
        args.push("--learner");
    }
    let out = etcdctl(endpoints, &args);
    out.lines()
        .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER=\""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no ETCD_INITIAL_CLUSTER in {out}"))
        .to_string()
}

/// Members by name: (hex id, is_learner), from `etcdctl member list -w json`.
fn members(endpoints: &str) -> Vec<(String, String, bool)> {
    let v: serde_json::Value = serde_json::from_str(&etcdctl(endpoints, &["member", "list", "-w", "json"])).unwrap();
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap_or("").to_string();
            (name, format!("{:x}", m["ID"].as_u64().unwrap()), m["isLearner"].as_bool().unwrap_or(false))
        })
        .collect()
}

/// The member list once it names `name`: a new member is listed without a
/// name until it has started and published its attributes through Raft,
/// which can come after it has caught up on data (etcd lists it so too).
async fn listed_by_name(endpoints: &str, name: &str) -> Vec<(String, String, bool)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = members(endpoints);
        if list.iter().any(|m| m.0 == name) {
            return list;
        }
        assert!(Instant::now() < deadline, "{name} never listed by name: {list:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn members_are_added_promoted_and_removed_with_etcdctl_even_the_leader() {
    let mut cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    for i in 0..20 {
        c.put(format!("early/{i:02}"), "x", None).await.unwrap();
    }
    let endpoints = cluster.endpoints()[..3].join(",");

    // A voter, added with etcdctl and started with `existing`: it gets the earlier data.
    let voter = cluster.new_member();
    let url = cluster.peer_url(voter);
    let initial = member_add(&endpoints, "m3", &url, false);
    assert!(initial.contains(&format!("m3={url}")), "{initial}");
    cluster.join(voter, &initial);
    cluster.wait_for_keys(voter, "early/", 20).await;
    let mut v = cluster.client(voter).await;
    v.put("from-new-member", "1", None).await.unwrap();
    assert_eq!(c.get("from-new-member", None).await.unwrap().kvs()[0].value(), b"1");
    let list = listed_by_name(&endpoints, "m3").await;
    assert_eq!(list.len(), 4);
    assert!(list.iter().any(|(name, _, learner)| name == "m3" && !learner), "{list:?}");

    // Refusals, with etcd's errors.
    let dup = Client::connect([cluster.members[1].endpoint()], None).await.unwrap();
    let err = dup.cluster_client().member_add([url.clone()], None).await.unwrap_err();
    assert_eq!(
        crate::common::grpc_error(err),
        (tonic::Code::FailedPrecondition, "etcdserver: Peer URLs already exists".into())
    );

    // A learner: added, started, promoted once it is in sync.
    let learner = cluster.new_member();
    let lurl = cluster.peer_url(learner);
    let initial = member_add(&endpoints, "m4", &lurl, true);
    cluster.join(learner, &initial);
    cluster.wait_for_keys(learner, "early/", 20).await;
    let id = listed_by_name(&endpoints, "m4").await.into_iter().find(|m| m.0 == "m4").expect("m4 listed").1;
    assert!(members(&endpoints).iter().any(|m| m.0 == "m4" && m.2), "m4 is a learner");
    // Refused while the leader does not yet see it in sync: try again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !etcdctl_unchecked(&endpoints, &["member", "promote", &id]).status.success() {
        assert!(Instant::now() < deadline, "the learner was never promoted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(members(&endpoints).iter().any(|m| m.0 == "m4" && !m.2), "m4 was promoted");

    // Remove the added voter, then the leader itself.
    let m3 = members(&endpoints).into_iter().find(|m| m.0 == "m3").unwrap().1;
    etcdctl(&endpoints, &["member", "remove", &m3]);
    cluster.kill(voter);
    let leader = cluster.leader().await;
    let leader_id = members(&endpoints).into_iter().find(|m| m.0 == cluster.members[leader].name).unwrap().1;
    let rest: Vec<String> =
        [0, 1, 2, learner].iter().filter(|&&i| i != leader).map(|&i| cluster.members[i].endpoint()).collect();
    etcdctl(&rest.join(","), &["member", "remove", &leader_id]);
    cluster.kill(leader);
    let list = members(&rest.join(","));
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(!list.iter().any(|m| m.1 == leader_id || m.1 == m3), "{list:?}");
    // The remaining three elect a leader and serve writes.
    let mut r = cluster.client(learner).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while r.put("after-removals", "1", None).await.is_err() {
        assert!(Instant::now() < deadline, "no writes after the leader was removed:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in [0, 1, 2, learner].into_iter().filter(|&i| i != leader) {
        cluster.wait_for_keys(i, "after-removals", 1).await;
    }
}

#[tokio::test]
async fn five_members_keep_serving_with_two_killed() {
    let mut cluster = Cluster::start(5).await;
    let leader = cluster.leader().await;
    let other = (leader + 1) % 5;
    let mut c = cluster.client((leader + 2) % 5).await;
    c.put("five/before", "1", None).await.unwrap();
    cluster.kill(leader);
    cluster.kill(other);
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.put("five/after", "2", None).await.is_err() {
        assert!(Instant::now() < deadline, "3 of 5 did not serve writes:\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in (0..5).filter(|&i| i != leader && i != other) {
        let mut m = cluster.client(i).await;
        let r = m.get("five/", Some(GetOptions::new().with_prefix())).await.unwrap();
        assert_eq!(r.count(), 2, "member {i}");
    }
    // Locks still work on the survivors.
    let lease = c.lease_grant(10, None).await.unwrap().id();
    let key = c.lock("five-lock", Some(etcd_client::LockOptions::new().with_lease(lease))).await.unwrap();
    c.unlock(key.key()).await.unwrap();
}

#[tokio::test]
async fn snapshot_save_and_defrag_with_etcdctl_and_raftlockctl() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    for i in 0..100 {
        c.put(format!("backup/{i}"), "x".repeat(100), None).await.unwrap();
    }
    let endpoints = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();
    // etcdctl checks the stream's SHA-256 trailer before it keeps the file.
    let file = dir.path().join("etcdctl.snap");
    let out = etcdctl(&cluster.members[1].endpoint(), &["snapshot", "save", file.to_str().unwrap()]);
    assert!(out.contains("Snapshot saved at"), "{out}");
    let len = std::fs::metadata(&file).unwrap().len();
    assert!(len > 100 * 100 && (len - 32).is_multiple_of(512), "{len} bytes");
    let ours = dir.path().join("raftlockctl.snap");
    let out = crate::common::raftlockctl()
        .args(["--endpoints", &cluster.members[2].endpoint(), "snapshot", "save", ours.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Snapshot saved at"), "{out:?}");
    assert!(std::fs::metadata(&ours).unwrap().len() > 100 * 100);
    let out = etcdctl(&endpoints, &["defrag"]);
    assert_eq!(out.matches("Finished defragmenting").count(), 3, "{out}");
    assert_eq!(c.get("backup/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count(), 100);
}

#[tokio::test]
async fn a_member_without_a_leader_is_unhealthy() {
    let mut cluster = Cluster::start(3).await;
    let survivor = cluster.follower().await;
    let endpoint = cluster.members[survivor].endpoint();
    let health = |endpoint: &str| {
        crate::common::raftlockctl()
            .args(["--endpoints", endpoint, "--command-timeout", "2s", "endpoint", "health"])
            .output()
            .unwrap()
    };
    assert!(health(&endpoint).status.success());
    for i in (0..3).filter(|&i| i != survivor) {
        cluster.kill(i);
    }
    // Once it notices (an election timeout), it has no leader and says so.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = health(&endpoint);
        if !out.status.success() {
            assert!(String::from_utf8_lossy(&out.stderr).contains("is unhealthy"), "{out:?}");
            break;
        }
        assert!(Instant::now() < deadline, "a member alone still reports healthy");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = etcdctl_unchecked(&endpoint, &["endpoint", "health"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unhealthy"), "{out:?}");
    let mut c = cluster.client(survivor).await;
    let status = c.status().await.unwrap();
    assert_eq!(status.leader(), 0);
    assert!(status.errors().iter().any(|e| e.contains("no leader")), "{:?}", status.errors());
}

fn etcdctl_unchecked(endpoints: &str, args: &[&str]) -> std::process::Output {
    crate::common::Etcdctl::v35(endpoints).run(args, None)
}

#[tokio::test]
async fn move_leader_hands_leadership_to_the_chosen_member() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let mut c = cluster.client(0).await;
    c.put("before-move", "1", None).await.unwrap();
    let leader = cluster.leader().await;
    let target = (leader + 1) % 3;
    let target_id = cluster.client(target).await.status().await.unwrap().header().unwrap().member_id();
    let out = etcdctl(&endpoints, &["move-leader", &format!("{target_id:x}")]);
    assert!(out.contains("Leadership transferred"), "{out}");
    // The third member hears of the new leader with its first heartbeat.
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(5);
        while cluster.client(i).await.status().await.unwrap().leader() != target_id {
            assert!(Instant::now() < deadline, "member {i} follows another leader");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The cluster serves as before, and elections work again (the new leader can be moved away).
    c.put("after-move", "2", None).await.unwrap();
    assert_eq!(c.get("before-move", None).await.unwrap().kvs()[0].value(), b"1");
    let back_id = cluster.client(leader).await.status().await.unwrap().header().unwrap().member_id();
    etcdctl(&endpoints, &["move-leader", &format!("{back_id:x}")]);
    assert_eq!(cluster.client(target).await.status().await.unwrap().leader(), back_id);
    // A member that does not exist: etcd's error.
    let out = etcdctl_unchecked(&endpoints, &["move-leader", "abcdef"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("bad leader transferee"), "{out:?}");
}

/// A follower hands its clients' writes to the leader on one long-lived
/// stream. When the leader's process is killed that stream breaks; once the
/// same member leads again (restarted, then handed leadership), the
/// follower opens a new stream to it, and writes through the follower are
/// applied as before, none of them lost or applied twice.
#[tokio::test]
async fn a_follower_forwards_again_to_a_leader_that_was_killed_and_leads_again() {
    let mut cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints().join(",");
    let leader = cluster.leader().await;
    let leader_id = cluster.client(leader).await.status().await.unwrap().header().unwrap().member_id();
    let follower = (leader + 1) % 3;
    let mut via = cluster.client(follower).await;
    via.put("forwarded/1", "before", None).await.unwrap();

    cluster.kill(leader);
    // Meanwhile another member leads, and the follower's writes reach it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while [0, leader_id].contains(&via.status().await.unwrap().leader()) {
        assert!(Instant::now() < deadline, "no new leader after the leader was killed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    via.put("forwarded/2", "meanwhile", None).await.unwrap();
    cluster.restart(leader).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !etcdctl_unchecked(&endpoints, &["move-leader", &format!("{leader_id:x}")]).status.success() {
        assert!(Instant::now() < deadline, "leadership could not be handed back to the restarted member");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while via.status().await.unwrap().leader() != leader_id {
        assert!(Instant::now() < deadline, "the follower does not follow the restarted leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 3..=12 {
        via.put(format!("forwarded/{i}"), "after", None).await.unwrap();
    }
    let mut on_leader = cluster.client(leader).await;
    let got = on_leader.get("forwarded/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(got.kvs().len(), 12, "every write through the follower, once");
    // Each applied once: one revision per put, none skipped or repeated.
    let versions: Vec<i64> = got.kvs().iter().map(|kv| kv.version()).collect();
    assert!(versions.iter().all(|&v| v == 1), "a write was applied more than once: {versions:?}");
}

/// A write that reaches a follower after its leader died, with the end of
/// the leader's connection not yet read there (the follower was stopped
/// meanwhile, so that both arrive at once), is sent on to the next leader,
/// never failed as "leader changed" (`peer::forward`). Three rounds, each
/// killing the leader of the moment.
#[tokio::test]
async fn a_write_that_reaches_a_follower_after_its_leader_died_goes_to_the_next_leader() {
    let mut cluster = Cluster::start(3).await;
    for round in 0..3 {
        let leader = cluster.leader().await;
        let follower = (leader + 1) % 3;
        let mut via = cluster.client(follower).await;
        // The follower's forwarding stream to this leader is open.
        via.put(format!("round/{round}/before"), "1", None).await.unwrap();
        cluster.pause(follower);
        let write = tokio::spawn({
            let mut via = via.clone();
            async move { via.put(format!("round/{round}/after"), "1", None).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.kill(leader);
        tokio::time::sleep(Duration::from_millis(100)).await;
        cluster.resume(follower);
        let written = tokio::time::timeout(Duration::from_secs(20), write).await.expect("the write never ended");
        if let Err(e) = written.unwrap() {
            panic!("round {round}: the write failed: {e}\n{}", cluster.logs());
        }
        cluster.restart(leader).expect("restart");
        cluster.wait_ready().await;
    }
    let mut c = cluster.client(0).await;
    let got = c.get("round/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(got.kvs().len(), 6, "every write, once");
    assert!(got.kvs().iter().all(|kv| kv.version() == 1), "a write was applied more than once");
}

/// A planned stop (SIGTERM) of the leader hands leadership to a caught-up
/// voter before the process exits, so that the others need not wait out an
/// election timeout: the member it names leads, and leads already when the
/// old leader's process has exited. Clients writing and reading
/// (linearizable) through a follower all along see every request succeed:
/// the leader neither proposes nor confirms reads during the transfer (its
/// heartbeats would keep the target from winning), and the requests go to
/// the new leader.
#[tokio::test]
async fn a_leader_stopped_with_sigterm_hands_leadership_over_first() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let via = cluster.follower().await;
    let mut c = cluster.client(via).await;
    for i in 0..20 {
        c.put(format!("before/{i}"), "v", None).await.unwrap();
    }
    // A writer and a linearizable reader on each follower.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in (0..3).filter(|i| *i != leader) {
        for reads in [false, true] {
            let (mut c, stop) = (cluster.client(i).await, stop.clone());
            clients.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let done = if reads {
                        c.get("before/0", None).await.map(drop)
                    } else {
                        c.put(format!("during/{i}/{n}"), "v", None).await.map(drop)
                    };
                    done.map_err(|e| format!("member {i}, {} {n}: {e}", if reads { "read" } else { "write" }))?;
                    n += 1;
                }
                Ok::<_, String>(n)
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(cluster.terminate(leader).success());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in clients {
        let done = task.await.unwrap().unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
        assert!(done > 0);
    }
    let said = cluster.log_of(leader);
    let line = said
        .lines()
        .find(|l| l.contains("handed leadership over before stopping"))
        .unwrap_or_else(|| panic!("the leader stopped without handing over:\n{}", cluster.logs()));
    // No election was needed: the member it named already leads.
    let status = c.status().await.unwrap();
    let named = format!("{:x}", status.leader());
    assert!(status.leader() != 0 && line.contains(&named), "leader {named} is not the one handed to: {line}");
    c.put("after", "v", None).await.unwrap();
}

/// A member removed from the cluster stops serving (its process exits, as
/// etcd's does) instead of answering from a state that no longer grows.
/// Asked to remove itself, a follower answers first (it may never apply
/// its own removal: the leader's commit is the answer), without itself in
/// the members it lists.
#[tokio::test]
async fn a_removed_member_stops_serving() {
    let mut cluster = Cluster::start(3).await;
    let gone = cluster.follower().await;
    let mut c = cluster.client(cluster.leader().await).await;
    let mut own = cluster.client(gone).await;
    let id = own.status().await.unwrap().header().unwrap().member_id();
    let answer = own.member_remove(id).await.unwrap();
    assert_eq!(answer.members().len(), 2, "{:?}", answer.members());
    assert!(answer.members().iter().all(|m| m.id() != id));
    let status = cluster.wait_exit(gone, Duration::from_secs(15));
    assert!(status.is_some(), "the removed member still runs:\n{}", cluster.logs());
    assert!(status.unwrap().success());
    assert!(cluster.log_of(gone).contains("removed from the cluster"));
    c.put("after-removal", "v", None).await.unwrap();
}

/// etcd's strict reconfiguration check: with a member down, adding a voter
/// (two of four would be up) and removing a member that is up (one of two
/// would be up) are refused with etcd's errors and change nothing; removing
/// the member that is down is allowed.
#[tokio::test]
async fn membership_changes_that_could_lose_the_quorum_are_refused() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let id_of = |i: usize| {
        let endpoint = cluster.members[i].endpoint();
        async move {
            let mut c = Client::connect([endpoint], None).await.unwrap();
            c.status().await.unwrap().header().unwrap().member_id()
        }
    };
    let (down, up) = (id_of(followers[0]).await, id_of(followers[1]).await);
    let mut c = cluster.client(leader).await;
    cluster.kill(followers[0]);
    // Long enough for the leader to count it as down (etcd's health interval).
    tokio::time::sleep(Duration::from_secs(6)).await;

    let expected = (
        tonic::Code::FailedPrecondition,
        "etcdserver: re-configuration failed due to not enough started members".to_string(),
    );
    let refused = c.member_add(["http://127.0.0.1:1"], None).await.unwrap_err();
    assert_eq!(crate::common::grpc_error(refused), expected);
    let refused = c.member_remove(up).await.unwrap_err();
    assert_eq!(crate::common::grpc_error(refused), expected);
    assert_eq!(c.member_list().await.unwrap().members().len(), 3, "a refused change changed nothing");

    c.member_remove(down).await.unwrap();
    assert_eq!(c.member_list().await.unwrap().members().len(), 2);
    c.put("still-writable", "v", None).await.unwrap();
}

/// A member that lost its data directory and is started again with the same
/// flags is refused (etcd: "member ... has already been bootstrapped"): let
/// in, it would have forgotten its vote and the entries it acknowledged, and
/// openraft's leader stops when a follower's log goes back. The others go on.
#[tokio::test]
async fn a_member_whose_data_was_lost_is_refused_and_the_others_go_on() {
    let mut cluster = Cluster::start(3).await;
    let lost = cluster.follower().await;
    let mut c = cluster.client(cluster.leader().await).await;
    for i in 0..20 {
        c.put(format!("before/{i}"), "v", None).await.unwrap();
    }
    cluster.kill(lost);
    std::fs::remove_dir_all(&cluster.members[lost].data_dir).unwrap();
    cluster.restart(lost).expect("restart");
    let status = cluster.wait_exit(lost, Duration::from_secs(15));
    assert!(status.is_some_and(|s| !s.success()), "the member with lost data was let in:\n{}", cluster.logs());
    assert!(cluster.log_of(lost).contains("has already been bootstrapped"), "{}", cluster.log_of(lost));
    for i in 0..20 {
        c.put(format!("after/{i}"), "v", None).await.unwrap();
    }
}

/// A member added to a cluster with a long log catches up from the log and
/// keeps running: while it replays, its log ends for a while with
/// configurations from before it was added, which must not make it think it
/// was removed.
#[tokio::test]
async fn a_member_added_to_a_long_log_catches_up_and_stays() {
    let mut cluster = Cluster::start(3).await;
    let mut c = cluster.client(cluster.leader().await).await;
    for i in 0..1500 {
        c.put(format!("long/{i:04}"), "x", None).await.unwrap();
    }
    let endpoints = cluster.endpoints()[..3].join(",");
    let added = cluster.new_member();
    let url = cluster.peer_url(added);
    let initial = member_add(&endpoints, "m3", &url, false);
    cluster.join(added, &initial);
    cluster.wait_for_keys(added, "long/", 1500).await;
    assert!(cluster.wait_exit(added, Duration::from_secs(4)).is_none(), "the new member stopped:\n{}", cluster.logs());
    assert!(!cluster.log_of(added).contains("removed from the cluster"));
}

/// Maintenance.HashKV: every member that applied the same history answers
/// the same checksum at a revision; another revision of a changed history
/// has another one; beyond the store, or below its compaction, is etcd's
/// error. Maintenance.Hash (the whole state) agrees on members at the same
/// applied index.
#[tokio::test]
async fn hash_kv_is_equal_on_every_member_at_a_revision() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    for i in 0..30 {
        c.put(format!("h/{}", i % 7), format!("v{i}"), None).await.unwrap();
    }
    let mid = c.delete("h/3", None).await.unwrap().header().unwrap().revision();
    for i in 0..10 {
        c.put(format!("h/late/{i}"), "x", None).await.unwrap();
    }
    let current = c.get("h/0", None).await.unwrap().header().unwrap().revision();
    c.compact(mid - 5, None).await.unwrap();
    // The compaction changes no revision, so waiting for `current` is not
    // enough: a follower may have the puts but not yet the compaction. The
    // leader applied the compaction before it answered, so the highest
    // applied index any member reports now covers it.
    let mut compacted_at = 0;
    for i in 0..3 {
        compacted_at = compacted_at.max(cluster.client(i).await.status().await.unwrap().raft_applied_index());
    }

    let (mut at_mid, mut at_current) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let mut m = cluster.client(i).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.status().await.unwrap().raft_applied_index() < compacted_at {
            assert!(Instant::now() < deadline, "member {i} never applied index {compacted_at}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let h = m.hash_kv(mid).await.unwrap();
        assert_eq!(h.compact_version(), mid - 5);
        at_mid.push(h.hash());
        at_current.push(m.hash_kv(current).await.unwrap().hash());
        assert_eq!(m.hash_kv(0).await.unwrap().hash(), at_current[i], "0 means the current revision");
        let future = m.hash_kv(current + 100).await.unwrap_err();
        assert_eq!(
            crate::common::grpc_error(future),
            (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision".into())
        );
        let compacted = m.hash_kv(mid - 10).await.unwrap_err();
        assert_eq!(
            crate::common::grpc_error(compacted),
            (tonic::Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted".into())
        );
    }
    assert!(at_mid.iter().all(|h| *h == at_mid[0]), "hashes at {mid} differ: {at_mid:?}");
    assert!(at_current.iter().all(|h| *h == at_current[0]), "hashes at {current} differ: {at_current:?}");
    assert_ne!(at_mid[0], at_current[0], "ten more puts changed nothing?");

    // Hash: the whole state, equal once every member applied the same index.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut seen = Vec::new();
        for i in 0..3 {
            let mut m = cluster.client(i).await;
            let applied = m.status().await.unwrap().raft_applied_index();
            seen.push((applied, m.hash().await.unwrap().hash(), m.status().await.unwrap().raft_applied_index()));
        }
        let steady = seen.iter().all(|(a, _, b)| a == b && *a == seen[0].0);
        if steady {
            assert!(seen.iter().all(|(_, h, _)| *h == seen[0].1), "Hash differs at one applied index: {seen:?}");
            break;
        }
        assert!(Instant::now() < deadline, "members never settled on one applied index: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // etcdctl's view: one line per endpoint, all with the same hash.
    let out = crate::common::Etcdctl::v35(&cluster.endpoints().join(",")).ok(&[
        "endpoint",
        "hashkv",
        "--rev",
        &mid.to_string(),
    ]);
    let hashes: Vec<&str> = out.lines().filter_map(|l| l.split(", ").nth(1)).collect();
    assert_eq!(hashes, vec![at_mid[0].to_string().as_str(); 3], "{out}");
}

/// A member whose state store was damaged on disk (one byte of one value,
/// changed while it was stopped) serves a HashKV that differs from its
/// peers' at the same revision: what an operator compares to find it.
#[tokio::test]
async fn hash_kv_tells_a_member_with_a_damaged_state_store() {
    let mut cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    c.put("damaged/key", "AAAAAAAAAAAAAAAA", None).await.unwrap();
    let revision = c.put("damaged/other", "x", None).await.unwrap().header().unwrap().revision();
    cluster.wait_for_keys(2, "damaged/", 2).await;
    assert!(cluster.terminate(2).success(), "a clean stop");

    // Change one byte of the value where member 2's state store keeps it:
    // in a frame of its journal file, whose CRC is made to match (a frame
    // whose CRC fails is cut off at start, and the log applies it again;
    // this is damage the CRC cannot see, as when a value was wrong before
    // it was framed).
    let images = cluster.members[2].data_dir.join("images");
    let mut changed = 0;
    for entry in std::fs::read_dir(&images).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_str().unwrap().starts_with("journal-") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let payload = at + 8..at + 8 + len;
            if let Some(i) = bytes[payload.clone()].windows(16).position(|w| w == b"AAAAAAAAAAAAAAAA") {
                bytes[payload.start + i] = b'B';
                let crc = crc32fast::hash(&bytes[payload.clone()]);
                bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
                changed += 1;
            }
            at = payload.end;
        }
        std::fs::write(&path, bytes).unwrap();
    }
    assert_eq!(changed, 1, "the value is in one journal frame");
    cluster.restart(2).expect("restart");
    cluster.wait_ready().await;

    let mut hashes = Vec::new();
    for i in 0..3 {
        hashes.push(cluster.client(i).await.hash_kv(revision).await.unwrap().hash());
    }
    assert_eq!(hashes[0], hashes[1], "the healthy members agree");
    assert_ne!(hashes[2], hashes[0], "the damaged member's hash differs");
    let mut damaged = cluster.client(2).await;
    let read = damaged.get("damaged/key", Some(GetOptions::new().with_serializable())).await.unwrap();
    assert_eq!(read.kvs()[0].value(), b"BAAAAAAAAAAAAAAA", "it serves what its disk says");

    // With etcd's start-up check, the damaged member finds out by itself and
    // refuses to serve; the healthy ones pass the same check.
    assert!(cluster.terminate(2).success());
    cluster.add_args(&["--experimental-initial-corrupt-check"]);
    cluster.restart(2).expect("restart");
    let status = cluster.wait_exit(2, Duration::from_secs(30)).expect("the damaged member stops");
    assert!(!status.success());
    let log = cluster.log_of(2);
    assert!(log.contains("found data inconsistency with peer"), "{log}");
    assert!(cluster.terminate(1).success());
    cluster.restart(1).expect("restart");
    cluster.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(1).contains("initial corruption check passed") {
        assert!(Instant::now() < deadline, "{}", cluster.log_of(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cluster.log_of(1).contains("initial corruption check passed"), "{}", cluster.log_of(1));
}

/// gRPC's standard health service: SERVING on every member of a healthy
/// cluster (for the whole server and for a service by name), NOT_SERVING on
/// a member left without a quorum, and SERVING again once it has one.
#[tokio::test]
async fn the_grpc_health_service_follows_the_members_leader() {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    let mut cluster = Cluster::start(3).await;
    let urls: Vec<String> = cluster.endpoints();
    let status = |i: usize, service: &str| {
        let (url, service) = (urls[i].clone(), service.to_string());
        async move {
            let channel = tonic::transport::Channel::from_shared(url).unwrap().connect().await.unwrap();
            let answer = HealthClient::new(channel).check(HealthCheckRequest { service }).await.unwrap();
            ServingStatus::try_from(answer.into_inner().status).unwrap()
        }
    };
    let wait_for = |i: usize, want: ServingStatus| {
        let status = &status;
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if status(i, "").await == want {
                    return;
                }
                assert!(Instant::now() < deadline, "member {i} never reported {want:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    for i in 0..3 {
        wait_for(i, ServingStatus::Serving).await;
        assert_eq!(status(i, "etcdserverpb.KV").await, ServingStatus::Serving);
    }
    cluster.kill(1);
    cluster.kill(2);
    wait_for(0, ServingStatus::NotServing).await;
    assert_eq!(status(0, "raftlock.v1.Locks").await, ServingStatus::NotServing);
    cluster.restart(1).expect("restart");
    wait_for(0, ServingStatus::Serving).await;
}

/// A member of a new cluster that starts after the others have elected a
/// leader joins that leader instead of campaigning, and the leader stays.
/// The late member is the one with the largest ID: openraft 0.9 orders the
/// votes of one term by node ID, so its campaign in the leader's term would
/// be "higher" and depose the leader (a second or so without one).
#[tokio::test]
async fn a_member_that_starts_after_the_leader_is_elected_joins_it_without_an_election() {
    let mut cluster = Cluster::unstarted(3);
    let id = |c: &Cluster, i: usize| raftlock::ids::member_id(&[c.peer_url(i)], "raftlock-cluster");
    let late = (0..3).max_by_key(|&i| id(&cluster, i)).unwrap();
    for i in (0..3).filter(|&i| i != late) {
        cluster.restart(i).expect("restart");
    }
    let leader = cluster.leader().await;
    let before = cluster.client(leader).await.status().await.unwrap();

    cluster.restart(late).expect("restart");
    cluster.wait_ready().await;
    // A deposed leader is noticed at the late member's first AppendEntries
    // answer; the next election would come an election timeout later.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 0..3 {
        let s = cluster.client(i).await.status().await.unwrap();
        assert_eq!(
            (s.leader(), s.raft_term()),
            (before.leader(), before.raft_term()),
            "member {i} follows another leader or term than the one elected before the late start; logs:\n{}",
            cluster.logs()
        );
    }
}

/// Members of a new cluster that start one after the other, the largest ID
/// first, elect one leader in term 1: a member bootstraps only once a
/// majority of the initial members answer (`raft::bootstrap_when_a_majority_answers`).
/// Before, the first member campaigned alone in term 1 and kept a vote that
/// outranks (by node ID) those of the members after it, so their term-1
/// campaigns failed too, and the first leader came in term 2 by pre-vote.
#[tokio::test]
async fn members_that_start_one_by_one_elect_one_leader_in_term_one() {
    let mut cluster = Cluster::unstarted(3);
    let id = |c: &Cluster, i: usize| raftlock::ids::member_id(&[c.peer_url(i)], "raftlock-cluster");
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(id(&cluster, i)));
    for i in order {
        cluster.restart(i).expect("restart");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    cluster.wait_ready().await;
    cluster.leader().await;
    // A deposed leader or a failed campaign shows within an election timeout.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let first = cluster.client(0).await.status().await.unwrap();
    for i in 0..3 {
        let s = cluster.client(i).await.status().await.unwrap();
        assert_eq!(
            (s.leader(), s.raft_term()),
            (first.leader(), 1),
            "member {i}: not one leader in term 1; logs:\n{}",
            cluster.logs()
        );
    }
}
