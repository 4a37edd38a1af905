//! Locks, semaphores and elections, run on the server over the node facade.
//!
//! A lock (or an election) named `N` is a queue of ordinary keys `N/<lease id
//! in hex>`, each attached to its owner's lease and ordered by create_revision.
//! With `permits` = P the first P keys hold the lock (P = 1: a mutex; etcd's
//! Lock and Election always use 1); the others wait in FIFO order. Because the
//! keys are exactly etcd's, client-side recipes (etcdctl lock and elect,
//! clientv3's `concurrency`), etcd's Lock service and the native API all see
//! and respect each other. (python-etcd3's lock is another recipe, on one key
//! `/locks/<name>`, and shares nothing with these.)
//!
//! Taking a place is one txn that also reads the front of the queue, so an
//! uncontended lock costs one write. Waiting is server-side, with no polling.
//! A waiter with one permit (a mutex, an election, either side of a
//! read-write lock) waits for the deletion of the last key queued ahead of
//! it that it waits for (a reader: the last writer's), which apply signals
//! for that key alone: a release wakes only the waiters whose turn it may
//! bring (the one queued behind it; behind a writer, the readers that waited
//! for it), and other writes wake no waiter (no thundering herd). A
//! semaphore waiter (N permits) waits the same way for the deletion of any
//! of the newest N keys ahead of it: while they all exist, N are ahead, so a
//! release wakes at most the N waiters behind it. Before it
//! answers, a waiter checks that its own key still exists in the committed
//! state in which its turn came: if its lease ended while it waited, it gets
//! an error, not the lock (etcd issue 11456). A waiter that gives up, times
//! out or is cancelled (the client went away) deletes its key while it
//! waits, never once its turn has come (see [`CleanupOnDrop`]): a place
//! belongs to the lease, and another acquire of it may have been told it
//! holds.
//!
//! Lock-delay (exclusive grants that asked for one): after such a grant
//! ends involuntarily, the lock's delay marker keeps every waiter waiting
//! until the leader deletes it ([`delay`], `crate::model::lock_delay`).
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

pub mod delay;
pub mod election;
pub mod event_hub;
pub mod fenced;
pub mod list;
pub mod multi;
pub mod mutex;
pub mod observe;
pub mod stats;
pub mod turn;
pub mod wake_list;

use crate::model::lock_delay;
use crate::model::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyValue, MvccError, MvccStore, PutRequest,
    RangeRequest, RequestOp, ResponseOp, SortOrder, SortTarget, TxnRequest,
};
use crate::node::{Node, ServerError, WriteError};

/// Re-exported where lock names meet key ranges.
pub use crate::model::mvcc::prefix_end;

/// The first release whose members apply a lock-delay's end (its marker,
/// `model::lock_delay`): an acquire may ask for one only once every member
/// runs it (`Node::require_release`).
pub const LOCK_DELAY_SINCE: crate::base::version::Version = crate::model::lock_delay::SINCE;

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
    /// A key named for validation is not a lock's owner key (no `/`).
    #[error("raftlock: {} is not a lock's owner key (it has no '/')", shown(.0))]
    NotAnOwnerKey(Vec<u8>),
    /// A multi-lock found the lease queued for some of its locks already.
    #[error("raftlock: the lease already holds or waits for lock {}; a multi-lock takes all its locks at once", shown(.0))]
    PartlyQueued(Vec<u8>),
}

/// How an error message shows a name or key from a request: quoted, and cut
/// to its first 64 bytes, since a message travels in a header (a long one
/// can make a client drop the connection) and must not echo a request.
pub fn shown(bytes: &[u8]) -> String {
    const SHOWN: usize = 64;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]);
    if bytes.len() > SHOWN {
        format!("{text:?}… ({} bytes)", bytes.len())
    } else {
        format!("{text:?}")
    }
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
    /// A grant's lock-delay setting (`<owner key>.delay`): nobody waits for it.
    DelaySetting,
    /// The lock's delay marker (`name/.lock-delay`): while it exists the
    /// lock is in a lock-delay, and nobody is granted it ([`delay`]).
    Delay,
}

/// What `key` is to the lock whose keys start with `prefix` (`name/`).
pub fn classify(prefix: &[u8], key: &[u8]) -> QueueKey {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    if rest == lock_delay::MARKER_SEGMENT {
        QueueKey::Delay
    } else if rest.contains(&b'/') {
        QueueKey::Exclusive
    } else if rest.ends_with(HOLDS) {
        QueueKey::HoldCount
    } else if lock_delay::is_setting(rest) {
        QueueKey::DelaySetting
    } else if rest.starts_with(READER) {
        QueueKey::Shared
    } else {
        QueueKey::Exclusive
    }
}

/// Whether a waiter in `mode` waits for an earlier key of kind `kind`.
fn waits_for(mode: Mode, kind: QueueKey) -> bool {
    match kind {
        QueueKey::HoldCount | QueueKey::DelaySetting | QueueKey::Delay => false,
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
/// waiters, leaving hold counts, delay settings and the delay marker out.
/// A writer holds while fewer than `permits` owners are ahead of it, a
/// reader while no writer is; nobody holds while the lock is in a
/// lock-delay (its marker is in the queue: it follows the involuntary end
/// of an exclusive grant, the only kind that may ask for one).
pub fn holders_and_waiters(prefix: &[u8], queue: Vec<KeyValue>, permits: usize) -> (Vec<KeyValue>, Vec<KeyValue>) {
    let (mut holders, mut waiters) = (Vec::new(), Vec::new());
    let (mut ahead, mut writers_ahead) = (0, 0);
    let delayed = queue.iter().any(|kv| classify(prefix, &kv.key) == QueueKey::Delay);
    for kv in queue {
        let holds = match classify(prefix, &kv.key) {
            QueueKey::HoldCount | QueueKey::DelaySetting | QueueKey::Delay => continue,
            _ if delayed => false,
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
    /// The holders of the lock, lowest create_revision first, as the txn's
    /// read of the queue's front decides them, else as this member's state
    /// once it has applied the txn does ([`holders_from`]).
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

/// The name of the lock an owner key queues in: the key up to its last `/`
/// (`None` without one).
pub fn lock_name_of(key: &[u8]) -> Option<&[u8]> {
    key.iter().rposition(|&b| b == b'/').map(|slash| &key[..slash])
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
    /// The native API's place: read the hold-count key too, and refuse a
    /// lease queued in the other mode.
    pub native: bool,
}

impl<'a> Place<'a> {
    /// A place in a mutex or semaphore as etcd's services take it.
    pub fn etcd(name: &'a [u8], lease: i64, value: &'a [u8], permits: usize) -> Self {
        Place { name, lease, value, permits, mode: Mode::Write, native: false }
    }
}

/// Take a place in the queue of lock `name` for `lease`, in one txn (as etcd's
/// recipes do): create the owner key with `value` unless it exists, and read
/// back the key and the queue's first `permits` keys (read further, outside
/// the txn, when readers, hold counts or delay settings leave its holders
/// undecided: [`holders_from`]). A
/// lease that is already queued keeps its place (and its value). A native
/// place is not taken while the lease is queued in the other mode
/// ([`RecipeError::OtherMode`]).
pub async fn enqueue(node: &Node, place: &Place<'_>) -> Result<Queued, RecipeError> {
    let key = owner_key(place.name, place.lease, place.mode);
    let prefix = queue_prefix(place.name);
    let range = |key: Vec<u8>| RequestOp::Range(RangeRequest { key, ..Default::default() });
    let mut reads = vec![range(key.clone()), RequestOp::Range(front_range(&prefix, place.permits))];
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
        ResponseOp::Range(r) => Some(r),
        _ => None,
    });
    let (Some(mine), Some(front)) = (ranges.next(), ranges.next()) else {
        unreachable!("the queue txn reads the key and the queue")
    };
    let (hold_count, other) = (ranges.next().and_then(|r| first(r.kvs)), ranges.next().and_then(|r| first(r.kvs)));
    if other.is_some() {
        return Err(RecipeError::OtherMode(place.mode.other()));
    }
    // A failure branch on a key that exists always finds it: the txn is atomic.
    let mine = first(mine.kvs).ok_or(RecipeError::SessionExpired)?;
    // In a lock-delay nobody holds; the wait for the turn waits for its end.
    // The marker is looked up here, in this member's state once it has
    // applied the txn, not read in the txn (whose entry every member stores
    // and applies): a marker put after the txn can only follow the end of a
    // grant this place made.
    node.wait_revision(result.revision).await?;
    let front = holders_from(&node.state().mvcc(), place.name, place.permits, front.kvs, front.more)
        .map_err(RecipeError::Mvcc)?;
    Ok(Queued { mine, revision: result.revision, front, created: result.succeeded, hold_count })
}

/// The holders of lock `name` with `permits`, from `front`, the first keys
/// of its queue as a txn read them, and `mvcc`, a state at or after that
/// txn's. None in a lock-delay. Those `front` shows when it decides them
/// ([`holders_decided`]) or is the whole queue (`more` false); else they
/// are read further in `mvcc` ([`holders_now`]): a later state, where they
/// still hold if they held then, as keys queued later queue behind them.
pub(super) fn holders_from(
    mvcc: &MvccStore,
    name: &[u8],
    permits: usize,
    front: Vec<KeyValue>,
    more: bool,
) -> Result<Vec<KeyValue>, MvccError> {
    let prefix = queue_prefix(name);
    if more && !holders_decided(&prefix, &front, permits) {
        holders_now(mvcc, name, permits)
    } else if in_lock_delay(mvcc, name)? {
        Ok(Vec::new())
    } else {
        Ok(holders_and_waiters(&prefix, front, permits).0)
    }
}

/// `key`'s key-value in `mvcc`, if it exists.
pub(super) fn point(mvcc: &MvccStore, key: Vec<u8>) -> Result<Option<KeyValue>, MvccError> {
    Ok(first(mvcc.range(&RangeRequest { key, ..Default::default() })?.kvs))
}

/// Whether lock `name` is in a lock-delay (its marker exists) in `mvcc`.
fn in_lock_delay(mvcc: &MvccStore, name: &[u8]) -> Result<bool, MvccError> {
    let marker = RangeRequest { key: lock_delay::marker_key(name), count_only: true, ..Default::default() };
    Ok(mvcc.range(&marker)?.count > 0)
}

/// Whether `front`, the first keys of a queue under `prefix` by create
/// revision, decides its holders with `permits`: no key after them can
/// hold, because a writer and at least `permits` places are ahead of it.
fn holders_decided(prefix: &[u8], front: &[KeyValue], permits: usize) -> bool {
    let (mut ahead, mut writers) = (0, 0);
    for kv in front {
        match classify(prefix, &kv.key) {
            QueueKey::HoldCount | QueueKey::DelaySetting | QueueKey::Delay => continue,
            QueueKey::Shared => ahead += 1,
            QueueKey::Exclusive => (ahead, writers) = (ahead + 1, writers + 1),
        }
        if writers > 0 && ahead >= permits {
            return true;
        }
    }
    false
}

/// How many keys past `permits` a queue's front is read at first when the
/// keys a txn read leave its holders undecided ([`holders_now`]).
const FRONT_SLACK: usize = 16;

/// The holders of lock `name` with `permits` in `mvcc`'s newest state
/// (none in a lock-delay), read from the front of its queue only as far as
/// a later key could still hold ([`holders_decided`]): a page at first,
/// four times more each time it leaves them undecided. Answered from the
/// store's queue index, so a long line of waiters behind the holders is not
/// read; readers that all hold are, as they are all holders.
pub(super) fn holders_now(mvcc: &MvccStore, name: &[u8], permits: usize) -> Result<Vec<KeyValue>, MvccError> {
    if in_lock_delay(mvcc, name)? {
        return Ok(Vec::new());
    }
    let prefix = queue_prefix(name);
    let mut limit = permits.saturating_add(FRONT_SLACK);
    loop {
        let read = mvcc.range(&front_range(&prefix, limit))?;
        if !read.more || holders_decided(&prefix, &read.kvs, permits) {
            return Ok(holders_and_waiters(&prefix, read.kvs, permits).0);
        }
        limit = limit.saturating_mul(4);
    }
}

/// Put `put` if every guard in `compare` holds: its revision, or `None`
/// when a guard failed.
pub(super) async fn put_if(node: &Node, compare: Vec<Compare>, put: PutRequest) -> Result<Option<i64>, RecipeError> {
    let txn = TxnRequest { compare, success: vec![RequestOp::Put(put)], failure: vec![] };
    let result = node.txn(txn, None).await?;
    Ok(result.succeeded.then_some(result.revision))
}

fn first(kvs: Vec<KeyValue>) -> Option<KeyValue> {
    kvs.into_iter().next()
}

/// A txn guard: `key`'s create_revision is `revision` (0: it does not exist).
pub(super) fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    compare(key, CompareTarget::Create, CompareResult::Equal, revision)
}

/// A txn guard on one key: its `target` compares to `number` as `result` says.
pub(super) fn compare(key: &[u8], target: CompareTarget, result: CompareResult, number: i64) -> Compare {
    Compare { result, target, key: key.to_vec(), range_end: vec![], number, value: vec![] }
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

    /// Every queue of readers, writers and hold counts up to six keys long,
    /// with one to three permits: wherever its front decides the holders,
    /// they are the holders the whole queue gives.
    #[test]
    fn a_decided_front_gives_the_whole_queues_holders() {
        let kinds = ["w", "read-", "w.holds"];
        let mut decided = 0;
        for len in 1..=6u32 {
            for mut code in 0..3usize.pow(len) {
                let queue: Vec<KeyValue> = (0..len as i64)
                    .map(|i| {
                        let kind = kinds[code % 3];
                        code /= 3;
                        let key = match kind {
                            "w" => format!("q/{i}"),
                            "read-" => format!("q/read-{i}"),
                            _ => format!("q/{i}.holds"),
                        };
                        kv(&key, i + 1)
                    })
                    .collect();
                for permits in 1..=3 {
                    let whole = holders_and_waiters(b"q/", queue.clone(), permits).0;
                    for read in 0..=queue.len() {
                        if holders_decided(b"q/", &queue[..read], permits) {
                            decided += 1;
                            let front = holders_and_waiters(b"q/", queue[..read].to_vec(), permits).0;
                            assert_eq!(keys(&front), keys(&whole), "{:?} read {read}", keys(&queue));
                        }
                    }
                }
            }
        }
        assert!(decided > 1000, "{decided}");
    }
}
