//! Which watch sessions want which keys, and the applied batches handed to
//! each: apply wakes a session only when a batch changed a key one of its
//! watchers watches.
//!
//! A watch session registers each watcher's key range here
//! ([`Inbox::watch`]). [`WatchRoutes::route`] (called by apply, once the
//! stores hold a batch) looks up each changed key among the single keys
//! watched (one hash lookup) and tests it against each distinct range
//! watched, queues the batch once in the inbox of every session that has a
//! match, wakes those sessions, and only then records the batch's revision
//! as routed. A session that takes its inbox ([`Inbox::take`]) reads that
//! revision *before* it drains: every batch up to it that concerns the
//! session is then in what it drained, and its watchers have missed nothing
//! up to that revision, whether or not they were woken for it (a watcher's
//! position may move past batches it never saw).
//!
//! Invariants: a session is woken at least once after each batch queued for
//! it (a wake that comes while it is busy is kept for its next wait); a
//! range registered before a batch is routed is matched against that batch.
//! A store replaced by a snapshot install (`resync`) reaches every session,
//! as a lag.
//!
//! Bounds: an inbox holds at most [`INBOX_CAPACITY`] batches. A session that
//! does not take them in time loses them and is told it lagged; it then
//! catches its watchers up from MVCC history, as it would after any lag.
//! Apply never waits for a session.
//!
//! Cost: routing a batch costs a hash lookup per changed key when only single
//! keys are watched, plus a test per changed key and distinct watched range
//! (sessions watching the same range share one entry).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::applied::AppliedChanges;
use crate::mvcc::{KeyRange, Revision};

/// Batches one session's inbox holds before it is told it lagged.
pub const INBOX_CAPACITY: usize = 1024;

/// The routing table of one member's watch sessions (see the module doc).
#[derive(Default)]
pub struct WatchRoutes {
    next_session: AtomicU64,
    table: Mutex<Table>,
    /// Every batch up to this revision has been queued for the sessions
    /// it concerns.
    routed: AtomicI64,
}

#[derive(Default)]
struct Table {
    /// Sessions watching one key, by key, with how many of their watchers do.
    keys: HashMap<Vec<u8>, HashMap<u64, usize>>,
    /// Sessions watching a range of keys, by range `(start, end)` (`end`
    /// empty: every key from `start` on), with how many of their watchers do.
    ranges: HashMap<(Vec<u8>, Vec<u8>), HashMap<u64, usize>>,
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
    lagged: bool,
}

/// What a session took from its inbox ([`Inbox::take`]).
pub struct Taken {
    /// The batches queued since the last take, in revision order (none if
    /// it lagged).
    pub batches: Vec<Arc<AppliedChanges>>,
    /// Batches were lost (the inbox overflowed, or a snapshot replaced the
    /// store): the session must catch up from history.
    pub lagged: bool,
    /// Every batch through this revision that concerns the session has been
    /// taken, by this take or an earlier one.
    pub through: Revision,
}

fn range_key(range: &KeyRange) -> Result<Vec<u8>, (Vec<u8>, Vec<u8>)> {
    match range {
        KeyRange::Single(key) => Ok(key.clone()),
        KeyRange::Interval(start, end) => Err((start.clone(), end.clone())),
        KeyRange::From(start) => Err((start.clone(), Vec::new())),
    }
}

fn in_range((start, end): &(Vec<u8>, Vec<u8>), key: &[u8]) -> bool {
    start.as_slice() <= key && (end.is_empty() || key < end.as_slice())
}

impl WatchRoutes {
    /// A new session's inbox; it concerns no key until its watchers register.
    pub fn open(self: &Arc<Self>) -> Inbox {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let queue = Arc::new(Queue::default());
        self.table().inboxes.insert(id, queue.clone());
        Inbox { routes: self.clone(), id, queue }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().expect("watch routes lock poisoned")
    }

    /// Queue `batch` for the sessions it concerns and wake them (every
    /// session, if it says the store was replaced); then record its revision
    /// as routed. Never waits for a session.
    pub fn route(&self, batch: &Arc<AppliedChanges>) {
        let table = self.table();
        if batch.resync {
            table.inboxes.values().for_each(|q| q.lost());
        } else if !table.inboxes.is_empty() {
            let mut concerned: Vec<u64> = Vec::new();
            for change in &batch.changes {
                if let Some(sessions) = table.keys.get(&change.key) {
                    concerned.extend(sessions.keys());
                }
                for (range, sessions) in &table.ranges {
                    if in_range(range, &change.key) {
                        concerned.extend(sessions.keys());
                    }
                }
            }
            concerned.sort_unstable();
            concerned.dedup();
            for id in concerned {
                if let Some(queue) = table.inboxes.get(&id) {
                    queue.push(batch.clone());
                }
            }
        }
        self.routed.fetch_max(batch.revision, Ordering::Release);
    }
}

impl Queue {
    fn push(&self, batch: Arc<AppliedChanges>) {
        let mut queued = self.batches.lock().expect("watch inbox lock poisoned");
        if !queued.lagged {
            if queued.batches.len() < INBOX_CAPACITY {
                queued.batches.push_back(batch);
            } else {
                queued.batches.clear();
                queued.lagged = true;
            }
        }
        drop(queued);
        self.ready.notify_one();
    }

    fn lost(&self) {
        let mut queued = self.batches.lock().expect("watch inbox lock poisoned");
        queued.batches.clear();
        queued.lagged = true;
        drop(queued);
        self.ready.notify_one();
    }
}

/// One watch session's registration and queue; dropping it unregisters the
/// session and every range it watched.
pub struct Inbox {
    routes: Arc<WatchRoutes>,
    id: u64,
    queue: Arc<Queue>,
}

impl Inbox {
    /// One more watcher of this session watches `range`: batches that
    /// change a key in it are queued from now on.
    pub fn watch(&self, range: &KeyRange) {
        let mut table = self.routes.table();
        let count = match range_key(range) {
            Ok(key) => table.keys.entry(key).or_default().entry(self.id).or_default(),
            Err(range) => table.ranges.entry(range).or_default().entry(self.id).or_default(),
        };
        *count += 1;
    }

    /// One watcher of this session no longer watches `range`.
    pub fn unwatch(&self, range: &KeyRange) {
        let mut table = self.routes.table();
        fn forget<K: std::hash::Hash + Eq>(map: &mut HashMap<K, HashMap<u64, usize>>, key: K, id: u64) {
            if let Some(sessions) = map.get_mut(&key) {
                if let Some(count) = sessions.get_mut(&id) {
                    *count -= 1;
                    if *count == 0 {
                        sessions.remove(&id);
                    }
                }
                if sessions.is_empty() {
                    map.remove(&key);
                }
            }
        }
        match range_key(range) {
            Ok(key) => forget(&mut table.keys, key, self.id),
            Err(range) => forget(&mut table.ranges, range, self.id),
        }
    }

    /// Resolves once a batch was queued (or lost) since the last time this
    /// resolved; it may resolve with nothing queued (a wake kept from while
    /// the session was busy).
    pub async fn ready(&self) {
        self.queue.ready.notified().await
    }

    /// Take what was queued (see [`Taken`]).
    pub fn take(&self) -> Taken {
        // Read before draining: a batch routed up to here is queued already.
        let through = self.routes.routed.load(Ordering::Acquire);
        let mut queued = self.queue.batches.lock().expect("watch inbox lock poisoned");
        let lagged = std::mem::take(&mut queued.lagged);
        let batches: Vec<_> = queued.batches.drain(..).collect();
        drop(queued);
        let through = batches.last().map_or(through, |b| b.revision.max(through));
        Taken { batches: if lagged { Vec::new() } else { batches }, lagged, through }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let mut table = self.routes.table();
        table.inboxes.remove(&self.id);
        let id = self.id;
        table.keys.retain(|_, sessions| {
            sessions.remove(&id);
            !sessions.is_empty()
        });
        table.ranges.retain(|_, sessions| {
            sessions.remove(&id);
            !sessions.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Change, KeyValue};
    use std::time::Duration;

    fn batch(revision: Revision, keys: &[&str]) -> Arc<AppliedChanges> {
        let changes = keys
            .iter()
            .map(|k| Change {
                revision,
                sub: 0,
                key: k.as_bytes().to_vec(),
                kv: Some(Arc::new(KeyValue { key: k.as_bytes().to_vec(), ..Default::default() })),
                prev: None,
            })
            .collect();
        Arc::new(AppliedChanges { revision, changes, resync: false })
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
        let single = routes.open();
        single.watch(&KeyRange::new(b"a", b""));
        let ranged = routes.open();
        ranged.watch(&KeyRange::new(b"b", b"c"));
        ranged.watch(&KeyRange::new(b"x", b"\0"));
        routes.route(&batch(2, &["a"]));
        routes.route(&batch(3, &["bb", "zz"]));
        routes.route(&batch(4, &["c", "ab"]));
        routes.route(&batch(5, &["y", "a"]));
        assert!(woken(&single).await && woken(&ranged).await);
        let (s, r) = (single.take(), ranged.take());
        assert_eq!((revisions(&s), s.through, s.lagged), (vec![2, 5], 5, false));
        assert_eq!((revisions(&r), r.through, r.lagged), (vec![3, 5], 5, false));
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
        let inbox = routes.open();
        let range = KeyRange::new(b"k", b"");
        inbox.watch(&range);
        inbox.watch(&range);
        inbox.unwatch(&range);
        routes.route(&batch(2, &["k"]));
        assert_eq!(revisions(&inbox.take()), vec![2]);
        inbox.unwatch(&range);
        routes.route(&batch(3, &["k"]));
        assert_eq!(revisions(&inbox.take()), Vec::<Revision>::new());
        inbox.watch(&KeyRange::new(b"a", b"b"));
        drop(inbox);
        let table = routes.table();
        assert!(table.keys.is_empty() && table.ranges.is_empty() && table.inboxes.is_empty());
    }

    /// An inbox that overflows, or a replaced store, is reported as a lag
    /// and loses its batches; it then fills again.
    #[tokio::test]
    async fn an_overflowing_inbox_reports_a_lag() {
        let routes = Arc::new(WatchRoutes::default());
        let inbox = routes.open();
        inbox.watch(&KeyRange::new(b"k", b""));
        for revision in 0..=INBOX_CAPACITY as Revision {
            routes.route(&batch(revision + 2, &["k"]));
        }
        let taken = inbox.take();
        assert!(taken.lagged && taken.batches.is_empty());
        assert_eq!(taken.through, INBOX_CAPACITY as Revision + 2);
        routes.route(&batch(5000, &["k"]));
        let taken = inbox.take();
        assert_eq!((revisions(&taken), taken.lagged), (vec![5000], false));
        routes.route(&Arc::new(AppliedChanges { revision: 5000, changes: Vec::new(), resync: true }));
        assert!(woken(&inbox).await && inbox.take().lagged);
    }
}
