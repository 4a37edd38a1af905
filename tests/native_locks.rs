//! raftlock's native lock API (`raftlock.v1.Locks`) on a real 3-member
//! cluster, through the crate's Rust client: try-lock and wait timeouts that
//! answer with the holder, fenced release and fenced writes, semaphores,
//! describe and list, a waiter whose lease ends, a holder process killed -9,
//! and a leader killed -9 while clients contend.

mod common;

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Cluster, ELECTION_MS};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use raftlock::client::{Acquisition, Client, ClientError, Guard, LockOptions, Session};

async fn native(cluster: &Cluster, i: usize) -> Client {
    Client::connect([cluster.members[i].endpoint()]).await.unwrap()
}

fn try_once() -> LockOptions {
    LockOptions { wait: Some(Duration::ZERO), ..Default::default() }
}

fn held(a: Acquisition) -> Guard {
    match a {
        Acquisition::Held(g) => g,
        Acquisition::Busy(h) => panic!("expected the lock, it is held by {h:?}"),
    }
}

async fn describe(c: &Client, name: &str, permits: u32) -> raftlock::proto::raftlock::v1::DescribeResponse {
    let req = raftlock::proto::raftlock::v1::DescribeRequest { name: name.into(), permits };
    c.locks().describe(req).await.unwrap().into_inner()
}

#[tokio::test]
async fn try_lock_and_wait_timeout_answer_with_the_holder_and_leave_no_key() {
    let cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let b = native(&cluster, 1).await;
    let sa = a.session(30).await.unwrap();
    let sb = b.session(30).await.unwrap();
    let opts = LockOptions { metadata: b"worker-a".to_vec(), ..try_once() };
    let guard = held(sa.lock("reports", opts).await.unwrap());
    assert_eq!(guard.key(), format!("reports/{:x}", sa.lease()).as_bytes());

    // Try-lock on a held lock: at once, with the holder.
    let started = Instant::now();
    let Acquisition::Busy(holders) = sb.lock("reports", try_once()).await.unwrap() else { panic!("held by a") };
    assert!(started.elapsed() < Duration::from_secs(1), "try-lock must not wait");
    assert_eq!(holders.len(), 1);
    assert_eq!((holders[0].key.as_slice(), holders[0].token), (guard.key(), guard.token()));
    assert_eq!((holders[0].lease, holders[0].metadata.as_slice()), (sa.lease(), &b"worker-a"[..]));

    // A wait that times out: not before the timeout, with the holder, no key left.
    let started = Instant::now();
    let wait = LockOptions { wait: Some(Duration::from_millis(400)), ..Default::default() };
    let Acquisition::Busy(holders) = sb.lock("reports", wait).await.unwrap() else { panic!("held by a") };
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(holders[0].token, guard.token());
    let d = describe(&b, "reports", 1).await;
    assert_eq!(d.holders.len(), 1);
    assert!(d.waiters.is_empty(), "a waiter that gave up left its key: {:?}", d.waiters);

    // A call cancelled while it waits (the client went away) removes its place.
    let cancelled = tokio::time::timeout(Duration::from_millis(300), sb.lock("reports", LockOptions::default())).await;
    assert!(cancelled.is_err(), "the lock is held: the call waits");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !describe(&b, "reports", 1).await.waiters.is_empty() {
        assert!(Instant::now() < deadline, "a cancelled waiter left its key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A wait that ends in time gets the lock once a releases it.
    let waiting = tokio::spawn(async move {
        let wait = LockOptions { wait: Some(Duration::from_secs(10)), ..Default::default() };
        let g = held(sb.lock("reports", wait).await.unwrap());
        (g.token(), sb)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(a.release(guard.key(), guard.token()).await.unwrap());
    let (token, _sb) = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
    assert!(token > holders[0].token, "fencing tokens grow across holders");
}

#[tokio::test]
async fn stale_release_and_stale_writes_leave_the_new_holder_alone() {
    let cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let mut kv = cluster.client(2).await;
    let sa = a.session(30).await.unwrap();

    // etcd issue 22082: the same lease locks again after a release; an Unlock
    // by key alone from the first round would delete the second grant.
    let first = held(sa.lock("db-migration", try_once()).await.unwrap());
    let (key, old_token) = (first.key().to_vec(), first.token());
    assert!(first.release().await.unwrap());
    let second = held(sa.lock("db-migration", try_once()).await.unwrap());
    assert_eq!(second.key(), key.as_slice(), "same lease, same key");
    assert!(second.token() > old_token);
    let req = raftlock::proto::raftlock::v1::ReleaseRequest { key: key.clone(), token: old_token };
    let stale = a.locks().release(req).await.unwrap().into_inner();
    assert!(!stale.released);
    assert_eq!(stale.current_token, second.token());
    assert_eq!(describe(&a, "db-migration", 1).await.holders[0].token, second.token(), "the new grant survives");

    // A paused holder: its lease ends (revoked here, as expiry would do), b
    // takes the lock, then the old holder wakes up and tries to write.
    let b = native(&cluster, 1).await;
    let sb = b.session(30).await.unwrap();
    let stale_key = String::from_utf8(key.clone()).unwrap();
    let stale_token = second.token();
    kv.lease_revoke(sa.lease()).await.unwrap();
    let wait = LockOptions { wait: Some(Duration::from_secs(5)), ..Default::default() };
    let fresh = held(sb.lock("db-migration", wait).await.unwrap());
    let fresh_key = String::from_utf8(fresh.key().to_vec()).unwrap();

    // Guard 1: a txn on raftlock's own keys — write only while the grant lives.
    let guarded_put = |key: String, token: i64, value: &'static str| {
        Txn::new().when([Compare::create_revision(key, CompareOp::Equal, token)]).and_then([TxnOp::put(
            "schema-version",
            value,
            None,
        )])
    };
    assert!(kv.txn(guarded_put(fresh_key, fresh.token(), "v2")).await.unwrap().succeeded());
    assert!(!kv.txn(guarded_put(stale_key.clone(), stale_token, "v1")).await.unwrap().succeeded());
    assert_eq!(kv.get("schema-version", None).await.unwrap().kvs()[0].value(), b"v2");

    // Guard 2: an outside service that keeps the highest token it has seen.
    let mut highest = 0;
    let mut accept = |token: i64| {
        let ok = token >= highest;
        highest = highest.max(token);
        ok
    };
    assert!(accept(fresh.token()));
    assert!(!accept(stale_token), "the stale holder's token is lower");

    // And its stale release changes nothing.
    assert!(!b.release(stale_key.as_bytes(), stale_token).await.unwrap());
    assert_eq!(describe(&b, "db-migration", 1).await.holders[0].token, fresh.token());
}

#[tokio::test]
async fn a_semaphore_admits_n_holders_then_serves_waiters_in_order() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    let mut sessions = Vec::new();
    for i in 0..5 {
        sessions.push(Arc::new(native(&cluster, i % 3).await.session(30).await.unwrap()));
    }
    let permits = |wait: Option<Duration>| LockOptions { wait, permits: 3, ..Default::default() };
    let mut kv = cluster.client(1).await;
    let mut guards = Vec::new();
    for s in &sessions[..3] {
        guards.push(held(s.lock("gpu", permits(Some(Duration::ZERO))).await.unwrap()));
    }
    let Acquisition::Busy(holders) = sessions[3].lock("gpu", permits(Some(Duration::ZERO))).await.unwrap() else {
        panic!("three permits are taken")
    };
    let tokens: Vec<i64> = guards.iter().map(Guard::token).collect();
    assert_eq!(holders.iter().map(|h| h.token).collect::<Vec<_>>(), tokens);

    // Two waiters queue up in order.
    let mut waiting = Vec::new();
    for s in &sessions[3..] {
        let s = s.clone();
        let key = format!("gpu/{:x}", s.lease());
        waiting.push(tokio::spawn(async move { held(s.lock("gpu", permits(None)).await.unwrap()) }));
        common::wait_for_key(&mut kv, &key).await;
    }
    let d = describe(&c, "gpu", 3).await;
    assert_eq!((d.holders.len(), d.waiters.len()), (3, 2));
    assert_eq!(d.waiters[0].lease, sessions[3].lease());

    // One permit comes free: the first waiter gets it, the second still waits.
    assert!(guards.remove(1).release().await.unwrap());
    let fourth = tokio::time::timeout(Duration::from_secs(5), waiting.remove(0)).await.unwrap().unwrap();
    assert_eq!(fourth.key(), format!("gpu/{:x}", sessions[3].lease()).as_bytes());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting[0].is_finished(), "only one permit came free");
    let d = describe(&c, "gpu", 3).await;
    assert_eq!((d.holders.len(), d.waiters.len()), (3, 1));

    // Describe shows every owner's lease TTL; List shows the semaphore.
    assert!(d.holders.iter().all(|h| h.granted_ttl == 30 && (0..=30).contains(&h.ttl)), "{:?}", d.holders);
    let req = raftlock::proto::raftlock::v1::ListRequest { prefix: b"g".to_vec(), permits: 3 };
    let list = c.locks().list(req).await.unwrap().into_inner();
    assert_eq!(list.locks.len(), 1);
    assert_eq!(
        (list.locks[0].name.as_slice(), list.locks[0].holders.len(), list.locks[0].waiters),
        (&b"gpu"[..], 3, 1)
    );
}

#[tokio::test]
async fn a_waiter_whose_lease_ends_gets_an_error_and_bad_requests_are_refused() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    let holder = c.session(30).await.unwrap();
    let _guard = held(holder.lock("busy", try_once()).await.unwrap());
    let waiter = Arc::new(native(&cluster, 1).await.session(30).await.unwrap());
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.lock("busy", LockOptions::default()).await });
    let mut kv = cluster.client(2).await;
    common::wait_for_key(&mut kv, &format!("busy/{:x}", waiter.lease())).await;
    kv.lease_revoke(waiter.lease()).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered at once").unwrap();
    let Err(ClientError::Status(s)) = outcome else { panic!("the lock must not be granted") };
    assert_eq!(s.code(), tonic::Code::FailedPrecondition);
    assert_eq!(s.message(), "raftlock: the lease ended while waiting for the lock");

    let acquire = |name: &str, lease: i64, permits: u32| raftlock::proto::raftlock::v1::AcquireRequest {
        name: name.into(),
        lease,
        permits,
        ..Default::default()
    };
    let refused = |r: Result<tonic::Response<_>, tonic::Status>| {
        let s = r.map(|_: tonic::Response<raftlock::proto::raftlock::v1::AcquireResponse>| ()).unwrap_err();
        (s.code(), s.message().to_string())
    };
    let mut locks = c.locks();
    let (code, msg) = refused(locks.acquire(acquire("", holder.lease(), 0)).await);
    assert_eq!((code, msg.as_str()), (tonic::Code::InvalidArgument, "raftlock: lock name is not provided"));
    let (code, _) = refused(locks.acquire(acquire("x", 0, 0)).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    let (code, _) = refused(locks.acquire(acquire("x", holder.lease(), 5000)).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    let (code, msg) = refused(locks.acquire(acquire("x", 0x7777, 0)).await);
    assert_eq!((code, msg.as_str()), (tonic::Code::NotFound, "etcdserver: requested lease not found"));
    let bad_release = raftlock::proto::raftlock::v1::ReleaseRequest { key: b"busy/1".to_vec(), token: 0 };
    assert_eq!(locks.release(bad_release).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Nothing was lost, and the node still serves.
    assert_eq!(describe(&c, "busy", 1).await.holders[0].lease, holder.lease());
}

#[tokio::test]
async fn a_holder_process_killed_passes_the_lock_on_within_ttl_and_an_election_timeout() {
    const TTL: u64 = 2;
    let cluster = Cluster::start(3).await;
    let endpoint = cluster.members[0].endpoint();
    // In a process group of its own, so that its `sleep` can be cleaned up.
    let mut holder = common::raftlockctl()
        .args(["--endpoints", &endpoint, "lock", "cron", "--ttl", &TTL.to_string(), "--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = holder.id() as i32;
    let c = native(&cluster, 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while describe(&c, "cron", 1).await.holders.is_empty() {
        assert!(Instant::now() < deadline, "raftlockctl never took the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let session = c.session(30).await.unwrap();
    assert!(matches!(session.lock("cron", try_once()).await.unwrap(), Acquisition::Busy(_)));

    holder.kill().unwrap(); // SIGKILL: no release, no revoke; only the lease can end it.
    holder.wait().unwrap();
    let killed = Instant::now();
    let guard = held(session.lock("cron", LockOptions::default()).await.unwrap());
    let took = killed.elapsed();
    let bound = Duration::from_secs(TTL) + Duration::from_millis(ELECTION_MS) + Duration::from_millis(500);
    assert!(took <= bound, "the lock passed on after {took:?}, more than TTL + election timeout");
    assert!(guard.token() > 0);
    // The orphaned `sleep` child of the killed holder.
    unsafe { libc::kill(-group, libc::SIGKILL) };
}

#[tokio::test]
async fn leader_killed_during_contention_never_two_holders_and_every_waiter_served() {
    const CLIENTS: usize = 6;
    const ROUNDS: u64 = 6;
    let mut cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints();
    let holding = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = Client::connect(&endpoints).await.unwrap();
        let (holding, grants) = (holding.clone(), grants.clone());
        let kv_endpoints = endpoints.clone();
        tasks.push(tokio::spawn(async move {
            let session = client.session(10).await.unwrap();
            let kv = etcd_client::Client::connect(kv_endpoints, None).await.unwrap();
            for _ in 0..ROUNDS {
                let guard = acquire_retrying(&session).await;
                assert!(!holding.swap(true, Ordering::SeqCst), "two holders at once");
                // A read-modify-write guarded by the grant: no update may be lost.
                let n = retry(|| async { kv.clone().get("contended", None).await }).await;
                let n: u64 = n.kvs().first().map_or(0, |kv| kv.value_str().unwrap().parse().unwrap());
                tokio::time::sleep(Duration::from_millis(5)).await;
                let key = String::from_utf8(guard.key().to_vec()).unwrap();
                let txn = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, guard.token())])
                    .and_then([TxnOp::put("contended", (n + 1).to_string(), None)]);
                let put = retry(|| async { kv.clone().txn(txn.clone()).await }).await;
                assert!(put.succeeded(), "the grant ended while held");
                grants.fetch_add(1, Ordering::SeqCst);
                holding.store(false, Ordering::SeqCst);
                let (key, token) = (guard.key().to_vec(), guard.token());
                retry(|| async { client.release(&key, token).await }).await;
            }
        }));
    }
    // Let contention build, then kill the leader in the middle of it.
    while grants.load(Ordering::SeqCst) < 8 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leader = cluster.leader().await;
    cluster.kill(leader);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await.expect("every waiter is served").unwrap();
    }
    let survivor = (leader + 1) % 3;
    let mut kv = cluster.client(survivor).await;
    let total = kv.get("contended", None).await.unwrap().kvs()[0].value_str().unwrap().to_string();
    assert_eq!(total, (CLIENTS as u64 * ROUNDS).to_string(), "an update was lost");
}

/// Retry a request that failed because the cluster was between leaders.
async fn retry<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(mut f: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "still failing after 20 s: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Acquire, waiting as long as it takes; a failover interrupts the call, and
/// calling again with the same lease keeps the waiter's place.
async fn acquire_retrying(session: &Session) -> Guard {
    match retry(|| session.lock("contended-lock", LockOptions::default())).await {
        Acquisition::Held(g) => g,
        Acquisition::Busy(_) => unreachable!("waits without a limit"),
    }
}
