//! raftlock's native lock API (`raftlock.v1.Locks`) on a real 3-member
//! cluster, through the crate's Rust client: try-lock and wait timeouts that
//! answer with the holder, fenced release and fenced writes, semaphores,
//! describe and list, a waiter whose lease ends, a holder process killed -9,
//! and a leader killed -9 while clients contend; read-write locks (shared
//! readers, excluded writers and etcd locks, a waiting writer not starved,
//! readers killed, a leader killed during contention) and reentrant holds.

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Cluster, ELECTION_MS};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use raftlock::client::{Acquisition, Client, ClientError, Guard, LockOptions, Session};

/// A Rust client of member `i` alone (shared with the other lock modules).
pub(crate) async fn native(cluster: &Cluster, i: usize) -> Client {
    Client::connect([cluster.members[i].endpoint()]).await.unwrap()
}

pub(crate) fn try_once() -> LockOptions {
    LockOptions { wait: Some(Duration::ZERO), ..Default::default() }
}

pub(crate) fn held(a: Acquisition) -> Guard {
    match a {
        Acquisition::Held(g) => g,
        Acquisition::Busy(h) => panic!("expected the lock, it is held by {h:?}"),
    }
}

async fn describe(c: &Client, name: &str, permits: u32) -> raftlock::proto::raftlock::v1::DescribeResponse {
    let req = raftlock::proto::raftlock::v1::DescribeRequest { name: name.into(), permits, ..Default::default() };
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
    let req =
        raftlock::proto::raftlock::v1::ReleaseRequest { key: key.clone(), token: old_token, ..Default::default() };
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
        crate::common::wait_for_key(&mut kv, &key).await;
    }
    let d = describe(&c, "gpu", 3).await;
    assert_eq!((d.holders.len(), d.waiters.len(), d.more), (3, 2, false));
    assert_eq!(d.waiters[0].lease, sessions[3].lease());
    // Waiters a page at a time: every holder each time, the waiters after
    // the last token seen, and `more` until the last.
    let page = |limit, waiters_after| raftlock::proto::raftlock::v1::DescribeRequest {
        name: b"gpu".to_vec(),
        permits: 3,
        limit,
        waiters_after,
        ..Default::default()
    };
    let first = c.locks().describe(page(1, 0)).await.unwrap().into_inner();
    assert_eq!((first.holders.len(), first.waiters.len(), first.more), (3, 1, true));
    assert_eq!(first.waiters[0].token, d.waiters[0].token);
    let second = c.locks().describe(page(1, first.waiters[0].token)).await.unwrap().into_inner();
    assert_eq!((second.holders.len(), second.waiters.len(), second.more), (3, 1, false));
    assert_eq!(second.waiters[0].token, d.waiters[1].token);
    let past = c.locks().describe(page(5, second.waiters[0].token)).await.unwrap().into_inner();
    assert_eq!((past.holders.len(), past.waiters.len(), past.more), (3, 0, false));

    // One permit comes free: the first waiter gets it, the second still waits.
    assert!(guards.remove(1).release().await.unwrap());
    let fourth = tokio::time::timeout(Duration::from_secs(5), waiting.remove(0)).await.unwrap().unwrap();
    assert_eq!(fourth.key(), format!("gpu/{:x}", sessions[3].lease()).as_bytes());
    // Deletions beside the semaphore's keys (a name that shares its first
    // letters, the bare name, another semaphore's key) free no permit.
    for key in ["gpux/1", "gpu", "cpu/1"] {
        kv.put(key, "x", None).await.unwrap();
        kv.delete(key, None).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting[0].is_finished(), "only one permit came free");
    let d = describe(&c, "gpu", 3).await;
    assert_eq!((d.holders.len(), d.waiters.len()), (3, 1));

    // Describe shows every owner's lease TTL; List shows the semaphore.
    assert!(d.holders.iter().all(|h| h.granted_ttl == 30 && (0..=30).contains(&h.ttl)), "{:?}", d.holders);
    let req = raftlock::proto::raftlock::v1::ListRequest { prefix: b"g".to_vec(), permits: 3, ..Default::default() };
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
    crate::common::wait_for_key(&mut kv, &format!("busy/{:x}", waiter.lease())).await;
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
    let bad_release =
        raftlock::proto::raftlock::v1::ReleaseRequest { key: b"busy/1".to_vec(), token: 0, ..Default::default() };
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
    let mut holder = crate::common::raftlockctl()
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

fn read_once() -> LockOptions {
    LockOptions { read: true, ..try_once() }
}

fn busy(a: Acquisition) -> Vec<raftlock::proto::raftlock::v1::Owner> {
    match a {
        Acquisition::Busy(holders) => holders,
        Acquisition::Held(g) => panic!("expected the lock to be busy, got token {}", g.token()),
    }
}

const READ: i32 = raftlock::proto::raftlock::v1::Mode::Read as i32;
const WRITE: i32 = raftlock::proto::raftlock::v1::Mode::Write as i32;

#[tokio::test]
async fn readers_share_writers_exclude_and_a_waiting_writer_holds_back_later_readers() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    let mut kv = cluster.client(1).await;
    let mut sessions = Vec::new();
    for i in 0..4 {
        sessions.push(Arc::new(native(&cluster, i % 3).await.session(30).await.unwrap()));
    }
    let (r1, r2, w, r3) = (&sessions[0], &sessions[1], sessions[2].clone(), sessions[3].clone());

    // Two readers hold at once, each with a token of its own.
    let g1 = held(r1.lock("catalog", read_once()).await.unwrap());
    let g2 = held(r2.lock("catalog", read_once()).await.unwrap());
    assert_eq!(g1.key(), format!("catalog/read-{:x}", r1.lease()).as_bytes());
    assert!(g2.token() > g1.token());

    // A writer cannot: it is told both readers hold.
    let holders = busy(w.lock("catalog", try_once()).await.unwrap());
    assert_eq!(holders.iter().map(|h| (h.token, h.mode)).collect::<Vec<_>>(), [(g1.token(), READ), (g2.token(), READ)]);
    // Nor can etcd's Lock on the same name (it queues as a writer).
    let mut etcd = cluster.client(2).await;
    let etcd_lease = etcd.lease_grant(30, None).await.unwrap().id();
    let options = etcd_client::LockOptions::new().with_lease(etcd_lease);
    let etcd_lock = tokio::time::timeout(Duration::from_millis(500), etcd.lock("catalog", Some(options))).await;
    assert!(etcd_lock.is_err(), "etcd's Lock must wait while readers hold");

    // The writer queues; a reader that comes after it waits behind it.
    let writing = tokio::spawn(async move { held(w.lock("catalog", LockOptions::default()).await.unwrap()) });
    crate::common::wait_for_key(&mut kv, &format!("catalog/{:x}", sessions[2].lease())).await;
    let holders = busy(r3.lock("catalog", read_once()).await.unwrap());
    assert_eq!(holders.len(), 2, "the readers hold, not the waiting writer");
    let reading = {
        let r3 = r3.clone();
        tokio::spawn(async move {
            held(r3.lock("catalog", LockOptions { read: true, ..Default::default() }).await.unwrap())
        })
    };
    crate::common::wait_for_key(&mut kv, &format!("catalog/read-{:x}", r3.lease())).await;
    let d = describe(&c, "catalog", 1).await;
    let modes =
        |owners: &[raftlock::proto::raftlock::v1::Owner]| owners.iter().map(|o| (o.lease, o.mode)).collect::<Vec<_>>();
    assert_eq!(modes(&d.holders), [(r1.lease(), READ), (r2.lease(), READ)]);
    assert_eq!(modes(&d.waiters), [(sessions[2].lease(), WRITE), (r3.lease(), READ)]);

    // The writer gets the lock when the last reader lets go, and only then.
    assert!(g1.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished(), "one reader still holds");
    let g2_token = g2.token();
    assert!(g2.release().await.unwrap());
    let wg = tokio::time::timeout(Duration::from_secs(5), writing).await.expect("the writer is granted").unwrap();
    assert!(wg.token() > g2_token);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reading.is_finished(), "a reader waits while the writer holds");
    assert!(busy(sessions[0].lock("catalog", read_once()).await.unwrap())[0].token == wg.token());

    // The writer done, the reader behind it holds, with a later token.
    let wg_token = wg.token();
    assert!(wg.release().await.unwrap());
    let rg = tokio::time::timeout(Duration::from_secs(5), reading).await.expect("the reader is granted").unwrap();
    assert!(rg.token() > wg_token);
    // List sees a lock held by a reader.
    let req = raftlock::proto::raftlock::v1::ListRequest { prefix: b"cat".to_vec(), permits: 1, ..Default::default() };
    let list = c.locks().list(req).await.unwrap().into_inner();
    assert_eq!(list.locks.len(), 1);
    assert_eq!((list.locks[0].holders[0].mode, list.locks[0].waiters), (READ, 0));
}

#[tokio::test]
async fn reentrant_acquires_count_holds_and_the_last_release_releases() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    let mut kv = cluster.client(1).await;
    let s = c.session(30).await.unwrap();
    let other = native(&cluster, 2).await.session(30).await.unwrap();
    let reentrant = LockOptions { reentrant: true, ..try_once() };

    let first = held(s.lock("jobs", try_once()).await.unwrap());
    assert_eq!(first.holds(), 1);
    let second = held(s.lock("jobs", reentrant.clone()).await.unwrap());
    assert_eq!((second.key(), second.token(), second.holds()), (first.key(), first.token(), 2));
    // A plain acquire (a retry, say) answers with the grant and adds nothing.
    let again = held(s.lock("jobs", try_once()).await.unwrap());
    assert_eq!((again.token(), again.holds()), (first.token(), 2));
    let d = describe(&c, "jobs", 1).await;
    assert_eq!((d.holders.len(), d.holders[0].holds, d.waiters.len()), (1, 2, 0), "the count is not a waiter");
    let count_key = format!("jobs/{:x}.holds", s.lease());
    let count = kv.get(count_key.as_str(), None).await.unwrap();
    assert_eq!((count.kvs()[0].value_str().unwrap(), count.kvs()[0].lease()), ("2", s.lease()));
    busy(other.lock("jobs", try_once()).await.unwrap());

    // Acquires by the holder that are cancelled mid-flight (deadlines of 0.1
    // to 2 ms, about a write's time) never release what the lease holds.
    for i in 0..64 {
        let req = raftlock::proto::raftlock::v1::AcquireRequest {
            name: b"jobs".to_vec(),
            lease: s.lease(),
            wait_ms: 0,
            ..Default::default()
        };
        let mut req = tonic::Request::new(req);
        req.set_timeout(Duration::from_micros(100 + 30 * i));
        let _ = c.locks().acquire(req).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = describe(&c, "jobs", 1).await;
    assert_eq!((d.holders[0].token, d.holders[0].holds), (first.token(), 2), "cancelled acquires took nothing");
    busy(other.lock("jobs", try_once()).await.unwrap());

    // One release gives one hold back; the lock stays held.
    let release = |token| raftlock::proto::raftlock::v1::ReleaseRequest {
        key: first.key().to_vec(),
        token,
        ..Default::default()
    };
    let r = c.locks().release(release(first.token())).await.unwrap().into_inner();
    assert_eq!((r.released, r.holds), (true, 1));
    busy(other.lock("jobs", try_once()).await.unwrap());
    assert!(kv.get(count_key.as_str(), None).await.unwrap().kvs().is_empty(), "one hold needs no count");
    // A release with another token changes nothing.
    let r = c.locks().release(release(first.token() - 1)).await.unwrap().into_inner();
    assert_eq!((r.released, r.current_token), (false, first.token()));
    // The last release releases the lock.
    let r = c.locks().release(release(first.token())).await.unwrap().into_inner();
    assert_eq!((r.released, r.holds), (true, 0));
    let theirs = held(other.lock("jobs", try_once()).await.unwrap());
    let r = c.locks().release(release(first.token())).await.unwrap().into_inner();
    assert_eq!((r.released, r.current_token), (false, 0), "a release after the last changes nothing");

    // A lease holds a lock in one mode at a time.
    let refused = other.lock("jobs", read_once()).await.err().expect("the lease holds it for writing");
    let ClientError::Status(status) = refused else { panic!("{refused}") };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status.message(), "raftlock: the lease already holds or waits for the lock in write mode");
    let req = raftlock::proto::raftlock::v1::AcquireRequest {
        name: b"jobs".to_vec(),
        lease: other.lease(),
        permits: 3,
        mode: READ,
        ..Default::default()
    };
    let status = c.locks().acquire(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(theirs.release().await.unwrap());

    // Reentrant reads count too, and a lease's end takes every hold at once.
    let shared = LockOptions { reentrant: true, ..read_once() };
    for holds in 1..=3 {
        assert_eq!(held(s.lock("reports", shared.clone()).await.unwrap()).holds(), holds);
    }
    assert_eq!(describe(&c, "reports", 1).await.holders[0].holds, 3);
    kv.lease_revoke(s.lease()).await.unwrap();
    let left = kv.get("reports/", Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    assert!(left.kvs().is_empty(), "the owner key and its count end with the lease");
    held(other.lock("reports", try_once()).await.unwrap());
}

#[tokio::test]
async fn readers_killed_pass_the_lock_to_a_writer_within_ttl() {
    const TTL: u64 = 2;
    let cluster = Cluster::start(3).await;
    let endpoint = cluster.members[0].endpoint();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let reader = crate::common::raftlockctl()
            .args([
                "--endpoints",
                &endpoint,
                "lock",
                "--read",
                "backup",
                "--ttl",
                &TTL.to_string(),
                "--",
                "sleep",
                "600",
            ])
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        readers.push(reader);
    }
    let c = native(&cluster, 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while describe(&c, "backup", 1).await.holders.len() < 2 {
        assert!(Instant::now() < deadline, "the two raftlockctl readers never held the lock together");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let session = c.session(30).await.unwrap();
    busy(session.lock("backup", try_once()).await.unwrap());
    for reader in &mut readers {
        reader.kill().unwrap();
        reader.wait().unwrap();
    }
    let killed = Instant::now();
    held(session.lock("backup", LockOptions::default()).await.unwrap());
    let took = killed.elapsed();
    let bound = Duration::from_secs(TTL) + Duration::from_millis(ELECTION_MS) + Duration::from_millis(500);
    assert!(took <= bound, "the lock passed on after {took:?}, more than TTL + election timeout");
    for reader in &readers {
        unsafe { libc::kill(-(reader.id() as i32), libc::SIGKILL) };
    }
}

#[tokio::test]
async fn leader_killed_while_readers_and_writers_contend_keeps_them_exclusive_and_serves_every_writer() {
    const READERS: usize = 4;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 8;
    let mut cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints();
    // Readers holding now, or -1 while a writer holds.
    let state = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let most_readers = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let writers_done = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for i in 0..READERS + WRITERS {
        let client = Client::connect(&endpoints).await.unwrap();
        let (state, most_readers, writes, writers_done) =
            (state.clone(), most_readers.clone(), writes.clone(), writers_done.clone());
        let read = i < READERS;
        let task = tokio::spawn(async move {
            let session = client.session(10).await.unwrap();
            let options = LockOptions { read, ..Default::default() };
            let mut round = 0;
            // Readers keep coming until every writer is done: a writer that
            // readers could starve would never finish.
            while if read { writers_done.load(Ordering::SeqCst) < WRITERS as u64 } else { round < ROUNDS } {
                round += 1;
                let guard = match retry(|| session.lock("rw-contended", options.clone())).await {
                    Acquisition::Held(g) => g,
                    Acquisition::Busy(_) => unreachable!("waits without a limit"),
                };
                if read {
                    let now = state.fetch_add(1, Ordering::SeqCst);
                    assert!(now >= 0, "a reader holds while a writer does");
                    most_readers.fetch_max(now as u64 + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    state.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let was = state.swap(-1, Ordering::SeqCst);
                    assert_eq!(was, 0, "a writer holds while {was} other holder(s) do");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    state.store(0, Ordering::SeqCst);
                    writes.fetch_add(1, Ordering::SeqCst);
                }
                let (key, token) = (guard.key().to_vec(), guard.token());
                retry(|| async { client.release(&key, token).await }).await;
            }
            if !read {
                writers_done.fetch_add(1, Ordering::SeqCst);
            }
        });
        if read {
            readers.push(task)
        } else {
            writers.push(task)
        }
    }
    while writes.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leader = cluster.leader().await;
    cluster.kill(leader);
    // The first task to fail an assertion fails the test at once.
    let all = futures::future::try_join_all(writers.into_iter().chain(readers));
    tokio::time::timeout(Duration::from_secs(90), all).await.expect("every writer is served").unwrap();
    assert_eq!(writes.load(Ordering::SeqCst), (WRITERS * ROUNDS) as u64);
    assert!(most_readers.load(Ordering::SeqCst) >= 2, "readers never shared the lock");
}
