//! raftlock's native locks (`raftlock.v1.Locks`): acquire with a wait timeout
//! or try-once, semaphores of N permits, fenced release, and introspection.
//!
//! These are the queues of the module above with three additions: a waiter
//! that reaches its deadline removes its key and answers who holds the lock
//! instead; the owner's metadata is the key's value; and Describe and List show
//! queues as they are, linearizably read (Describe with every owner's lease
//! TTL).
//!
//! Read-write locks and reentrancy are this module's too: an acquire names its
//! [`Mode`]; a reentrant one by a lease that already holds the lock in that
//! mode adds a hold to the grant (in its hold-count key, see the module above)
//! and [`release`] takes one back, deleting the owner key with the last. A
//! plain acquire by such a lease answers with the grant and adds nothing:
//! that keeps retries safe, which a reentrant acquire is not (a retry whose
//! first answer was lost adds a second hold).
//!
//! Invariant: an acquire that does not answer "acquired" leaves no key behind
//! (its removal is fenced by the key's token, so it can never remove a later
//! grant) while its place waits; a place whose turn came as its caller went
//! away is kept for the lease, which another acquire of it may have been
//! told it holds (see `CleanupOnDrop`). One that finds the lease holding the
//! lock never removes it. A
//! place in the queue belongs to the lease, as in etcd: acquires by one lease
//! of one lock share it; one that gives up while the place waits gives it up,
//! and each reentrant one that is granted adds a hold.
//!
//! Caveat: a hold count is read, then written in a txn guarded by its
//! mod_revision, and retried when another acquire or release of the same
//! lease came between: concurrent acquires of one lease are rare.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::turn::{enqueue_guarded, wait_for_turn, GaveUp};
use super::{compare, create_revision_is, hold_count_key, mode_of, queue_prefix, Mode, Place, QueueKey, RecipeError};
use crate::model::lock_delay;
use crate::model::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyValue, MvccError, MvccStore, PutRequest,
    RangeRequest, RequestOp, ResponseOp, TxnRequest,
};
use crate::node::Node;

/// How long an acquire may wait for its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Answer at once.
    Never,
    For(Duration),
    /// Until granted, the lease ends or the caller goes away.
    Forever,
}

/// An owner in a lock's queue (a holder or a waiter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kv: KeyValue,
    /// Seconds left on the owner's lease (-1: unknown or ended); Describe only.
    pub ttl: i64,
    /// The lease's granted TTL in seconds; Describe only.
    pub granted_ttl: i64,
    pub mode: Mode,
    /// The lease's holds on the grant; Describe only, for holders (else 0).
    pub holds: u32,
    /// The grant's lock-delay in ms; Describe only, for holders (else 0).
    pub lock_delay_ms: u32,
}

impl Owner {
    pub(super) fn of(prefix: &[u8], kv: KeyValue) -> Self {
        Owner { mode: mode_of(prefix, &kv.key), kv, ttl: -1, granted_ttl: 0, holds: 0, lock_delay_ms: 0 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Held: the owner key (its create_revision is the fencing token), and the
    /// lease's holds on it, this acquire's included.
    Granted { kv: KeyValue, revision: i64, holds: u32 },
    /// Not held within the wait; who holds the lock.
    Refused { holders: Vec<Owner>, revision: i64 },
}

/// What to acquire: `permits` places of lock `name` (a reader's is 1) in
/// `mode` for `lease`; `metadata` becomes the owner key's value.
pub struct Request<'a> {
    pub name: &'a [u8],
    pub lease: i64,
    pub metadata: &'a [u8],
    pub permits: usize,
    pub mode: Mode,
    /// Add a hold if the lease holds the lock already.
    pub reentrant: bool,
    /// The grant's lock-delay in ms (0: none; an exclusive lock only).
    pub lock_delay_ms: u32,
}

/// Acquire as `req` says, waiting at most `wait`.
pub async fn acquire(node: Arc<Node>, req: Request<'_>, wait: Wait) -> Result<Acquired, RecipeError> {
    let lock_delay_ms = req.lock_delay_ms;
    let acquired = acquire_place(node.clone(), req, wait).await?;
    match acquired {
        Acquired::Granted { kv, holds, .. } if lock_delay_ms > 0 => {
            let revision = set_lock_delay(&node, &kv, lock_delay_ms).await?;
            Ok(Acquired::Granted { kv, revision, holds })
        }
        other => Ok(other),
    }
}

/// Store the lock-delay of the grant `owner` (`crate::model::lock_delay`),
/// once it is granted: a lock-delay protects a grant, never a place that
/// waits. Fails if the grant has ended meanwhile (its lease ended).
async fn set_lock_delay(node: &Node, owner: &KeyValue, ms: u32) -> Result<i64, RecipeError> {
    let setting = PutRequest {
        key: lock_delay::setting_key(&owner.key),
        value: lock_delay::format_ms(ms),
        lease: owner.lease,
        ..Default::default()
    };
    let guard = vec![create_revision_is(&owner.key, owner.create_revision)];
    super::put_if(node, guard, setting).await?.ok_or(RecipeError::SessionExpired)
}

async fn acquire_place(node: Arc<Node>, req: Request<'_>, wait: Wait) -> Result<Acquired, RecipeError> {
    let Request { name, lease, metadata, permits, mode, reentrant, .. } = req;
    let place = Place { name, lease, value: metadata, permits, mode, native: true };
    let (queued, cleanup) = enqueue_guarded(&node, &place).await?;
    if queued.holds() {
        cleanup.disarm();
        let holds = holds_of(&queued.mine, queued.hold_count.as_ref());
        if queued.created || !reentrant {
            return Ok(Acquired::Granted { kv: queued.mine, revision: queued.revision, holds });
        }
        let (holds, revision) = add_hold(&node, &queued.mine, queued.hold_count).await?;
        return Ok(Acquired::Granted { kv: queued.mine, revision, holds });
    }
    let prefix = queue_prefix(name);
    let waited = match wait {
        // An overflowing deadline is as good as none.
        Wait::For(d) => match Instant::now().checked_add(d) {
            Some(deadline) => wait_for_turn(&node, &prefix, &queued.mine, mode, permits, Some(deadline)).await,
            None => wait_for_turn(&node, &prefix, &queued.mine, mode, permits, None).await,
        },
        Wait::Forever => wait_for_turn(&node, &prefix, &queued.mine, mode, permits, None).await,
        Wait::Never => Err(RecipeError::TimedOut),
    };
    let held = match waited {
        Ok(kv) => {
            cleanup.disarm();
            kv
        }
        Err(RecipeError::TimedOut) => match cleanup.give_up().await? {
            // The turn came as the wait ended: the place holds, and is kept.
            GaveUp::Holds(kv) => kv,
            // The place belongs to the lease, as in etcd: an acquire that gives
            // up removes it while it waits, even if another acquire by the
            // lease made it.
            GaveUp::Removed(removed) => {
                let holders = if wait == Wait::Never {
                    queued.front
                } else {
                    node.read_barrier().await?;
                    let mvcc = node.state().mvcc();
                    super::holders_now(&mvcc, name, permits).map_err(RecipeError::Mvcc)?
                };
                let holders = holders.into_iter().map(|kv| Owner::of(&prefix, kv)).collect();
                return Ok(Acquired::Refused { holders, revision: removed.revision });
            }
        },
        Err(e) => return Err(e),
    };
    if queued.created || !reentrant {
        // A place gets a hold count only once it holds: this is its first hold.
        return Ok(Acquired::Granted { kv: held, revision: node.revision(), holds: 1 });
    }
    // Another acquire of this lease made the place; both now hold it.
    let (holds, revision) = add_hold(&node, &held, None).await?;
    Ok(Acquired::Granted { kv: held, revision, holds })
}

/// A lock's holders and a page of its waiters, each with its lease's TTL
/// (asked of the leader).
pub struct Description {
    pub holders: Vec<Owner>,
    pub waiters: Vec<Owner>,
    pub revision: i64,
    /// The lock's delay marker, while it is in a lock-delay.
    pub delay: Option<KeyValue>,
    /// Whether more waiters follow the last one in `waiters`.
    pub more: bool,
}

/// Which waiters a [`describe`] answers.
#[derive(Clone, Debug)]
pub struct Page {
    /// At most this many (at least one).
    pub limit: usize,
    /// Those after this token (0: from the first), and among the keys with
    /// that token (made by one txn), after `after_key` (empty: none of them).
    pub after: i64,
    pub after_key: Vec<u8>,
}

/// The most waiters one [`describe`] answers, and how many when not told.
pub const MOST_WAITERS: usize = 10_000;
pub const DEFAULT_WAITERS: usize = 1_000;

impl Page {
    /// The page a request asks for (`limit` 0: the default; capped).
    pub fn of(limit: u32, after: i64, after_key: Vec<u8>) -> Self {
        let limit = match limit as usize {
            0 => DEFAULT_WAITERS,
            n => n.min(MOST_WAITERS),
        };
        Page { limit, after, after_key }
    }
}

/// Lock `name`'s holders, every one, and the page `page` of its waiters,
/// read linearizably in one state. What is read is bounded by the holders
/// and the page, not by the queue: the holders from the front of the queue
/// (`holders_now`), the waiters from the first token past `page.after`,
/// both answered from the store's queue index; hold counts and delay
/// settings are looked up for the holders alone, and the leases' TTLs of
/// the owners answered, in one question to the leader.
pub async fn describe(node: &Node, name: &[u8], permits: usize, page: Page) -> Result<Description, RecipeError> {
    node.read_barrier().await?;
    let prefix = queue_prefix(name);
    let (holders, waiters, asides, delay, more, revision) = {
        let mvcc = node.state().mvcc();
        let point = |key: Vec<u8>| super::point(&mvcc, key).map_err(RecipeError::Mvcc);
        let holders = super::holders_now(&mvcc, name, permits).map_err(RecipeError::Mvcc)?;
        // Hold counts and delay settings of the holders, by key.
        let mut asides = BTreeMap::new();
        for holder in &holders {
            for key in [hold_count_key(&holder.key), lock_delay::setting_key(&holder.key)] {
                if let Some(kv) = point(key.clone())? {
                    asides.insert(key, kv);
                }
            }
        }
        let delay = point(lock_delay::marker_key(name))?;
        let (waiters, more) = waiters_page(&mvcc, &prefix, &holders, &page).map_err(RecipeError::Mvcc)?;
        (holders, waiters, asides, delay, more, mvcc.revision())
    };
    // Every owner's lease times in one question to the leader.
    let leases: Vec<i64> = holders.iter().chain(&waiters).map(|kv| kv.lease).collect();
    let mut times = node.times_left(&leases).await?.into_iter();
    let mut owner = |kv: KeyValue, held: bool| {
        let (ttl, granted_ttl) = times.next().flatten().map_or((-1, 0), |t| (t.remaining, t.granted));
        let (holds, lock_delay_ms) = match held {
            true => (
                holds_of(&kv, asides.get(&hold_count_key(&kv.key))),
                asides.get(&lock_delay::setting_key(&kv.key)).and_then(|s| lock_delay::parse_ms(&s.value)).unwrap_or(0),
            ),
            false => (0, 0),
        };
        Owner { ttl, granted_ttl, holds, lock_delay_ms, ..Owner::of(&prefix, kv) }
    };
    let holders: Vec<Owner> = holders.into_iter().map(|kv| owner(kv, true)).collect();
    let waiters: Vec<Owner> = waiters.into_iter().map(|kv| owner(kv, false)).collect();
    Ok(Description { holders, waiters, revision, delay, more })
}

/// The waiters of the queue under `prefix` past `page`'s (token, key), at
/// most `page.limit` of them, first in line first, and whether more follow:
/// the owner keys there that are not among `holders` (hold counts, delay
/// settings and holders skipped), read a page at a time by create revision
/// from the store's queue index. Each read starts at the last token seen,
/// so keys that share it (made by one txn) are read again and skipped, and
/// the next read is larger by that many: it always gets further.
fn waiters_page(
    mvcc: &MvccStore,
    prefix: &[u8],
    holders: &[KeyValue],
    page: &Page,
) -> Result<(Vec<KeyValue>, bool), MvccError> {
    let held: std::collections::HashSet<&[u8]> = holders.iter().map(|kv| kv.key.as_slice()).collect();
    let mut waiters = Vec::new();
    let (mut after, mut after_key) = (page.after, page.after_key.clone());
    let mut ties = 0;
    loop {
        let wanted = page.limit + 1 - waiters.len() + ties;
        let read =
            mvcc.range(&RangeRequest { min_create_revision: after.max(1), ..super::front_range(prefix, wanted) })?;
        // Past the cursor: a later token, or a later key with its token.
        let past = |kv: &KeyValue, after: i64, after_key: &[u8]| {
            kv.create_revision > after
                || (kv.create_revision == after && !after_key.is_empty() && kv.key.as_slice() > after_key)
        };
        let Some(last) = read.kvs.last() else { return Ok((waiters, false)) };
        // The cursor moves to the last key read, never back: a read that
        // ends among the keys that share the cursor's token leaves it.
        let next = past(last, after, &after_key).then(|| (last.create_revision, last.key.clone()));
        ties = read.kvs.iter().filter(|kv| kv.create_revision == last.create_revision).count();
        for kv in read.kvs {
            let owner = matches!(super::classify(prefix, &kv.key), QueueKey::Exclusive | QueueKey::Shared);
            if past(&kv, after, &after_key) && owner && !held.contains(kv.key.as_slice()) {
                if waiters.len() == page.limit {
                    return Ok((waiters, true));
                }
                waiters.push(kv);
            }
        }
        if !read.more {
            return Ok((waiters, false));
        }
        if let Some(next) = next {
            (after, after_key) = next;
        }
    }
}

/// The holds on `owner`'s grant that its hold-count key (if any) says.
fn holds_of(owner: &KeyValue, count: Option<&KeyValue>) -> u32 {
    match count {
        // A count from an earlier grant of the same key does not count.
        Some(count) if count.create_revision > owner.create_revision => {
            std::str::from_utf8(&count.value).ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(1)
        }
        _ => 1,
    }
}

/// The guard that `owner`'s hold count is still as `count` was read: the same
/// key (by mod_revision) if it counted, else none that counts.
fn count_unchanged(owner: &KeyValue, count: Option<&KeyValue>) -> Compare {
    let key = hold_count_key(&owner.key);
    match count {
        Some(c) if c.create_revision > owner.create_revision => {
            compare(&key, CompareTarget::Mod, CompareResult::Equal, c.mod_revision)
        }
        _ => compare(&key, CompareTarget::Create, CompareResult::Less, owner.create_revision + 1),
    }
}

/// How many times a guarded hold-count change is tried before giving up.
const HOLD_COUNT_TRIES: usize = 64;

/// Add one hold to the grant `owner` (which the lease holds), starting from
/// the hold count `count` as read; returns the holds now and the revision.
async fn add_hold(node: &Node, owner: &KeyValue, mut count: Option<KeyValue>) -> Result<(u32, i64), RecipeError> {
    let key = hold_count_key(&owner.key);
    for _ in 0..HOLD_COUNT_TRIES {
        if let Some(stale) = count.as_ref().filter(|c| c.create_revision <= owner.create_revision) {
            // A count left from an earlier grant of the key (whose owner key
            // went alone): a put would keep its create_revision, and so its
            // staleness. Delete it first.
            let delete = DeleteRangeRequest { key: key.clone(), range_end: vec![], prev_kv: false };
            let txn = TxnRequest {
                compare: vec![
                    create_revision_is(&owner.key, owner.create_revision),
                    compare(&key, CompareTarget::Mod, CompareResult::Equal, stale.mod_revision),
                ],
                success: vec![RequestOp::DeleteRange(delete)],
                failure: reads_of(owner, &key),
            };
            let result = node.txn(txn, None).await?;
            count = if result.succeeded { None } else { still_held(owner, result.responses)? };
            continue;
        }
        let holds = holds_of(owner, count.as_ref()).saturating_add(1);
        let put = PutRequest {
            key: key.clone(),
            value: holds.to_string().into_bytes(),
            lease: owner.lease,
            ..Default::default()
        };
        let txn = TxnRequest {
            compare: vec![
                create_revision_is(&owner.key, owner.create_revision),
                count_unchanged(owner, count.as_ref()),
            ],
            success: vec![RequestOp::Put(put)],
            failure: reads_of(owner, &key),
        };
        let result = node.txn(txn, None).await?;
        if result.succeeded {
            return Ok((holds, result.revision));
        }
        count = still_held(owner, result.responses)?;
    }
    Err(RecipeError::Contended)
}

/// From a hold-count txn's failure branch: the count as it is now, if the
/// grant `owner` still exists.
fn still_held(owner: &KeyValue, responses: Vec<ResponseOp>) -> Result<Option<KeyValue>, RecipeError> {
    let (owner_now, count_now) = read_back(responses);
    if owner_now.map(|kv| kv.create_revision) != Some(owner.create_revision) {
        // The grant ended (its lease did, or a release) between the enqueue and now.
        return Err(RecipeError::SessionExpired);
    }
    Ok(count_now)
}

/// The failure branch of a hold-count txn: the owner key and its count.
fn reads_of(owner: &KeyValue, count_key: &[u8]) -> Vec<RequestOp> {
    let range = |key: &[u8]| RequestOp::Range(RangeRequest { key: key.to_vec(), ..Default::default() });
    vec![range(&owner.key), range(count_key)]
}

fn read_back(responses: Vec<ResponseOp>) -> (Option<KeyValue>, Option<KeyValue>) {
    let mut ranges = responses.into_iter().map(|r| match r {
        ResponseOp::Range(r) => r.kvs.into_iter().next(),
        _ => None,
    });
    (ranges.next().flatten(), ranges.next().flatten())
}

/// What a fenced [`release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    pub revision: i64,
    /// Whether a hold was given back.
    pub released: bool,
    /// When released: the holds left (0: the owner key is deleted).
    pub holds: u32,
    /// When not released: the key's create_revision now, 0 if it does not exist.
    pub current_token: i64,
}

/// Give back one hold of the grant `key` made with `token`: the last deletes
/// the key (and its hold count); an earlier one lowers the count. Nothing
/// changes unless the key still has that token, so a stale release cannot
/// touch a later grant.
pub async fn release(node: &Node, key: &[u8], token: i64) -> Result<Released, RecipeError> {
    let count_key = hold_count_key(key);
    let delete = |key: &[u8]| {
        RequestOp::DeleteRange(DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false })
    };
    // As the key is when the txn runs; the lease is unknown until read.
    let mut owner = KeyValue { key: key.to_vec(), create_revision: token, ..Default::default() };
    let mut count = None;
    for _ in 0..HOLD_COUNT_TRIES {
        let holds = holds_of(&owner, count.as_ref());
        let (success, left) = if holds <= 1 {
            // The delay setting goes with the key: a release starts no lock-delay.
            (vec![delete(key), delete(&count_key), delete(&lock_delay::setting_key(key))], 0)
        } else if holds == 2 {
            (vec![delete(&count_key)], 1)
        } else {
            let value = (holds - 1).to_string().into_bytes();
            let put = PutRequest { key: count_key.clone(), value, lease: owner.lease, ..Default::default() };
            (vec![RequestOp::Put(put)], holds - 1)
        };
        let txn = TxnRequest {
            compare: vec![create_revision_is(key, token), count_unchanged(&owner, count.as_ref())],
            success,
            failure: reads_of(&owner, &count_key),
        };
        let result = node.txn(txn, None).await?;
        if result.succeeded {
            return Ok(Released { revision: result.revision, released: true, holds: left, current_token: 0 });
        }
        let revision = result.revision;
        let (owner_now, count_now) = read_back(result.responses);
        match owner_now {
            Some(kv) if kv.create_revision == token => {
                owner = kv;
                count = count_now;
            }
            other => {
                let current_token = other.map_or(0, |kv| kv.create_revision);
                return Ok(Released { revision, released: false, holds: 0, current_token });
            }
        }
    }
    Err(RecipeError::Contended)
}

/// What [`validate`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// The revision the answer holds at.
    pub revision: i64,
    /// The key exists with the token and holds its lock.
    pub current: bool,
    /// The key's create_revision now, 0 if it does not exist.
    pub current_token: i64,
    /// The key's lease (0 when the key is gone) and its seconds left (-1).
    pub lease: i64,
    pub ttl: i64,
}

/// Whether the grant `key` made with `token` still holds its lock (the one
/// named by the key's path up to its last `/`, with `permits`), read
/// linearizably; with its lease's time left, asked of the leader.
pub async fn validate(node: &Node, key: &[u8], token: i64, permits: usize) -> Result<Validity, RecipeError> {
    let name = super::lock_name_of(key).ok_or_else(|| RecipeError::NotAnOwnerKey(key.to_vec()))?;
    node.read_barrier().await?;
    // The key and the lock's holders, read in one state (the holders as far
    // as the front of the queue decides them: a resource server that asks
    // for every request it serves does not read a long line of waiters).
    let (mine, holders, revision) = {
        let mvcc = node.state().mvcc();
        let mine = super::point(&mvcc, key.to_vec()).map_err(RecipeError::Mvcc)?;
        let holders = super::holders_now(&mvcc, name, permits).map_err(RecipeError::Mvcc)?;
        (mine, holders, mvcc.revision())
    };
    let Some(mine) = mine else {
        return Ok(Validity { revision, current: false, current_token: 0, lease: 0, ttl: -1 });
    };
    let current = mine.create_revision == token && holders.iter().any(|kv| kv.key == key);
    let ttl = node.time_to_live(mine.lease).await?.map_or(-1, |status| status.remaining);
    Ok(Validity { revision, current, current_token: mine.create_revision, lease: mine.lease, ttl })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queue `q/` as txns made it: a holder, five keys from one txn (one
    /// token), a hold count, two more keys. Waiters read a page at a time,
    /// of every size, come out once each, in order, both with a read of the
    /// queue registered in the index and without.
    #[test]
    fn pages_of_waiters_cover_the_queue_once_even_across_shared_tokens() {
        for indexed in [false, true] {
            let mut s = MvccStore::default();
            let put = |key: &str| {
                RequestOp::Put(PutRequest { key: key.as_bytes().to_vec(), value: b"w".to_vec(), ..Default::default() })
            };
            for txn in
                [vec!["q/a"], vec!["q/b", "q/c", "q/d", "q/e", "q/f"], vec!["q/a.holds"], vec!["q/g"], vec!["q/h"]]
            {
                let mut ops: Vec<RequestOp> = txn.into_iter().map(put).collect();
                if indexed {
                    ops.push(RequestOp::Range(super::super::front_range(b"q/", 1)));
                }
                s.txn(&TxnRequest { success: ops, ..Default::default() }, &()).unwrap();
            }
            let holders = super::super::holders_now(&s, b"q", 1).unwrap();
            assert_eq!(holders.iter().map(|kv| kv.key.as_slice()).collect::<Vec<_>>(), [b"q/a"]);
            let all = ["q/b", "q/c", "q/d", "q/e", "q/f", "q/g", "q/h"];
            for limit in 1..=8 {
                let (mut seen, mut page) = (Vec::new(), Page::of(limit, 0, Vec::new()));
                loop {
                    let (waiters, more) = waiters_page(&s, b"q/", &holders, &page).unwrap();
                    assert!(waiters.len() <= limit as usize);
                    seen.extend(waiters.iter().map(|kv| String::from_utf8(kv.key.clone()).unwrap()));
                    let Some(last) = waiters.last().filter(|_| more) else { break };
                    page = Page::of(limit, last.create_revision, last.key.clone());
                }
                assert_eq!(seen, all, "limit {limit}, indexed {indexed}");
            }
            // A token alone skips every key with it.
            let (waiters, _) = waiters_page(&s, b"q/", &holders, &Page::of(10, 0, Vec::new())).unwrap();
            let shared = waiters[0].create_revision;
            assert!(waiters[..5].iter().all(|kv| kv.create_revision == shared));
            let (waiters, _) = waiters_page(&s, b"q/", &holders, &Page::of(10, shared, Vec::new())).unwrap();
            assert_eq!(waiters.iter().map(|kv| kv.key.as_slice()).collect::<Vec<_>>(), [&b"q/g"[..], b"q/h"]);
        }
    }
}
