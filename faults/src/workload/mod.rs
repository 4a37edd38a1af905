//! The workloads that run against the cluster while a nemesis works on it.
//! Each records what it did — every operation with its invocation and
//! completion time and its outcome — for the checkers in `crate::check`.
//!
//! - [`registers`]: reads, writes and compare-and-set on a few keys
//!   (linearizability, and serializable reads that must be a possible past);
//! - [`writes`]: puts of unique keys (an acknowledged write is never lost);
//! - [`leases`]: leases kept alive, then abandoned (never revoked while kept
//!   alive; revoked in time once abandoned);
//! - [`locks`]: etcd's Lock API and raftlock's native API on the same names,
//!   with fenced increments, and a native semaphore;
//! - [`storm`]: batches of leases abandoned at once (mass expiry: none
//!   revoked early, all revoked in time);
//! - [`watches`]: watchers over the register keys that reconnect wherever
//!   they can (ordered, unique, atomic, reliable, prev_kv, progress).
//!
//! The rule every workload keeps: an outcome is `Ok` or `Failed` only when
//! the answer says so for certain; a timeout or a broken connection is
//! `Unknown`. Clients back off after an error instead of spinning on a dead
//! member, and move to another member.

pub mod leases;
pub mod locks;
pub mod lost;
pub mod registers;
pub mod storm;
pub mod watches;
pub mod writes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raftlock_faults::history::Time;
use tokio::sync::watch;

/// The run's clock: nanoseconds since it began, shared by every client.
#[derive(Clone, Copy)]
pub struct Clock(tokio::time::Instant);

impl Clock {
    pub fn start() -> Clock {
        Clock(tokio::time::Instant::now())
    }

    pub fn now(&self) -> Time {
        self.0.elapsed().as_nanos() as Time
    }
}

/// What every workload task gets: the clock, the members' endpoints, the
/// stop signal, and its own random sequence.
#[derive(Clone)]
pub struct Context {
    pub clock: Clock,
    pub endpoints: Arc<Vec<String>>,
    pub stop: watch::Receiver<bool>,
    values: Arc<AtomicU64>,
}

impl Context {
    pub fn new(clock: Clock, endpoints: Vec<String>, stop: watch::Receiver<bool>) -> Context {
        Context { clock, endpoints: Arc::new(endpoints), stop, values: Arc::new(AtomicU64::new(1)) }
    }

    pub fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// A value never used before in this run.
    pub fn unique_value(&self) -> u64 {
        self.values.fetch_add(1, Ordering::Relaxed)
    }

    /// Sleep for `d`, or less if the run stops meanwhile.
    pub async fn pause(&self, d: Duration) {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// xorshift64*: the suite's random numbers, reproducible from a seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A duration between `lo` and `hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(if span == 0 { 0 } else { self.next() % span })
    }

    /// True with probability `percent`%.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A client's connection to one member at a time. After a failure it drops
/// the connection, waits [`BACKOFF`] and moves to a member drawn at random:
/// the one it talked to may be down or cut off.
pub struct Roaming {
    member: usize,
    conn: Option<etcd_client::Client>,
}

impl Roaming {
    pub fn new(first: usize) -> Roaming {
        Roaming { member: first, conn: None }
    }

    /// The connection, made if need be; `None` (after moving on) if the
    /// member could not be reached.
    pub async fn client(&mut self, ctx: &Context, rng: &mut Rng) -> Option<&mut etcd_client::Client> {
        if self.conn.is_none() {
            match crate::cluster::connect(&[ctx.endpoints[self.member].clone()]).await {
                Ok(c) => self.conn = Some(c),
                Err(_) => {
                    self.failed(ctx, rng).await;
                    return None;
                }
            }
        }
        self.conn.as_mut()
    }

    /// The last request failed: move to another member after a pause.
    pub async fn failed(&mut self, ctx: &Context, rng: &mut Rng) {
        self.conn = None;
        self.member = rng.below(ctx.endpoints.len());
        ctx.pause(BACKOFF).await;
    }
}

/// One keepalive on an open KeepAlive stream: the TTL it was answered
/// with, `None` if the stream ended.
pub async fn keep_alive_once(
    keeper: &mut etcd_client::LeaseKeeper,
    answers: &mut etcd_client::LeaseKeepAliveStream,
) -> Result<Option<i64>, String> {
    bounded(async {
        keeper.keep_alive().await?;
        Ok::<_, etcd_client::Error>(answers.message().await?.map(|r| r.ttl()))
    })
    .await
}

/// How long one request may take before its outcome counts as unknown.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client waits after an error before it tries again.
pub const BACKOFF: Duration = Duration::from_millis(150);

/// Run `request` for at most [`REQUEST_TIMEOUT`]; a timeout is an error.
pub async fn bounded<T, E: std::fmt::Display>(
    request: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_string()),
    }
}
