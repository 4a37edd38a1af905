//! Day-2 operations on real clusters of processes: the space quota and its
//! NOSPACE alarm (etcd's error, what still works, recovery by compact +
//! defrag + disarm, with etcdctl), auto compaction in both modes, and etcd's
//! request size limits on every service.

use std::time::{Duration, Instant};

use crate::common::Etcdctl;
use crate::common::{grpc_error, http_get, Cluster};
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
    assert!(crate::common::text(&ctl_put).contains("database space exceeded"), "{}", crate::common::text(&ctl_put));

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
        cluster.restart(i).expect("restart");
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

/// One watch stream holds at most 10,000 watchers: one more is created and
/// canceled at once with a reason, and the stream and its watchers go on.
#[tokio::test]
async fn one_watch_stream_holds_a_bounded_number_of_watchers() {
    let cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    let mut stream = c.watch("w/0", None).await.unwrap();
    for i in 1..=10_000 {
        stream.watch(format!("w/{i}"), None).await.unwrap();
    }
    let mut created = 0;
    let refused = loop {
        let resp = stream.message().await.unwrap().expect("the stream is open");
        if resp.canceled() {
            break resp;
        }
        assert!(resp.created());
        created += 1;
    };
    assert_eq!(created, 10_000);
    assert!(refused.created() && refused.watch_id() == -1, "{refused:?}");
    assert_eq!(refused.cancel_reason(), "etcdserver: too many watchers on this stream (at most 10000)");
    // The watchers there are still deliver.
    c.put("w/9999", "v", None).await.unwrap();
    let resp = stream.message().await.unwrap().unwrap();
    assert_eq!(resp.events()[0].kv().unwrap().key(), b"w/9999");
}

/// A physical compaction returns once the compacted history is gone from
/// the member: the space counted has fallen by then.
#[tokio::test]
async fn a_physical_compaction_waits_for_the_history_to_go() {
    let cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    let value = vec![b'v'; 10_000];
    for _ in 0..20 {
        for k in 0..50 {
            c.put(format!("h/{k}"), value.clone(), None).await.unwrap();
        }
    }
    let size = |s: etcd_client::StatusResponse| s.raft_used_db_size();
    let before = size(c.status().await.unwrap());
    assert!(before > 20 * 50 * 10_000, "{before}");
    let rev = c.get("h/0", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();
    let after = size(c.status().await.unwrap());
    assert!(after < 50 * 10_000 + 50 * 1_000, "only the last version of each key is counted: {after}");
}

/// One sample of a Prometheus text exposition: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parse the text format (the subset every Prometheus encoder writes).
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a value: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("closed labels: {line}"));
                let labels = body
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|pair| {
                        let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("a label: {line}"));
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "a metric name: {line}");
        samples.push((name.to_string(), labels, value));
    }
    samples
}

/// The value of the sample named `name` whose labels include `labels`.
fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v)))
        .map(|(_, _, v)| *v)
}

/// `/metrics` on the client port and on `--listen-metrics-urls` parses as
/// Prometheus text with etcd's names and labels and values that follow what
/// happened; `/health`, `/livez` and `/readyz` answer as etcd's.
#[tokio::test]
async fn metrics_and_health_endpoints_answer_as_etcds() {
    let metrics_port = crate::common::free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let single = Cluster::start_with(1, &["--listen-metrics-urls", &metrics_url]).await;
    let mut c = single.client(0).await;
    c.put("m/k", "v0", None).await.unwrap();
    // The overwrite moves the first value to the history spill.
    let revision = c.put("m/k", "v", None).await.unwrap().header().unwrap().revision();
    c.get("m/k", None).await.unwrap();
    assert!(c.lease_revoke(12345).await.is_err(), "an unknown lease");
    let lease = c.lease_grant(60, None).await.unwrap().id();
    c.lock("m/lock", Some(etcd_client::LockOptions::new().with_lease(lease))).await.unwrap();
    // Leases: one renewed, one revoked, one left to expire.
    let (mut keeper, mut kept) = c.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    assert!(kept.message().await.unwrap().unwrap().ttl() > 0);
    let revoked = c.lease_grant(60, None).await.unwrap().id();
    c.lease_revoke(revoked).await.unwrap();
    c.lease_grant(1, None).await.unwrap();

    // The state store commits what apply wrote a moment later (its writer
    // gathers batches): wait for the first commit to be timed, and for the
    // short lease to expire.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let samples = parse_metrics(&http_get(&metrics_url, "/metrics").await.1);
        if sample(&samples, "etcd_disk_backend_commit_duration_seconds_count", &[]).unwrap_or(0.0) >= 1.0
            && sample(&samples, "raftlock_lease_expired_total", &[]).unwrap_or(0.0) >= 1.0
        {
            break;
        }
        assert!(Instant::now() < deadline, "the state store never committed, or the lease never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for endpoint in [single.members[0].endpoint(), metrics_url.clone()] {
        let (status, text) = http_get(&endpoint, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        let samples = parse_metrics(&text);
        let value = |name: &str, labels: &[(&str, &str)]| {
            sample(&samples, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in:\n{text}"))
        };
        assert_eq!(value("etcd_server_has_leader", &[]), 1.0);
        assert_eq!(value("etcd_server_is_leader", &[]), 1.0);
        assert!(value("etcd_server_leader_changes_seen_total", &[]) >= 1.0);
        assert!(value("etcd_debugging_mvcc_current_revision", &[]) >= revision as f64);
        assert!(value("etcd_debugging_mvcc_keys_total", &[]) >= 2.0, "m/k and the lock's key");
        assert!(value("etcd_mvcc_put_total", &[]) >= 1.0);
        assert!(value("etcd_mvcc_range_total", &[]) >= 1.0);
        assert!(value("etcd_mvcc_txn_total", &[]) >= 1.0, "the lock's txn");
        assert!(value("etcd_mvcc_db_total_size_in_use_in_bytes", &[]) > 0.0);
        assert_eq!(value("etcd_server_quota_backend_bytes", &[]), 2147483648.0);
        assert!(value("etcd_server_proposals_applied_total", &[]) >= 3.0);
        assert!(value("etcd_disk_wal_fsync_duration_seconds_count", &[]) >= 1.0);
        assert!(value("etcd_disk_wal_fsync_duration_seconds_bucket", &[("le", "0.001")]) >= 0.0);
        assert!(value("etcd_disk_backend_commit_duration_seconds_count", &[]) >= 1.0);
        let put = [("grpc_type", "unary"), ("grpc_service", "etcdserverpb.KV"), ("grpc_method", "Put")];
        assert!(value("grpc_server_started_total", &put) >= 1.0);
        assert!(value("grpc_server_handled_total", &[put[0], put[1], put[2], ("grpc_code", "OK")]) >= 1.0);
        assert!(value("grpc_server_msg_received_total", &put) >= 1.0);
        assert!(value("grpc_server_msg_sent_total", &put) >= 1.0);
        let revoke =
            [("grpc_service", "etcdserverpb.Lease"), ("grpc_method", "LeaseRevoke"), ("grpc_code", "NotFound")];
        assert_eq!(value("grpc_server_handled_total", &revoke), 1.0);
        assert!(value("grpc_server_handling_seconds_count", &put) >= 1.0);
        assert!(value("grpc_server_handling_seconds_bucket", &[put[0], put[1], put[2], ("le", "+Inf")]) >= 1.0);
        assert_eq!(value("etcd_debugging_lease_granted_total", &[]), 3.0);
        assert_eq!(value("etcd_debugging_lease_revoked_total", &[]), 2.0, "one revoked, one expired");
        assert_eq!(value("raftlock_lease_expired_total", &[]), 1.0);
        assert!(value("etcd_debugging_lease_renewed_total", &[]) >= 1.0);
        assert_eq!(value("raftlock_lease_expiries_overdue", &[]), 0.0);
        assert_eq!(value("raftlock_alarms", &[("alarm", "NOSPACE")]), 0.0);
        assert_eq!(value("raftlock_lock_grant_duration_seconds_count", &[("api", "v3lock")]), 1.0);
        assert_eq!(value("raftlock_lock_holders", &[]), 1.0);
        assert_eq!(value("raftlock_lock_waiters", &[]), 0.0);
        // A lone member leads: it proposes every write and forwards none.
        let proposed = value("raftlock_proposal_batch_commands_count", &[]);
        assert!(proposed >= 1.0, "entries proposed: {proposed}");
        // Two puts, a lease grant and a lock's txn, one after the other.
        assert!(value("raftlock_proposal_batch_commands_sum", &[]) >= 4.0);
        assert_eq!(value("raftlock_forwarded_batch_commands_count", &[]), 0.0);
        assert!(value("raftlock_history_spill_bytes", &[]) >= 34.0, "m/k's first version: 32 bytes and its value");
        assert!(value("process_resident_memory_bytes", &[]) > 0.0);
    }
    // The metrics port serves no gRPC.
    let mut on_metrics = etcd_client::Client::connect([metrics_url.as_str()], None).await.unwrap();
    assert_eq!(grpc_error(on_metrics.get("m/k", None).await.unwrap_err()).0, tonic::Code::Unimplemented);

    // Health: fine, then NOSPACE (unless excluded).
    let endpoint = single.members[0].endpoint();
    assert_eq!(http_get(&endpoint, "/health").await, (200, r#"{"health":"true","reason":""}"#.to_string()));
    assert_eq!(http_get(&endpoint, "/livez").await, (200, "ok\n".to_string()));
    assert_eq!(http_get(&endpoint, "/readyz").await, (200, "ok\n".to_string()));
    let verbose = http_get(&endpoint, "/readyz?verbose").await;
    assert_eq!(verbose.0, 200);
    assert!(verbose.1.contains("[+]linearizable_read ok\n") && verbose.1.ends_with("ok\n"), "{}", verbose.1);
    let mut maintenance = c.maintenance_client();
    maintenance.alarm(etcd_client::AlarmAction::Activate, etcd_client::AlarmType::Nospace, None).await.unwrap();
    let (status, body) = http_get(&endpoint, "/health").await;
    assert_eq!((status, body.as_str()), (503, r#"{"health":"false","reason":"ALARM NOSPACE"}"#));
    let samples = parse_metrics(&http_get(&endpoint, "/metrics").await.1);
    assert_eq!(sample(&samples, "raftlock_alarms", &[("alarm", "NOSPACE")]), Some(1.0));
    assert_eq!(sample(&samples, "raftlock_alarms", &[("alarm", "CORRUPT")]), Some(0.0));
    assert_eq!(http_get(&endpoint, "/health?exclude=NOSPACE").await.0, 200);

    // A follower sends the writes it takes to the leader, and counts the batches.
    let mut cluster = Cluster::start(3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let is_leader = |text: &str| sample(&parse_metrics(text), "etcd_server_is_leader", &[]) == Some(1.0);
        let mut follower = None;
        for i in 0..3 {
            if !is_leader(&http_get(&cluster.members[i].endpoint(), "/metrics").await.1) {
                follower = Some(i);
            }
        }
        let i = follower.expect("a follower");
        cluster.client(i).await.put("m/forwarded", "v", None).await.unwrap();
        let text = http_get(&cluster.members[i].endpoint(), "/metrics").await.1;
        let forwarded = sample(&parse_metrics(&text), "raftlock_forwarded_batch_commands_sum", &[]).unwrap();
        // Unless member i led by the time the put reached it.
        if !is_leader(&text) || forwarded >= 1.0 {
            assert!(forwarded >= 1.0, "member {i} forwarded nothing:\n{text}");
            break;
        }
        assert!(Instant::now() < deadline, "no stable follower");
    }

    // A member without a leader.
    for i in 0..3 {
        cluster.kill(i);
    }
    cluster.restart(0).expect("restart");
    let endpoint = cluster.members[0].endpoint();
    // Until its election timeout passes, a restarted member still counts on
    // the leader its stored vote names, and its health check's read times
    // out (503 too, with "QGET ERROR"); then it knows it has none.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let answer = http_get(&endpoint, "/health").await;
        assert!(answer.0 == 503 || answer.0 == 200, "{answer:?}");
        if answer.1.contains("RAFT NO LEADER") || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((status, body.as_str()), (503, r#"{"health":"false","reason":"RAFT NO LEADER"}"#));
    assert_eq!(http_get(&endpoint, "/livez").await, (200, "ok\n".to_string()));
    let (status, body) = http_get(&endpoint, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("[-]linearizable_read failed") && body.ends_with("readyz check failed\n"), "{body}");
    let (status, metrics) = http_get(&endpoint, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(sample(&parse_metrics(&metrics), "etcd_server_has_leader", &[]), Some(0.0));
}

/// `raftlockctl snapshot restore` (etcdutl's flags) makes a new cluster from
/// a file etcdctl saved: every member restored from it serves the saved keys,
/// leases and users, under new member IDs; a damaged file and an existing
/// data directory are refused. The revision jumps a billion past the
/// backup's and is marked compacted, so that no fencing token (revision)
/// goes backwards and old history reads as compacted; `--bump-revision 0`
/// keeps the backup's revision and its history.
#[tokio::test]
async fn a_cluster_restored_from_a_saved_snapshot_serves_the_saved_data() {
    let source = Cluster::start(3).await;
    let mut c = source.client(0).await;
    for i in 0..50 {
        c.put(format!("saved/{i:02}"), format!("v{i}"), None).await.unwrap();
    }
    let first = c.put("saved/history", "old", None).await.unwrap().header().unwrap().revision();
    c.put("saved/history", "new", None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("saved/leased", "x", Some(etcd_client::PutOptions::new().with_lease(lease))).await.unwrap();
    let ctl = Etcdctl::v35(&source.members[1].endpoint());
    ctl.ok(&["user", "add", "alice:secret"]);
    let saved_revision = c.get("saved/", None).await.unwrap().header().unwrap().revision();
    let old_ids: Vec<u64> = c.member_list().await.unwrap().members().iter().map(|m| m.id()).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.db");
    ctl.ok(&["snapshot", "save", file.to_str().unwrap()]);
    drop(source);

    let mut restored = Cluster::unstarted(3);
    let restore_with = |i: usize, file: &std::path::Path, data_dir: &std::path::Path, extra: &[&str]| {
        crate::common::raftlockctl()
            .args(["snapshot", "restore", file.to_str().unwrap()])
            .args(["--name", &restored.members[i].name])
            .args(["--initial-cluster", restored.initial_cluster()])
            .args(["--initial-advertise-peer-urls", &restored.peer_url(i)])
            .args(["--data-dir", data_dir.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let restore = |i: usize, file: &std::path::Path, data_dir: &std::path::Path| restore_with(i, file, data_dir, &[]);
    // Without a bump, the backup's revision and history are kept.
    let unbumped = dir.path().join("unbumped.raftlock");
    let out = restore_with(0, &file, &unbumped, &["--bump-revision", "0"]);
    assert!(
        crate::common::text(&out).contains(&format!("Restored revision {saved_revision} ")),
        "{}",
        crate::common::text(&out)
    );
    let out = restore_with(0, &file, &dir.path().join("refused"), &["--bump-revision", "0", "--mark-compacted"]);
    assert!(
        !out.status.success() && crate::common::text(&out).contains("--mark-compacted needs"),
        "{}",
        crate::common::text(&out)
    );
    let bumped_revision = saved_revision + 1_000_000_000;
    // A damaged file is refused, and leaves nothing behind.
    let mut damaged = std::fs::read(&file).unwrap();
    damaged[100] ^= 1;
    let damaged_file = dir.path().join("damaged.db");
    std::fs::write(&damaged_file, damaged).unwrap();
    let out = restore(0, &damaged_file, &restored.members[0].data_dir);
    assert!(
        !out.status.success() && crate::common::text(&out).contains("hash mismatch"),
        "{}",
        crate::common::text(&out)
    );
    assert!(!restored.members[0].data_dir.exists());
    for i in 0..3 {
        let out = restore(i, &file, &restored.members[i].data_dir);
        assert!(out.status.success(), "{}", crate::common::text(&out));
        assert!(
            crate::common::text(&out).contains(&format!("Restored revision {bumped_revision} ")),
            "{}",
            crate::common::text(&out)
        );
    }
    // An existing data directory is never overwritten.
    let out = restore(0, &file, &restored.members[0].data_dir);
    assert!(!out.status.success() && crate::common::text(&out).contains("exists"), "{}", crate::common::text(&out));

    restored.start_all().await;
    for i in 0..3 {
        let mut c = restored.client(i).await;
        let all = c.get("saved/", Some(GetOptions::new().with_prefix().with_serializable())).await.unwrap();
        assert_eq!(all.kvs().len(), 52, "member {i}");
        let old = c.get("saved/history", Some(GetOptions::new().with_revision(first))).await.unwrap_err();
        assert!(old.to_string().contains("required revision has been compacted"), "{old}");
        assert_eq!(all.kvs().iter().map(|kv| kv.mod_revision()).max(), Some(saved_revision), "kept as written");
    }
    let mut c = restored.client(2).await;
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.ttl() > 0, "the lease came along");
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    assert!(members.members().iter().all(|m| !old_ids.contains(&m.id())), "new member IDs");
    let users = Etcdctl::v35(&restored.members[0].endpoint()).ok(&["user", "list"]);
    assert!(users.contains("alice"), "{users}");
    // The new cluster takes writes, replicated to every member.
    let revision = c.put("saved/after", "1", None).await.unwrap().header().unwrap().revision();
    assert_eq!(revision, bumped_revision + 1, "past every revision the old cluster could have handed out");
    restored.wait_for_keys(0, "saved/", 53).await;
}

/// A member whose port is taken stops before it opens its storage: nothing
/// is written (a fresh data directory would otherwise hold a cluster it
/// bootstrapped), it never says it serves, and the error names the address.
/// Once the port is free, the same member starts and serves.
#[tokio::test]
async fn a_taken_port_stops_the_start_before_anything_is_written() {
    let mut cluster = Cluster::unstarted(1);
    let (peer_port, client_port) = (cluster.members[0].peer_port, cluster.members[0].client_port);
    for taken in [peer_port, client_port] {
        let holder = std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap();
        cluster.restart(0).expect("restart");
        let status = cluster.wait_exit(0, Duration::from_secs(20)).expect("the member exits by itself");
        assert!(!status.success());
        let log = cluster.log_of(0);
        assert!(log.contains(&format!("binding 127.0.0.1:{taken}")), "{log}");
        assert!(!log.contains("raftlock is serving"), "{log}");
        assert!(!cluster.members[0].data_dir.exists(), "the data directory was made: {log}");
        drop(holder);
    }
    cluster.start_all().await;
    let mut c = cluster.client(0).await;
    c.put("started", "1", None).await.unwrap();
    assert!(cluster.members[0].data_dir.exists());
}
