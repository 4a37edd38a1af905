//! Lock events (`Observe`) on a real 3-member cluster: the first message is
//! the lock as it is, then every place queued, granted and ended, each end
//! with its cause (a request, or the lease's end), resumable from a
//! revision; a holder's guard learns that its grant ended without its asking
//! (lease revoked by another client, key deleted by another client) within a
//! round trip, and not when only its member dies while its lease lives on;
//! a member cut off from the leader ends its streams ("no leader");
//! `raftlockctl observe -w json` prints one object per event.

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::Cluster;
use crate::native_locks::{held, native, try_once};
use raftlock::client::{Client, LockOptions};
use raftlock::proto::raftlock::v1::lock_event::Kind;
use raftlock::proto::raftlock::v1::{LockEvent, ObserveResponse};

/// The next message of an observe stream, within 10 s.
async fn next(stream: &mut tonic::Streaming<ObserveResponse>) -> ObserveResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("no event came").unwrap().unwrap()
}

/// (kind, lease of the place, position, was_holding) of each event.
fn summary(events: &[LockEvent]) -> Vec<(Kind, i64, i64, bool)> {
    events.iter().map(|e| (e.kind(), e.owner.as_ref().unwrap().lease, e.position, e.was_holding)).collect()
}

/// Events until `n` have come (a revision's events come in one message).
async fn collect(stream: &mut tonic::Streaming<ObserveResponse>, n: usize) -> Vec<LockEvent> {
    let mut events = Vec::new();
    while events.len() < n {
        events.extend(next(stream).await.events);
    }
    events
}

#[tokio::test]
async fn observe_tells_grants_waits_and_ends_with_their_causes_and_resumes() {
    let cluster = Cluster::start(3).await;
    let (a, b, c) = (native(&cluster, 0).await, native(&cluster, 1).await, native(&cluster, 2).await);
    let (sa, sb, sc) = (a.session(30).await.unwrap(), b.session(30).await.unwrap(), c.session(30).await.unwrap());
    let ga = held(sa.lock("ev", try_once()).await.unwrap());
    let b_lease = sb.lease();
    let waiter_b = tokio::spawn(async move { (held(sb.lock("ev", LockOptions::default()).await.unwrap()), sb) });
    // Wait until b is queued, then observe from the third member.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let req =
            raftlock::proto::raftlock::v1::DescribeRequest { name: b"ev".to_vec(), permits: 1, ..Default::default() };
        if !c.locks().describe(req).await.unwrap().into_inner().waiters.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "b never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut events = c.observe(b"ev", 1, 0).await.unwrap();
    let first = next(&mut events).await;
    let start = first.header.unwrap().revision;
    assert_eq!(summary(&first.events), [(Kind::Holding, sa.lease(), 0, false), (Kind::Waiting, b_lease, 0, false)]);
    assert_eq!(first.events[0].owner.as_ref().unwrap().token, ga.token());

    // A third place queues behind the waiter.
    let waiter_c = tokio::spawn(async move { (held(sc.lock("ev", LockOptions::default()).await.unwrap()), sc) });
    let queued = collect(&mut events, 1).await;
    assert_eq!((queued[0].kind(), queued[0].position), (Kind::Queued, 1));

    // The holder releases: its end (a request), then the waiter's grant, at one revision.
    assert!(ga.release().await.unwrap());
    let handoff = collect(&mut events, 2).await;
    assert_eq!(summary(&handoff)[0], (Kind::Released, sa.lease(), 0, true));
    assert_eq!(handoff[1].kind(), Kind::Granted);
    assert_eq!(handoff[0].revision, handoff[1].revision);
    let (gb, sb) = waiter_b.await.unwrap();
    assert_eq!(handoff[1].owner.as_ref().unwrap().token, gb.token());

    // The new holder's lease is revoked: a lease end, then the next grant.
    sb.close().await.unwrap();
    let revoked = collect(&mut events, 2).await;
    assert_eq!(summary(&revoked)[0], (Kind::LeaseEnded, b_lease, 0, true));
    assert_eq!(revoked[1].kind(), Kind::Granted);
    let (gc, _sc) = waiter_c.await.unwrap();

    // Someone else deletes the holder's key: a request, not a lease end.
    let delete = raftlock::proto::etcdserverpb::DeleteRangeRequest { key: gc.key().to_vec(), ..Default::default() };
    a.kv().delete_range(delete).await.unwrap();
    let deleted = collect(&mut events, 1).await;
    assert_eq!((deleted[0].kind(), deleted[0].was_holding), (Kind::Released, true));

    // Resumed from after the first message: the same story from history,
    // where a lease that ended shows as Ended (history keeps no cause).
    let mut resumed = a.observe(b"ev", 1, start + 1).await.unwrap();
    let replay = next(&mut resumed).await.events;
    let kinds: Vec<Kind> = replay.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        [Kind::Queued, Kind::Released, Kind::Granted, Kind::Ended, Kind::Granted, Kind::Released],
        "{replay:?}"
    );
    // Bad input: no name, a negative revision; the member still serves.
    assert_eq!(
        a.observe(b"", 1, 0).await.err().map(|e| e.to_string()),
        Some("raftlock: lock name is not provided".into())
    );
    assert!(a.observe(b"ev", 1, -1).await.is_err());
    assert!(next(&mut a.observe(b"ev", 1, 0).await.unwrap()).await.events.is_empty());
}

#[tokio::test]
async fn a_holder_learns_its_grant_ended_without_its_asking_and_not_while_its_lease_lives() {
    let mut cluster = Cluster::start(3).await;
    let a = native(&cluster, 0).await;
    let other = native(&cluster, 1).await;

    // Its lease revoked by another client.
    let sa = a.session(30).await.unwrap();
    let guard = held(sa.lock("job", try_once()).await.unwrap());
    let lost = tokio::spawn({
        let a = a.clone();
        let (key, token) = (guard.key().to_vec(), guard.token());
        async move { a.grant_ended(&key, token).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!lost.is_finished());
    let revoked = Instant::now();
    other.lease().lease_revoke(raftlock::proto::etcdserverpb::LeaseRevokeRequest { id: sa.lease() }).await.unwrap();
    let kind = tokio::time::timeout(Duration::from_secs(5), lost).await.unwrap().unwrap();
    assert_eq!(kind, Kind::LeaseEnded);
    assert!(revoked.elapsed() < Duration::from_secs(1), "told after {:?}", revoked.elapsed());
    // Asked after the end: told at once, from history.
    assert_eq!(guard.lost().await.unwrap(), Kind::Ended);

    // Its key deleted by another client.
    let sa = a.session(30).await.unwrap();
    let guard = held(sa.lock("job", try_once()).await.unwrap());
    let delete = raftlock::proto::etcdserverpb::DeleteRangeRequest { key: guard.key().to_vec(), ..Default::default() };
    let (kind, _) = tokio::join!(guard.lost(), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        other.kv().delete_range(delete).await.unwrap();
    });
    assert_eq!(kind.unwrap(), Kind::Released);

    // Its member dies, but its client reaches another and keeps the lease:
    // nothing is lost, and the grant stays current.
    let both = Client::connect([cluster.members[2].endpoint(), cluster.members[1].endpoint()]).await.unwrap();
    let session = both.session(3).await.unwrap();
    let guard = held(session.lock("job", try_once()).await.unwrap());
    cluster.kill(2);
    let quiet = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    assert!(quiet.is_err(), "a grant whose lease lives was reported lost: {quiet:?}");
    assert!(other.validate(guard.key(), guard.token(), 1).await.unwrap().current);
    // Released through a live member: this client's next request may still
    // be sent to the dead one (its channel learns of the death by failing).
    assert!(other.release(guard.key(), guard.token()).await.unwrap());
}

#[tokio::test]
async fn a_member_cut_off_from_the_leader_ends_its_lock_event_streams() {
    let mut cluster = Cluster::start(3).await;
    let alone = cluster.follower().await;
    let c = native(&cluster, alone).await;
    let mut stream = c.observe(b"cut", 1, 0).await.unwrap();
    next(&mut stream).await;
    for i in (0..3).filter(|&i| i != alone) {
        cluster.kill(i);
    }
    // It would learn of no end now: after three election timeouts without a
    // leader it says so, and a client picks the stream up elsewhere.
    let cut = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(20), stream.message()).await.expect("the stream went on");
    let status = ended.expect_err("the stream ended without an error");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "etcdserver: no leader");
    assert!(cut.elapsed() >= Duration::from_millis(500), "ended after {:?}", cut.elapsed());
}

#[tokio::test]
async fn raftlockctl_observe_prints_one_json_object_per_event() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    let session = c.session(30).await.unwrap();
    let guard = held(session.lock("ctl-ev", try_once()).await.unwrap());
    let mut observer = crate::common::raftlockctl()
        .args(["--endpoints", &cluster.members[1].endpoint(), "-w", "json", "observe", "ctl-ev"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = observer.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let line = |rx: &std::sync::mpsc::Receiver<String>| -> serde_json::Value {
        serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).expect("no line")).unwrap()
    };
    let first = line(&rx);
    assert_eq!((first["event"].as_str(), first["owner"]["token"].as_i64()), (Some("holding"), Some(guard.token())));
    assert!(guard.release().await.unwrap());
    let released = line(&rx);
    assert_eq!((released["event"].as_str(), released["was_holding"].as_bool()), (Some("released"), Some(true)));
    observer.kill().unwrap();
    observer.wait().unwrap();
}

#[tokio::test]
async fn raftlockctl_stops_its_command_when_its_key_is_deleted_by_another_client() {
    let cluster = Cluster::start(3).await;
    let c = native(&cluster, 0).await;
    // The lease lives on (a TTL of 30 s, kept alive): only the events can
    // tell raftlockctl that its grant is gone.
    let holder = crate::common::raftlockctl()
        .args(["--endpoints", &cluster.members[1].endpoint(), "lock", "deploy", "--ttl", "30", "--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let key = loop {
        let req = raftlock::proto::raftlock::v1::DescribeRequest {
            name: b"deploy".to_vec(),
            permits: 1,
            ..Default::default()
        };
        if let Some(h) = c.locks().describe(req).await.unwrap().into_inner().holders.first() {
            break h.key.clone();
        }
        assert!(Instant::now() < deadline, "raftlockctl never took the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Let it start following its grant.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted = Instant::now();
    c.kv().delete_range(raftlock::proto::etcdserverpb::DeleteRangeRequest { key, ..Default::default() }).await.unwrap();
    let status = tokio::task::spawn_blocking(move || holder.wait_with_output()).await.unwrap().unwrap();
    assert!(deleted.elapsed() < Duration::from_secs(3), "stopped after {:?}", deleted.elapsed());
    assert_eq!(status.status.code(), Some(1));
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("lock deploy lost: its key was deleted by another client"), "{err}");
}

/// (kind, key, token, revision) of each event, in order.
fn story(events: &[LockEvent]) -> Vec<(Kind, Vec<u8>, i64, i64)> {
    events
        .iter()
        .map(|e| (e.kind(), e.owner.as_ref().unwrap().key.clone(), e.owner.as_ref().unwrap().token, e.revision))
        .collect()
}

#[tokio::test]
async fn the_streams_of_one_lock_share_its_events_and_one_read_slowly_misses_none() {
    use raftlock::proto::etcdserverpb::{DeleteRangeRequest, PutRequest};
    use raftlock::proto::raftlock::v1::{locks_client::LocksClient, ObserveRequest};
    let cluster = Cluster::start(3).await;
    let (a, c) = (native(&cluster, 0).await, native(&cluster, 2).await);
    let session = a.session(60).await.unwrap();
    // Forty streams on one member share the lock's events (the hub wakes
    // them a chunk at a time), eight to a connection (a client's HTTP/2
    // bounds the small frames it holds unread on one); another reads nothing
    // until the end, through a connection whose HTTP/2 window holds a few
    // messages, so it falls far behind the lock's broadcast.
    let mut connections = Vec::new();
    for _ in 0..5 {
        connections.push(native(&cluster, 2).await);
    }
    let mut streams = Vec::new();
    for i in 0..40 {
        let mut stream = connections[i / 8].observe(b"many", 1, 0).await.unwrap();
        assert!(next(&mut stream).await.events.is_empty());
        streams.push(stream);
    }
    let narrow = tonic::transport::Endpoint::from_shared(cluster.members[2].endpoint())
        .unwrap()
        .initial_stream_window_size(Some(512))
        .connect()
        .await
        .unwrap();
    let mut slow = LocksClient::new(narrow)
        .observe(ObserveRequest { name: b"many".to_vec(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(next(&mut slow).await.events.is_empty());
    let rejoins = |text: &str| -> u64 {
        let line =
            text.lines().find(|l| l.starts_with("raftlock_lock_event_rejoins_total ")).expect("the rejoin counter");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let rejoins_before = rejoins(&crate::common::http_get(&cluster.members[2].endpoint(), "/metrics").await.1);

    // 400 places taken and released: 800 events, one revision each, each
    // told alone (the lock is quiet for longer than the hub lets it settle).
    let cycles = 400;
    // (The hub waits for 2 ms of quiet; 5 ms is well past it.)
    let settled = || tokio::time::sleep(Duration::from_millis(5));
    let mut late = None;
    for i in 0..cycles {
        let key = format!("many/{:x}", 0x1000 + i).into_bytes();
        let put = PutRequest { key: key.clone(), value: b"x".to_vec(), lease: session.lease(), ..Default::default() };
        a.kv().put(put).await.unwrap();
        settled().await;
        a.kv().delete_range(DeleteRangeRequest { key, ..Default::default() }).await.unwrap();
        settled().await;
        if i == cycles / 4 {
            // Half the streams go; the others go on.
            streams.truncate(20);
        }
        if i == cycles / 2 {
            // A stream that joins midway starts from the lock as it is (free).
            let mut stream = c.observe(b"many", 1, 0).await.unwrap();
            let first = next(&mut stream).await;
            assert!(first.events.is_empty(), "{:?}", first.events);
            late = Some((first.header.unwrap().revision, stream));
        }
    }
    let mut told = Vec::new();
    for stream in &mut streams {
        told.push(story(&collect(stream, 2 * cycles).await));
    }
    let kinds: Vec<Kind> = told[0].iter().map(|e| e.0).collect();
    assert_eq!(kinds, [Kind::Granted, Kind::Released].repeat(cycles), "each place granted, then released");
    assert!(told[0].windows(2).all(|w| w[0].3 < w[1].3), "one revision per event, in order");
    for other in &told[1..] {
        assert_eq!(other, &told[0], "every stream of the lock is told the same");
    }
    let (joined_at, mut late) = late.unwrap();
    let after: Vec<_> = told[0].iter().filter(|e| e.3 > joined_at).cloned().collect();
    assert_eq!(story(&collect(&mut late, after.len()).await), after, "a late stream is told what came after it joined");
    // The slow stream fell behind the broadcast and read the rest from history: nothing missed, nothing twice.
    assert_eq!(story(&collect(&mut slow, 2 * cycles).await), told[0]);
    let rejoins_after = rejoins(&crate::common::http_get(&cluster.members[2].endpoint(), "/metrics").await.1);
    assert!(rejoins_after > rejoins_before, "the slow stream never fell behind ({rejoins_before} -> {rejoins_after})");
}
