//! Locks, semaphores and elections, run on the server over the node facade.
//!
//! A lock (or an election) named `N` is a queue of ordinary keys `N/<lease id
//! in hex>`, each attached to its owner's lease and ordered by create_revision.
//! With `permits` = P the first P keys hold the lock (P = 1: a mutex; etcd's
//! Lock and Election always use 1); the others wait in FIFO order. Because the
//! keys are exactly etcd's, client-side recipes (etcdctl lock and elect,
//! clientv3's `concurrency`, python etcd3 locks), etcd's Lock service and the
//! native API all see and respect each other.
//!
//! Taking a place is one txn that also reads the front of the queue, so an
//! uncontended lock costs one write. Waiting is server-side, with no polling.
//! A waiter with one permit (a mutex, an election, either side of a
//! read-write lock) waits for the deletion of the last key queued ahead of
//! it that it waits for (a reader: the last writer's), which apply signals
//! for that key alone: a release wakes only the waiters whose turn it may
//! bring (the one queued behind it; behind a writer, the readers that waited
//! for it), and other writes wake no waiter (no thundering herd). A
//! semaphore waiter (more permits) is handed the applied changes under its
//! name's prefix (`AppliedState::follow`; other writes wake it not) and
//! counts down the deletions of keys ahead of it, looking at the store
//! again only when its turn has come. Before it
//! answers, a waiter checks that its own key still exists in the committed
//! state in which its turn came: if its lease ended while it waited, it gets
//! an error, not the lock (etcd issue 11456). A waiter that gives up, times
//! out or is cancelled (the client went away) deletes its key while it
//! waits, never once its turn has come (see [`CleanupOnDrop`]): a place
//! belongs to the lease, and another acquire of it may have been told it
//! holds.
//!
//! Fencing: a grant's token is its key's create_revision, strictly greater for
//! every later holder of the same name. Releases can be fenced by it, so a
//! stale holder cannot delete a later grant of the same lease (etcd issue 22082).
//!
//! Read-write locks (native API only): a reader's key is `N/read-<lease hex>`
//! and holds once no other kind of key was queued before it ([`Mode::Read`]);
//! a writer is the mutex above and waits for every key before it, readers
//! included. Readers queued behind a waiting writer wait for it, so a stream
//! of readers cannot starve a writer. Reentrant holds (native API only) are
//! counted in `<owner key>.holds` ([`hold_count_key`]), which every waiter
//! ignores. Every kind of key is told apart by its name alone ([`classify`]).
//!
//! Caveats: names nest — the keys of lock `a/b` lie under `a/` and so queue in
//! lock `a` too (as writers), as in etcd; every user of a name must agree on
//! `permits`; raftlock's own waiters (etcd's Lock and Election services
//! included) skip every key whose last segment ends in `.holds`; and etcd's
//! clientv3 Mutex, which counts every key under the prefix, waits for a
//! hold-count key too — harmless, as it is deleted with its owner key, unless
//! an etcd Unlock deletes the owner key alone (the count then lingers until
//! its lease ends, or until the lease's next reentrant acquire deletes it).

pub mod election;
pub mod fenced;
pub mod mutex;
pub mod stats;

use std::sync::Arc;
use std::time::Instant;

use crate::model::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyRange, KeyValue, MvccError, PutRequest, RangeRequest,
    RequestOp, ResponseOp, SortOrder, SortTarget, TxnRequest,
};
use crate::node::{Node, ServerError, WriteError};

/// Re-exported where lock names meet key ranges.
pub use crate::model::mvcc::prefix_end;

/// Why a lock or election request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{0}")]
    Mvcc(MvccError),
    /// The waiter's own key vanished (its lease expired or was revoked).
    #[error("the session's lease ended")]
    SessionExpired,
    #[error("not the election's leader")]
    NotLeader,
    #[error("the election has no leader")]
    NoLeader,
    /// The wait for a lock reached its deadline.
    #[error("the wait for the lock timed out")]
    TimedOut,
    /// Auth refused the caller.
    #[error(transparent)]
    Denied(crate::model::auth::AuthError),
    /// The lease is queued for (or holds) the lock in this other mode.
    #[error("the lease already holds or waits for the lock in {} mode", match .0 { Mode::Read => "read", Mode::Write => "write" })]
    OtherMode(Mode),
    /// A hold count kept changing under this request (concurrent acquires
    /// and releases of one lease).
    #[error("the lock's hold count kept changing")]
    Contended,
}

impl From<WriteError> for RecipeError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Server(e) => RecipeError::Server(e),
            WriteError::Rejected(e) => RecipeError::Mvcc(e),
            WriteError::Denied(e) => RecipeError::Denied(e),
        }
    }
}

/// How a lock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Exclusive (with `permits` > 1: one of that many holders).
    Write,
    /// Shared with other readers, exclusive of everything else.
    Read,
}

impl Mode {
    /// The other mode.
    pub fn other(self) -> Mode {
        match self {
            Mode::Write => Mode::Read,
            Mode::Read => Mode::Write,
        }
    }
}

/// Where a reader's key name starts: `N/read-<lease hex>`.
pub(crate) const READER: &[u8] = b"read-";
/// Where a hold-count key's name ends: `<owner key>.holds`.
const HOLDS: &[u8] = b".holds";

/// The owner key of `lease` in lock `name`: `name/<lease hex>` for a writer
/// (etcd's key for a lease in a lock or election), `name/read-<lease hex>`
/// for a reader.
pub fn owner_key(name: &[u8], lease: i64, mode: Mode) -> Vec<u8> {
    let mut key = queue_prefix(name);
    if mode == Mode::Read {
        key.extend_from_slice(READER);
    }
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The key that counts the holds of a reentrant grant: `<owner key>.holds`.
/// Its value is the count in decimal (at least 2; absent means one hold); it
/// is attached to the owner's lease and counts only while its create_revision
/// is above the owner key's (a count left from an earlier grant does not).
pub fn hold_count_key(owner: &[u8]) -> Vec<u8> {
    [owner, HOLDS].concat()
}

/// What a key under a lock's prefix is to that lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKey {
    /// A writer, or anything else that is not a reader (an etcd lock or
    /// election key, a nested lock's key): every waiter waits for it.
    Exclusive,
    /// A reader: only writers wait for it.
    Shared,
    /// A hold count: nobody waits for it.
    HoldCount,
}

/// What `key` is to the lock whose keys start with `prefix` (`name/`).
pub fn classify(prefix: &[u8], key: &[u8]) -> QueueKey {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    if rest.contains(&b'/') {
        QueueKey::Exclusive
    } else if rest.ends_with(HOLDS) {
        QueueKey::HoldCount
    } else if rest.starts_with(READER) {
        QueueKey::Shared
    } else {
        QueueKey::Exclusive
    }
}

/// Whether a waiter in `mode` waits for an earlier key of kind `kind`.
fn waits_for(mode: Mode, kind: QueueKey) -> bool {
    match kind {
        QueueKey::HoldCount => false,
        QueueKey::Exclusive => true,
        QueueKey::Shared => mode == Mode::Write,
    }
}

/// The mode of an owner key's grant.
pub fn mode_of(prefix: &[u8], key: &[u8]) -> Mode {
    match classify(prefix, key) {
        QueueKey::Shared => Mode::Read,
        _ => Mode::Write,
    }
}

/// Split a queue (its keys in create_revision order) into holders and
/// waiters, leaving hold counts out. A writer holds while fewer than
/// `permits` owners are ahead of it, a reader while no writer is.
pub fn holders_and_waiters(prefix: &[u8], queue: Vec<KeyValue>, permits: usize) -> (Vec<KeyValue>, Vec<KeyValue>) {
    let (mut holders, mut waiters) = (Vec::new(), Vec::new());
    let (mut ahead, mut writers_ahead) = (0, 0);
    for kv in queue {
        let holds = match classify(prefix, &kv.key) {
            QueueKey::HoldCount => continue,
            QueueKey::Shared => writers_ahead == 0,
            QueueKey::Exclusive => {
                writers_ahead += 1;
                ahead < permits
            }
        };
        ahead += 1;
        if holds {
            holders.push(kv);
        } else {
            waiters.push(kv);
        }
    }
    (holders, waiters)
}

/// A place in a lock's queue, as the txn that took it left things.
#[derive(Clone, Debug)]
pub struct Queued {
    /// Our key; its create_revision is our place (and fencing token).
    pub mine: KeyValue,
    /// The revision of the txn that queued (or found) the key.
    pub revision: i64,
    /// The holders of the lock at that revision, lowest create_revision
    /// first (as far as the keys read show them: see [`Place::whole_queue`]).
    pub front: Vec<KeyValue>,
    /// Whether the txn created our key (else the lease was queued already).
    pub created: bool,
    /// Our key's hold-count key, if it exists ([`Place::native`] only).
    pub hold_count: Option<KeyValue>,
}

impl Queued {
    /// Whether our key is among the holders.
    pub fn holds(&self) -> bool {
        self.front.iter().any(|kv| kv.key == self.mine.key && kv.create_revision == self.mine.create_revision)
    }
}

/// `name/`, the prefix of every key of a lock or election.
pub fn queue_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The first `permits` keys under `prefix`, by create_revision (0: all).
pub(super) fn front_range(prefix: &[u8], permits: usize) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        limit: permits as i64,
        ..Default::default()
    }
}

/// Which place in which queue to take.
#[derive(Clone, Debug)]
pub struct Place<'a> {
    pub name: &'a [u8],
    pub lease: i64,
    /// The owner key's value, if the txn creates it.
    pub value: &'a [u8],
    pub permits: usize,
    pub mode: Mode,
    /// Read the whole queue, not just its first `permits` keys: needed to
    /// find the holders of a lock with readers or hold counts in its queue.
    pub whole_queue: bool,
    /// The native API's place: read the hold-count key too, and refuse a
    /// lease queued in the other mode.
    pub native: bool,
}

impl<'a> Place<'a> {
    /// A place in a mutex or semaphore as etcd's services take it.
    pub fn etcd(name: &'a [u8], lease: i64, value: &'a [u8], permits: usize) -> Self {
        Place { name, lease, value, permits, mode: Mode::Write, whole_queue: false, native: false }
    }
}

/// Take a place in the queue of lock `name` for `lease`, in one txn (as etcd's
/// recipes do): create the owner key with `value` unless it exists, and read
/// back the key and the queue (its first `permits` keys, or all of it). A
/// lease that is already queued keeps its place (and its value). A native
/// place is not taken while the lease is queued in the other mode
/// ([`RecipeError::OtherMode`]).
pub async fn enqueue(node: &Node, place: &Place<'_>) -> Result<Queued, RecipeError> {
    let key = owner_key(place.name, place.lease, place.mode);
    let prefix = queue_prefix(place.name);
    let range = |key: Vec<u8>| RequestOp::Range(RangeRequest { key, ..Default::default() });
    let mut reads = vec![
        range(key.clone()),
        RequestOp::Range(front_range(&prefix, if place.whole_queue { 0 } else { place.permits })),
    ];
    let mut compare = vec![create_revision_is(&key, 0)];
    if place.native {
        let other = owner_key(place.name, place.lease, place.mode.other());
        reads.push(range(hold_count_key(&key)));
        reads.push(range(other.clone()));
        compare.push(create_revision_is(&other, 0));
    }
    let put = RequestOp::Put(PutRequest {
        key: key.clone(),
        value: place.value.to_vec(),
        lease: place.lease,
        ..Default::default()
    });
    let txn =
        TxnRequest { compare, success: std::iter::once(put).chain(reads.iter().cloned()).collect(), failure: reads };
    let result = node.txn(txn, None).await?;
    let mut ranges = result.responses.into_iter().filter_map(|r| match r {
        ResponseOp::Range(r) => Some(r.kvs),
        _ => None,
    });
    let (Some(mine), Some(queue)) = (ranges.next(), ranges.next()) else {
        unreachable!("the queue txn reads the key and the queue")
    };
    let (hold_count, other) = (ranges.next().and_then(first), ranges.next().and_then(first));
    if other.is_some() {
        return Err(RecipeError::OtherMode(place.mode.other()));
    }
    // A failure branch on a key that exists always finds it: the txn is atomic.
    let mine = mine.into_iter().next().ok_or(RecipeError::SessionExpired)?;
    let front = holders_and_waiters(&prefix, queue, place.permits).0;
    Ok(Queued { mine, revision: result.revision, front, created: result.succeeded, hold_count })
}

fn first(kvs: Vec<KeyValue>) -> Option<KeyValue> {
    kvs.into_iter().next()
}

/// [`enqueue`], guarded: the place comes with the [`CleanupOnDrop`] that
/// removes it unless disarmed. The txn runs in a task of its own, so that
/// a caller that goes away while it is in flight (a cancelled request) cannot
/// leave a place behind: the task finishes, and the guard it produced, which
/// nobody takes, removes the key. A place the lease already held comes with
/// an unarmed guard: an acquire that finds the lock held by its lease never
/// removes it.
pub async fn enqueue_guarded(node: &Arc<Node>, place: &Place<'_>) -> Result<(Queued, CleanupOnDrop), RecipeError> {
    let (node, name, value) = (node.clone(), place.name.to_vec(), place.value.to_vec());
    let place = Place { name: &[], value: &[], ..place.clone() };
    let task = tokio::spawn(async move {
        let place = Place { name: &name, value: &value, ..place };
        let queued = match enqueue(&node, &place).await {
            // Its txn may or may not have been applied: queue again (a place
            // the first try made is then joined). Not for the native API,
            // where a reentrant acquire would count a join as a second hold.
            Err(RecipeError::Server(ServerError::LeaderChanged)) if !place.native => enqueue(&node, &place).await?,
            queued => queued?,
        };
        let waits = Waits { prefix: queue_prefix(place.name), mode: place.mode, permits: place.permits };
        let guard = match !queued.created && queued.holds() {
            // The lease held the lock already: nothing of this acquire's to remove.
            true => CleanupOnDrop::unarmed(waits),
            false => CleanupOnDrop::new(node, &queued.mine, waits),
        };
        Ok((queued, guard))
    });
    task.await.unwrap_or(Err(RecipeError::Server(ServerError::Stopped)))
}

/// A txn guard: `key`'s create_revision is `revision` (0: it does not exist).
pub(super) fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    compare(key, CompareTarget::Create, CompareResult::Equal, revision)
}

/// A txn guard on one key: its `target` compares to `number` as `result` says.
pub(super) fn compare(key: &[u8], target: CompareTarget, result: CompareResult, number: i64) -> Compare {
    Compare { result, target, key: key.to_vec(), range_end: vec![], number, value: vec![] }
}

/// The place `key` (made with `token`) as this member's applied state has
/// it (or whatever now has that key), the keys queued ahead of it under
/// `prefix` that a `mode` waiter waits for ([`classify`]), and the revision
/// of that state.
fn standing(
    node: &Node,
    key: &[u8],
    token: i64,
    prefix: &[u8],
    mode: Mode,
) -> Result<(Option<KeyValue>, Vec<KeyValue>, i64), RecipeError> {
    let mvcc = node.state().mvcc();
    let own = mvcc.range(&RangeRequest { key: key.to_vec(), ..Default::default() });
    let own = own.map_err(RecipeError::Mvcc)?.kvs.into_iter().next();
    let earlier = RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        max_create_revision: token - 1,
        keys_only: true,
        ..Default::default()
    };
    let mut ahead = mvcc.range(&earlier).map_err(RecipeError::Mvcc)?.kvs;
    ahead.retain(|kv| waits_for(mode, classify(prefix, &kv.key)));
    Ok((own, ahead, mvcc.revision()))
}

/// Wait until fewer than `permits` keys under `prefix` that a `mode` waiter
/// waits for ([`classify`]) were created before `mine` (it holds the lock), or
/// until `deadline` ([`RecipeError::TimedOut`]). A reader's `permits` is 1.
/// Fails if `mine` itself is deleted (its lease ended) before its turn comes.
/// Returns our key as it is when the turn came.
///
/// It reads the keys ahead in the local applied state (committed, so the
/// reading is true at that revision; later keys are created behind `mine`),
/// and waits for deletions: with one permit, of the last key ahead
/// ([`wait_for_the_last_key_ahead`]); with more, of any key ahead, counted
/// down from the changes under the prefix ([`count_down_the_keys_ahead`]). Either way it looks at
/// the store again only when the turn may have come, and that look is the
/// re-check: our key (hence our lease) is alive in the committed state in
/// which nobody is ahead of us any more.
pub async fn wait_for_turn(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let _waiting = stats::Waiting::start();
    // The key may have been queued through another member; see it here first.
    node.wait_revision(mine.mod_revision).await?;
    if permits == 1 {
        wait_for_the_last_key_ahead(node, prefix, mine, mode, deadline).await
    } else {
        count_down_the_keys_ahead(node, prefix, mine, mode, permits, deadline).await
    }
}

/// [`wait_for_turn`] with one permit: the turn cannot come before the key
/// ahead that was created last (of those a `mode` waiter waits for) is
/// deleted, so wait for that deletion (and for our own key's), then look
/// again. A release therefore wakes only the waiters that waited for that
/// key, and a write anywhere else wakes none (as etcd's client-side mutex
/// watches only the key before its own).
async fn wait_for_the_last_key_ahead(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let mut stopping = node.stopping();
    // The key ahead waited for, and the wait on it (and on our own key).
    let mut wait: Option<(Vec<u8>, crate::model::applied::DeletionWait)> = None;
    loop {
        let (own, ahead, _) = standing(node, &mine.key, mine.create_revision, prefix, mode)?;
        let current = match own {
            Some(kv) if kv.create_revision == mine.create_revision => kv,
            _ => return Err(RecipeError::SessionExpired),
        };
        let Some(last) = ahead.into_iter().max_by_key(|kv| kv.create_revision) else {
            return Ok(current);
        };
        match &wait {
            Some((ahead, w)) if *ahead == last.key => tokio::select! {
                _ = w.deleted() => {}
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            },
            // Wait first, then look again: a deletion between the look
            // above and the registration would go unseen otherwise.
            _ => {
                let w = node.state().wait_for_deletion(vec![mine.key.clone(), last.key.clone()]);
                wait = Some((last.key, w));
            }
        }
    }
}

/// [`wait_for_turn`] with more than one permit: follow the applied changes
/// under `prefix` ([`crate::model::applied::AppliedState::follow`]) and count down
/// the deletions of keys ahead (any of them may be the one that lets us in),
/// looking at the store again only when the count says the turn has come, or
/// when changes were lost. Only a change under the prefix wakes such a waiter.
async fn count_down_the_keys_ahead(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let waits_for = |key: &[u8]| waits_for(mode, classify(prefix, key));
    let mut stopping = node.stopping();
    // Follow the keys before reading them, so that no deletion slips between.
    let inbox = node.state().follow(&KeyRange::with_prefix(prefix));
    'count: loop {
        // What is queued now shows in the look that follows.
        inbox.take();
        let (own, ahead, read_at) = standing(node, &mine.key, mine.create_revision, prefix, mode)?;
        let current = match own {
            Some(kv) if kv.create_revision == mine.create_revision => kv,
            _ => return Err(RecipeError::SessionExpired),
        };
        let mut ahead = ahead.len();
        if ahead < permits {
            return Ok(current);
        }
        while ahead >= permits {
            tokio::select! {
                _ = inbox.ready() => {}
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            }
            let taken = inbox.take();
            if taken.lost_after.is_some() {
                // Missed changes (or a snapshot replaced the store): count again.
                continue 'count;
            }
            // Changes up to `read_at` are already in the count.
            for batch in &taken.batches {
                for c in batch.changes.iter().filter(|c| c.kv.is_none() && c.revision > read_at) {
                    if c.key == mine.key {
                        return Err(RecipeError::SessionExpired);
                    }
                    let was_ahead = c.prev.as_ref().is_some_and(|p| p.create_revision < mine.create_revision);
                    if was_ahead && c.key.starts_with(prefix) && waits_for(&c.key) {
                        ahead = ahead.saturating_sub(1);
                    }
                }
            }
        }
        // The count says the turn has come: the look that follows confirms it.
    }
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Delete `key` (one revision if it existed); returns the store revision.
pub async fn delete(node: &Node, key: &[u8]) -> Result<i64, RecipeError> {
    let req = DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
    Ok(node.delete_range(req, None).await?.revision)
}

/// What a fenced release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// The revision of the release's txn.
    pub revision: i64,
    pub released: bool,
    /// When not released: the key's create_revision now, 0 if it does not exist.
    pub current_token: i64,
}

/// How many times the removal of an abandoned place is tried while its
/// writes end with their fate unknown or find no leader (an election).
const CLEANUP_TRIES: u32 = 5;

/// Remove an abandoned place while it still waits (see [`CleanupOnDrop`]).
/// The removal is a guarded txn, so one whose fate is unknown is tried
/// again, after a pause that grows with each try.
async fn remove_abandoned(node: &Node, key: &[u8], token: i64, waits: &Waits) -> Result<(), RecipeError> {
    let mut tries = 1;
    loop {
        match give_up(node, key, token, waits).await {
            Err(RecipeError::Server(ServerError::LeaderChanged | ServerError::Timeout | ServerError::NoLeader))
                if tries < CLEANUP_TRIES =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200) * tries).await;
                tries += 1;
            }
            removed => return removed.map(|_| ()),
        }
    }
}

/// How a place in a queue waits: what [`give_up`] must find still ahead of it.
#[derive(Clone, Debug)]
pub struct Waits {
    /// The queue's prefix, `name/`.
    pub prefix: Vec<u8>,
    pub mode: Mode,
    pub permits: usize,
}

/// What [`give_up`] came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GaveUp {
    /// The place was removed (or was gone already: `released` false).
    Removed(Release),
    /// The place holds the lock: its turn came first. It is kept.
    Holds(KeyValue),
}

/// How many times [`give_up`] looks again when the queue changed under it.
const GIVE_UP_TRIES: usize = 64;

/// Remove the place `key` (made with `token`) while it still waits, never
/// once it holds: the removal is a txn guarded by `permits` keys that were
/// ahead of it (while they all exist, it waits), read linearizably just
/// before. A place whose turn has come is answered as [`GaveUp::Holds`].
pub async fn give_up(node: &Node, key: &[u8], token: i64, waits: &Waits) -> Result<GaveUp, RecipeError> {
    for _ in 0..GIVE_UP_TRIES {
        node.read_barrier().await?;
        let (mine, ahead, revision) = standing(node, key, token, &waits.prefix, waits.mode)?;
        let mine = match mine {
            Some(kv) if kv.create_revision == token => kv,
            other => {
                let current_token = other.map_or(0, |kv| kv.create_revision);
                return Ok(GaveUp::Removed(Release { revision, released: false, current_token }));
            }
        };
        if ahead.len() < waits.permits {
            return Ok(GaveUp::Holds(mine));
        }
        let mut compare = vec![create_revision_is(key, token)];
        compare.extend(ahead.iter().take(waits.permits).map(|kv| create_revision_is(&kv.key, kv.create_revision)));
        let delete = DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
        let txn = TxnRequest { compare, success: vec![RequestOp::DeleteRange(delete)], failure: vec![] };
        let result = node.txn(txn, None).await?;
        if result.succeeded {
            return Ok(GaveUp::Removed(Release { revision: result.revision, released: true, current_token: 0 }));
        }
        // A key ahead went (or ours did): look again.
    }
    Err(RecipeError::Contended)
}

/// Removes a waiting place, unless disarmed: explicitly
/// ([`CleanupOnDrop::give_up`]) when the waiter gives up, or in the
/// background when it is dropped mid-wait (the client went away).
///
/// Either way a place is removed only while it still waits ([`give_up`]),
/// never once its turn has come: the place belongs to the lease, and another
/// acquire of the lease (a retry, say) may have joined it and been told it
/// holds, which nothing in the store records (a join writes nothing, as in
/// etcd). A place whose turn came as its caller went away stays until its
/// lease releases it or ends; a retry by the same lease is granted it.
pub struct CleanupOnDrop {
    node: Option<Arc<Node>>,
    key: Vec<u8>,
    token: i64,
    waits: Waits,
}

impl CleanupOnDrop {
    /// Armed for the place `mine`.
    pub fn new(node: Arc<Node>, mine: &KeyValue, waits: Waits) -> Self {
        CleanupOnDrop { node: Some(node), key: mine.key.clone(), token: mine.create_revision, waits }
    }

    /// A guard that removes nothing.
    fn unarmed(waits: Waits) -> Self {
        CleanupOnDrop { node: None, key: Vec::new(), token: 0, waits }
    }

    /// The wait ended with the lock; keep the key.
    pub fn disarm(mut self) {
        self.node = None;
    }

    /// The waiter gave up: remove the place now, unless its turn has come
    /// ([`give_up`]). Stays armed until that is settled, so that a failure,
    /// or this call being dropped midway, still leaves it to the background.
    pub async fn give_up(mut self) -> Result<GaveUp, RecipeError> {
        let node = self.node.clone().expect("armed until used");
        let outcome = give_up(&node, &self.key, self.token, &self.waits).await?;
        self.node = None;
        Ok(outcome)
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let (key, token, waits) = (std::mem::take(&mut self.key), self.token, self.waits.clone());
            tokio::spawn(async move {
                if let Err(e) = remove_abandoned(&node, &key, token, &waits).await {
                    tracing::warn!(error = %e, "removing an abandoned waiter's key");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create_revision: i64) -> KeyValue {
        KeyValue { key: key.as_bytes().to_vec(), create_revision, ..Default::default() }
    }

    fn keys(kvs: &[KeyValue]) -> Vec<&str> {
        kvs.iter().map(|kv| std::str::from_utf8(&kv.key).unwrap()).collect()
    }

    #[test]
    fn keys_are_told_apart_by_name() {
        let p = b"db/";
        assert_eq!(owner_key(b"db", 0x1f, Mode::Write), b"db/1f");
        assert_eq!(owner_key(b"db", 0x1f, Mode::Read), b"db/read-1f");
        assert_eq!(hold_count_key(b"db/read-1f"), b"db/read-1f.holds");
        assert_eq!(classify(p, b"db/1f"), QueueKey::Exclusive);
        assert_eq!(classify(p, b"db/read-1f"), QueueKey::Shared);
        assert_eq!(classify(p, b"db/1f.holds"), QueueKey::HoldCount);
        assert_eq!(classify(p, b"db/read-1f.holds"), QueueKey::HoldCount);
        // A nested lock's keys, whatever they look like, are in the way of all.
        assert_eq!(classify(p, b"db/t/read-1f"), QueueKey::Exclusive);
        assert_eq!(classify(p, b"db/t/1f.holds"), QueueKey::Exclusive);
        assert!(waits_for(Mode::Write, QueueKey::Shared) && !waits_for(Mode::Read, QueueKey::Shared));
        assert!(waits_for(Mode::Read, QueueKey::Exclusive) && !waits_for(Mode::Read, QueueKey::HoldCount));
    }

    #[test]
    fn readers_share_until_a_writer_queues() {
        let queue = vec![
            kv("db/read-1", 10),
            kv("db/read-2", 11),
            kv("db/read-1.holds", 12),
            kv("db/3", 13),
            kv("db/read-4", 14),
            kv("db/5", 15),
        ];
        let (holders, waiters) = holders_and_waiters(b"db/", queue.clone(), 1);
        assert_eq!(keys(&holders), ["db/read-1", "db/read-2"]);
        assert_eq!(keys(&waiters), ["db/3", "db/read-4", "db/5"], "the reader behind a writer waits");
        // The readers gone, the writer holds, alone.
        let (holders, waiters) = holders_and_waiters(b"db/", queue[3..].to_vec(), 1);
        assert_eq!((keys(&holders), keys(&waiters)), (vec!["db/3"], vec!["db/read-4", "db/5"]));
        // A semaphore's permits count writers; hold counts count for nothing.
        let queue = vec![kv("s/1", 1), kv("s/1.holds", 2), kv("s/2", 3), kv("s/3", 4)];
        let (holders, waiters) = holders_and_waiters(b"s/", queue, 2);
        assert_eq!((keys(&holders), keys(&waiters)), (vec!["s/1", "s/2"], vec!["s/3"]));
    }
}
