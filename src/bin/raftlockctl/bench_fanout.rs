//! The watch fan-out workload (`bench watch-fanout`): `--watchers` watchers,
//! 100 to a stream, on one key or on as many distinct keys, prefixes or
//! ranges (`--watch-shape`); one client puts `--total` times, one put at a
//! time, and each put is timed from its sending to the event of the last
//! watcher it concerns (every watcher for one key, its own watcher
//! otherwise), and from its answer to that event. What it measures: how a server's cost of delivering a change
//! grows with the watchers it has, and of finding the watchers a change
//! concerns among many.
//!
//! Caveats: the events are read by this one process, which on a small
//! machine shares the cores with the servers; the figures compare systems
//! measured the same way, not absolute delivery times. A latency after the
//! answer is never below zero: an event read before the answer counts as
//! at the answer.

use std::time::{Duration, Instant};

use anyhow::Context;
use raftlock::client::{ClientTls, TokenInterceptor};
use raftlock::proto::etcdserverpb as pb;
use raftlock::proto::etcdserverpb::kv_client::KvClient;
use raftlock::proto::etcdserverpb::watch_client::WatchClient;
use tonic::service::interceptor::InterceptedService;

use crate::bench::{report, BenchArgs, BenchReport, CpuUsed};
use crate::bench_load::spread;

/// What the watchers of [`watch_fanout`] watch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchShape {
    /// All of them one key, the one every put writes.
    #[default]
    OneKey,
    /// Each a key of its own; a put writes one of them.
    Keys,
    /// Each a prefix of its own (etcd's `--prefix`); a put writes a key
    /// under one of them.
    Prefixes,
    /// Each a range of its own that is no prefix (`[k, k~)`); a put writes
    /// a key inside one of them.
    Ranges,
}

/// Watchers on one stream.
const WATCHERS_PER_STREAM: usize = 100;

/// What watcher `i` watches: its key and range end.
fn watched(shape: WatchShape, i: usize) -> (Vec<u8>, Vec<u8>) {
    let own = format!("bench-fan/{i:07}");
    match shape {
        WatchShape::OneKey => (b"bench-fan/one".to_vec(), Vec::new()),
        WatchShape::Keys => (own.into_bytes(), Vec::new()),
        WatchShape::Prefixes => (format!("{own}/").into_bytes(), format!("{own}0").into_bytes()),
        WatchShape::Ranges => (own.clone().into_bytes(), format!("{own}~").into_bytes()),
    }
}

/// The key put `round` writes, and how many watchers it concerns.
fn written(shape: WatchShape, round: u64, watchers: usize) -> (Vec<u8>, usize) {
    let j = (round as usize).wrapping_mul(7919) % watchers.max(1);
    let own = format!("bench-fan/{j:07}");
    match shape {
        WatchShape::OneKey => (b"bench-fan/one".to_vec(), watchers),
        WatchShape::Keys => (own.into_bytes(), 1),
        WatchShape::Prefixes => (format!("{own}/x").into_bytes(), 1),
        WatchShape::Ranges => (format!("{own}m").into_bytes(), 1),
    }
}

/// Open the watchers, then time the puts (see the module doc). The report
/// counts puts, its latencies from sending; its server CPU is per put (divide by the watchers a put
/// concerns for the CPU per event delivered).
pub(crate) async fn watch_fanout(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: &TokenInterceptor,
    args: &BenchArgs,
) -> anyhow::Result<BenchReport> {
    let n = args.watchers.max(1);
    let streams = n.div_ceil(WATCHERS_PER_STREAM);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel::<(i64, Instant)>();
    let mut readers = Vec::with_capacity(streams);
    let mut senders = Vec::with_capacity(streams);
    for (service, stream_ids) in spread(endpoints, tls, token, streams).await? {
        for s in stream_ids {
            let ids = s * WATCHERS_PER_STREAM..n.min((s + 1) * WATCHERS_PER_STREAM);
            // Every create is queued before the call: etcd answers a watch
            // call (even its headers) only once a request came.
            let (tx, rx) = tokio::sync::mpsc::channel(WATCHERS_PER_STREAM);
            let wanted = ids.len();
            for i in ids {
                let (key, range_end) = watched(args.watch_shape, i);
                let create = pb::WatchCreateRequest { key, range_end, ..Default::default() };
                tx.send(pb::WatchRequest {
                    request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
                })
                .await?;
            }
            let mut stream = WatchClient::new(service.clone())
                .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            let mut created = 0;
            while created < wanted {
                let resp = stream.message().await?.context("a watch stream ended before its watchers were created")?;
                anyhow::ensure!(!resp.canceled, "a watcher was refused: {}", resp.cancel_reason);
                created += usize::from(resp.created);
            }
            let events_tx = events_tx.clone();
            readers.push(tokio::spawn(async move {
                while let Ok(Some(resp)) = stream.message().await {
                    let at = Instant::now();
                    for event in &resp.events {
                        let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                        if events_tx.send((revision, at)).is_err() {
                            return;
                        }
                    }
                }
            }));
            // The request stream stays open (a closed one ends the watch).
            senders.push(tx);
        }
    }
    let channel = raftlock::client::endpoint(&endpoints[0], tls)?.connect().await?;
    let mut kv = KvClient::new(InterceptedService::new(channel, token.clone()));
    let value = vec![b'v'; args.value_size];
    let (start, cpu_at_start) = (Instant::now(), CpuUsed::now(&args.server_pids));
    let (mut latencies, mut after_answer, mut errors) = (Vec::new(), Vec::new(), 0);
    for round in 0..args.total {
        if args.seconds > 0.0 && start.elapsed().as_secs_f64() >= args.seconds {
            break;
        }
        let (key, concerned) = written(args.watch_shape, round, n);
        let sent = Instant::now();
        let put = kv.put(pb::PutRequest { key, value: value.clone(), ..Default::default() }).await;
        let answered = Instant::now();
        let Ok(put) = put else {
            errors += 1;
            continue;
        };
        let revision = put.into_inner().header.map_or(0, |h| h.revision);
        let (mut seen, mut last) = (0, answered);
        while seen < concerned {
            let next = tokio::time::timeout(Duration::from_secs(30), events.recv()).await;
            let Ok(Some((event_revision, at))) = next else {
                anyhow::bail!("{} of {concerned} events of revision {revision} came within 30 s", seen);
            };
            if event_revision == revision {
                seen += 1;
                last = last.max(at);
            }
        }
        latencies.push(last - sent);
        after_answer.push(last - answered);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut r = report(args, latencies, errors, elapsed);
    let after = report(args, after_answer, 0, elapsed);
    r.after_answer_ms = Some((after.p50_ms, after.p99_ms));
    CpuUsed::now(&args.server_pids).record_since(&cpu_at_start, &mut r);
    readers.iter().for_each(tokio::task::JoinHandle::abort);
    drop(senders);
    Ok(r)
}
