//! Lock-delay on a real 3-member cluster: after a grant that asked for one
//! ends involuntarily — its lease revoked, its lease expired while the
//! holder was paused, its key deleted by someone else — nobody is granted
//! the lock until the delay has passed (measured from before the end was
//! sent); a Release starts none; a leader killed during the delay does not
//! shorten it; Describe and Observe show it; etcd's Lock service (which
//! raftlock runs on the server) waits for it; bad requests are refused.

use std::time::{Duration, Instant};

use crate::common::{Cluster, ELECTION_MS};
use crate::native_locks::{held, native, try_once};
use raftlock::client::{Acquisition, Client, LockOptions};
use raftlock::proto::raftlock::v1 as pb;
use raftlock::proto::raftlock::v1::lock_event::Kind;

fn delayed(ms: u64) -> LockOptions {
    LockOptions { lock_delay: Duration::from_millis(ms), ..try_once() }
}

async fn describe(c: &Client, name: &str) -> pb::DescribeResponse {
    let req = pb::DescribeRequest { name: name.into(), permits: 1, ..Default::default() };
    c.locks().describe(req).await.unwrap().into_inner()
}

/// Wait until lock `name` has a waiter (as `c`'s member sees it).
async fn until_queued(c: &Client, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while describe(c, name).await.waiters.is_empty() {
        assert!(Instant::now() < deadline, "nobody queued for {name}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_revoked_holder_delays_the_next_grant_and_a_release_does_not() {
    let cluster = Cluster::start(3).await;
    let (a, b, c) = (native(&cluster, 0).await, native(&cluster, 1).await, native(&cluster, 2).await);
    let (sa, sb, sc) = (a.session(30).await.unwrap(), b.session(30).await.unwrap(), c.session(30).await.unwrap());
    let ga = held(sa.lock("ld", delayed(1500)).await.unwrap());
    let d = describe(&c, "ld").await;
    assert_eq!(d.holders[0].lock_delay_ms, 1500, "stored with the grant");
    assert!(d.lock_delay.is_none());
    let mut events = c.observe(b"ld", 1, 0).await.unwrap();
    events.message().await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        let granted = sb.lock("ld", LockOptions { lock_delay: Duration::from_millis(800), ..Default::default() });
        (held(granted.await.unwrap()), Instant::now(), sb)
    });
    until_queued(&b, "ld").await;

    // The holder's lease is revoked (by its session's close): an involuntary end.
    let ended = Instant::now();
    sa.close().await.unwrap();
    let d = describe(&c, "ld").await;
    let delay = d.lock_delay.expect("the lock is in a lock-delay");
    assert_eq!(delay.delay_ms, 1500);
    assert!((0..=1500).contains(&delay.remaining_ms), "{delay:?}");
    assert!(d.holders.is_empty(), "nobody holds during the delay: {:?}", d.holders);
    assert_eq!(d.waiters.len(), 1, "the waiter still waits");
    let v = a.validate(ga.key(), ga.token(), 1).await.unwrap();
    assert!(!v.current);

    let (gb, granted_at, sb) = waiter.await.unwrap();
    let waited = granted_at - ended;
    assert!(waited >= Duration::from_millis(1500), "granted {waited:?} after the end, inside the delay");
    assert!(waited < Duration::from_millis(1500 + 3000), "the delay ended late: {waited:?}");
    // Observe told the waiter queued, the end, the delay, its end and the grant, in that order.
    let mut kinds = Vec::new();
    while !kinds.contains(&Kind::Granted) {
        let m = tokio::time::timeout(Duration::from_secs(5), events.message()).await.unwrap().unwrap().unwrap();
        kinds.extend(m.events.iter().map(|e| e.kind()));
        if let Some(e) = m.events.iter().find(|e| e.kind() == Kind::DelayStarted) {
            assert_eq!(e.lock_delay_ms, 1500);
        }
    }
    assert_eq!(kinds, [Kind::Queued, Kind::LeaseEnded, Kind::DelayStarted, Kind::DelayEnded, Kind::Granted]);
    assert!(describe(&a, "ld").await.lock_delay.is_none());

    // A release is no involuntary end: the next waiter is granted at once.
    let next = tokio::spawn(async move {
        let granted = held(sc.lock("ld", LockOptions::default()).await.unwrap());
        (granted, Instant::now())
    });
    until_queued(&c, "ld").await;
    let released = Instant::now();
    let (b_key, b_token) = (gb.key().to_vec(), gb.token());
    assert!(gb.release().await.unwrap());
    let (gc, granted_at) = next.await.unwrap();
    assert!(granted_at - released < Duration::from_millis(700), "a release delayed the next grant");
    assert!(gc.token() > b_token);
    // The setting went with the key.
    let mut kv = cluster.client(0).await;
    let setting = [&b_key[..], b".delay"].concat();
    assert!(kv.get(setting, None).await.unwrap().kvs().is_empty());
    drop(sb);
}

#[tokio::test]
async fn a_paused_holder_whose_lease_expires_delays_the_next_grant() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (native(&cluster, 0).await, native(&cluster, 1).await);
    // A holder that stops keeping its lease alive (paused past its TTL).
    let lease = a.lease().lease_grant(etcd_lease(2)).await.unwrap().into_inner().id;
    let req = pb::AcquireRequest { name: b"lp".to_vec(), lease, lock_delay_ms: 2000, ..Default::default() };
    let first = a.locks().acquire(req).await.unwrap().into_inner();
    assert!(first.acquired);
    let sb = b.session(30).await.unwrap();
    let waiter = tokio::spawn(async move { (held(sb.lock("lp", LockOptions::default()).await.unwrap()), sb) });
    until_queued(&b, "lp").await;
    // The lease ends (its TTL and the keeper's tick); the end, then the delay.
    let mut kv = cluster.client(1).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let ended = loop {
        if kv.get(first.key.clone(), None).await.unwrap().kvs().is_empty() {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (gb, _sb) = waiter.await.unwrap();
    let waited = ended.elapsed();
    // Seen gone at `ended`: it ended at most a poll before.
    assert!(waited + Duration::from_millis(10) >= Duration::from_millis(2000), "granted {waited:?} after expiry");
    assert!(gb.token() > first.token);
}

fn etcd_lease(ttl: i64) -> raftlock::proto::etcdserverpb::LeaseGrantRequest {
    raftlock::proto::etcdserverpb::LeaseGrantRequest { ttl, id: 0 }
}

#[tokio::test]
async fn a_foreign_delete_starts_the_delay_and_killing_the_leader_does_not_shorten_it() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let (x, y) = ((leader + 1) % 3, (leader + 2) % 3);
    let (a, b) = (native(&cluster, x).await, native(&cluster, y).await);
    let (sa, sb) = (a.session(30).await.unwrap(), b.session(30).await.unwrap());
    const DELAY: u64 = 4000;
    let ga = held(sa.lock("lf", delayed(DELAY)).await.unwrap());
    let waiter = tokio::spawn(async move { (held(sb.lock("lf", LockOptions::default()).await.unwrap()), sb) });
    until_queued(&b, "lf").await;
    // Someone else deletes the holder's key (as an etcd Unlock would).
    let mut kv = cluster.client(x).await;
    let ended = Instant::now();
    kv.delete(ga.key(), None).await.unwrap();
    // Its setting went with it, and the delay began.
    assert!(kv.get([ga.key(), b".delay"].concat(), None).await.unwrap().kvs().is_empty());
    assert!(describe(&a, "lf").await.lock_delay.is_some());
    // The leader dies during the delay; the next one ends it, no sooner.
    cluster.kill(leader);
    let (gb, _sb) = waiter.await.unwrap();
    let waited = ended.elapsed();
    assert!(waited >= Duration::from_millis(DELAY), "granted {waited:?} after the end, inside the delay");
    assert!(
        waited < Duration::from_millis(DELAY + 10 * ELECTION_MS + 3000),
        "lengthened by more than a failover: {waited:?}"
    );
    assert!(gb.token() > ga.token());
    drop(sa);
}

#[tokio::test]
async fn etcds_lock_service_waits_for_a_lock_delay() {
    let cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let sa = a.session(30).await.unwrap();
    held(sa.lock("le", delayed(1500)).await.unwrap());
    let mut etcd = cluster.client(1).await;
    let lease = etcd.lease_grant(30, None).await.unwrap().id();
    let locking = tokio::spawn(async move {
        let options = etcd_client::LockOptions::new().with_lease(lease);
        etcd.lock("le", Some(options)).await.unwrap();
        Instant::now()
    });
    until_queued(&a, "le").await;
    let ended = Instant::now();
    sa.close().await.unwrap();
    let waited = locking.await.unwrap() - ended;
    assert!(waited >= Duration::from_millis(1500), "etcd's Lock granted {waited:?} after the end");
}

#[tokio::test]
async fn bad_lock_delays_are_refused() {
    let cluster = Cluster::start(1).await;
    let a = native(&cluster, 0).await;
    let s = a.session(30).await.unwrap();
    let refused = |r: Result<Acquisition, raftlock::client::ClientError>| match r {
        Err(raftlock::client::ClientError::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
            s.message().to_string()
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    };
    let too_long = refused(s.lock("bad", delayed(60_001)).await);
    assert_eq!(too_long, "raftlock: lock_delay_ms must be at most 60000");
    let semaphore = refused(s.lock("bad", LockOptions { permits: 2, ..delayed(100) }).await);
    assert!(semaphore.contains("only for an exclusive lock"), "{semaphore}");
    let read = refused(s.lock("bad", LockOptions { read: true, ..delayed(100) }).await);
    assert!(read.contains("only for an exclusive lock"), "{read}");
    match s.lock_all(["x", "y"], delayed(100)).await {
        Err(raftlock::client::ClientError::Status(st)) => {
            assert_eq!(st.message(), "raftlock: a multi-lock cannot have a lock-delay")
        }
        _ => panic!("a multi-lock with a lock-delay was accepted"),
    }
    // Nothing was left behind; the maximum is accepted.
    assert!(describe(&a, "bad").await.holders.is_empty());
    held(s.lock("bad", delayed(60_000)).await.unwrap());
}
