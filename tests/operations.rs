//! Day-2 operations on real clusters of processes: the space quota and its
//! NOSPACE alarm (etcd's error, what still works, recovery by compact +
//! defrag + disarm, with etcdctl), auto compaction in both modes, and etcd's
//! request size limits on every service.

mod common;

use std::time::{Duration, Instant};

use common::Etcdctl;
use common::{grpc_error, Cluster};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use raftlock::proto::raftlock::v1::AcquireRequest;

const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";

/// A quota reached raises NOSPACE through the log: every member then refuses
/// puts, txns that put and lease grants with etcd's error, while reads,
/// deletions, delete-only txns, compaction and revocation still work; an
/// operator recovers as with etcd (compact, defrag, `etcdctl alarm disarm`).
#[tokio::test]
async fn a_full_quota_raises_nospace_and_compact_defrag_disarm_recover() {
    let cluster = Cluster::start_with(3, &["--quota-backend-bytes", "300000"]).await;
    let mut c = cluster.client(0).await;
    let lease = c.lease_grant(60, None).await.unwrap().id();
    let value = vec![b'x'; 10_000];
    let mut written = 0;
    let refused = loop {
        match c.put(format!("full/{written:03}"), value.clone(), None).await {
            Ok(_) => written += 1,
            Err(e) => break grpc_error(e),
        }
        assert!(written < 100, "300 kB of quota took {written} puts of 10 kB");
    };
    assert_eq!(refused, (tonic::Code::ResourceExhausted, NO_SPACE.to_string()));
    assert!((25..=30).contains(&written), "{written} puts of 10 kB fit a 300 kB quota");

    // The alarm is the cluster's: etcdctl sees it, and another member refuses too.
    let ctl = Etcdctl::v35(&cluster.endpoints().join(","));
    let alarms = ctl.ok(&["alarm", "list"]);
    assert!(alarms.contains("alarm:NOSPACE"), "etcdctl alarm list: {alarms}");
    let mut other = cluster.client(2).await;
    let status = other.status().await.unwrap();
    assert!(status.errors().iter().any(|e| e.contains("alarm:NOSPACE")), "status errors: {:?}", status.errors());
    assert_eq!(grpc_error(other.put("small", "1", None).await.unwrap_err()).1, NO_SPACE);
    assert_eq!(grpc_error(other.lease_grant(60, None).await.unwrap_err()).1, NO_SPACE);
    let put_txn = Txn::new().and_then([TxnOp::put("t", "1", None)]);
    assert_eq!(grpc_error(other.txn(put_txn).await.unwrap_err()).1, NO_SPACE);
    let ctl_put = ctl.run(&["put", "small", "1"], None);
    assert!(common::text(&ctl_put).contains("database space exceeded"), "{}", common::text(&ctl_put));

    // What frees space, or reads, still works.
    assert_eq!(other.get("full/000", None).await.unwrap().kvs()[0].value(), &value[..]);
    other.delete("full/000", None).await.unwrap();
    let delete_txn = Txn::new()
        .when([Compare::version("full/001", CompareOp::Greater, 0)])
        .and_then([TxnOp::delete("full/001", None)]);
    assert!(other.txn(delete_txn).await.unwrap().succeeded());
    other.lease_revoke(lease).await.unwrap();

    // Recovery: make room (delete, compact), defragment, disarm.
    let revision = other.delete("full/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    let revision = revision.header().unwrap().revision();
    ctl.ok(&["compact", &revision.to_string()]);
    ctl.ok(&["defrag"]);
    // Still raised until disarmed.
    assert_eq!(grpc_error(c.put("small", "1", None).await.unwrap_err()).1, NO_SPACE);
    let disarmed = ctl.ok(&["alarm", "disarm"]);
    assert!(disarmed.contains("alarm:NOSPACE"), "etcdctl alarm disarm: {disarmed}");
    assert_eq!(ctl.ok(&["alarm", "list"]).trim(), "");
    c.put("small", "1", None).await.unwrap();
    other.lease_grant(60, None).await.unwrap();

    // The alarm state survives restarts (it is replicated state): raise it
    // again, restart every member, and it still holds until disarmed.
    let mut cluster = cluster;
    for i in 0.. {
        if c.put(format!("again/{i}"), value.clone(), None).await.is_err() {
            break;
        }
    }
    for i in 0..3 {
        cluster.terminate(i);
    }
    for i in 0..3 {
        cluster.restart(i);
    }
    cluster.wait_ready().await;
    let mut c = cluster.client(1).await;
    assert_eq!(grpc_error(c.put("small", "2", None).await.unwrap_err()).1, NO_SPACE);
    assert!(ctl.ok(&["alarm", "list"]).contains("alarm:NOSPACE"));
}

/// Revision mode keeps a number of revisions, compacting on its own through
/// the leader.
#[tokio::test]
async fn revision_auto_compaction_keeps_the_last_revisions() {
    let revision_mode = Cluster::start_with(
        3,
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "10",
            "--auto-compaction-check-interval",
            "200ms",
        ],
    )
    .await;
    let mut c = revision_mode.client(1).await;
    let mut last = 0;
    for i in 0..40 {
        last = c.put("rev/k", format!("{i}"), None).await.unwrap().header().unwrap().revision();
    }
    // (A read at the compaction revision itself still works.)
    let compacted = wait_for_compaction(&mut c, "rev/k", last - 11).await;
    assert!(compacted <= last - 10, "revision mode compacted to {compacted}, past {last} - 10");
    let kept = c.get("rev/k", Some(GetOptions::new().with_revision(last - 10))).await.unwrap();
    assert_eq!(kept.kvs().len(), 1, "the last 10 revisions are kept");
}

/// Periodic mode keeps about a period of history (here a second).
#[tokio::test]
async fn periodic_auto_compaction_keeps_the_retention_period() {
    let periodic = Cluster::start_with(1, &["--auto-compaction-retention", "1s"]).await;
    let mut c = periodic.client(0).await;
    let first = c.put("per/k", "0", None).await.unwrap().header().unwrap().revision();
    let started = Instant::now();
    let mut latest = first;
    // Keep writing for a while: the compactor samples the revision as it goes.
    while started.elapsed() < Duration::from_millis(2500) {
        latest = c.put("per/k", "x", None).await.unwrap().header().unwrap().revision();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let compacted = wait_for_compaction(&mut c, "per/k", first + 1).await;
    assert!(compacted < latest, "periodic mode keeps the last second: compacted {compacted} of {latest}");
    let kept = c.get("per/k", Some(GetOptions::new().with_revision(latest - 1))).await.unwrap();
    assert_eq!(kept.kvs().len(), 1, "recent history is kept");
}

/// Wait until a read of `key` at `revision` is refused as compacted; returns
/// the compaction revision the refusal reports.
async fn wait_for_compaction(c: &mut etcd_client::Client, key: &str, revision: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let read = c.get(key, Some(GetOptions::new().with_revision(revision))).await;
        if let Err(e) = read {
            assert_eq!(grpc_error(e).1, "etcdserver: mvcc: required revision has been compacted");
            // A watch from revision 1 reports the compaction revision.
            let mut stream = c.watch(key, Some(etcd_client::WatchOptions::new().with_start_revision(1))).await.unwrap();
            loop {
                let r = stream.message().await.unwrap().unwrap();
                if r.compact_revision() > 0 {
                    return r.compact_revision();
                }
            }
        }
        assert!(Instant::now() < deadline, "revision {revision} of {key} was never compacted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// etcd's two size limits on every service that takes a request with data:
/// over 1.5 MiB, "request is too large"; over 2 MiB, gRPC's ResourceExhausted
/// in gRPC-Go's words. The member keeps serving.
#[tokio::test]
async fn oversized_requests_get_etcds_errors_on_every_service() {
    let cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    let too_large = (tonic::Code::InvalidArgument, "etcdserver: request is too large".to_string());
    let over_grpc = |n: usize| {
        let expected = format!("grpc: received message larger than max ({n} vs. 2097152)");
        move |got: (tonic::Code, String)| {
            assert_eq!(got.0, tonic::Code::ResourceExhausted, "{got:?}");
            // The size counted is the encoded message's, a few bytes over the value.
            let head = expected.split(" (").next().unwrap();
            assert!(got.1.starts_with(head) && got.1.ends_with("vs. 2097152)"), "{got:?}, expected like {expected}");
        }
    };
    let big = vec![b'v'; 1_600_000];
    let huge = vec![b'v'; 2_200_000];

    assert_eq!(grpc_error(c.put("k", big.clone(), None).await.unwrap_err()), too_large);
    over_grpc(huge.len())(grpc_error(c.put("k", huge.clone(), None).await.unwrap_err()));
    let txn = Txn::new().and_then([TxnOp::put("k", huge.clone(), None)]);
    over_grpc(huge.len())(grpc_error(c.txn(txn).await.unwrap_err()));

    let lease = c.lease_grant(60, None).await.unwrap().id();
    let mut lock = c.lock_client();
    let opts = Some(etcd_client::LockOptions::new().with_lease(lease));
    assert_eq!(grpc_error(lock.lock(big.clone(), opts.clone()).await.unwrap_err()), too_large);
    over_grpc(huge.len())(grpc_error(lock.lock(huge.clone(), opts).await.unwrap_err()));
    let mut election = c.election_client();
    assert_eq!(grpc_error(election.campaign("e", big.clone(), lease).await.unwrap_err()), too_large);
    over_grpc(huge.len())(grpc_error(election.campaign("e", huge.clone(), lease).await.unwrap_err()));

    let native = raftlock::client::Client::connect([cluster.members[0].endpoint()]).await.unwrap();
    let acquire = |name: Vec<u8>| AcquireRequest { name, lease, wait_ms: 0, ..Default::default() };
    let refused = native.locks().acquire(acquire(big.clone())).await.unwrap_err();
    assert_eq!((refused.code(), refused.message().to_string()), too_large);
    let refused = native.locks().acquire(acquire(huge.clone())).await.unwrap_err();
    over_grpc(huge.len())((refused.code(), refused.message().to_string()));

    // Nothing was lost, and the member serves on.
    c.put("k", "small", None).await.unwrap();
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"small");
}
