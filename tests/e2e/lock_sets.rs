//! Multi-locks and token validation on a real 3-member cluster, through the
//! crate's Rust client: a set taken all or none (a refused set leaves no
//! place behind), sessions taking overlapping sets in opposite orders
//! without deadlock and without two holders, bad sets refused; Validate
//! answering "current" only for the holding grant, and no longer once its
//! holder process was paused past its TTL or its member was killed.

use std::collections::HashSet;
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Cluster, ELECTION_MS};
use crate::native_locks::{held, native, try_once};
use raftlock::client::{Acquisition, Client, LockOptions, MultiAcquisition, MultiGuard};
use raftlock::proto::raftlock::v1 as pb;

fn all_held(a: MultiAcquisition) -> MultiGuard {
    match a {
        MultiAcquisition::Held(g) => g,
        MultiAcquisition::Busy { blocked_on, holders } => {
            panic!("expected the set, {} is held by {holders:?}", String::from_utf8_lossy(&blocked_on))
        }
    }
}

/// Every key under lock `name` (holders, waiters and hold counts).
async fn keys_of(c: &Client, name: &str) -> Vec<Vec<u8>> {
    let prefix = format!("{name}/").into_bytes();
    let mut end = prefix.clone();
    *end.last_mut().unwrap() += 1;
    let req = raftlock::proto::etcdserverpb::RangeRequest { key: prefix, range_end: end, ..Default::default() };
    c.kv().range(req).await.unwrap().into_inner().kvs.into_iter().map(|kv| kv.key).collect()
}

#[tokio::test]
async fn a_multi_lock_is_all_or_none_and_a_refused_one_leaves_nothing() {
    let cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let b = native(&cluster, 1).await;
    let sa = a.session(30).await.unwrap();
    let sb = b.session(30).await.unwrap();

    // One txn queues the set: one token, every lock held.
    let set = all_held(sa.lock_all(["orders", "stock"], try_once()).await.unwrap());
    let grants = set.grants();
    assert_eq!(grants.len(), 2);
    assert_eq!((grants[0].name.as_slice(), grants[1].name.as_slice()), (&b"orders"[..], &b"stock"[..]));
    assert_eq!(grants[0].key, format!("orders/{:x}", sa.lease()).into_bytes());
    assert_eq!(grants[0].token, grants[1].token, "one txn, one revision, one token");
    assert!(matches!(sb.lock("stock", try_once()).await.unwrap(), Acquisition::Busy(_)));

    // A set that overlaps a held one: refused at once, naming the lock in the
    // way and its holder; its place in the free lock is gone again.
    let MultiAcquisition::Busy { blocked_on, holders } = sb.lock_all(["ledger", "stock"], try_once()).await.unwrap()
    else {
        panic!("stock is held")
    };
    assert_eq!((blocked_on.as_slice(), holders[0].token), (&b"stock"[..], grants[1].token));
    assert!(keys_of(&b, "ledger").await.is_empty(), "a refused set keeps no place");

    // A wait that times out while one lock of the set held already: that one
    // is given back too.
    let started = Instant::now();
    let wait = LockOptions { wait: Some(Duration::from_millis(500)), ..Default::default() };
    let MultiAcquisition::Busy { blocked_on, .. } = sb.lock_all(["ledger", "orders"], wait).await.unwrap() else {
        panic!("orders is held")
    };
    assert!(started.elapsed() >= Duration::from_millis(500), "gave up before the wait ended");
    assert_eq!(blocked_on, b"orders");
    assert!(keys_of(&b, "ledger").await.is_empty(), "the place whose turn came was released");
    assert_eq!(keys_of(&b, "orders").await.len(), 1, "only the holder's place is left");

    // A waiting set is granted once the holder releases the whole set at once.
    let waiter = tokio::spawn(async move {
        let set = all_held(sb.lock_all(["stock", "orders", "ledger"], LockOptions::default()).await.unwrap());
        (sb, set)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    assert!(set.release().await.unwrap(), "both grants released");
    let (_sb, set_b) = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_eq!(set_b.grants().len(), 3);
    assert!(set_b.grants().iter().all(|g| g.token == set_b.grants()[0].token));

    // A lease queued for some of a set's locks on its own is refused, since
    // taking the rest later could deadlock; bad sets are refused; nothing
    // changed meanwhile.
    let single = held(sa.lock("audit", try_once()).await.unwrap());
    let e = sa.lock_all(["audit", "reports"], try_once()).await.err().unwrap();
    assert!(e.to_string().contains("already holds or waits for lock \"audit\""), "{e}");
    let refused = |names: Vec<&'static str>| {
        let sa = &sa;
        async move {
            match sa.lock_all(names, try_once()).await {
                Err(raftlock::client::ClientError::Status(s)) => (s.code(), s.message().to_string()),
                _ => panic!("a bad set must be refused"),
            }
        }
    };
    let (code, msg) = refused(vec!["x", "y", "x"]).await;
    assert_eq!((code, msg.as_str()), (tonic::Code::InvalidArgument, "raftlock: lock \"x\" is named twice"));
    let (code, msg) = refused(vec!["jobs", "jobs/nightly"]).await;
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(msg.contains("nested under lock \"jobs\""), "{msg}");
    let too_many: Vec<&'static str> = (0..65).map(|i| &*format!("n{i}").leak()).collect();
    assert_eq!(refused(too_many).await.0, tonic::Code::InvalidArgument);
    let reentrant = LockOptions { reentrant: true, ..try_once() };
    assert!(sa.lock_all(["p", "q"], reentrant).await.is_err());
    assert!(keys_of(&a, "reports").await.is_empty());
    assert!(set_b.release().await.unwrap());
    assert!(single.release().await.unwrap());
}

#[tokio::test]
async fn overlapping_sets_in_opposite_orders_never_deadlock_nor_share_a_lock() {
    const NAMES: [&str; 4] = ["a", "b", "c", "d"];
    const ROUNDS: usize = 8;
    let cluster = Cluster::start(3).await;
    // Which locks are held by a client at this moment, as the clients see it.
    let holding: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let mut clients = Vec::new();
    for i in 0..6 {
        let client = native(&cluster, i % 3).await;
        let holding = holding.clone();
        clients.push(tokio::spawn(async move {
            let session = client.session(30).await.unwrap();
            for round in 0..ROUNDS {
                // Sets of two or three, in rotating and reversed orders.
                let mut set: Vec<&'static str> = (0..2 + (i + round) % 2).map(|k| NAMES[(i + k + round) % 4]).collect();
                if (i + round) % 2 == 1 {
                    set.reverse();
                }
                let guard = all_held(session.lock_all(set.clone(), LockOptions::default()).await.unwrap());
                {
                    let mut holding = holding.lock().unwrap();
                    for name in &set {
                        assert!(holding.insert(name), "lock {name} held twice at once");
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                {
                    let mut holding = holding.lock().unwrap();
                    for name in &set {
                        holding.remove(name);
                    }
                }
                assert!(guard.release().await.unwrap());
            }
        }));
    }
    // A deadlock would stall them all: every client must finish.
    for c in clients {
        tokio::time::timeout(Duration::from_secs(60), c).await.expect("a multi-lock deadlocked").unwrap();
    }
}

#[tokio::test]
async fn a_set_whose_holder_member_is_killed_passes_on_within_ttl_and_an_election_timeout() {
    const TTL: i64 = 2;
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let (victim, other) = ((leader + 1) % 3, (leader + 2) % 3);
    let a = native(&cluster, victim).await;
    let sa = a.session(TTL).await.unwrap();
    let set = all_held(sa.lock_all(["east", "west"], try_once()).await.unwrap());
    let b = native(&cluster, other).await;
    let sb = b.session(30).await.unwrap();
    let waiter =
        tokio::spawn(async move { all_held(sb.lock_all(["west", "east"], LockOptions::default()).await.unwrap()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The holder's member dies: its session can renew its lease nowhere.
    cluster.kill(victim);
    let killed = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(30), waiter).await.unwrap().unwrap();
    let took = killed.elapsed();
    let bound = Duration::from_secs(TTL as u64 + 1) + Duration::from_millis(ELECTION_MS) + Duration::from_secs(1);
    assert!(took <= bound, "the set passed on after {took:?}");
    assert!(next.grants()[0].token > set.grants()[0].token, "a later grant has a greater token");
    // The old grant is not current anywhere any more; the new one is.
    let v = b.validate(&set.grants()[0].key, set.grants()[0].token, 1).await.unwrap();
    assert!(!v.current && v.current_token == 0, "{v:?}");
    let v = b.validate(&next.grants()[0].key, next.grants()[0].token, 1).await.unwrap();
    assert!(v.current && v.ttl > 0, "{v:?}");
}

#[tokio::test]
async fn validate_is_current_only_for_the_holding_grant_and_ends_with_a_paused_holder() {
    const TTL: u64 = 2;
    let cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let b = native(&cluster, 1).await;
    let sa = a.session(30).await.unwrap();
    let sb = b.session(30).await.unwrap();
    let guard = held(sa.lock("vault", try_once()).await.unwrap());
    let v = b.validate(guard.key(), guard.token(), 1).await.unwrap();
    assert!(v.current, "{v:?}");
    assert_eq!((v.current_token, v.lease), (guard.token(), sa.lease()));
    assert!(v.ttl > 0 && v.ttl <= 30);
    assert!(guard.is_current(1).await.unwrap());
    // A stale token for the same key is not current, and says the current one.
    let v = b.validate(guard.key(), guard.token() - 1, 1).await.unwrap();
    assert!(!v.current && v.current_token == guard.token());

    // A waiter's key exists but does not hold.
    let waiter = tokio::spawn(async move { held(sb.lock("vault", LockOptions::default()).await.unwrap()) });
    let waiter_key = format!("vault/{:x}", {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let d = a
                .locks()
                .describe(pb::DescribeRequest { name: b"vault".to_vec(), permits: 1, ..Default::default() })
                .await
                .unwrap();
            if let Some(w) = d.into_inner().waiters.first() {
                break w.lease;
            }
            assert!(Instant::now() < deadline, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let range =
        raftlock::proto::etcdserverpb::RangeRequest { key: waiter_key.clone().into_bytes(), ..Default::default() };
    let waiter_token = a.kv().range(range).await.unwrap().into_inner().kvs[0].create_revision;
    let v = a.validate(waiter_key.as_bytes(), waiter_token, 1).await.unwrap();
    assert!(!v.current && v.current_token == waiter_token, "a waiter is not current: {v:?}");
    // As a semaphore of two, it would hold.
    assert!(a.validate(waiter_key.as_bytes(), waiter_token, 2).await.unwrap().current);

    // Released: the old grant is gone, the next one is current.
    assert!(guard.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert!(!a.validate(b"vault/1", 1, 1).await.unwrap().current);
    let v = a.validate(next.key(), next.token(), 1).await.unwrap();
    assert!(v.current);
    let v = a.validate(format!("vault/{:x}", sa.lease()).as_bytes(), 5, 1).await.unwrap();
    assert!(!v.current && v.current_token == 0 && v.ttl == -1);
    assert!(next.release().await.unwrap());

    // A holder process paused past its TTL: its grant stops being current,
    // the lock passes on, and once resumed it learns it lost the lock and
    // stops its command.
    let endpoint = cluster.members[2].endpoint();
    let holder = crate::common::raftlockctl()
        .args(["--endpoints", &endpoint, "-w", "json", "lock", "vault", "--ttl", &TTL.to_string()])
        .args(["--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = holder.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (key, token) = loop {
        let d = a
            .locks()
            .describe(pb::DescribeRequest { name: b"vault".to_vec(), permits: 1, ..Default::default() })
            .await
            .unwrap();
        if let Some(h) = d.into_inner().holders.first() {
            break (h.key.clone(), h.token);
        }
        assert!(Instant::now() < deadline, "raftlockctl never took the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(a.validate(&key, token, 1).await.unwrap().current);
    unsafe { libc::kill(holder.id() as i32, libc::SIGSTOP) };
    let paused = Instant::now();
    let sc = a.session(30).await.unwrap();
    let taker = held(sc.lock("vault", LockOptions::default()).await.unwrap());
    let took = paused.elapsed();
    let bound = Duration::from_secs(TTL) + Duration::from_millis(ELECTION_MS) + Duration::from_secs(1);
    assert!(took <= bound, "the lock passed on after {took:?}");
    let v = b.validate(&key, token, 1).await.unwrap();
    assert!(!v.current && v.current_token == 0, "the paused holder's grant is not current: {v:?}");
    assert!(b.validate(taker.key(), taker.token(), 1).await.unwrap().current);
    unsafe { libc::kill(holder.id() as i32, libc::SIGCONT) };
    let status = tokio::task::spawn_blocking(move || holder.wait_with_output()).await.unwrap().unwrap();
    assert!(!status.status.success(), "a holder that lost its lock fails");
    assert!(String::from_utf8_lossy(&status.stderr).contains("lost"), "{}", String::from_utf8_lossy(&status.stderr));
    unsafe { libc::kill(-group, libc::SIGKILL) };

    // Bad input: a key with no lock name is refused; the node still serves.
    let e = a.validate(b"nolock", 1, 1).await.unwrap_err();
    assert!(e.to_string().contains("not a lock's owner key"), "{e}");
    assert!(a.validate(taker.key(), taker.token(), 1).await.unwrap().current);
}
