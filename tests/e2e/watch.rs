//! Watches on a real 3-member cluster, driven by `etcd-client`.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::Cluster;
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};

async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a watch response within 10 s")
        .expect("the stream stays up")
        .expect("the stream is not closed")
}

/// (type, key, value, mod revision, prev value) of every event until `n` are in.
async fn collect(stream: &mut WatchStream, n: usize) -> Vec<(EventType, String, String, i64, Option<String>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let resp = next(stream).await;
        for e in resp.events() {
            let kv = e.kv().unwrap();
            out.push((
                e.event_type(),
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                kv.mod_revision(),
                e.prev_kv().map(|p| p.value_str().unwrap().to_string()),
            ));
        }
    }
    out
}

#[tokio::test]
async fn replay_prev_kv_filters_progress_cancel_and_compaction() {
    let cluster = Cluster::start(3).await;
    let mut w = cluster.client(0).await;
    let r1 = w.put("a", "1", None).await.unwrap().header().unwrap().revision();
    w.put("a", "2", None).await.unwrap();
    let r3 = w.delete("a", None).await.unwrap().header().unwrap().revision();
    let r4 = w.put("b", "1", None).await.unwrap().header().unwrap().revision();

    // History replay on a follower, with previous values.
    let mut c = cluster.client(cluster.follower().await).await;
    let mut s = c.watch("a", Some(WatchOptions::new().with_start_revision(r1).with_prev_key())).await.unwrap();
    let created = next(&mut s).await;
    assert!(created.created());
    assert_eq!(created.watch_id(), 0, "the first watch on a stream is 0");
    let events = collect(&mut s, 3).await;
    assert_eq!(
        events,
        vec![
            (EventType::Put, "a".into(), "1".into(), r1, None),
            (EventType::Put, "a".into(), "2".into(), r1 + 1, Some("1".into())),
            (EventType::Delete, "a".into(), "".into(), r3, Some("2".into())),
        ]
    );
    // A second watch on the same stream gets the next ID; then live events.
    s.watch("b", Some(WatchOptions::new().with_start_revision(r4 + 1))).await.unwrap();
    let second = next(&mut s).await;
    assert!(second.created());
    assert_eq!(second.watch_id(), 1);
    w.put("b", "2", None).await.unwrap();
    let live = next(&mut s).await;
    assert_eq!((live.watch_id(), live.events().len()), (1, 1));
    assert_eq!(live.header().unwrap().revision(), r4 + 1);

    // Progress on request: not tied to a watcher, at the current revision.
    s.request_progress().await.unwrap();
    let progress = next(&mut s).await;
    assert!(progress.events().is_empty());
    assert_eq!(progress.watch_id(), -1);
    assert_eq!(progress.header().unwrap().revision(), r4 + 1);
    s.cancel(1).await.unwrap();
    let canceled = next(&mut s).await;
    assert!(canceled.canceled());
    assert_eq!(canceled.watch_id(), 1);

    // Filters.
    let opts = WatchOptions::new().with_prefix().with_start_revision(r1);
    let mut no_put = c.watch("", Some(opts.clone().with_filters([WatchFilterType::NoPut]))).await.unwrap();
    next(&mut no_put).await;
    let deletes = collect(&mut no_put, 1).await;
    assert_eq!(deletes[0].0, EventType::Delete);
    let mut no_delete = c.watch("", Some(opts.with_filters([WatchFilterType::NoDelete]))).await.unwrap();
    next(&mut no_delete).await;
    let puts = collect(&mut no_delete, 4).await;
    assert!(puts.iter().all(|e| e.0 == EventType::Put));
    assert_eq!(puts.iter().map(|e| e.3).collect::<Vec<_>>(), vec![r1, r1 + 1, r4, r4 + 1]);

    // A watch from a compacted revision is created, then cancelled. (Watches
    // are served from the member's own state: read through it first, so that
    // it has applied the compaction.)
    w.compact(r3, None).await.unwrap();
    c.get("a", None).await.unwrap();
    let mut old = c.watch("a", Some(WatchOptions::new().with_start_revision(r1))).await.unwrap();
    assert!(next(&mut old).await.created());
    let cancel = next(&mut old).await;
    assert!(cancel.canceled());
    assert_eq!(cancel.compact_revision(), r3);
}

#[tokio::test]
async fn every_revision_once_in_order_with_writers_on_every_member() {
    const PER_WRITER: usize = 150;
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(1).await;
    let start = c.get("w/", None).await.unwrap().header().unwrap().revision() + 1;
    let mut s = c.watch("w/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert!(next(&mut s).await.created());

    let mut writers = Vec::new();
    for m in 0..3 {
        let mut wc = cluster.client(m).await;
        writers.push(tokio::spawn(async move {
            for i in 0..PER_WRITER {
                wc.put(format!("w/{m}/{i:04}"), "v", None).await.unwrap();
            }
        }));
    }
    // Read half on member 1, then move to member 2 and resume after the last
    // revision seen, as a client does when its member goes away.
    let first = collect(&mut s, 3 * PER_WRITER / 2).await;
    let resume = first.last().unwrap().3 + 1;
    drop(s);
    let mut c2 = cluster.client(2).await;
    let mut s2 = c2.watch("w/", Some(WatchOptions::new().with_prefix().with_start_revision(resume))).await.unwrap();
    assert!(next(&mut s2).await.created());
    for w in writers {
        w.await.unwrap();
    }
    let rest = collect(&mut s2, 3 * PER_WRITER - first.len()).await;
    let all: Vec<_> = first.into_iter().chain(rest).collect();
    let revisions: Vec<i64> = all.iter().map(|e| e.3).collect();
    assert_eq!(
        revisions,
        (start..start + (3 * PER_WRITER) as i64).collect::<Vec<_>>(),
        "every revision once, in order"
    );
    let keys: BTreeSet<&String> = all.iter().map(|e| &e.1).collect();
    assert_eq!(keys.len(), 3 * PER_WRITER);
}

#[tokio::test]
async fn a_stalled_watcher_does_not_block_writes_and_catches_up() {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 600;
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    // Opened and never read while the writes run.
    let mut stalled = c.watch("s/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    let value = vec![b'x'; 8 * 1024];
    let writes = async {
        let mut tasks = Vec::new();
        for m in 0..WRITERS {
            let mut wc = cluster.client(m % 3).await;
            let value = value.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    wc.put(format!("s/{m}/{i:04}"), value.clone(), None).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(120), writes).await.expect("writes finish while a watcher is stalled");
    // Now it reads, and gets everything, in order.
    assert!(next(&mut stalled).await.created());
    let mut last = 0;
    let mut seen = 0;
    while seen < WRITERS * PER_WRITER {
        for e in next(&mut stalled).await.events() {
            let rev = e.kv().unwrap().mod_revision();
            assert!(rev > last, "out of order: {rev} after {last}");
            assert_eq!(e.kv().unwrap().value().len(), 8 * 1024);
            last = rev;
            seen += 1;
        }
    }
    assert_eq!(seen, WRITERS * PER_WRITER);
}

/// A session so far behind that apply dropped the changes queued for it
/// (more than its inbox holds) reads them from history instead: its watcher
/// still gets every event, once, in order. Each of the writer's puts is an
/// apply call of its own on the leader (the next is sent once the last is
/// applied). Beyond the inbox, the session's outbox (64 responses) and the
/// stream's HTTP/2 window (2 MiB) hold a few hundred of the puts, far fewer
/// than the more than `INBOX_CAPACITY` (1024) written after them: the
/// inbox overflows by count (48 MiB is under its byte bound). If either
/// premise stops holding, the assertion on the counter fails, not passes.
#[tokio::test]
async fn a_watch_that_fell_behind_its_inbox_reads_the_rest_from_history() {
    const PUTS: usize = 3_000;
    const VALUE: usize = 16 * 1024;
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let endpoint = cluster.members[leader].endpoint();
    let mut c = cluster.client(leader).await;
    let overflows = "raftlock_watch_inbox_overflows_total";
    let before = crate::common::metric(&endpoint, overflows).await;
    let mut stalled = c.watch("behind/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    // Created before the first put (the stream's headers may come first),
    // and then not read while the puts run.
    assert!(next(&mut stalled).await.created());
    let mut writer = cluster.client(leader).await;
    for i in 0..PUTS {
        writer.put(format!("behind/{i:05}"), vec![(i % 251) as u8; VALUE], None).await.unwrap();
    }
    let after = crate::common::metric(&endpoint, overflows).await;
    assert!(after > before, "the stalled session's inbox never overflowed ({before} -> {after})");
    let mut seen = 0;
    let mut last = 0;
    while seen < PUTS {
        for e in next(&mut stalled).await.events() {
            let kv = e.kv().unwrap();
            assert_eq!(
                kv.key_str().unwrap(),
                format!("behind/{seen:05}"),
                "an event missing, repeated or out of order"
            );
            assert_eq!(kv.value(), vec![(seen % 251) as u8; VALUE].as_slice());
            assert!(last == 0 || kv.mod_revision() == last + 1, "revision {} after {last}", kv.mod_revision());
            last = kv.mod_revision();
            seen += 1;
        }
    }
    // And nothing more: a put after them is the next event.
    writer.put("behind/last", "x", None).await.unwrap();
    let events = next(&mut stalled).await;
    assert_eq!(events.events().len(), 1);
    assert_eq!(events.events()[0].kv().unwrap().key_str().unwrap(), "behind/last");
}

#[tokio::test]
async fn progress_notifications_fragments_and_a_clean_shutdown_with_open_streams() {
    use raftlock::proto::etcdserverpb as pb;
    let mut cluster = Cluster::start_with(3, &["--watch-progress-notify-interval", "300"]).await;
    let mut c = cluster.client(0).await;

    // Periodic progress for a watcher that asked for it, with no events.
    let mut s = c.watch("p/", Some(WatchOptions::new().with_prefix().with_progress_notify())).await.unwrap();
    assert!(next(&mut s).await.created());
    let progress = next(&mut s).await;
    assert!(progress.events().is_empty() && !progress.canceled() && !progress.created());
    assert_eq!(progress.watch_id(), 0);

    // Fragments: one revision whose events are larger than a request may be.
    let big = vec![b'x'; 1 << 20];
    c.put("f/1", big.clone(), None).await.unwrap();
    let written = c.put("f/2", big, None).await.unwrap().header().unwrap().revision();
    let mut raw = pb::watch_client::WatchClient::connect(cluster.members[0].endpoint())
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let create = pb::WatchCreateRequest {
        key: b"f/".to_vec(),
        range_end: b"f0".to_vec(),
        prev_kv: true,
        fragment: true,
        // From just after the puts: member 0 may not have applied them yet
        // when the watch is created, and they are not what is tested here.
        start_revision: written + 1,
        ..Default::default()
    };
    tx.send(pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) })
        .await
        .unwrap();
    let mut responses = raw.watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    assert!(responses.message().await.unwrap().unwrap().created);
    c.delete("f/", Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    let first = responses.message().await.unwrap().unwrap();
    let second = responses.message().await.unwrap().unwrap();
    assert!(first.fragment && !second.fragment, "a 2 MiB revision comes in two fragments");
    assert_eq!((first.events.len(), second.events.len()), (1, 1));
    assert_eq!(first.events[0].prev_kv.as_ref().unwrap().value.len(), 1 << 20);

    // SIGTERM with a watch and a keepalive stream open: a prompt, clean exit,
    // and the streams end.
    let id = c.lease_grant(60, None).await.unwrap().id();
    let (mut keeper, _answers) = c.lease_keep_alive(id).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let stopping = std::time::Instant::now();
    assert!(cluster.terminate(0).success());
    assert!(stopping.elapsed() < Duration::from_secs(5), "shutdown took {:?}", stopping.elapsed());
    let ended = tokio::time::timeout(Duration::from_secs(5), s.message()).await.expect("the watch stream ends");
    assert!(!matches!(ended, Ok(Some(ref r)) if !r.events().is_empty()), "{ended:?}");
    drop(tx);
}

/// A progress notification promises that every event up to its revision has
/// been sent on the stream. Under a stream of writes, applied batches can be
/// waiting in the session's inbox while a progress request is answered: the
/// answer must not report a revision whose events are still to come.
#[tokio::test]
async fn a_progress_notification_never_overtakes_an_event() {
    let cluster = Cluster::start(3).await;
    let via = cluster.leader().await;
    let mut c = cluster.client(via).await;
    let mut stream = c.watch("p/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert!(next(&mut stream).await.created());

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16 {
        let (mut c, stop) = (cluster.client(via).await, stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.put(format!("p/{w}"), n.to_string(), None).await.unwrap();
                n += 1;
            }
        }));
    }
    let until = std::time::Instant::now() + Duration::from_secs(4);
    let (mut promised, mut progress_seen, mut events_seen) = (0i64, 0, 0);
    let mut overtaken = Vec::new();
    while std::time::Instant::now() < until {
        stream.request_progress().await.unwrap();
        // Read a few of the responses that have arrived, then ask again.
        for _ in 0..8 {
            let Ok(resp) = tokio::time::timeout(Duration::from_millis(2), stream.message()).await else { break };
            let resp = resp.unwrap().unwrap();
            if resp.events().is_empty() {
                promised = promised.max(resp.header().unwrap().revision());
                progress_seen += 1;
            }
            for e in resp.events() {
                events_seen += 1;
                let rev = e.kv().unwrap().mod_revision();
                if rev <= promised {
                    overtaken.push((rev, promised));
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    assert!(progress_seen > 50 && events_seen > 500, "{progress_seen} progress answers, {events_seen} events");
    assert!(
        overtaken.is_empty(),
        "events at or below a promised progress revision: {:?}",
        &overtaken[..overtaken.len().min(10)]
    );
}

/// A watch opened with etcd's `hasleader` metadata (clientv3's
/// `WithRequireLeader`) on a member that loses its leader ends with etcd's
/// "no leader" instead of waiting in silence, and a new one is refused.
#[tokio::test]
async fn a_watch_that_requires_a_leader_ends_when_its_member_has_none() {
    let mut cluster = Cluster::start(3).await;
    let via = cluster.follower().await;
    let options = etcd_client::ConnectOptions::new().with_require_leader(true);
    let mut c = etcd_client::Client::connect([cluster.members[via].endpoint()], Some(options)).await.unwrap();
    let mut stream = c.watch("r/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert!(next(&mut stream).await.created());
    for i in (0..3).filter(|i| *i != via) {
        cluster.kill(i);
    }
    let end = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("the watch still waits in silence 20 s after its member lost the leader");
    let (code, message) = crate::common::grpc_error(end.expect_err("the watch must end with an error"));
    assert_eq!((code, message.as_str()), (tonic::Code::Unavailable, "etcdserver: no leader"));
    let refused = async {
        let mut s = c.watch("r/", None).await?;
        s.message().await
    };
    let (code, message) = crate::common::grpc_error(refused.await.expect_err("a new watch must be refused"));
    assert_eq!((code, message.as_str()), (tonic::Code::Unavailable, "etcdserver: no leader"));
}

/// Streams on two members watch single keys and a prefix, while writers on
/// every member also write keys nobody watches: each watcher gets its own
/// key's events, every one, in order, and nothing else; a stream whose keys
/// did not change at all is told of progress up to the last write all the
/// same (its position moved past batches it was never handed).
#[tokio::test]
async fn each_watcher_gets_its_own_keys_events_among_unwatched_writes() {
    const ROUNDS: usize = 40;
    let cluster = Cluster::start(3).await;
    let (f, l) = (cluster.follower().await, cluster.leader().await);
    let mut c1 = cluster.client(f).await;
    let mut s1 = c1.watch("one/a", None).await.unwrap();
    assert_eq!(next(&mut s1).await.watch_id(), 0);
    s1.watch("one/b", None).await.unwrap();
    assert_eq!(next(&mut s1).await.watch_id(), 1);
    s1.watch("r/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    assert_eq!(next(&mut s1).await.watch_id(), 2);
    let mut c2 = cluster.client(l).await;
    let mut s2 = c2.watch("one/a", None).await.unwrap();
    assert_eq!(next(&mut s2).await.watch_id(), 0);
    let mut idle = c2.watch("never", None).await.unwrap();
    assert!(next(&mut idle).await.created());

    // Writes go round the members; what each watcher should see, by revision.
    let mut writers = Vec::new();
    for m in 0..3 {
        writers.push(cluster.client(m).await);
    }
    let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = 0;
    for i in 0..ROUNDS {
        let w = &mut writers[i % 3];
        let rev = |resp: Option<&etcd_client::ResponseHeader>| resp.unwrap().revision();
        last = rev(w.put(format!("noise/{i}"), "n", None).await.unwrap().header());
        if i % 2 == 0 {
            a.push(rev(w.put("one/a", format!("{i}"), None).await.unwrap().header()));
        }
        if i % 5 == 0 {
            b.push(rev(w.put("one/b", format!("{i}"), None).await.unwrap().header()));
        }
        if i % 7 == 3 {
            a.push(rev(w.delete("one/a", None).await.unwrap().header()));
        }
        r.push(rev(w.put(format!("r/{i}"), "v", None).await.unwrap().header()));
        last = last.max(rev(w.put("one/ab", "not one/a", None).await.unwrap().header()));
    }
    last = last.max(writers[0].put("noise/last", "n", None).await.unwrap().header().unwrap().revision());

    /// Revisions of the events each watch ID got, until `n` events are in.
    async fn by_watcher(stream: &mut WatchStream, n: usize) -> std::collections::BTreeMap<i64, Vec<i64>> {
        let mut out = std::collections::BTreeMap::<i64, Vec<i64>>::new();
        let mut got = 0;
        while got < n {
            let resp = next(stream).await;
            for e in resp.events() {
                out.entry(resp.watch_id()).or_default().push(e.kv().unwrap().mod_revision());
                got += 1;
            }
        }
        out
    }
    let got = by_watcher(&mut s1, a.len() + b.len() + r.len()).await;
    assert_eq!(got, [(0, a.clone()), (1, b), (2, r)].into_iter().collect());
    let got = by_watcher(&mut s2, a.len()).await;
    assert_eq!(got, [(0, a)].into_iter().collect());

    // The stream with no event: progress up to the last write, once its
    // member has applied it (a linearizable read there waits for that).
    c1.get("noise/last", None).await.unwrap();
    c2.get("noise/last", None).await.unwrap();
    idle.request_progress().await.unwrap();
    let progress = next(&mut idle).await;
    assert!(progress.events().is_empty(), "nothing was written to the watched key");
    assert_eq!(progress.header().unwrap().revision(), last);
    // Nor did the other streams get anything more.
    for s in [&mut s1, &mut s2] {
        s.request_progress().await.unwrap();
        let p = next(s).await;
        assert!(p.events().is_empty());
        assert_eq!(p.header().unwrap().revision(), last);
    }
}

/// A client that closes its side of the stream once it has sent its create
/// requests (grpcurl does, as may any client with nothing more to ask) still
/// gets the events, as from etcd: the stream lasts until the client goes away.
#[tokio::test]
async fn a_stream_whose_client_closed_its_side_still_delivers_events() {
    use raftlock::proto::etcdserverpb as pb;
    let cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    let mut raw = pb::watch_client::WatchClient::connect(cluster.members[0].endpoint()).await.unwrap();
    let create = pb::WatchCreateRequest { key: b"half-closed".to_vec(), ..Default::default() };
    let requests = tokio_stream::iter([pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    }]);
    let mut responses = raw.watch(requests).await.unwrap().into_inner();
    assert!(responses.message().await.unwrap().unwrap().created);
    // Time for the end of the requests to reach the member.
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.put("half-closed", "v", None).await.unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), responses.message())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .expect("the stream stays open");
    assert_eq!(resp.events.len(), 1);
    assert_eq!(resp.events[0].kv.as_ref().unwrap().key, b"half-closed");
}
