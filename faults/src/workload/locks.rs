//! Locks: etcd's Lock API and raftlock's native API contending for the same
//! names — the native API with write locks, with read and write locks some
//! of which are acquired again reentrantly, and with multi-locks that take
//! both names at once — and a native semaphore.
//!
//! A holder of a mutex does fenced increments of the lock's counter: it
//! reads the counter, then writes counter + 1 in a Txn guarded by its own
//! lock key still having the create revision it was granted with (its
//! fencing token). The read and the write are separate requests, so two
//! holders at once would lose an update — which the counter check finds —
//! and a holder whose key is gone (a lost lease) has its write refused.
//!
//! A reader reads the counter twice under its grant, each read guarded by its
//! token as the writes are: a write between the two is a writer let in while
//! a reader held the lock. A holder that re-enters acquires its grant again
//! reentrantly, without waiting, and gives that hold back before its work:
//! the answers must show the same token, two holds, then one.
//!
//! A mutex holder also asks `Validate` about its own grant, once it has
//! written: the answer is recorded with its interval, for the checker that
//! no successor was granted before a "current" answer. A multi-lock's grant
//! is recorded as one grant per name (same token, same interval), and its
//! holder does its fenced increments on every name's counter.
//!
//! A native mutex holder with a lock-delay ([`Api::Delayed`]) sometimes
//! dies holding its lock: it revokes its lease instead of releasing. Its
//! grant is recorded with the instant it was last known alive (the revoke's
//! invocation; for a grant found gone at its release, the last keepalive
//! answered alive), for the checker that no successor came inside the delay.
//!
//! Every grant is recorded with its interval as the client saw it (acquire
//! completed .. release invoked) and whether the holder's lease certainly
//! lived through it: the grant and the keepalives answered with a TTL must
//! cover the whole interval, the holder's guarded writes must not have found
//! it deposed, and a native release must have found its key.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, LockOptions, Txn, TxnOp};
use raftlock::proto::raftlock::v1::locks_client::LocksClient;
use raftlock::proto::raftlock::v1::{AcquireRequest, LockSpec, Mode, ReleaseRequest, ValidateRequest};
use raftlock_faults::check::locks::{Grant, GuardedWrite, Liveness, Reentry, SharedRead, Validation};
use raftlock_faults::check::lost::LostGrant;
use raftlock_faults::history::{Outcome, Time};
use tonic::transport::{Channel, Endpoint};

use super::{bounded, keep_alive_once, Context, Rng, BACKOFF};
use crate::cluster::connect;

/// The TTL of a lock holder's lease, in seconds.
pub const TTL: i64 = 3;
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);
/// How long an acquisition may wait.
pub(super) const ACQUIRE_WAIT: Duration = Duration::from_secs(4);

/// Which API a client takes its locks with.
#[derive(Clone, Copy, Debug)]
pub enum Api {
    /// etcd's v3lock Lock / Unlock.
    Etcd,
    /// raftlock's native Acquire / Release, with `permits` holders at once.
    Native { permits: u32 },
    /// raftlock's native read (two in three) and write locks, a quarter of
    /// them acquired a second time reentrantly.
    ReadWrite,
    /// raftlock's native mutex with a lock-delay of [`LOCK_DELAY_MS`]; one
    /// grant in [`ABANDON_ONE_IN`] ends by the holder revoking its lease.
    Delayed,
}

/// The lock-delay of [`Api::Delayed`]'s grants.
pub const LOCK_DELAY_MS: u32 = 1000;
/// How often (one in this many) a delayed grant's holder dies holding it.
const ABANDON_ONE_IN: usize = 5;

pub fn counter_key(name: &str) -> String {
    format!("counter/{name}")
}

#[derive(Default)]
pub struct LockHistory {
    pub grants: Vec<Grant>,
    pub writes: Vec<GuardedWrite>,
    /// Per lock name: (increments answered written, increments unknown).
    pub increments: std::collections::BTreeMap<String, (u64, u64)>,
    pub reads: Vec<SharedRead>,
    pub reentries: Vec<Reentry>,
    pub validations: Vec<Validation>,
    /// The multi-lock clients' last acquires, after the faults healed.
    pub liveness: Vec<Liveness>,
    /// Grants taken from their holders by someone else (check 11).
    pub lost: Vec<LostGrant>,
}

impl LockHistory {
    pub fn merge(&mut self, other: LockHistory) {
        self.grants.extend(other.grants);
        self.writes.extend(other.writes);
        self.reads.extend(other.reads);
        self.reentries.extend(other.reentries);
        self.validations.extend(other.validations);
        self.liveness.extend(other.liveness);
        self.lost.extend(other.lost);
        for (name, (ok, unknown)) in other.increments {
            let e = self.increments.entry(name).or_default();
            e.0 += ok;
            e.1 += unknown;
        }
    }
}

/// The times at which a lease is known to have been alive until: each
/// (invoke, TTL) answered by a grant or a keepalive guarantees it lives
/// until at least invoke + TTL.
type Lifeline = Arc<Mutex<Vec<(Time, i64)>>>;

/// Whether `life` covers every instant of `from..=to`.
fn covered(life: &[(Time, i64)], from: Time, to: Time) -> bool {
    let mut spans: Vec<(Time, Time)> =
        life.iter().filter(|(_, ttl)| *ttl > 0).map(|(at, ttl)| (*at, at + *ttl as u64 * 1_000_000_000)).collect();
    spans.sort_unstable();
    let mut reach = from;
    for (start, end) in spans {
        if start > reach {
            break;
        }
        reach = reach.max(end);
    }
    reach > to
}

/// A lease with a keepalive task of its own, recording its lifeline.
pub(crate) struct HeldLease {
    pub(crate) id: i64,
    life: Lifeline,
    pub(super) keeper: tokio::task::JoinHandle<()>,
}

impl HeldLease {
    /// Granted through `c` (a connection to `member`), and kept alive
    /// until the run stops.
    pub(crate) async fn grant(ctx: &Context, c: &mut Client, member: usize) -> Result<HeldLease, String> {
        let invoke = ctx.clock.now();
        let granted = bounded(c.lease_grant(TTL, None)).await?;
        let life: Lifeline = Arc::new(Mutex::new(vec![(invoke, granted.ttl())]));
        let keeper = tokio::spawn(keep_alive(ctx.clone(), granted.id(), life.clone(), member));
        Ok(HeldLease { id: granted.id(), life, keeper })
    }

    pub(super) fn covers(&self, from: Time, to: Time) -> bool {
        covered(&self.life.lock().expect("lifeline lock poisoned"), from, to)
    }

    /// The last instant up to `until` at which the lease is known to have
    /// been alive after `from`: the latest keepalive invoked then that was
    /// answered with a TTL (the server saw it alive after the invocation).
    fn alive_after(&self, from: Time, until: Time) -> Time {
        let life = self.life.lock().expect("lifeline lock poisoned");
        life.iter().filter(|(at, ttl)| *ttl > 0 && *at <= until).map(|(at, _)| *at).fold(from, Time::max)
    }

    /// Stop keeping it alive and revoke it (best effort: it expires anyway).
    pub(crate) async fn give_up(self, c: &mut Client) {
        self.keeper.abort();
        let _ = bounded(c.lease_revoke(self.id)).await;
    }
}

async fn keep_alive(ctx: Context, lease: i64, life: Lifeline, mut member: usize) {
    let mut rng = Rng::new(lease as u64);
    while !ctx.stopping() {
        let Ok(mut c) = connect(&[ctx.endpoints[member].clone()]).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        let Ok((mut keeper, mut answers)) = bounded(c.lease_keep_alive(lease)).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        loop {
            let invoke = ctx.clock.now();
            match keep_alive_once(&mut keeper, &mut answers).await {
                Ok(Some(ttl)) if ttl > 0 => life.lock().expect("lifeline lock poisoned").push((invoke, ttl)),
                Ok(Some(_)) => return,
                _ => {
                    member = rng.below(ctx.endpoints.len());
                    break;
                }
            }
            ctx.pause(KEEPALIVE_EVERY).await;
            if ctx.stopping() {
                return;
            }
        }
    }
}

/// A grant as the client holds it.
pub(super) struct Held {
    pub(super) key: Vec<u8>,
    pub(super) token: i64,
}

/// What a native acquire asks for.
#[derive(Clone, Copy)]
pub(super) struct Ask {
    pub(super) permits: u32,
    pub(super) read: bool,
    pub(super) wait: Duration,
    pub(super) lock_delay_ms: u32,
}

async fn acquire(
    api: Api,
    c: &mut Client,
    native: &mut LocksClient<Channel>,
    name: &str,
    lease: i64,
    read: bool,
) -> Result<Held, String> {
    match api {
        Api::Etcd => {
            let locked = tokio::time::timeout(ACQUIRE_WAIT, c.lock(name, Some(LockOptions::new().with_lease(lease))))
                .await
                .map_err(|_| "lock timed out".to_string())?
                .map_err(|e| e.to_string())?;
            let key = locked.key().to_vec();
            // The fencing token is the key's create revision.
            let got = bounded(c.get(key.clone(), None)).await?;
            let token = got.kvs().first().map(|kv| kv.create_revision()).ok_or("the lock key is gone already")?;
            Ok(Held { key, token })
        }
        Api::Native { permits } => {
            let ask = Ask { permits, read: false, wait: ACQUIRE_WAIT, lock_delay_ms: 0 };
            acquire_native(native, name, lease, ask).await
        }
        Api::ReadWrite => {
            let ask = Ask { permits: 1, read, wait: ACQUIRE_WAIT, lock_delay_ms: 0 };
            acquire_native(native, name, lease, ask).await
        }
        Api::Delayed => {
            let ask = Ask { permits: 1, read: false, wait: ACQUIRE_WAIT, lock_delay_ms: LOCK_DELAY_MS };
            acquire_native(native, name, lease, ask).await
        }
    }
}

pub(super) async fn acquire_native(
    native: &mut LocksClient<Channel>,
    name: &str,
    lease: i64,
    ask: Ask,
) -> Result<Held, String> {
    let req = AcquireRequest {
        name: name.as_bytes().to_vec(),
        lease,
        wait_ms: ask.wait.as_millis() as i64,
        permits: ask.permits,
        metadata: Vec::new(),
        mode: if ask.read { Mode::Read } else { Mode::Write }.into(),
        reentrant: false,
        lock_delay_ms: ask.lock_delay_ms,
        ..Default::default()
    };
    let resp = tokio::time::timeout(ask.wait + Duration::from_secs(1), native.acquire(req))
        .await
        .map_err(|_| "acquire timed out".to_string())?
        .map_err(|s| s.message().to_string())?
        .into_inner();
    if !resp.acquired {
        return Err("not acquired within the wait".to_string());
    }
    Ok(Held { key: resp.key, token: resp.token })
}

/// Acquire the grant `held` again, reentrantly, and give that hold back.
/// `None` when an answer was lost (the holds are then unknown).
async fn reenter(
    native: &mut LocksClient<Channel>,
    name: &str,
    lease: i64,
    read: bool,
    held: &Held,
) -> Option<(i64, u32, u32)> {
    let req = AcquireRequest {
        name: name.as_bytes().to_vec(),
        lease,
        mode: if read { Mode::Read } else { Mode::Write }.into(),
        reentrant: true,
        ..Default::default()
    };
    let again = bounded(native.acquire(req)).await.ok()?.into_inner();
    if !again.acquired {
        // Not even the same grant: a wrong answer, told by its token 0.
        return Some((0, 0, 0));
    }
    let req = ReleaseRequest { key: held.key.clone(), token: held.token, ..Default::default() };
    let released = bounded(native.release(req)).await.ok()?.into_inner();
    Some((again.token, again.holds, if released.released { released.holds } else { u32::MAX }))
}

/// Read `name`'s counter in a txn guarded by the grant; `Some(None)`: the
/// guard found the holder deposed; `None`: no certain answer.
async fn guarded_read(c: &mut Client, name: &str, held: &Held) -> Option<Option<u64>> {
    let guard = Compare::create_revision(held.key.clone(), CompareOp::Equal, held.token);
    let txn = Txn::new().when([guard]).and_then([TxnOp::get(counter_key(name), None)]);
    let resp = bounded(c.txn(txn)).await.ok()?;
    if !resp.succeeded() {
        return Some(None);
    }
    let value = resp.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => {
            Some(get.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok()).unwrap_or(0))
        }
        _ => None,
    });
    Some(Some(value.unwrap_or(0)))
}

/// Release; `Ok(false)` when the native API says the key was no longer ours.
pub(super) async fn release(
    api: Api,
    c: &mut Client,
    native: &mut LocksClient<Channel>,
    held: &Held,
) -> Result<bool, String> {
    match api {
        Api::Etcd => bounded(c.unlock(held.key.clone())).await.map(|_| true),
        Api::Native { .. } | Api::ReadWrite | Api::Delayed => {
            let req = ReleaseRequest { key: held.key.clone(), token: held.token, ..Default::default() };
            bounded(native.release(req)).await.map(|r| r.into_inner()).map(|r| r.released && r.holds == 0)
        }
    }
}

/// One fenced increment of `name`'s counter; `Ok(false)`: the guard found
/// this holder deposed.
pub(super) async fn increment(
    c: &mut Client,
    name: &str,
    held: &Held,
    client: usize,
    history: &mut LockHistory,
) -> Option<bool> {
    let counter = counter_key(name);
    let read = bounded(c.get(counter.as_str(), None)).await.ok()?;
    let value: u64 = read.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok()).unwrap_or(0);
    let guard = Compare::create_revision(held.key.clone(), CompareOp::Equal, held.token);
    let txn = Txn::new().when([guard]).and_then([TxnOp::put(counter.as_str(), (value + 1).to_string(), None)]);
    let counts = history.increments.entry(name.to_string()).or_default();
    let (outcome, revision) = match bounded(c.txn(txn)).await {
        Ok(resp) => {
            if resp.succeeded() {
                counts.0 += 1;
            }
            let revision = if resp.succeeded() { resp.header().map_or(0, |h| h.revision()) } else { 0 };
            (Outcome::Ok(resp.succeeded()), revision)
        }
        Err(e) => {
            counts.1 += 1;
            (Outcome::Unknown(e), 0)
        }
    };
    let written = match outcome {
        Outcome::Ok(w) => Some(w),
        _ => None,
    };
    history.writes.push(GuardedWrite { name: name.to_string(), client, token: held.token, revision, outcome });
    written
}

/// Ask `Validate` about the grant `held` of mutex `name`; `None` without a
/// certain answer.
async fn validate(
    ctx: &Context,
    native: &mut LocksClient<Channel>,
    name: &str,
    held: &Held,
    client: usize,
) -> Option<Validation> {
    let invoked = ctx.clock.now();
    let req = ValidateRequest { key: held.key.clone(), token: held.token, permits: 1 };
    let answer = bounded(native.validate(req)).await.ok()?.into_inner();
    let completed = ctx.clock.now();
    Some(Validation { name: name.to_string(), client, token: held.token, invoked, completed, current: answer.current })
}

/// Take every one of `names` at once (a multi-lock), in the order given; the
/// grants in the same order.
async fn acquire_all(native: &mut LocksClient<Channel>, names: &[String], lease: i64) -> Result<Vec<Held>, String> {
    acquire_all_within(native, names, lease, ACQUIRE_WAIT).await
}

async fn acquire_all_within(
    native: &mut LocksClient<Channel>,
    names: &[String],
    lease: i64,
    wait: Duration,
) -> Result<Vec<Held>, String> {
    let req = AcquireRequest {
        lease,
        wait_ms: wait.as_millis() as i64,
        locks: names.iter().map(|n| LockSpec { name: n.as_bytes().to_vec(), ..Default::default() }).collect(),
        ..Default::default()
    };
    let resp = tokio::time::timeout(wait + Duration::from_secs(1), native.acquire(req))
        .await
        .map_err(|_| "acquire timed out".to_string())?
        .map_err(|s| s.message().to_string())?
        .into_inner();
    if !resp.acquired {
        return Err("not acquired within the wait".to_string());
    }
    if resp.grants.len() != names.len() {
        return Err(format!("{} grants for {} locks", resp.grants.len(), names.len()));
    }
    Ok(resp.grants.into_iter().map(|g| Held { key: g.key, token: g.token }).collect())
}

/// A lock client's connection to `member` (etcd's API and the native one)
/// and a lease kept alive there; `None` if either failed.
pub(super) async fn open_session(ctx: &Context, member: usize) -> Option<(Client, LocksClient<Channel>, HeldLease)> {
    let endpoint = ctx.endpoints[member].clone();
    let mut c = connect(std::slice::from_ref(&endpoint)).await.ok()?;
    let native = LocksClient::new(Endpoint::from_shared(endpoint).ok()?.connect_lazy());
    let lease = HeldLease::grant(ctx, &mut c, member).await.ok()?;
    Some((c, native, lease))
}

/// How long the liveness probe waits: every place a stopped client left
/// goes within its lease's TTL and the keeper's expiry (or at once, revoked),
/// a lock-delay within [`LOCK_DELAY_MS`], all far below this.
const PROBE_WAIT: Duration = Duration::from_secs(20);

/// Liveness: one more multi-lock of `names` once the faults have healed and
/// the clients are stopping, on a lease of its own that needs no keepalive
/// (whose task stops with the clients). A place stuck in a queue (a
/// deadlock, a lock-delay never ended) leaves it waiting.
async fn liveness_probe(ctx: &Context, id: usize, names: &[String]) -> Liveness {
    let invoked = ctx.clock.now();
    let outcome = async {
        let endpoint = ctx.endpoints[id % ctx.endpoints.len()].clone();
        let mut c = connect(std::slice::from_ref(&endpoint)).await.map_err(|e| e.to_string())?;
        let channel = Endpoint::from_shared(endpoint).map_err(|e| e.to_string())?.connect_lazy();
        let mut native = LocksClient::new(channel);
        let lease = bounded(c.lease_grant(60, None)).await?.id();
        let held = acquire_all_within(&mut native, names, lease, PROBE_WAIT).await;
        let _ = bounded(c.lease_revoke(lease)).await;
        held.map(|_| ())
    }
    .await;
    Liveness {
        client: id,
        names: names.to_vec(),
        invoked,
        completed: ctx.clock.now(),
        granted: outcome.is_ok(),
        why: outcome.err().unwrap_or_default(),
    }
}

/// One client taking all of `names` together (multi-locks), each time in a
/// shuffled order, and incrementing every name's counter under the set;
/// once stopped, a last one that must be granted ([`liveness_probe`]).
pub async fn multi_client(ctx: Context, id: usize, mut names: Vec<String>, seed: u64) -> LockHistory {
    let mut rng = Rng::new(seed);
    let mut history = LockHistory::default();
    let mut member = id % ctx.endpoints.len();
    while !ctx.stopping() {
        let Some((mut c, mut native, lease)) = open_session(&ctx, member).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        while !ctx.stopping() {
            for i in (1..names.len()).rev() {
                names.swap(i, rng.below(i + 1));
            }
            let acquire_invoked = ctx.clock.now();
            let Ok(held) = acquire_all(&mut native, &names, lease.id).await else { break };
            let granted_at = ctx.clock.now();
            let mut deposed = false;
            'names: for (name, held) in names.iter().zip(&held) {
                match increment(&mut c, name, held, id, &mut history).await {
                    Some(true) => {}
                    Some(false) => {
                        deposed = true;
                        break 'names;
                    }
                    None => break 'names,
                }
            }
            let released_at = ctx.clock.now();
            let grants = held
                .iter()
                .map(|h| raftlock::proto::raftlock::v1::Grant {
                    key: h.key.clone(),
                    token: h.token,
                    ..Default::default()
                })
                .collect();
            let req = ReleaseRequest { grants, ..Default::default() };
            let released = bounded(native.release(req)).await.map(|r| r.into_inner().released);
            let kept = !deposed && matches!(released, Ok(true)) && lease.covers(granted_at, released_at);
            for (name, held) in names.iter().zip(&held) {
                history.grants.push(Grant {
                    name: name.clone(),
                    client: id,
                    permits: 1,
                    token: held.token,
                    acquire_invoked,
                    granted_at,
                    released_at,
                    kept,
                    shared: false,
                    multi: true,
                    lock_delay_ms: 0,
                    ended_after: None,
                });
            }
            if released.is_err() {
                break;
            }
        }
        lease.give_up(&mut c).await;
        member = rng.below(ctx.endpoints.len());
    }
    history.liveness.push(liveness_probe(&ctx, id, &names).await);
    history
}

/// One client taking `names` in turn through `api`.
pub async fn client(ctx: Context, id: usize, api: Api, names: Vec<String>, seed: u64) -> LockHistory {
    let mut rng = Rng::new(seed);
    let mut history = LockHistory::default();
    let mut member = id % ctx.endpoints.len();
    let permits = match api {
        Api::Etcd | Api::ReadWrite | Api::Delayed => 1,
        Api::Native { permits } => permits.max(1) as usize,
    };
    while !ctx.stopping() {
        let Some((mut c, mut native, lease)) = open_session(&ctx, member).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        // Take locks under this lease until something fails; then start
        // over with a new lease (an attempt that failed may have left a key).
        while !ctx.stopping() {
            let name = names[rng.below(names.len())].clone();
            let (read, reentrant) = match api {
                Api::ReadWrite => (rng.below(3) < 2, rng.below(4) == 0),
                _ => (false, false),
            };
            let acquire_invoked = ctx.clock.now();
            let Ok(held) = acquire(api, &mut c, &mut native, &name, lease.id, read).await else { break };
            let granted_at = ctx.clock.now();
            let mut deposed = false;
            let mut reentry = None;
            if reentrant {
                match reenter(&mut native, &name, lease.id, read, &held).await {
                    Some((token_again, holds_after_acquire, holds_after_release)) => {
                        // Judged on its own: a wrong answer must not hide behind
                        // the deposed holder it makes.
                        let kept = lease.covers(granted_at, ctx.clock.now());
                        reentry = Some(Reentry {
                            name: name.clone(),
                            client: id,
                            token: held.token,
                            token_again,
                            holds_after_acquire,
                            holds_after_release,
                            kept,
                        });
                    }
                    // The holds are unknown: give the lease up with the grant.
                    None => deposed = true,
                }
            }
            let mut read_twice = None;
            match (deposed, read, permits) {
                (true, _, _) => {}
                (false, true, _) => {
                    let first = guarded_read(&mut c, &name, &held).await;
                    ctx.pause(rng.between(Duration::from_millis(5), Duration::from_millis(30))).await;
                    let second = guarded_read(&mut c, &name, &held).await;
                    match (first, second) {
                        (Some(Some(first)), Some(Some(second))) => read_twice = Some((first, second)),
                        (Some(None), _) | (_, Some(None)) => deposed = true,
                        _ => {}
                    }
                }
                (false, false, 1) => {
                    for _ in 0..2 {
                        match increment(&mut c, &name, &held, id, &mut history).await {
                            Some(true) => {}
                            Some(false) => {
                                deposed = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    if let Some(v) = validate(&ctx, &mut native, &name, &held, id).await {
                        history.validations.push(v);
                    }
                }
                (false, false, _) => {
                    ctx.pause(rng.between(Duration::from_millis(5), Duration::from_millis(50))).await;
                }
            }
            let released_at = ctx.clock.now();
            let abandon = matches!(api, Api::Delayed) && !deposed && rng.below(ABANDON_ONE_IN) == 0;
            let released = match abandon {
                // The holder dies holding the lock: its lease ends, not its grant.
                true => {
                    lease.keeper.abort();
                    bounded(c.lease_revoke(lease.id)).await.map(|_| false)
                }
                false => release(api, &mut c, &mut native, &held).await,
            };
            let kept = !deposed && (abandon || matches!(released, Ok(true))) && lease.covers(granted_at, released_at);
            let ended_after = match (api, abandon, &released) {
                // The revoke ended it, no sooner than it was invoked.
                (Api::Delayed, true, Ok(_)) => Some(released_at),
                // Found gone at its release: ended after it was last known alive.
                (Api::Delayed, false, Ok(false)) => Some(lease.alive_after(acquire_invoked, released_at)),
                _ => None,
            };
            if let Some((first, second)) = read_twice {
                history.reads.push(SharedRead { name: name.clone(), client: id, token: held.token, first, second });
            }
            let reentered = reentry.is_some();
            history.reentries.extend(reentry);
            history.grants.push(Grant {
                name: name.clone(),
                client: id,
                permits,
                token: held.token,
                acquire_invoked,
                granted_at,
                released_at,
                kept,
                shared: read,
                multi: false,
                lock_delay_ms: if matches!(api, Api::Delayed) { LOCK_DELAY_MS as u64 } else { 0 },
                ended_after,
            });
            if released.is_err() || abandon || reentrant && !reentered {
                break;
            }
        }
        lease.give_up(&mut c).await;
        member = rng.below(ctx.endpoints.len());
    }
    history
}

#[cfg(test)]
mod tests {
    use super::covered;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_lifeline_covers_only_what_its_ttls_reach() {
        let life = [(0, 3), (2 * S, 3), (4 * S, 3)];
        assert!(covered(&life, S, 6 * S));
        assert!(!covered(&life, S, 7 * S), "4 s + 3 s ends at 7 s");
        assert!(!covered(&[(0, 3), (4 * S, 3)], S, 5 * S), "a gap from 3 s to 4 s");
        assert!(!covered(&[(0, 0)], 0, 1), "a TTL of 0 covers nothing");
    }
}
