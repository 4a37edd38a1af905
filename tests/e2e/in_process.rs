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

/// A semaphore's waiter waits only for the deletion of one of the newest
/// `permits` keys ahead of it (`locks::turn::wait_for_turn`), and a
/// waiter that gives up guards its removal with them: a long queue is
/// served in order all the same, never more than the permits at once, and
/// a waiter deep in the queue that gives up leaves without a grant and
/// without holding up those behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_semaphore_queue_is_served_in_order() {
    use raftlock::client::{Acquisition, Client, LockOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    const PERMITS: u32 = 2;
    const WAITERS: usize = 100;
    const GIVES_UP: usize = 80;
    let cluster = InProcessCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let clients: Vec<Client> = futures::future::join_all((0..3).map(|i| Client::connect([endpoints[i].clone()])))
        .await
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    let options = |wait| LockOptions { wait, permits: PERMITS, ..Default::default() };
    let mut holders = Vec::new();
    for i in 0..PERMITS as usize {
        let session = clients[i % 3].session(60).await.unwrap();
        let Acquisition::Held(guard) = session.lock("pool", options(Some(Duration::ZERO))).await.unwrap() else {
            panic!("a permit is free")
        };
        holders.push((session, guard));
    }
    let mut kv = cluster.client(0).await;
    let (holding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let granted: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut waiters = Vec::new();
    for w in 0..WAITERS {
        let session = clients[w % 3].session(60).await.unwrap();
        let key = format!("pool/{:x}", session.lease());
        let wait = if w == GIVES_UP { Some(Duration::from_secs(2)) } else { None };
        let (holding, most, granted) = (holding.clone(), most.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let acquired = session.lock("pool", options(wait)).await.unwrap();
            let Acquisition::Held(guard) = acquired else { return false };
            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            granted.lock().unwrap().push(w);
            tokio::time::sleep(Duration::from_millis(5)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            assert!(guard.release().await.unwrap(), "waiter {w} released its grant");
            true
        }));
        // Queued in this order: each key exists before the next waiter asks.
        raftlock_testkit::wait_for_key(&mut kv, &key).await;
    }
    // The one deep in the queue gives up while everyone ahead still waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(waiters[GIVES_UP].is_finished(), "the waiter with a 2 s wait gave up");
    assert!(granted.lock().unwrap().is_empty(), "no permit came free yet");
    for (_, guard) in holders.drain(..) {
        assert!(guard.release().await.unwrap());
    }
    let mut served = Vec::new();
    for (w, waiter) in waiters.into_iter().enumerate() {
        served.push((w, tokio::time::timeout(Duration::from_secs(30), waiter).await.unwrap().unwrap()));
    }
    assert!(served.iter().all(|&(w, got)| got == (w != GIVES_UP)), "{served:?}");
    let order = granted.lock().unwrap().clone();
    assert_eq!(order.len(), WAITERS - 1);
    // In queue order, up to the two permits' grants racing to be recorded.
    for (position, w) in order.iter().enumerate() {
        let place = if *w > GIVES_UP { w - 1 } else { *w };
        assert!(place.abs_diff(position) < PERMITS as usize, "waiter {w} granted {position}th: {order:?}");
    }
    assert!(most.load(Ordering::SeqCst) <= PERMITS as usize, "more holders than permits at once");
    assert_eq!(kv.get("pool/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap().count(), 0);
    cluster.shutdown().await;
}

/// Describe answers each owner's lease TTL (the time left, and the TTL
/// granted) from one question to the leader for the whole page: asked
/// through a follower and through the leader, every holder and waiter gets
/// its own lease's times, in the queue's order, and a page further on gets
/// the times of its own owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn describe_gives_every_owner_its_own_lease_times_through_any_member() {
    use raftlock::client::{Acquisition, Client, LockOptions};
    use raftlock::proto::raftlock::v1::DescribeRequest;
    use raftlock::ClusterVersion;

    const PERMITS: u32 = 2;
    const WAITERS: i64 = 6;
    let cluster = InProcessCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let client = Client::connect([endpoints[cluster.leader().await].clone()]).await.unwrap();
    let options = |wait| LockOptions { wait, permits: PERMITS, ..Default::default() };
    // Each owner's lease has a TTL of its own: 30 s for the first holder,
    // one more for each next owner.
    let (mut owners, mut guards, mut waiters) = (Vec::new(), Vec::new(), Vec::new());
    let mut kv = cluster.client(0).await;
    for i in 0..PERMITS as i64 + WAITERS {
        let session = client.session(30 + i).await.unwrap();
        owners.push((session.lease(), 30 + i));
        if i < PERMITS as i64 {
            let Acquisition::Held(guard) = session.lock("pool", options(Some(Duration::ZERO))).await.unwrap() else {
                panic!("a permit is free")
            };
            guards.push((guard, session));
        } else {
            let key = format!("pool/{:x}", session.lease());
            waiters.push(tokio::spawn(async move {
                let _ = session.lock("pool", options(None)).await;
                session
            }));
            // Queued in this order: each key exists before the next waiter asks.
            raftlock_testkit::wait_for_key(&mut kv, &key).await;
        }
    }
    // One question for the page once every member knows the others'
    // releases (each asks every 5 s); until then one per lease, as 0.1.0.
    let decided = Instant::now();
    while !(0..3).all(|i| matches!(cluster.node(i).cluster_version(), ClusterVersion::Decided(_))) {
        assert!(decided.elapsed() < Duration::from_secs(15), "the cluster version is not decided");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let follower = cluster.follower().await;
    for member in [follower, cluster.leader().await] {
        let c = Client::connect([endpoints[member].clone()]).await.unwrap();
        let mut seen = Vec::new();
        let mut req = DescribeRequest { name: b"pool".to_vec(), permits: PERMITS, limit: 4, ..Default::default() };
        let mut pages = 0;
        loop {
            let d = c.locks().describe(req.clone()).await.unwrap().into_inner();
            pages += 1;
            if seen.is_empty() {
                assert_eq!(d.holders.len(), PERMITS as usize);
                seen.extend(d.holders.iter().map(|h| (h.lease, h.granted_ttl, h.ttl)));
            }
            seen.extend(d.waiters.iter().map(|w| (w.lease, w.granted_ttl, w.ttl)));
            match (d.more, d.waiters.last()) {
                (true, Some(last)) => (req.waiters_after, req.waiters_after_key) = (last.token, last.key.clone()),
                _ => break,
            }
        }
        assert_eq!((seen.len(), pages), (owners.len(), 2), "member {member}: {seen:?}");
        for ((lease, granted, left), (owner, ttl)) in seen.iter().zip(&owners) {
            assert_eq!((lease, granted), (owner, ttl), "member {member}: {seen:?}");
            // Sessions keep their leases alive a third of a TTL apart.
            assert!((ttl / 2..=*ttl).contains(left), "member {member}: lease {lease:x} has {left} s left of {ttl}");
        }
    }
    for waiter in waiters {
        waiter.abort();
    }
    for (guard, _session) in guards {
        guard.release().await.unwrap();
    }
    cluster.shutdown().await;
}
