//! A load generator for any etcd-compatible endpoint list, so that raftlock and
//! etcd are measured by the same client code in the same run.
//!
//! `clients` concurrent request loops share `conns` gRPC connections (spread
//! over the endpoints round-robin, as etcd's own benchmark tool does) and run
//! until `total` requests have completed. Every request's latency is recorded;
//! the report gives throughput and latency percentiles. A failed request is
//! counted and reported, never silently dropped from the figures.
//!
//! Two drivers send the requests: raftlockctl's own gRPC client (the
//! default; one connection per `--conns`, each to one endpoint) and the
//! `etcd-client` crate (`--driver etcd-client`, `bench_etcd_client`), the
//! client applications run, whose every connection balances over all
//! endpoints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench_etcd_client::{self, EtcdClientDriver};
use crate::bench_fanout::{watch_fanout, WatchShape};
use crate::bench_load::{idle_observers, idle_watchers, lock_observers, watch_history};
use crate::bench_range::{check_range, range_request};
pub(crate) use crate::bench_report::{report, BenchReport, CpuUsed};
use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use raftlock::client::{ClientTls, Service, TokenInterceptor};
use tonic::service::interceptor::InterceptedService;

use raftlock::proto::etcdserverpb as pb;
use raftlock::proto::etcdserverpb::kv_client::KvClient;
use raftlock::proto::etcdserverpb::lease_client::LeaseClient;
use raftlock::proto::raftlock::v1 as native;
use raftlock::proto::raftlock::v1::locks_client::LocksClient;
use raftlock::proto::v3lockpb as v3lock;
use raftlock::proto::v3lockpb::lock_client::LockClient;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Put a random key of the key space.
    Put,
    /// Linearizable get of a random key (keys are written first).
    Get,
    /// Serializable get of a random key.
    GetSerializable,
    /// A txn: if the key's mod revision is >= 0, put it (always succeeds).
    Txn,
    /// A linearizable range of `--range-limit` consecutive keys from a
    /// random one, over a key space written beforehand (`put --sequential
    /// --total N --key-space N`).
    Range,
    /// A linearizable count-only range over every key under `--key-prefix`.
    Count,
    /// etcd's Lock service: Lock then Unlock, one op per cycle. Each client
    /// has its own lease and uses lock `bench-lock/<client % lock-names>`.
    Lock,
    /// raftlock's native API: Acquire (waiting) then fenced Release, one op per
    /// cycle, on the same locks as `lock`.
    NativeLock,
    /// Grant a lease of `--lease-ttl` seconds and put the request's key on
    /// it, one lease per request, never revoked by the bench: the set-up of
    /// a lease-expiry storm (scripts/bench.sh storm).
    LeaseKey,
    /// One watch over every key the bench writes (`bench/...`), from
    /// `--start-revision` to the revision current when it starts: reading
    /// history back. The report counts events, not requests, and its
    /// latencies are the gaps between two responses.
    WatchHistory,
    /// `--watchers` watchers on one key or on as many keys, prefixes or
    /// ranges (`--watch-shape`); one put at a time, each timed from its
    /// answer to the last event it causes (see `bench_fanout`).
    WatchFanout,
}

/// Which client code sends the requests (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriverKind {
    /// raftlockctl's own gRPC client: each connection to one endpoint.
    #[default]
    Raftlockctl,
    /// The `etcd-client` crate: each connection balanced over all endpoints.
    EtcdClient,
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub workload: Workload,
    /// The client code that sends the requests.
    #[arg(long, value_enum, default_value_t = DriverKind::Raftlockctl)]
    pub driver: DriverKind,
    /// Concurrent request loops.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// gRPC connections shared by the clients.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 10_000)]
    pub total: u64,
    /// Key size in bytes.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Distinct keys used.
    #[arg(long, default_value_t = 10_000)]
    pub key_space: u64,
    /// range: the keys each range asks for (its limit).
    #[arg(long, default_value_t = 1000)]
    pub range_limit: u64,
    /// Lock workloads: distinct lock names the clients spread over (1: every
    /// client contends for one lock, measuring handoffs).
    #[arg(long, default_value_t = 1)]
    pub lock_names: usize,
    /// native-lock: holders at once on each name (more than 1: a semaphore).
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
    /// Write keys in order (request n uses key n % key-space) instead of at
    /// random: `--sequential --total K --key-space K` writes every key once.
    #[arg(long)]
    pub sequential: bool,
    /// Issue requests at this many a second in all (request n is due n/rate
    /// seconds after the start, taken by the next free client), instead of
    /// each client sending its next as soon as the last is answered; each
    /// latency counts from when its request was due, so a client that fell
    /// behind is counted as waiting (0: as fast as answered).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Clients arrive at this many a second: client c sends its first
    /// request no sooner than c/arrival-rate seconds after the start, as a
    /// fleet that comes over time (a queue of 100,000 sent at once overruns
    /// any server's backlog of proposals). A lock workload's handoffs are
    /// then counted from when the last client arrived (0: all at once).
    #[arg(long, default_value_t = 0.0)]
    pub arrival_rate: f64,
    /// Stop after this many seconds even if `--total` requests were not all
    /// issued (0: no time limit).
    #[arg(long, default_value_t = 0.0)]
    pub seconds: f64,
    /// Give up, with an error that says the run stalled, once no request
    /// has succeeded for this many seconds since the start or the last
    /// success (0: never): a system that has stopped making progress is
    /// told apart from a slow one without waiting out an outer time limit.
    #[arg(long, default_value_t = 0.0)]
    pub stall_after: f64,
    /// What every key written begins with.
    #[arg(long, default_value = "bench/")]
    pub key_prefix: String,
    /// lease-key: the TTL of each lease granted, in seconds.
    #[arg(long, default_value_t = 60)]
    pub lease_ttl: i64,
    /// lease-key: put `<key>/<lease hex>`, the owner key of lock `<key>`
    /// (what a granted Lock or native Acquire leaves): a held lock each.
    #[arg(long)]
    pub owner_keys: bool,
    /// watch-history: the revision the watch starts at.
    #[arg(long, default_value_t = 1)]
    pub start_revision: i64,
    /// Watch streams held open through the run, each with one watcher on a
    /// key of its own that the run never writes, spread over the endpoints
    /// (as many clients each watching their own key would be): what idle
    /// watchers cost the requests.
    #[arg(long, default_value_t = 0)]
    pub idle_watchers: usize,
    /// Election observers (v3election Observe streams) held open through the
    /// run, each on an election of its own that the run never joins, spread
    /// over the endpoints (as many clients each following a leader would be):
    /// what idle observers cost the requests.
    #[arg(long, default_value_t = 0)]
    pub idle_observers: usize,
    /// Lock workloads: raftlock lock-event streams (`Observe`) held open
    /// through the run on the workload's own lock names, spread over the
    /// names and the endpoints, each reading every event: what followers of
    /// a busy lock cost its handoffs.
    #[arg(long, default_value_t = 0)]
    pub lock_observers: usize,
    /// watch-fanout: the watchers, 100 to a stream.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// watch-fanout: what the watchers watch.
    #[arg(long, value_enum, default_value_t = WatchShape::OneKey)]
    pub watch_shape: WatchShape,
    /// The servers' process IDs, when they run on this machine: their CPU
    /// time (from /proc) over the measured run is reported per request.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
}

pub(crate) fn key(args: &BenchArgs, n: u64) -> Vec<u8> {
    let mut k = format!("{}{:0width$}", args.key_prefix, n % args.key_space, width = 10).into_bytes();
    k.resize(args.key_size.max(k.len()), b'_');
    k
}

/// A small deterministic generator (xorshift): keys differ per client, with no
/// dependency and no shared state.
struct Keys(u64);

impl Keys {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The TTL of a lock workload's leases, in seconds: never kept alive, so
/// long enough for any run (a queue of 10,000 takes minutes to go round).
pub(crate) const LOCK_LEASE_TTL: i64 = 3600;

/// One request loop's connection and identity, raftlockctl's own client.
struct OwnDriver {
    channel: Service,
    kv: KvClient<Service>,
    /// Lock workloads: the client's lease and lock name.
    lease: i64,
    lock_name: Vec<u8>,
    /// Lock workloads: each cycle's grant (its answer's arrival) and the
    /// sending of its release, for [`handoffs`].
    cycles: Vec<(Instant, Instant)>,
}

impl OwnDriver {
    async fn new(channel: Service, args: &BenchArgs, lock_name: Vec<u8>) -> Result<OwnDriver, tonic::Status> {
        let mut lease = 0;
        if matches!(args.workload, Workload::Lock | Workload::NativeLock) {
            let grant = pb::LeaseGrantRequest { ttl: LOCK_LEASE_TTL, id: 0 };
            lease = LeaseClient::new(channel.clone()).lease_grant(grant).await?.into_inner().id;
        }
        Ok(OwnDriver { kv: KvClient::new(channel.clone()), channel, lease, lock_name, cycles: Vec::new() })
    }

    /// After a failed lock cycle, which may have left the lease's key
    /// queued (or holding) with nobody to unlock it: revoke the lease, which
    /// deletes the key, and go on with a new one.
    async fn renew_lease(&mut self) -> Result<(), tonic::Status> {
        let mut leases = LeaseClient::new(self.channel.clone());
        let _ = leases.lease_revoke(pb::LeaseRevokeRequest { id: self.lease }).await;
        let grant = pb::LeaseGrantRequest { ttl: LOCK_LEASE_TTL, id: 0 };
        self.lease = leases.lease_grant(grant).await?.into_inner().id;
        Ok(())
    }

    /// Revoke the client's lease, if it has one.
    async fn finish(&self) {
        if self.lease != 0 {
            let _ =
                LeaseClient::new(self.channel.clone()).lease_revoke(pb::LeaseRevokeRequest { id: self.lease }).await;
        }
    }
}

async fn one_request(d: &mut OwnDriver, args: &BenchArgs, n: u64, value: &[u8]) -> Result<(), tonic::Status> {
    let key = key(args, n);
    let client = &mut d.kv;
    match args.workload {
        Workload::Put => {
            client.put(pb::PutRequest { key, value: value.to_vec(), ..Default::default() }).await?;
        }
        Workload::Get | Workload::GetSerializable => {
            let serializable = args.workload == Workload::GetSerializable;
            client.range(pb::RangeRequest { key, serializable, ..Default::default() }).await?;
        }
        Workload::Range | Workload::Count => {
            let (key, range_end, limit, count_only) = range_request(args, n);
            let answer =
                client.range(pb::RangeRequest { key, range_end, limit, count_only, ..Default::default() }).await?;
            check_range(args, answer.into_inner().kvs.len() as u64).map_err(tonic::Status::internal)?;
        }
        Workload::Txn => {
            use pb::compare::{CompareResult, CompareTarget, TargetUnion};
            let compare = pb::Compare {
                result: CompareResult::Greater as i32,
                target: CompareTarget::Mod as i32,
                key: key.clone(),
                target_union: Some(TargetUnion::ModRevision(-1)),
                range_end: vec![],
            };
            let put = pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key,
                    value: value.to_vec(),
                    ..Default::default()
                })),
            };
            client.txn(pb::TxnRequest { compare: vec![compare], success: vec![put], failure: vec![] }).await?;
        }
        Workload::Lock => {
            let mut locks = LockClient::new(d.channel.clone());
            let req = v3lock::LockRequest { name: d.lock_name.clone(), lease: d.lease };
            let key = locks.lock(req).await?.into_inner().key;
            // Released at once: the release is sent as the grant arrives.
            let granted = Instant::now();
            d.cycles.push((granted, granted));
            locks.unlock(v3lock::UnlockRequest { key }).await?;
        }
        Workload::NativeLock => {
            let mut locks = LocksClient::new(d.channel.clone());
            let req = native::AcquireRequest {
                name: d.lock_name.clone(),
                lease: d.lease,
                wait_ms: -1,
                permits: args.permits,
                ..Default::default()
            };
            let granted = locks.acquire(req).await?.into_inner();
            if !granted.acquired {
                return Err(tonic::Status::internal("an unbounded wait answered without the lock"));
            }
            let granted_at = Instant::now();
            d.cycles.push((granted_at, granted_at));
            locks
                .release(native::ReleaseRequest { key: granted.key, token: granted.token, ..Default::default() })
                .await?;
        }
        Workload::LeaseKey => {
            let grant = pb::LeaseGrantRequest { ttl: args.lease_ttl, id: 0 };
            let lease = LeaseClient::new(d.channel.clone()).lease_grant(grant).await?.into_inner().id;
            // An owner key names its lease: the key a granted lock leaves.
            let key = match args.owner_keys {
                true => [key, format!("/{lease:x}").into_bytes()].concat(),
                false => key,
            };
            client.put(pb::PutRequest { key, value: value.to_vec(), lease, ..Default::default() }).await?;
        }
        Workload::WatchHistory | Workload::WatchFanout => unreachable!("a watch is not a request loop"),
    }
    Ok(())
}

/// A request loop's driver, of either kind.
enum Driver {
    Own(Box<OwnDriver>),
    EtcdClient(Box<EtcdClientDriver>),
}

impl Driver {
    async fn put(&mut self, key: Vec<u8>, value: &[u8]) -> anyhow::Result<()> {
        match self {
            Driver::Own(d) => {
                d.kv.put(pb::PutRequest { key, value: value.to_vec(), ..Default::default() }).await?;
            }
            Driver::EtcdClient(d) => d.put(key, value).await?,
        }
        Ok(())
    }

    /// Request `n` of the run (its key is `key(args, n)`).
    async fn request(&mut self, args: &BenchArgs, n: u64, value: &[u8]) -> anyhow::Result<()> {
        match self {
            Driver::Own(d) => {
                let outcome = one_request(d, args, n, value).await;
                if outcome.is_err() && d.lease != 0 {
                    d.renew_lease().await?;
                }
                outcome?
            }
            Driver::EtcdClient(d) => d.request(args, key(args, n), n, value).await?,
        }
        Ok(())
    }

    async fn finish(&mut self) {
        match self {
            Driver::Own(d) => d.finish().await,
            Driver::EtcdClient(d) => d.finish().await,
        }
    }

    /// The lock cycles this driver's loop timed ([`OwnDriver::cycles`]).
    fn cycles(&self) -> &[(Instant, Instant)] {
        match self {
            Driver::Own(d) => &d.cycles,
            Driver::EtcdClient(_) => &[],
        }
    }
}

/// Handoffs of one lock: from a holder's release being sent to the next
/// holder's grant arriving, for every grant but the first, given every
/// client's `(granted, release sent)` cycles. Grants of one lock of one
/// permit follow each other, so in grant order each cycle's release hands
/// the lock to the next cycle. Only a lock someone always waits for hands
/// over at once: otherwise the time it lay free counts too. Grants before
/// `from` (the queue still filling) are left out.
fn handoffs(mut cycles: Vec<(Instant, Instant)>, from: Instant) -> Vec<Duration> {
    cycles.retain(|c| c.0 >= from);
    cycles.sort_unstable();
    cycles.windows(2).map(|w| w[1].0.saturating_duration_since(w[0].1)).collect()
}

/// When client `c` of a run begun at `start` sends its first request
/// (`--arrival-rate`; at the start when it is 0).
fn arrival(args: &BenchArgs, start: Instant, c: usize) -> Instant {
    match args.arrival_rate > 0.0 {
        true => start + Duration::from_secs_f64(c as f64 / args.arrival_rate),
        false => start,
    }
}

/// How many clients are made ready (a lease each, for lock workloads), or
/// finished, at once: one at a time, 100,000 of them took minutes.
const SETUP_AT_ONCE: usize = 64;

/// The connections a run's request loops share, of the chosen driver.
enum Connections {
    Own(Vec<Service>),
    EtcdClient(Vec<bench_etcd_client::Client>),
}

/// Resolves once no request has succeeded for `after` seconds (the last
/// success read from `last_success_ms`, milliseconds from `start`), with the
/// time since; never when `after` is 0.
async fn stalled(start: Instant, last_success_ms: &AtomicU64, after: f64) -> Duration {
    if !(after > 0.0 && after.is_finite()) {
        return std::future::pending().await;
    }
    let after = Duration::from_secs_f64(after);
    loop {
        let last = start + Duration::from_millis(last_success_ms.load(Ordering::Relaxed));
        let since = last.elapsed();
        if since >= after {
            return since;
        }
        tokio::time::sleep(after - since).await;
    }
}

/// Run one benchmark against `endpoints`; every request carries `token`'s
/// auth token, if it has one (the etcd-client driver authenticates itself
/// with `credentials`).
pub async fn run(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    token: TokenInterceptor,
    credentials: Option<&(String, String)>,
    args: &BenchArgs,
) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(!endpoints.is_empty(), "no endpoints");
    let connections = match args.driver {
        DriverKind::Raftlockctl => {
            let mut channels = Vec::new();
            for i in 0..args.conns.max(1) {
                let url = &endpoints[i % endpoints.len()];
                let channel = raftlock::client::endpoint(url, tls)?
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {url}"))?;
                channels.push(InterceptedService::new(channel, token.clone()));
            }
            if args.workload == Workload::WatchHistory {
                return watch_history(channels[0].clone(), args).await;
            }
            if args.workload == Workload::WatchFanout {
                return watch_fanout(endpoints, tls, &token, args).await;
            }
            Connections::Own(channels)
        }
        DriverKind::EtcdClient => {
            let mut clients = Vec::new();
            for _ in 0..args.conns.max(1) {
                clients.push(bench_etcd_client::connect(endpoints, tls, credentials).await?);
            }
            Connections::EtcdClient(clients)
        }
    };
    let value = vec![b'v'; args.value_size];

    let issued = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    // The last success, in milliseconds from the start (for `--stall-after`).
    let last_success_ms = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Each lock client grants itself a lease first: made some at a time.
    let connections = &connections;
    let mut drivers: Vec<Driver> = futures::stream::iter(0..args.clients.max(1))
        .map(|c| async move {
            let lock_name = format!("bench-lock/{}", c % args.lock_names.max(1)).into_bytes();
            anyhow::Ok(match connections {
                Connections::Own(channels) => {
                    Driver::Own(Box::new(OwnDriver::new(channels[c % channels.len()].clone(), args, lock_name).await?))
                }
                Connections::EtcdClient(clients) => {
                    let client = clients[c % clients.len()].clone();
                    Driver::EtcdClient(Box::new(EtcdClientDriver::new(client, args, lock_name).await?))
                }
            })
        })
        .buffered(SETUP_AT_ONCE)
        .try_collect()
        .await?;
    if matches!(args.workload, Workload::Get | Workload::GetSerializable) {
        // Reads need something to read.
        for n in 0..args.key_space.min(args.total) {
            drivers[0].put(key(args, n), &value).await?;
        }
    }
    let _watchers = idle_watchers(endpoints, tls, &token, args.idle_watchers).await?;
    let _observers = idle_observers(endpoints, tls, &token, args.idle_observers).await?;
    let _lock_observers = lock_observers(endpoints, tls, &token, args.lock_observers, args.lock_names.max(1)).await?;
    let start = Instant::now();
    let cpu_at_start = CpuUsed::now(&args.server_pids);
    for (c, mut driver) in drivers.into_iter().enumerate() {
        let (issued, errors, args, value) = (issued.clone(), errors.clone(), args.clone(), value.clone());
        let last_success_ms = last_success_ms.clone();
        tasks.push(tokio::spawn(async move {
            let mut keys = Keys(0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1));
            let mut latencies = Vec::new();
            let mut succeeded = Vec::new();
            let deadline = (args.seconds > 0.0).then(|| start + Duration::from_secs_f64(args.seconds));
            tokio::time::sleep_until(arrival(&args, start, c).into()).await;
            loop {
                let i = issued.fetch_add(1, Ordering::Relaxed);
                if i >= args.total || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let n = if args.sequential { i } else { keys.next() };
                let t = if args.rate > 0.0 {
                    let due = start + Duration::from_secs_f64(i as f64 / args.rate);
                    tokio::time::sleep_until(due.into()).await;
                    due
                } else {
                    Instant::now()
                };
                if let Err(e) = driver.request(&args, n, &value).await {
                    // The first failure's reason, once: the report counts them.
                    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("bench: the first failed request: {e:#}");
                    }
                } else {
                    let now = Instant::now();
                    last_success_ms.fetch_max((now - start).as_millis() as u64, Ordering::Relaxed);
                    succeeded.push(now);
                }
                latencies.push(t.elapsed());
            }
            (latencies, succeeded, driver)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(args.total as usize);
    let mut drivers = Vec::new();
    let mut succeeded = Vec::new();
    let joined = async {
        for t in tasks {
            let (l, s, driver) = t.await?;
            latencies.extend(l);
            succeeded.extend(s);
            drivers.push(driver);
        }
        anyhow::Ok(())
    };
    tokio::select! {
        joined = joined => joined?,
        stalled = stalled(start, &last_success_ms, args.stall_after) => anyhow::bail!(
            "stalled: no request succeeded for {:.0} s ({} issued, {} failed)",
            stalled.as_secs_f64(),
            issued.load(Ordering::Relaxed).min(args.total),
            errors.load(Ordering::Relaxed)
        ),
    }
    // From the start, and up to the end: a request that hangs until the run
    // is over (say, one a dead leader never answers) is unavailability too.
    succeeded.extend([start, Instant::now()]);
    succeeded.sort_unstable();
    let max_gap = succeeded.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_at_end = CpuUsed::now(&args.server_pids);
    // One lock of one permit, contended, at full speed: its handoffs.
    let contended = matches!(args.workload, Workload::Lock | Workload::NativeLock)
        && args.lock_names <= 1
        && args.permits <= 1
        && args.clients > 1
        && args.rate <= 0.0;
    // With clients arriving over time, the queue is whole once the last came.
    let arrived = arrival(args, start, args.clients.max(1) - 1);
    let handed =
        contended.then(|| handoffs(drivers.iter().flat_map(|d| d.cycles().iter().copied()).collect(), arrived));
    // Each lock client revokes its lease, some at a time.
    futures::stream::iter(drivers).for_each_concurrent(SETUP_AT_ONCE, |mut d| async move { d.finish().await }).await;
    let mut r = report(args, latencies, errors.load(Ordering::Relaxed), elapsed);
    r.max_gap_ms = max_gap.as_secs_f64() * 1e3;
    if let Some(mut handed) = handed.filter(|h| !h.is_empty()) {
        handed.sort_unstable();
        let pct = |p: f64| handed[((handed.len() as f64 * p).ceil() as usize).clamp(1, handed.len()) - 1];
        r.handoff_ms = Some((pct(0.5).as_secs_f64() * 1e3, pct(0.99).as_secs_f64() * 1e3));
    }
    cpu_at_end.record_since(&cpu_at_start, &mut r);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_runs_from_a_release_to_the_next_grant_in_grant_order() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Three clients' cycles, out of order: grants at 0, 5 and 12 ms,
        // each released 1 ms after its grant.
        let cycles = vec![(at(12), at(13)), (at(0), at(1)), (at(5), at(6))];
        assert_eq!(handoffs(cycles.clone(), t0), vec![Duration::from_millis(4), Duration::from_millis(6)]);
        assert!(handoffs(vec![(at(0), at(1))], t0).is_empty());
        // Clients still arriving until 5 ms: the grant at 0 is left out.
        assert_eq!(handoffs(cycles, at(5)), vec![Duration::from_millis(6)]);
    }
}
