//! The bench's load beside the measured requests, and its one stream
//! workload: idle watch streams and idle lock observers held open while
//! requests are timed (what a server pays for many quiet clients), and the
//! watch-history workload (a watch from revision 1, timed to its last event).

use std::time::{Duration, Instant};

use anyhow::Context;
use raftlock::client::{ClientTls, Service, TokenInterceptor};
use raftlock::proto::etcdserverpb as pb;
use raftlock::proto::etcdserverpb::kv_client::KvClient;
use tonic::service::interceptor::InterceptedService;

use crate::bench::{report, BenchArgs, BenchReport, CpuUsed};

/// Streams opened by [`idle_watchers`]: each its request sender (a closed
/// request stream would end the watch) and its responses.
pub(crate) type IdleWatch = (tokio::sync::mpsc::Sender<pb::WatchRequest>, tonic::Streaming<pb::WatchResponse>);

/// Open `n` watch streams (see [`BenchArgs::idle_watchers`]), at most 100 on
/// one connection, the connections round-robin over `endpoints`; each is
/// returned once its watcher was created.
pub(crate) async fn idle_watchers(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: &TokenInterceptor,
    n: usize,
) -> anyhow::Result<Vec<IdleWatch>> {
    use raftlock::proto::etcdserverpb::watch_client::WatchClient;
    let mut watches = Vec::with_capacity(n);
    for (service, streams) in spread(endpoints, tls, token, n).await? {
        for i in streams {
            let create = pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
                    key: format!("bench-idle/{i}").into_bytes(),
                    ..Default::default()
                })),
            };
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(create).await?;
            let mut stream = WatchClient::new(service.clone())
                .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            let created = stream.message().await?.context("a watch stream ended before its watcher was created")?;
            anyhow::ensure!(
                created.created && !created.canceled,
                "an idle watcher was refused: {}",
                created.cancel_reason
            );
            watches.push((tx, stream));
        }
    }
    Ok(watches)
}

/// The connections for `n` long-lived streams, at most
/// [`STREAMS_PER_CONNECTION`] on one, round-robin over `endpoints`: each with
/// the indices of the streams it carries.
pub(crate) async fn spread(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: &TokenInterceptor,
    n: usize,
) -> anyhow::Result<Vec<(Service, std::ops::Range<usize>)>> {
    let mut connections = Vec::new();
    for i in 0..n.div_ceil(STREAMS_PER_CONNECTION) {
        let url = &endpoints[i % endpoints.len()];
        let channel =
            raftlock::client::endpoint(url, tls)?.connect().await.with_context(|| format!("connecting to {url}"))?;
        let streams = i * STREAMS_PER_CONNECTION..n.min((i + 1) * STREAMS_PER_CONNECTION);
        connections.push((InterceptedService::new(channel, token.clone()), streams));
    }
    Ok(connections)
}

/// How many observer streams share one connection.
const STREAMS_PER_CONNECTION: usize = 100;

/// Observer streams opened by [`idle_observers`] or [`lock_observers`]: each the task that holds
/// its call (aborted when the run ends).
pub(crate) struct IdleObservers(Vec<tokio::task::JoinHandle<Result<(), tonic::Status>>>);

impl Drop for IdleObservers {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Open `n` election observers (see [`BenchArgs::idle_observers`]), at most
/// 100 on one connection, the connections round-robin over `endpoints`. An
/// election without a leader answers nothing (etcd sends not even the
/// response's headers), so each call is held by a task of its own, and the
/// servers are given a moment to take them all in; an observer refused or
/// ended by then fails the run.
pub(crate) async fn idle_observers(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: &TokenInterceptor,
    n: usize,
) -> anyhow::Result<IdleObservers> {
    use raftlock::proto::v3electionpb::{election_client::ElectionClient, LeaderRequest};
    let mut observers = Vec::with_capacity(n);
    for (service, streams) in spread(endpoints, tls, token, n).await? {
        let client = ElectionClient::new(service);
        for j in streams {
            let (mut client, name) = (client.clone(), format!("bench-observe/{j}").into_bytes());
            observers.push(tokio::spawn(async move {
                let mut stream = client.observe(LeaderRequest { name }).await?.into_inner();
                while stream.message().await?.is_some() {}
                Err(tonic::Status::aborted("the observe stream ended"))
            }));
        }
    }
    if n > 0 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut observers = IdleObservers(observers);
    if let Some(ended) = observers.0.iter().position(tokio::task::JoinHandle::is_finished) {
        let outcome = observers.0.swap_remove(ended).await?;
        anyhow::bail!("an idle observer ended before the run: {outcome:?}");
    }
    Ok(observers)
}

/// Open `n` lock-event streams (see [`BenchArgs::lock_observers`]) on the
/// lock workload's names `bench-lock/0 .. names`, at most 100 on one
/// connection, the connections round-robin over `endpoints`; each reads every
/// event it is sent. The first message (the lock as it is) comes at once, so
/// each is known to be open before the run starts.
pub(crate) async fn lock_observers(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: &TokenInterceptor,
    n: usize,
    names: usize,
) -> anyhow::Result<IdleObservers> {
    use raftlock::proto::raftlock::v1::{locks_client::LocksClient, ObserveRequest};
    let mut observers = Vec::with_capacity(n);
    for (service, streams) in spread(endpoints, tls, token, n).await? {
        let client = LocksClient::new(service);
        for j in streams {
            let name = format!("bench-lock/{}", j % names).into_bytes();
            let mut stream = client.clone().observe(ObserveRequest { name, ..Default::default() }).await?.into_inner();
            stream.message().await?.context("a lock-event stream ended before its first message")?;
            observers.push(tokio::spawn(async move {
                while stream.message().await?.is_some() {}
                Err(tonic::Status::aborted("the lock-event stream ended"))
            }));
        }
    }
    Ok(IdleObservers(observers))
}

/// Read history back through one watch (see [`Workload::WatchHistory`]).
pub(crate) async fn watch_history(channel: Service, args: &BenchArgs) -> anyhow::Result<BenchReport> {
    use raftlock::proto::etcdserverpb::watch_client::WatchClient;
    let current = KvClient::new(channel.clone())
        .range(pb::RangeRequest { key: b"bench/".to_vec(), count_only: true, ..Default::default() })
        .await?
        .into_inner()
        .header
        .map_or(0, |h| h.revision);
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: b"bench/".to_vec(),
            range_end: b"bench0".to_vec(),
            start_revision: args.start_revision,
            ..Default::default()
        })),
    };
    // The request stream stays open (a closed one ends the watch).
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(create).await?;
    let start = Instant::now();
    let cpu_at_start = CpuUsed::now(&args.server_pids);
    let mut stream =
        WatchClient::new(channel).watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let (mut events, mut gaps, mut last) = (0u64, Vec::new(), Instant::now());
    while let Some(resp) = stream.message().await? {
        anyhow::ensure!(!resp.canceled, "the watch was canceled: {}", resp.cancel_reason);
        gaps.push(last.elapsed());
        last = Instant::now();
        events += resp.events.len() as u64;
        if resp.events.last().and_then(|e| e.kv.as_ref()).is_some_and(|kv| kv.mod_revision >= current) {
            break;
        }
        if args.seconds > 0.0 && start.elapsed().as_secs_f64() >= args.seconds {
            break;
        }
    }
    drop(tx);
    let elapsed = start.elapsed().as_secs_f64();
    let max_gap = gaps.iter().max().copied().unwrap_or_default();
    let mut r = report(args, gaps, 0, elapsed);
    r.max_gap_ms = max_gap.as_secs_f64() * 1e3;
    r.total = events;
    CpuUsed::now(&args.server_pids).record_since(&cpu_at_start, &mut r);
    r.ops_per_sec = events as f64 / elapsed;
    Ok(r)
}
