//! Leases on a real 3-member cluster, driven by `etcd-client`: grant, revoke,
//! expiry timing, keepalive through a follower, a leader killed while a lease
//! is kept alive, leases across restarts, the rate at which leases that
//! lapse together are revoked, and leases granted again under the IDs of
//! ones being expired.

use std::time::{Duration, Instant};

use crate::common::{grpc_error, Cluster, ELECTION_MS};
use etcd_client::{Client, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use tonic::Code;

/// The TTL floor with the test timing: 1.5 election timeouts, rounded up to a second.
const FLOOR: i64 = ((ELECTION_MS * 3).div_ceil(2000)) as i64;

async fn exists(c: &mut Client, key: &str) -> bool {
    !c.get(key, None).await.unwrap().kvs().is_empty()
}

/// Grant a lease of `ttl` for each of `ids` (0: the server chooses), 32
/// grants at a time.
async fn grant_leases(c: &Client, ids: Vec<i64>, ttl: i64) {
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let mut c = c.clone();
            let mine: Vec<i64> = ids.iter().copied().skip(t).step_by(32).collect();
            tokio::spawn(async move {
                for id in mine {
                    let chosen = (id != 0).then(|| LeaseGrantOptions::new().with_id(id));
                    c.lease_grant(ttl, chosen).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn grant_attach_revoke_and_time_to_live() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;

    let lease = c.lease_grant(60, None).await.unwrap();
    assert_eq!(lease.ttl(), 60);
    let id = lease.id();
    assert!(id > 0);
    let chosen = c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(4242))).await.unwrap();
    assert_eq!(chosen.id(), 4242);
    let (code, msg) = grpc_error(c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(4242))).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::FailedPrecondition, "etcdserver: lease already exists"));
    let floor = c.lease_grant(0, None).await.unwrap();
    assert_eq!(floor.ttl(), FLOOR, "a TTL below the floor is raised to it");

    c.put("l/a", "1", Some(PutOptions::new().with_lease(id))).await.unwrap();
    c.put("l/b", "2", Some(PutOptions::new().with_lease(id))).await.unwrap();
    c.put("l/c", "3", Some(PutOptions::new().with_lease(4242))).await.unwrap();
    // Moving a key to another lease detaches it from the first.
    c.put("l/c", "3", Some(PutOptions::new().with_lease(id))).await.unwrap();
    assert_eq!(c.get("l/a", None).await.unwrap().kvs()[0].lease(), id);

    let ttl = c.lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);
    assert!(ttl.ttl() > 50 && ttl.ttl() <= 60, "remaining {}", ttl.ttl());
    let mut keys: Vec<_> = ttl.keys().to_vec();
    keys.sort();
    assert_eq!(keys, vec![b"l/a".to_vec(), b"l/b".to_vec(), b"l/c".to_vec()]);
    let listed: Vec<i64> = c.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
    assert!(listed.contains(&id) && listed.contains(&4242));

    // Revoke deletes every attached key in one revision.
    let before = c.get("l/", None).await.unwrap().header().unwrap().revision();
    let revoked = c.lease_revoke(id).await.unwrap();
    assert_eq!(revoked.header().unwrap().revision(), before + 1);
    for k in ["l/a", "l/b", "l/c"] {
        assert!(!exists(&mut c, k).await, "{k} outlived its lease");
    }
    assert_eq!(c.lease_time_to_live(id, None).await.unwrap().ttl(), -1, "an unknown lease has TTL -1");
    let (code, msg) = grpc_error(c.lease_revoke(id).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::NotFound, "etcdserver: requested lease not found"));
    let (code, _) = grpc_error(c.put("l/x", "1", Some(PutOptions::new().with_lease(id))).await.unwrap_err());
    assert_eq!(code, Code::NotFound);
    // A keepalive on an unknown lease answers TTL 0, which etcd-client reports
    // as "lease not found".
    match c.lease_keep_alive(id).await {
        Err(etcd_client::Error::LeaseKeepAliveError(msg)) => assert_eq!(msg, "lease not found"),
        other => panic!("expected a TTL-0 answer, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_lease_without_keepalive_expires_on_time_and_one_kept_alive_does_not() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    // Its deadline counts from its grant: time it from just before.
    let granted = Instant::now();
    let lapsing = c.lease_grant(3, None).await.unwrap().id();
    let kept = c.lease_grant(3, None).await.unwrap().id();
    c.put("e/lapsing", "v", Some(PutOptions::new().with_lease(lapsing))).await.unwrap();
    c.put("e/kept", "v", Some(PutOptions::new().with_lease(kept))).await.unwrap();
    let (mut keeper, mut answers) = c.lease_keep_alive(kept).await.unwrap();

    let mut gone_after = None;
    while granted.elapsed() < Duration::from_secs(8) {
        keeper.keep_alive().await.unwrap();
        assert_eq!(answers.message().await.unwrap().unwrap().ttl(), 3);
        if gone_after.is_none() && !exists(&mut c, "e/lapsing").await {
            gone_after = Some(granted.elapsed());
        }
        assert!(exists(&mut c, "e/kept").await, "a lease kept alive expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone_after = gone_after.expect("the lease without keepalive never expired");
    let slack = Duration::from_millis(FLOOR as u64 * 1000 + ELECTION_MS + 300);
    assert!(gone_after >= Duration::from_millis(2900), "expired early: {gone_after:?}");
    assert!(gone_after <= Duration::from_secs(3) + slack, "expired late: {gone_after:?}");
}

#[tokio::test]
async fn a_kept_alive_lease_survives_the_leader_being_killed() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let mut c = cluster.client(follower).await;
    let id = c.lease_grant(3, None).await.unwrap().id();
    c.put("k/held", "v", Some(PutOptions::new().with_lease(id))).await.unwrap();
    let mut stream = Some(c.lease_keep_alive(id).await.unwrap());
    let start = Instant::now();
    let mut killed = false;
    let mut kept = 0;
    while start.elapsed() < Duration::from_secs(9) {
        if !killed && start.elapsed() > Duration::from_secs(1) {
            cluster.kill(leader);
            killed = true;
        }
        // A keepalive waits out the election on the follower; should a round
        // fail anyway, a client re-opens the stream, as etcd's clients do.
        let mut answered = None;
        if let Some((keeper, answers)) = &mut stream {
            if keeper.keep_alive().await.is_ok() {
                if let Ok(Ok(Some(a))) = tokio::time::timeout(Duration::from_secs(3), answers.message()).await {
                    answered = Some(a.ttl());
                }
            }
        }
        match answered {
            Some(ttl) => {
                assert_eq!(ttl, 3, "the lease must not lapse across the election");
                kept += 1;
            }
            None => stream = c.lease_keep_alive(id).await.ok(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(kept > 5, "only {kept} keepalives answered");
    assert!(exists(&mut c, "k/held").await, "the key of a lease kept alive was deleted");
    assert!(c.lease_time_to_live(id, None).await.unwrap().ttl() > 0);
}

#[tokio::test]
async fn leases_survive_a_restart_of_every_member() {
    let mut cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    let id = c.lease_grant(120, None).await.unwrap().id();
    c.put("r/leased", "v", Some(PutOptions::new().with_lease(id))).await.unwrap();
    drop(c);
    for i in 0..3 {
        assert!(cluster.terminate(i).success());
    }
    for i in 0..3 {
        cluster.restart(i).expect("restart");
    }
    cluster.wait_ready().await;
    let mut c = cluster.client(1).await;
    let ttl = c.lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys())).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 120);
    assert!(ttl.ttl() > 100, "a new leader gives the lease its full TTL again ({})", ttl.ttl());
    assert_eq!(ttl.keys(), [b"r/leased".to_vec()]);
    c.lease_revoke(id).await.unwrap();
    assert!(!exists(&mut c, "r/leased").await);
}

/// The worst bug a lock server can have: a leader frozen (SIGSTOP) for much
/// longer than the election timeout and the TTL wakes up still believing it
/// leads, finds the lease's deadline long past, and revokes it — although its
/// holder kept it alive through a follower, and the new leader renewed it all
/// along. The revoke must not be applied: the key attached to the lease must
/// survive, and every keepalive must keep answering a positive TTL.
#[tokio::test]
async fn a_paused_leader_does_not_revoke_a_lease_kept_alive_elsewhere() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let via = cluster.follower().await;
    let mut c = cluster.client(via).await;
    let ttl = 3;
    let id = c.lease_grant(ttl, None).await.unwrap().id();
    c.put("held", "by-a-live-session", Some(PutOptions::new().with_lease(id))).await.unwrap();

    let (mut keeper, mut answers) = c.lease_keep_alive(id).await.unwrap();
    let keepalive = tokio::spawn(async move {
        let mut ttls = Vec::new();
        let until = Instant::now() + Duration::from_secs(14);
        while Instant::now() < until {
            // A keepalive that cannot be answered in time (no leader yet) is
            // retried; the TTL leaves room for an election.
            let _ = keeper.keep_alive().await;
            if let Ok(Ok(Some(answer))) = tokio::time::timeout(Duration::from_millis(900), answers.message()).await {
                ttls.push(answer.ttl());
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        ttls
    });

    // Frozen for more than twice the TTL: the others elect a new leader, which
    // renews the lease; the old one's deadline for it passes while it sleeps.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.pause(leader);
    tokio::time::sleep(Duration::from_secs(7)).await;
    cluster.resume(leader);
    let ttls = keepalive.await.unwrap();

    assert!(ttls.iter().all(|t| *t > 0), "a keepalive answered that the lease is gone: {ttls:?}");
    assert!(exists(&mut c, "held").await, "the lease was revoked while its holder kept it alive");
    let left = c.lease_time_to_live(id, None).await.unwrap().ttl();
    assert!(left > 0, "the lease is gone (TTL {left})");
}

/// Leases that lapse together are revoked at the configured rate (etcd's here), a keeper tick's
/// share at a time, not all in one burst, and all of them are revoked.
/// Leadership is moved after the grants, so that the new leader gives every
/// lease its full TTL at the same instant: without the rate, its first
/// tick past the deadline would revoke them all at once.
#[tokio::test]
async fn leases_that_lapse_together_are_revoked_at_a_bounded_rate() {
    use raftlock::LEASE_TICK;
    const LEASES: usize = 3000;
    const TTL: i64 = 8;
    // 1,000 a second: 100 a tick.
    const EXPIRIES_PER_TICK: usize = 100;
    let cluster = Cluster::start_with(3, &["--lease-expiry-rate", "1000"]).await;
    let leader = cluster.leader().await;
    let target = (leader + 1) % 3;
    let mut c = cluster.client(target).await;
    let target_id = c.status().await.unwrap().header().unwrap().member_id();

    // No deadline of any leader falls before `start + TTL`.
    let start = Instant::now();
    grant_leases(&c, vec![0; LEASES], TTL).await;
    // MoveLeader is the leader's to answer, as etcd's. The new leader's
    // term, and so its deadlines' count, begin after `moving`.
    let moving = Instant::now();
    cluster.client(leader).await.move_leader(target_id).await.unwrap();
    let moved = Instant::now();

    // The most keeper ticks, on a leader whose deadlines all fall at
    // `first_due` or later, that can have expired leases by `until`: none
    // before `first_due`, then one a tick (a tick up to 5 ms late does not
    // move the schedule, so the next may come 95 ms after it), and one more
    // for a tick that began before `first_due` and read its clock after.
    let ticks = |first_due: Instant, until: Instant| -> usize {
        match until.checked_duration_since(first_due) {
            None => 0,
            Some(d) => (d.as_millis() / (LEASE_TICK.as_millis() - 5)) as usize + 2,
        }
    };
    let ttl = Duration::from_secs(TTL as u64);
    let mut seen = Vec::new();
    let give_up = moved + Duration::from_secs(TTL as u64 + (LEASES / 1000) as u64 + 20);
    loop {
        let left = c.leases().await.unwrap().leases().len();
        let read = Instant::now();
        let revoked = LEASES - left;
        // The leader before the move (until it moved; its deadlines count
        // from the grants) and the one after (from its term).
        let most = EXPIRIES_PER_TICK * (ticks(start + ttl, moved) + ticks(moving + ttl, read));
        seen.push((read.saturating_duration_since(start).as_millis(), revoked));
        assert!(revoked <= most, "{revoked} leases revoked when at most {most} could be: {seen:?}");
        if left == 0 {
            break;
        }
        assert!(read < give_up, "leases outlived their TTL: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Spread over more than one tick: the backlog did not arrive at once.
    let partial = seen.iter().filter(|(_, revoked)| *revoked > 0 && *revoked < LEASES).count();
    assert!(partial >= 2, "the leases were revoked in one burst: {seen:?}");
}

/// Leases revoked and granted again under their IDs while a backlog of
/// expiries works through them (the keeper takes a tick's share of the
/// lapsed leases, in ID order here): every lease granted again keeps its
/// new TTL, whichever moment its grant met the keeper's expiry of the old
/// one in (`raft::lease_order`), and every other lease expires, even those
/// whose IDs clients keep asking to grant all along (refused while the old
/// lease is there).
#[tokio::test]
async fn leases_granted_again_under_their_ids_while_the_old_ones_expire_are_kept() {
    use raftlock::LEASE_TICK;
    const LEASES: i64 = 2000;
    // Long enough for the grants to end before the first deadline.
    const TTL: i64 = 5;
    // 1,000 a second: 100 a tick.
    const EXPIRIES_PER_TICK: usize = 100;
    let cluster = Cluster::start_with(3, &["--lease-expiry-rate", "1000"]).await;
    let leader = cluster.leader().await;
    let target = (leader + 1) % 3;
    let mut c = cluster.client(target).await;
    let target_id = c.status().await.unwrap().header().unwrap().member_id();
    grant_leases(&c, (1..=LEASES).collect(), TTL).await;
    // The new leader gives every lease one deadline: its keeper then
    // expires them a tick's share at a time, lowest ID first.
    cluster.client(leader).await.move_leader(target_id).await.unwrap();
    let ttl_of = |c: &mut Client, id: i64| {
        let mut c = c.clone();
        async move { c.lease_time_to_live(id, None).await.unwrap().ttl() }
    };
    let deadline = Instant::now() + Duration::from_secs(TTL as u64 + 10);
    while ttl_of(&mut c, 1).await != -1 {
        assert!(Instant::now() < deadline, "lease 1 never expired");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let front = Instant::now();

    // Every third lease is revoked and granted again around the tick its
    // expiry is due in, at moments spread over the tick.
    let per_tick = EXPIRIES_PER_TICK as i64;
    let tick = LEASE_TICK;
    let again: Vec<i64> = (2..=LEASES).filter(|id| id % 3 == 0).collect();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let mut c = c.clone();
            let mine: Vec<i64> = again.iter().copied().skip(t).step_by(16).collect();
            tokio::spawn(async move {
                let mut kept = Vec::new();
                for id in mine {
                    let due = front + tick * ((id - 1) / per_tick) as u32;
                    let spread = tick.mul_f64(((id * 37) % 100) as f64 / 100.0);
                    tokio::time::sleep_until((due + spread - tick / 2).into()).await;
                    let _ = c.lease_revoke(id).await;
                    let granted = c.lease_grant(60, Some(LeaseGrantOptions::new().with_id(id))).await.is_ok();
                    // An error may hide a grant that was made: the lease with
                    // a TTL above the old one's is the new one.
                    if granted || c.lease_time_to_live(id, None).await.unwrap().ttl() > TTL {
                        kept.push(id);
                    }
                }
                kept
            })
        })
        .collect();
    // Clients that ask to grant a lease of the backlog again and again,
    // refused until it has expired.
    let insistent: Vec<i64> = (LEASES / 2..LEASES / 2 + 24).filter(|id| id % 3 == 1).collect();
    let insisting: Vec<_> = insistent
        .iter()
        .map(|&id| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let give_up = Instant::now() + Duration::from_secs(20);
                while c.lease_grant(60, Some(LeaseGrantOptions::new().with_id(id))).await.is_err() {
                    assert!(Instant::now() < give_up, "lease {id} never expired while its ID was asked for");
                }
            })
        })
        .collect();
    let mut kept = Vec::new();
    for t in tasks {
        kept.extend(t.await.unwrap());
    }
    assert!(kept.len() > again.len() / 2, "few leases could be granted again: {}", kept.len());
    for t in insisting {
        t.await.unwrap();
    }
    kept.extend(insistent);

    // Once the backlog is through: the leases granted again are there with
    // their new TTL, the others are gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: std::collections::BTreeSet<i64> = c.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
        let lost: Vec<i64> = kept.iter().copied().filter(|id| !left.contains(id)).collect();
        assert!(lost.is_empty(), "leases granted again were revoked: {lost:?}");
        if left.len() == kept.len() {
            break;
        }
        assert!(Instant::now() < deadline, "{} leases outlived their TTL", left.len() - kept.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for &id in kept.iter().step_by(50) {
        assert!(ttl_of(&mut c, id).await > 50, "lease {id} lost its new TTL");
    }
}
