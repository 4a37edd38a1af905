//! Which watch sessions want which keys, and the applied batches handed to
//! each: apply wakes a session only when a batch changed a key one of its
//! watchers watches.
//!
//! A watch session registers each watcher's key range here
//! ([`Inbox::watch`]). Other waiters for particular keys (a semaphore
//! waiter, an election's observer: `AppliedState::follow`) are sessions of
//! one range each. [`WatchRoutes::route`] (called by apply, once the
//! stores hold a batch) looks up each changed key among the single keys
//! watched (one hash lookup) and its prefixes among the prefixes watched
//! (etcd's `--prefix` ranges: one hash lookup per distinct length of a
//! prefix watched), finds it among the other distinct ranges watched (an
//! interval index, `range_index`), queues the batch once in the inbox of
//! every session that has a match, wakes those sessions, and only then
//! records the batch's revision as routed. A session that takes its inbox
//! ([`Inbox::take`]) reads that revision *before* it drains: every batch up
//! to it that concerns the session is then in what it drained, and its
//! watchers have missed nothing up to that revision, whether or not they
//! were woken for it (a watcher's position may move past batches it never
//! saw).
//!
//! Invariants: a session is woken at least once after each batch queued for
//! it (a wake that comes while it is busy is kept for its next wait); a
//! range registered before a batch is routed is matched against that batch.
//! A store replaced by a snapshot install (`resync`) reaches every session,
//! as a lag.
//!
//! Bounds: an inbox holds at most [`WATCH_INBOX_BATCHES`] batches and
//! [`WATCH_INBOX_BYTES`] of their changes. A session that does not take them in
//! time loses them and is told it lagged, and from which revision on
//! ([`Taken::lost_after`]); it then catches its watchers up from MVCC
//! history, as it would after any lag (`raftlock_watch_inbox_overflows_total`
//! counts these). Apply never waits for a session.
//! Batches are shared: the sessions a batch concerns hold one copy of it.
//!
//! Cost, in apply, with the table's lock held: per changed key, a hash
//! lookup, and one per distinct length of the prefixes watched (so a
//! thousand elections observed, or semaphores waited on, cost a few lookups,
//! not a thousand tests); a lookup per changed key in the interval index of
//! the other ranges, logarithmic in their number plus the ranges that
//! contain the key (sessions watching the same range share one entry, the
//! project's `KeyRange`); and the sessions of each matched entry,
//! deduplicated once per batch. Nothing is spent on a batch while no session
//! is open. The distinct other ranges are still capped per member
//! ([`MAX_WATCHED_RANGES`]): a bound on what the table holds for ranges no
//! two watchers share, no longer on the cost of matching.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::base::limits::{MAX_WATCHED_RANGES, WATCH_INBOX_BATCHES, WATCH_INBOX_BYTES};
use crate::model::mvcc::{Change, KeyRange, Revision};
use crate::model::range_index::RangeIndex;

/// What one apply call changed, in revision order; `revision` is the store's
/// revision after it.
#[derive(Debug)]
pub struct AppliedChanges {
    pub revision: Revision,
    pub changes: Vec<Change>,
    /// The store was replaced (a snapshot was installed) and `changes` may not
    /// hold everything that changed: the readers of particular keys must look
    /// at the store again, as after a lag.
    pub resync: bool,
    /// The revisions, ascending, at which a lease's end (its expiry or
    /// revoke) deleted its keys: what tells a lock's observers that a grant
    /// was lost, not released. Not kept in history.
    pub lease_ended: Vec<Revision>,
}

impl AppliedChanges {
    /// What one apply call changed (no lease ended in it).
    pub fn new(revision: Revision, changes: Vec<Change>) -> AppliedChanges {
        AppliedChanges { revision, changes, resync: false, lease_ended: Vec::new() }
    }

    /// The store was replaced at `revision`: every reader must look again.
    pub fn resync(revision: Revision) -> AppliedChanges {
        AppliedChanges { resync: true, ..AppliedChanges::new(revision, Vec::new()) }
    }
}

/// The routing table of one member's watch sessions (see the module doc).
#[derive(Default)]
pub struct WatchRoutes {
    next_session: AtomicU64,
    table: Mutex<Table>,
    /// Every batch up to this revision has been queued for the sessions
    /// it concerns.
    routed_through: AtomicI64,
}

#[derive(Default)]
struct Table {
    /// The sessions watching one key, by key.
    keys: HashMap<Vec<u8>, HashSet<u64>>,
    /// The sessions watching every key with a prefix, by prefix.
    prefixes: HashMap<Vec<u8>, HashSet<u64>>,
    /// How many prefixes in `prefixes` have each length: the lengths a
    /// changed key's prefixes are looked up at.
    prefix_lengths: BTreeMap<usize, usize>,
    /// The sessions watching any other range of keys, by range, in an
    /// interval index: the ranges a changed key is in are found without
    /// testing every range.
    ranges: RangeIndex<HashSet<u64>>,
    inboxes: HashMap<u64, Arc<Queue>>,
}

/// A session's queue of batches, and its wake-up.
#[derive(Default)]
struct Queue {
    batches: Mutex<Queued>,
    ready: Notify,
}

#[derive(Default)]
struct Queued {
    batches: VecDeque<Arc<AppliedChanges>>,
    /// The bytes of the batches queued.
    bytes: usize,
    /// Batches were lost; every one through this revision that concerned
    /// the session had been queued before them.
    lost_after: Option<Revision>,
}

/// What a session took from its inbox ([`Inbox::take`]).
pub struct Taken {
    /// The batches queued since the last take, in revision order (none if
    /// batches were lost).
    pub batches: Vec<Arc<AppliedChanges>>,
    /// Batches were lost (the inbox overflowed, or a snapshot replaced the
    /// store): the session must catch its watchers up from history, from
    /// after this revision at the latest (every batch up to it that
    /// concerned the session was taken, by an earlier take).
    pub lost_after: Option<Revision>,
    /// Every batch through this revision that concerns the session has been
    /// taken, by this take or an earlier one (or was lost, if `lost_after`
    /// says so).
    pub through: Revision,
}

/// The bytes of a batch's changes, as an inbox counts them.
fn weight(batch: &AppliedChanges) -> usize {
    let kv = |kv: &Option<Arc<crate::model::mvcc::KeyValue>>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len());
    batch.changes.iter().map(|c| c.key.len() + kv(&c.kv) + kv(&c.prev) + 64).sum()
}

impl WatchRoutes {
    /// A new session's inbox; it concerns no key until its watchers register.
    pub fn open(self: &Arc<Self>) -> Inbox {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let queue = Arc::new(Queue::default());
        self.table().inboxes.insert(id, queue.clone());
        Inbox { routes: self.clone(), id, queue, watched: HashMap::new() }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().expect("watch routes lock poisoned")
    }

    /// Queue `batch` for the sessions it concerns and wake them (every
    /// session, if it says the store was replaced); then record its revision
    /// as routed. Never waits for a session.
    pub fn route(&self, batch: &Arc<AppliedChanges>) {
        let table = self.table();
        let before = self.routed_through.load(Ordering::Relaxed);
        if batch.resync {
            table.inboxes.values().for_each(|q| q.lose(before));
        } else if !table.inboxes.is_empty() {
            // The sessions of the entries matched (a range is tested until a
            // changed key is in it), each once.
            let changed = || batch.changes.iter().map(|c| c.key.as_slice());
            let of_keys = changed().filter_map(|key| table.keys.get(key));
            let of_prefixes = changed().flat_map(|key| {
                let lengths = table.prefix_lengths.range(..=key.len()).map(|(&len, _)| len);
                lengths.filter_map(|len| table.prefixes.get(&key[..len]))
            });
            let mut of_ranges: Vec<&HashSet<u64>> = Vec::new();
            if !table.ranges.is_empty() {
                for key in changed() {
                    table.ranges.containing(key, &mut |_, sessions| of_ranges.push(sessions));
                }
                // A range that holds several changed keys: its sessions once.
                of_ranges.sort_unstable_by_key(|sessions| *sessions as *const HashSet<u64>);
                of_ranges.dedup_by(|a, b| std::ptr::eq(*a, *b));
            }
            let mut concerned: Vec<u64> = of_keys.chain(of_prefixes).chain(of_ranges).flatten().copied().collect();
            concerned.sort_unstable();
            concerned.dedup();
            if !concerned.is_empty() {
                let weight = weight(batch);
                for id in concerned {
                    if let Some(queue) = table.inboxes.get(&id) {
                        queue.push(batch.clone(), weight, before);
                    }
                }
            }
        }
        self.routed_through.fetch_max(batch.revision, Ordering::Release);
    }
}

impl Queue {
    /// Queue `batch` (of `weight` bytes; `before`: the revision routed
    /// before it), or lose it and what is queued if the inbox is full.
    fn push(&self, batch: Arc<AppliedChanges>, weight: usize, before: Revision) {
        let mut queued = self.batches.lock().expect("watch inbox lock poisoned");
        if queued.lost_after.is_none() {
            if queued.batches.len() < WATCH_INBOX_BATCHES && queued.bytes + weight <= WATCH_INBOX_BYTES {
                queued.bytes += weight;
                queued.batches.push_back(batch);
            } else {
                queued.lose(before);
                crate::base::metrics::metrics().watch_inbox_overflows.inc();
            }
        }
        drop(queued);
        self.ready.notify_one();
    }

    /// Lose what is queued (the store was replaced after `before`).
    fn lose(&self, before: Revision) {
        self.batches.lock().expect("watch inbox lock poisoned").lose(before);
        self.ready.notify_one();
    }
}

impl Queued {
    /// Drop what is queued and note from where batches were lost: below the
    /// first change of the first batch dropped (a batch spans the revisions
    /// of its apply call), or after `before` (the revision routed before the
    /// batch that could not be queued) if none was queued.
    fn lose(&mut self, before: Revision) {
        let first = |b: &AppliedChanges| b.changes.first().map_or(b.revision, |c| c.revision);
        let from = self.batches.front().map_or(before, |b| first(b) - 1);
        self.lost_after = Some(self.lost_after.map_or(from, |earlier| earlier.min(from)));
        self.batches.clear();
        self.bytes = 0;
    }
}

/// One watch session's registration and queue; dropping it unregisters the
/// session and every range it watched.
pub struct Inbox {
    routes: Arc<WatchRoutes>,
    id: u64,
    queue: Arc<Queue>,
    /// The ranges this session's watchers watch, with how many watch each:
    /// the session is in a range's entry of the table while its count is
    /// above zero.
    watched: HashMap<KeyRange, usize>,
}

impl Table {
    /// Put session `id` in `range`'s entry; false (and nothing changed)
    /// if that would route more than [`MAX_WATCHED_RANGES`] other ranges.
    fn join(&mut self, range: &KeyRange, id: u64) -> bool {
        if let Some(prefix) = range.prefix() {
            let sessions = self.prefixes.entry(prefix.to_vec()).or_default();
            if sessions.is_empty() {
                *self.prefix_lengths.entry(prefix.len()).or_default() += 1;
            }
            sessions.insert(id);
            return true;
        }
        match range {
            KeyRange::Single(key) => {
                self.keys.entry(key.clone()).or_default().insert(id);
            }
            _ => {
                let routed = self.ranges.len();
                match self.ranges.get_mut(range) {
                    Some(sessions) => {
                        sessions.insert(id);
                    }
                    None if routed >= MAX_WATCHED_RANGES => return false,
                    None => self.ranges.insert(range.clone(), HashSet::from([id])),
                }
            }
        }
        true
    }

    /// Take session `id` out of `range`'s entry, and the entry out of the
    /// table once no session is in it.
    fn leave(&mut self, range: &KeyRange, id: u64) {
        fn leave_entry<K: std::hash::Hash + Eq + ?Sized>(
            entries: &mut HashMap<impl std::borrow::Borrow<K> + std::hash::Hash + Eq, HashSet<u64>>,
            key: &K,
            id: u64,
        ) -> bool {
            let Some(sessions) = entries.get_mut(key) else { return false };
            sessions.remove(&id);
            let emptied = sessions.is_empty();
            if emptied {
                entries.remove(key);
            }
            emptied
        }
        if let Some(prefix) = range.prefix() {
            if leave_entry(&mut self.prefixes, prefix, id) {
                let count = self.prefix_lengths.get_mut(&prefix.len()).expect("every prefix's length is counted");
                *count -= 1;
                if *count == 0 {
                    self.prefix_lengths.remove(&prefix.len());
                }
            }
            return;
        }
        match range {
            KeyRange::Single(key) => {
                leave_entry(&mut self.keys, key.as_slice(), id);
            }
            _ => {
                let Some(sessions) = self.ranges.get_mut(range) else { return };
                sessions.remove(&id);
                if sessions.is_empty() {
                    self.ranges.remove(range);
                }
            }
        }
    }
}

impl Inbox {
    /// One more watcher of this session watches `range`: batches that
    /// change a key in it are queued from now on. False, and nothing
    /// changed, when the member routes [`MAX_WATCHED_RANGES`] other ranges
    /// already (never for a prefix or a single key).
    #[must_use]
    pub fn watch(&mut self, range: &KeyRange) -> bool {
        if self.watched.contains_key(range) || self.routes.table().join(range, self.id) {
            *self.watched.entry(range.clone()).or_default() += 1;
            return true;
        }
        false
    }

    /// One watcher of this session no longer watches `range`.
    pub fn unwatch(&mut self, range: &KeyRange) {
        let Some(count) = self.watched.get_mut(range) else { return };
        *count -= 1;
        if *count == 0 {
            self.watched.remove(range);
            self.routes.table().leave(range, self.id);
        }
    }

    /// Resolves once a batch was queued (or lost) since the last time this
    /// resolved; it may resolve with nothing queued (a wake kept from while
    /// the session was busy).
    pub async fn ready(&self) {
        self.queue.ready.notified().await
    }

    /// How far the routes have routed: every change after this revision that
    /// concerns a range watched now will be queued here.
    pub fn routed_through(&self) -> i64 {
        self.routes.routed_through.load(Ordering::Acquire)
    }

    /// Take what was queued (see [`Taken`]).
    pub fn take(&self) -> Taken {
        // Read before draining: a batch routed up to here is queued already.
        let through = self.routed_through();
        let mut queued = self.queue.batches.lock().expect("watch inbox lock poisoned");
        let lost_after = queued.lost_after.take();
        // Nothing is queued while batches are lost (see `Queue::push`).
        let batches: Vec<_> = queued.batches.drain(..).collect();
        queued.bytes = 0;
        drop(queued);
        let through = batches.last().map_or(through, |b| b.revision.max(through));
        Taken { batches, lost_after, through }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let mut table = self.routes.table();
        table.inboxes.remove(&self.id);
        for range in self.watched.keys() {
            table.leave(range, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::{Change, KeyValue};
    use std::time::Duration;

    /// A batch of one apply call that wrote `keys` at consecutive revisions,
    /// the last `revision`.
    fn batch(revision: Revision, keys: &[&str]) -> Arc<AppliedChanges> {
        let first = revision + 1 - keys.len() as Revision;
        let changes = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Change {
                revision: first + i as Revision,
                sub: 0,
                key: k.as_bytes().to_vec(),
                kv: Some(Arc::new(KeyValue { key: k.as_bytes().to_vec(), ..Default::default() })),
                prev: None,
            })
            .collect();
        Arc::new(AppliedChanges::new(revision, changes))
    }

    async fn woken(inbox: &Inbox) -> bool {
        tokio::time::timeout(Duration::from_millis(20), inbox.ready()).await.is_ok()
    }

    fn revisions(taken: &Taken) -> Vec<Revision> {
        taken.batches.iter().map(|b| b.revision).collect()
    }

    /// A session gets the batches that change a key it watches (a single
    /// key, an interval, every key from a start) and no other, and learns
    /// that nothing else concerned it up to the last routed revision.
    #[tokio::test]
    async fn a_session_gets_only_the_batches_that_change_its_keys() {
        let routes = Arc::new(WatchRoutes::default());
        let mut single = routes.open();
        assert!(single.watch(&KeyRange::new(b"a", b"")));
        let mut ranged = routes.open();
        assert!(ranged.watch(&KeyRange::new(b"b", b"c")));
        assert!(ranged.watch(&KeyRange::new(b"x", b"\0")));
        routes.route(&batch(2, &["a"]));
        routes.route(&batch(3, &["bb", "zz"]));
        routes.route(&batch(4, &["c", "ab"]));
        routes.route(&batch(5, &["y", "a"]));
        assert!(woken(&single).await && woken(&ranged).await);
        let (s, r) = (single.take(), ranged.take());
        assert_eq!((revisions(&s), s.through, s.lost_after), (vec![2, 5], 5, None));
        assert_eq!((revisions(&r), r.through, r.lost_after), (vec![3, 5], 5, None));
        // Nothing for it since: not woken, and the take moves past batch 6.
        routes.route(&batch(6, &["c"]));
        assert!(!woken(&single).await);
        let s = single.take();
        assert_eq!((revisions(&s), s.through), (vec![], 6));
    }

    /// Two watchers of one range: the range stays routed until both are
    /// gone; a dropped session leaves nothing registered.
    #[tokio::test]
    async fn a_range_is_routed_until_its_last_watcher_goes() {
        let routes = Arc::new(WatchRoutes::default());
        let mut inbox = routes.open();
        let range = KeyRange::new(b"k", b"");
        assert!(inbox.watch(&range));
        assert!(inbox.watch(&range));
        inbox.unwatch(&range);
        routes.route(&batch(2, &["k"]));
        assert_eq!(revisions(&inbox.take()), vec![2]);
        inbox.unwatch(&range);
        routes.route(&batch(3, &["k"]));
        assert_eq!(revisions(&inbox.take()), Vec::<Revision>::new());
        assert!(inbox.watch(&KeyRange::new(b"a", b"b")));
        drop(inbox);
        let table = routes.table();
        assert!(table.keys.is_empty() && table.ranges.is_empty() && table.inboxes.is_empty());
    }

    /// Prefix ranges (etcd's `--prefix`) are found by their prefix, nested
    /// ones included, and only they are: a range that merely starts at a
    /// prefix is tested as a range. The lengths looked up go with the last
    /// prefix of each length.
    #[tokio::test]
    async fn prefix_ranges_are_found_by_the_changed_keys_prefixes() {
        let routes = Arc::new(WatchRoutes::default());
        let prefix = KeyRange::with_prefix;
        let mut outer = routes.open();
        assert!(outer.watch(&prefix(b"el/")));
        let mut inner = routes.open();
        assert!(inner.watch(&prefix(b"el/a/")));
        assert!(inner.watch(&KeyRange::new(b"y", b"\0")));
        let mut interval = routes.open();
        assert!(interval.watch(&KeyRange::new(b"el/", b"el/b")));
        assert_eq!(routes.table().prefix_lengths, BTreeMap::from([(3, 1), (5, 1)]));
        assert_eq!(routes.table().ranges.len(), 2, "a range to the end and an interval that is no prefix");
        routes.route(&batch(2, &["el/a/1"]));
        routes.route(&batch(3, &["el/b"]));
        routes.route(&batch(4, &["elz", "el", "e"]));
        routes.route(&batch(5, &["yy"]));
        assert_eq!(revisions(&outer.take()), vec![2, 3]);
        assert_eq!(revisions(&inner.take()), vec![2, 5]);
        assert_eq!(revisions(&interval.take()), vec![2]);
        drop(outer);
        assert_eq!(routes.table().prefix_lengths, BTreeMap::from([(5, 1)]));
        drop(inner);
        let table = routes.table();
        assert!(table.prefixes.is_empty() && table.prefix_lengths.is_empty());
    }

    /// Ranges found in the interval index: overlapping and nested ranges,
    /// one range holding many changed keys, and a session watching several
    /// matched ranges each get a batch once; a range that ends before a key
    /// or starts after it is not matched.
    #[tokio::test]
    async fn overlapping_ranges_queue_a_batch_once_per_session() {
        let routes = Arc::new(WatchRoutes::default());
        let mut wide = routes.open();
        assert!(wide.watch(&KeyRange::new(b"a", b"m")) && wide.watch(&KeyRange::new(b"c", b"d")));
        let mut narrow = routes.open();
        assert!(narrow.watch(&KeyRange::new(b"c", b"c2")));
        let mut tail = routes.open();
        assert!(tail.watch(&KeyRange::new(b"k", b"\0")));
        let mut elsewhere = routes.open();
        assert!(elsewhere.watch(&KeyRange::new(b"0", b"a")) && elsewhere.watch(&KeyRange::new(b"x", b"xy")));
        routes.route(&batch(2, &["c1", "c1", "c", "b"]));
        routes.route(&batch(3, &["l", "m"]));
        routes.route(&batch(4, &["y", "a"]));
        assert_eq!(revisions(&wide.take()), vec![2, 3, 4]);
        assert_eq!(revisions(&narrow.take()), vec![2]);
        assert_eq!(revisions(&tail.take()), vec![3, 4]);
        assert_eq!(revisions(&elsewhere.take()), Vec::<Revision>::new());
        drop(wide);
        routes.route(&batch(5, &["c"]));
        assert_eq!(revisions(&narrow.take()), vec![5]);
        assert_eq!(routes.table().ranges.len(), 4, "the wide session's ranges left the index");
    }

    /// An inbox that overflows (in batches or in bytes, even with one batch
    /// alone), or a replaced store, loses its batches and says from where:
    /// below the first batch it lost, or after what was routed if it held
    /// none. It then fills again.
    #[tokio::test]
    async fn an_overflowing_inbox_says_from_where_it_lost_batches() {
        let routes = Arc::new(WatchRoutes::default());
        let mut inbox = routes.open();
        assert!(inbox.watch(&KeyRange::new(b"k", b"")));
        routes.route(&batch(2, &["k"]));
        assert_eq!(revisions(&inbox.take()), vec![2]);
        routes.route(&batch(3, &["x"]));
        // The first batch lost changed revisions 10 and 11.
        for revision in 0..=WATCH_INBOX_BATCHES as Revision {
            routes.route(&batch(revision + 11, &["k", "k"]));
        }
        let taken = inbox.take();
        assert_eq!((taken.lost_after, revisions(&taken)), (Some(9), vec![]));
        assert_eq!(taken.through, WATCH_INBOX_BATCHES as Revision + 11);
        routes.route(&batch(5000, &["k"]));
        let taken = inbox.take();
        assert_eq!((revisions(&taken), taken.lost_after), (vec![5000], None));
        // A replaced store, with nothing queued: lost after what was routed.
        routes.route(&Arc::new(AppliedChanges::resync(6000)));
        assert!(woken(&inbox).await);
        assert_eq!(inbox.take().lost_after, Some(5000));
        // Bytes: a batch that does not fit loses the ones queued before it.
        let big = |revision, size| {
            let mut b = batch(revision, &["k"]);
            Arc::get_mut(&mut b).unwrap().changes[0].kv =
                Some(Arc::new(KeyValue { key: b"k".to_vec(), value: vec![0; size], ..Default::default() }));
            b
        };
        routes.route(&big(6001, WATCH_INBOX_BYTES / 2));
        routes.route(&big(6002, WATCH_INBOX_BYTES / 2));
        assert_eq!(inbox.take().lost_after, Some(6000));
        // One batch heavier than the whole bound is lost even into an empty
        // inbox; the next one is queued again.
        routes.route(&big(6003, WATCH_INBOX_BYTES + 1));
        let taken = inbox.take();
        assert_eq!((taken.lost_after, revisions(&taken), taken.through), (Some(6002), vec![], 6003));
        routes.route(&batch(6004, &["k"]));
        let taken = inbox.take();
        assert_eq!((revisions(&taken), taken.lost_after), (vec![6004], None));
    }

    /// Distinct ranges that are neither keys nor prefixes are capped per
    /// member; a range already routed, a prefix and a key still are; one
    /// freed makes room.
    #[test]
    fn distinct_ranges_are_capped() {
        let routes = Arc::new(WatchRoutes::default());
        let mut inbox = routes.open();
        let interval = |i: usize| KeyRange::new(format!("r{i:05}").as_bytes(), format!("r{i:05}z").as_bytes());
        for i in 0..MAX_WATCHED_RANGES {
            assert!(inbox.watch(&interval(i)));
        }
        let mut other = routes.open();
        assert!(!other.watch(&interval(MAX_WATCHED_RANGES)), "one over the cap");
        assert!(other.watch(&interval(7)), "a range already routed");
        assert!(other.watch(&KeyRange::with_prefix(b"p/")) && other.watch(&KeyRange::new(b"k", b"")));
        inbox.unwatch(&interval(0));
        assert!(other.watch(&interval(MAX_WATCHED_RANGES)), "room once one is gone");
    }
}
