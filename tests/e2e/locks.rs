//! The etcd-compatible Lock and Election services on a real 3-member cluster,
//! driven by `etcd-client`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{grpc_error, Cluster};
use etcd_client::{Client, LockOptions, ProclaimOptions, ResignOptions};
use tonic::Code;

async fn lease(c: &mut Client, ttl: i64) -> i64 {
    c.lease_grant(ttl, None).await.unwrap().id()
}

async fn lock(c: &mut Client, name: &str, lease: i64) -> Result<Vec<u8>, etcd_client::Error> {
    c.lock(name, Some(LockOptions::new().with_lease(lease))).await.map(|r| r.key().to_vec())
}

async fn create_revision(c: &mut Client, key: &[u8]) -> i64 {
    c.get(key, None).await.unwrap().kvs()[0].create_revision()
}

#[tokio::test]
async fn mutual_exclusion_with_increasing_fencing_tokens() {
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 8;
    let cluster = Cluster::start(3).await;
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let mut c = cluster.client(i % 3).await;
        let tokens = tokens.clone();
        tasks.push(tokio::spawn(async move {
            let id = lease(&mut c, 30).await;
            for _ in 0..ROUNDS {
                let key = lock(&mut c, "counter-lock", id).await.unwrap();
                // Read-modify-write under the lock: an unlocked version loses updates.
                let n: u64 = match c.get("counter", None).await.unwrap().kvs().first() {
                    Some(kv) => kv.value_str().unwrap().parse().unwrap(),
                    None => 0,
                };
                let token = create_revision(&mut c, &key).await;
                tokens.lock().unwrap().push(token);
                tokio::time::sleep(Duration::from_millis(2)).await;
                c.put("counter", (n + 1).to_string(), None).await.unwrap();
                c.unlock(key).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut c = cluster.client(0).await;
    let total = c.get("counter", None).await.unwrap().kvs()[0].value_str().unwrap().to_string();
    assert_eq!(total, (CLIENTS * ROUNDS).to_string(), "an update was lost: two holders at once");
    let tokens = tokens.lock().unwrap().clone();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens must increase across holders: {tokens:?}");
}

#[tokio::test]
async fn waiters_are_served_in_fifo_order_and_a_dead_holder_passes_the_lock_on() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(1).await;
    let holder = lease(&mut c, 30).await;
    let held = lock(&mut c, "fifo", holder).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for name in ["first", "second", "third"] {
        let mut wc = cluster.client(2).await;
        let id = lease(&mut wc, 30).await;
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let key = lock(&mut wc, "fifo", id).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(100)).await;
            wc.unlock(key).await.unwrap();
        }));
        // Each waiter's key exists before the next one's is created.
        crate::common::wait_for_key(&mut c, &format!("fifo/{id:x}")).await;
    }
    assert!(order.lock().unwrap().is_empty(), "nobody gets a held lock");
    // The holder "dies": its lease is revoked, as expiry would do.
    c.lease_revoke(holder).await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(10), w).await.expect("every waiter is served").unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["first", "second", "third"]);
    assert!(c.get(held, None).await.unwrap().kvs().is_empty());
}

/// A waiter waits for the key queued just ahead of its own. When that key
/// goes while the lock is still held (its waiter's lease ended), the waiter
/// behind must wait for the next key ahead, not take the lock, and must be
/// served when that one is released; writes elsewhere meanwhile change
/// nothing.
#[tokio::test]
async fn a_waiter_whose_predecessor_leaves_waits_for_the_next_key_ahead() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    let holder = lease(&mut c, 60).await;
    let held = lock(&mut c, "chain", holder).await.unwrap();
    let mut waiters = Vec::new();
    let mut leases = Vec::new();
    for i in 0..3 {
        let mut wc = cluster.client(i % 3).await;
        let id = lease(&mut wc, 60).await;
        leases.push(id);
        waiters.push(tokio::spawn(async move { (lock(&mut wc, "chain", id).await, wc) }));
        crate::common::wait_for_key(&mut c, &format!("chain/{id:x}")).await;
    }
    // The middle waiter leaves; the last one now has the first ahead of it.
    c.lease_revoke(leases[1]).await.unwrap();
    let (left, _) =
        tokio::time::timeout(Duration::from_secs(5), waiters.remove(1)).await.expect("answered at once").unwrap();
    let (code, msg) = grpc_error(left.expect_err("a waiter whose lease ended must not get the lock"));
    assert_eq!((code, msg.as_str()), (Code::Unknown, "session: session is expired"));
    for i in 0..20 {
        c.put(format!("elsewhere/{i}"), "x", None).await.unwrap();
        c.delete(format!("elsewhere/{i}"), None).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "nobody gets a held lock");
    c.unlock(held).await.unwrap();
    let (first, mut fc) = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the first waiter is served")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiters[0].is_finished(), "the last waiter must wait for the first one's release");
    fc.unlock(first.unwrap()).await.unwrap();
    let (last, _) = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the last waiter is served once the first releases")
        .unwrap();
    assert_eq!(last.unwrap(), format!("chain/{:x}", leases[2]).into_bytes());
}

#[tokio::test]
async fn a_waiter_whose_lease_ends_gets_an_error_and_a_cancelled_waiter_leaves_no_key() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    let holder = lease(&mut c, 60).await;
    lock(&mut c, "busy", holder).await.unwrap();

    // Its lease is revoked while it waits: an error, never the lock.
    let doomed = lease(&mut c, 60).await;
    let mut wc = cluster.client(1).await;
    let waiting = tokio::spawn(async move { lock(&mut wc, "busy", doomed).await });
    crate::common::wait_for_key(&mut c, &format!("busy/{doomed:x}")).await;
    c.lease_revoke(doomed).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered at once").unwrap();
    let (code, msg) = grpc_error(outcome.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::Unknown, "session: session is expired"));

    // A waiter that gives up (its call is cancelled) removes its key.
    let quitter = lease(&mut c, 60).await;
    let mut qc = cluster.client(2).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(500), lock(&mut qc, "busy", quitter)).await;
    assert!(gave_up.is_err(), "the lock is held; the call waits");
    let key = format!("busy/{quitter:x}");
    let mut gone = false;
    for _ in 0..100 {
        if c.get(key.as_str(), None).await.unwrap().kvs().is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the cancelled waiter's key was left behind");

    // Unknown lease: etcd's Lock service passes the error through as Unknown.
    let (code, msg) = grpc_error(lock(&mut c, "busy", 777).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::Unknown, "etcdserver: requested lease not found"));
}

#[tokio::test]
async fn an_abandoned_lock_call_never_frees_a_place_granted_to_another_call_of_its_lease() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower().await;
    let mut c = cluster.client(leader).await;
    let holder = lease(&mut c, 60).await;
    let held = lock(&mut c, "shared", holder).await.unwrap();

    // A call of lease `both` makes its key through a follower and waits; a
    // second call of the same lease, through the leader, joins that place.
    let both = lease(&mut c, 60).await;
    let key = format!("shared/{both:x}");
    let mut fc = cluster.client(follower).await;
    let first = tokio::spawn(async move { lock(&mut fc, "shared", both).await });
    crate::common::wait_for_key(&mut c, &key).await;
    let mut sc = cluster.client(leader).await;
    let second = tokio::spawn(async move { lock(&mut sc, "shared", both).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The follower stops. Meanwhile the first call's client goes away, and
    // the holder unlocks: the second call is granted the place.
    cluster.pause(follower);
    first.abort();
    c.unlock(held).await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), second).await.expect("granted").unwrap().unwrap();
    assert_eq!(granted, key.as_bytes());
    let token = create_revision(&mut c, &granted).await;

    // The follower resumes and learns, together, that the first call's client
    // went away and that its turn came. Its cleanup must leave the place to
    // the call that was granted it.
    cluster.resume(follower);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kvs = c.get(key.as_str(), None).await.unwrap().kvs().to_vec();
    assert_eq!(kvs.first().map(|kv| kv.create_revision()), Some(token), "the granted place was removed");
    let other = lease(&mut c, 60).await;
    let mut oc = cluster.client(leader).await;
    let taken = tokio::time::timeout(Duration::from_secs(1), lock(&mut oc, "shared", other)).await;
    assert!(taken.is_err(), "another lease got the lock while lease {both:x} holds it");
}

#[tokio::test]
async fn elections_campaign_proclaim_observe_and_resign() {
    let cluster = Cluster::start(3).await;
    let mut a = cluster.client(0).await;
    let mut b = cluster.client(1).await;
    let (code, msg) = grpc_error(a.leader("pick").await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::Unknown, "election: no leader"));

    let la = lease(&mut a, 30).await;
    let lb = lease(&mut b, 30).await;
    let a_leads = a.campaign("pick", "a", la).await.unwrap().leader().unwrap().clone();
    assert_eq!(a.leader("pick").await.unwrap().kv().unwrap().value(), b"a");
    let mut observed = cluster.client(2).await.observe("pick").await.unwrap();
    assert_eq!(observed.message().await.unwrap().unwrap().kv().unwrap().value(), b"a");

    let b_campaign =
        tokio::spawn(async move { b.campaign("pick", "b", lb).await.map(|r| r.leader().unwrap().clone()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b_campaign.is_finished(), "b waits while a leads");

    a.proclaim("a2", Some(ProclaimOptions::new().with_leader(a_leads.clone()))).await.unwrap();
    assert_eq!(observed.message().await.unwrap().unwrap().kv().unwrap().value(), b"a2");
    a.resign(Some(ResignOptions::new().with_leader(a_leads.clone()))).await.unwrap();
    let b_leads = tokio::time::timeout(Duration::from_secs(5), b_campaign).await.unwrap().unwrap().unwrap();
    assert_eq!(observed.message().await.unwrap().unwrap().kv().unwrap().value(), b"b");
    assert!(b_leads.rev() > a_leads.rev());
    // a no longer leads.
    let (code, msg) =
        grpc_error(a.proclaim("late", Some(ProclaimOptions::new().with_leader(a_leads))).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::Unknown, "election: not leader"));
}
