//! Queues by creation: for directories that lock recipes read as queues,
//! their live keys in (create_revision, key) order, so that "the first
//! `limit` keys under `name/` by create revision" — what etcd's Lock, the
//! etcd client mutex and raftlock's own acquire ask in apply on every
//! request, and what a waiter asks when its turn may have come — costs the
//! keys answered, not a walk and a sort of the whole queue.
//!
//! A directory is a prefix ending in `/` (at most [`MAX_DEPTH`] deep). It
//! is registered when a write's txn first reads it as the index can answer
//! ([`answerable`]: sorted by create revision, or the keys ahead of a
//! waiter), before that txn is checked ([`MvccStore::index_queue`]): every
//! history under it is walked once then, and from then on every key created
//! or deleted under it is recorded as its version is pushed. It stays
//! registered, empty or not, while any history is left under it, so an
//! emptied lock's next key is recorded without a walk, and compaction drops
//! it with the last of that history ([`MvccStore::forget_swept_queues`]).
//! (It used to be dropped as it emptied; then the check before proposing
//! of every acquire that followed a long queue walked the tombstones of all
//! its earlier holders, and members stalled: #55.)
//!
//! Invariants:
//! - a registered directory's set holds exactly the live keys under it at
//!   the store's newest revision, each with its create revision. So an
//!   answer from it ([`MvccStore::from_queue_index`]) is the answer the walk
//!   would give, ties in create revision (keys created by one txn) in key
//!   order as the walk's stable sort leaves them; the property test below
//!   compares the two on random histories, compactions included;
//! - a registered directory has history under it: reads of directories
//!   that hold nothing register nothing;
//! - apply's answer never depends on what is registered: a txn registers
//!   every directory it reads before it is weighed, so every member weighs
//!   it from the index (or, with no history under it, as empty), whatever
//!   it had registered before a restart or a snapshot.
//!
//! A txn's read is weighed from the index key by key, in the answer's
//! order, up to the budget ([`MvccStore::weigh_from_queue_index`]): the
//! check of a txn that reads a long queue with no limit stops once it is
//! too large, without copying the queue first.
//!
//! Caveats: only reads at the newest revision are answered from it (older
//! revisions walk); it is derived data, rebuilt only by write txns after a
//! restore (plain reads walk until one has registered their directory);
//! not counted in the space quota: it holds a copy of each indexed key per
//! registered directory above it, [`MAX_DEPTH`] copies at most.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::version::Held;
use super::{
    prefix_end, response_weight, KeyRange, KeyValue, MvccStore, RangeRequest, Revision, SortOrder, SortTarget,
};

/// The registered directories (see the module doc).
#[derive(Debug, Default)]
pub(super) struct QueueIndex {
    dirs: HashMap<Vec<u8>, BTreeSet<(Revision, Vec<u8>)>>,
}

impl QueueIndex {
    /// `key` (created at `create`) went live, or (`live` false) ended.
    pub(super) fn record(&mut self, key: &[u8], create: Revision, live: bool) {
        if self.dirs.is_empty() {
            return;
        }
        for dir in dirs_above(key) {
            let Some(set) = self.dirs.get_mut(dir) else { continue };
            if live {
                set.insert((create, key.to_vec()));
            } else {
                set.remove(&(create, key.to_vec()));
            }
        }
    }
}

/// How deep a directory may be to be registered: at most this many `/`
/// in it. Deeper ones are walked (alike on every member). The bound keeps
/// a key's recording to that many lookups, and the copies of a key held by
/// the registered directories above it to that many, whatever its shape (a
/// key of 1.5 MiB with a `/` in every other byte would otherwise be hashed
/// once per prefix: quadratic, in apply, on every member).
const MAX_DEPTH: usize = 8;

/// The directories `key` is under that may be registered: its prefixes that
/// end in `/`, the first [`MAX_DEPTH`] of them.
fn dirs_above(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    key.iter().enumerate().filter(|(_, b)| **b == b'/').take(MAX_DEPTH).map(move |(i, _)| &key[..=i])
}

/// The directory `req` reads as a queue: its key ends in `/` (with at most
/// [`MAX_DEPTH`] of them) and its range is every key under it.
fn queue_dir(req: &RangeRequest) -> Option<&[u8]> {
    let dir = req.key.as_slice();
    let is_dir = dir.last() == Some(&b'/') && req.range_end == prefix_end(dir);
    (is_dir && dir.iter().filter(|b| **b == b'/').count() <= MAX_DEPTH).then_some(dir)
}

/// Whether the index can answer `req`: sorted by create revision (either
/// way, filtered at most by create revision: a page of a queue), or in key
/// order filtered by `max_create_revision` alone (the keys ahead of a
/// waiter).
fn answerable(req: &RangeRequest) -> bool {
    let by_mod = req.min_mod_revision != 0 || req.max_mod_revision != 0;
    let by_create = req.sort_target == SortTarget::Create && req.order() != SortOrder::None;
    let ahead = req.order() == SortOrder::None && req.max_create_revision != 0 && req.min_create_revision == 0;
    !by_mod && (by_create || ahead)
}

/// What the index answers for a range: the key-values in the response's
/// order (at most `limit + 1`, so that `more` can be told; all without a
/// limit), and how many live keys the range holds.
pub(super) struct Indexed {
    pub kvs: Vec<Arc<KeyValue>>,
    pub count: i64,
}

impl MvccStore {
    /// Register the directory `req` reads, if it reads one as a queue (see
    /// the module doc): called by a write's txn before it reads.
    pub(super) fn index_queue(&mut self, req: &RangeRequest) {
        let Some(dir) = answerable(req).then(|| queue_dir(req)).flatten() else { return };
        if self.queues.dirs.contains_key(dir) {
            return;
        }
        let mut set = BTreeSet::new();
        let mut any_history = false;
        for (key, versions) in self.histories(&KeyRange::with_prefix(dir)) {
            any_history = true;
            if let Some(Held::Memory(kv)) = versions.last().map(|v| &v.held) {
                set.insert((kv.create_revision, key.clone()));
            }
        }
        if any_history {
            self.queues.dirs.insert(dir.to_vec(), set);
        }
    }

    /// Compaction swept away the whole history of `keys`: drop the
    /// registered directories above them that have no history left.
    pub(super) fn forget_swept_queues(&mut self, keys: &[Vec<u8>]) {
        if self.queues.dirs.is_empty() {
            return;
        }
        for key in keys {
            for dir in dirs_above(key) {
                let emptied = self.queues.dirs.get(dir).is_some_and(BTreeSet::is_empty);
                if emptied && !self.has_history_under(dir) {
                    self.queues.dirs.remove(dir);
                }
            }
        }
    }

    /// Whether any key under `dir` has history (live or not).
    fn has_history_under(&self, dir: &[u8]) -> bool {
        self.histories(&KeyRange::with_prefix(dir)).next().is_some()
    }

    /// Whether `req` reads, as a queue, a directory that is not registered:
    /// only a walk of every history under it could weigh its answer.
    pub(super) fn reads_unindexed_queue(&self, req: &RangeRequest) -> bool {
        answerable(req) && queue_dir(req).is_some_and(|dir| !self.queues.dirs.contains_key(dir))
    }

    /// `req`'s answer from the index, read at `rev` (`current`: the newest
    /// revision), when it can give it (see [`answerable`]); `None`: walk.
    pub(super) fn from_queue_index(&self, req: &RangeRequest, rev: Revision, current: Revision) -> Option<Indexed> {
        let (count, answer) = self.indexed_answer(req, rev, current)?;
        // One more than the limit, so that `more` can be told.
        let take = req.kv_limit().map_or(usize::MAX, |l| l.saturating_add(1));
        Some(Indexed { kvs: answer.take(take).cloned().collect(), count })
    }

    /// What the first `limit` key-values of `req`'s answer from the index,
    /// read at `rev`, weigh in its response (all without a limit), when the
    /// index can answer it: `Some(None)` once past `budget`, where it stops
    /// adding (an unlimited read of a long queue is not copied to be weighed).
    pub(super) fn weigh_from_queue_index(
        &self,
        req: &RangeRequest,
        rev: Revision,
        budget: usize,
    ) -> Option<Option<usize>> {
        let (_, answer) = self.indexed_answer(req, rev, self.revision)?;
        let mut sum = 0usize;
        for kv in answer.take(req.kv_limit().unwrap_or(usize::MAX)) {
            sum += response_weight(req, &kv.key, kv.value.len());
            if sum > budget {
                return Some(None);
            }
        }
        Some(Some(sum))
    }

    /// `req`'s answer from the index as it is read, in the response's
    /// order, and how many live keys the range holds; `None`: walk.
    fn indexed_answer<'a>(
        &'a self,
        req: &RangeRequest,
        rev: Revision,
        current: Revision,
    ) -> Option<(i64, Box<dyn Iterator<Item = &'a Arc<KeyValue>> + 'a>)> {
        if rev != current || !answerable(req) {
            return None;
        }
        let set = self.queues.dirs.get(queue_dir(req)?)?;
        let count = set.len() as i64;
        if req.count_only {
            return Some((count, Box::new(std::iter::empty())));
        }
        // The entries created within [min_create_revision, max_create_revision]
        // (unbounded where 0).
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let from = match req.min_create_revision {
            0 => Unbounded,
            min => Included((min, Vec::new())),
        };
        let to = match req.max_create_revision {
            0 => Unbounded,
            max => Excluded((max.saturating_add(1), Vec::new())),
        };
        if let (Included((min, _)), Excluded((end, _))) = (&from, &to) {
            if min >= end {
                return Some((count, Box::new(std::iter::empty())));
            }
        }
        let upto = set.range((from, to));
        let load = |(_, key): &(Revision, Vec<u8>)| self.get_live(key).expect("an indexed key is live");
        Some(match req.order() {
            SortOrder::Descend => (count, Box::new(upto.rev().map(load))),
            SortOrder::Ascend => (count, Box::new(upto.map(load))),
            SortOrder::None => {
                // In key order: all of them first, to sort.
                let mut ahead: Vec<&Arc<KeyValue>> = upto.map(load).collect();
                ahead.sort_by(|a, b| a.key.cmp(&b.key));
                (count, Box::new(ahead.into_iter()))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::model::mvcc::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    const KEYS: [&str; 14] =
        ["q/", "q/1", "q/2", "q/3", "q/4", "q/5", "q/a/", "q/a/1", "q/a/2", "qq", "q0", "r/1", "r/2", "r/a/b/c"];
    const DIRS: [&str; 4] = ["q/", "q/a/", "r/", "r/a/"];

    /// A queue read, as the recipes and other clients may ask it.
    fn query(rng: &mut Rng, revision: Revision) -> RangeRequest {
        let dir = DIRS[rng.below(DIRS.len())];
        let (sort_target, sort_order) = [
            (SortTarget::Create, SortOrder::Ascend),
            (SortTarget::Create, SortOrder::Descend),
            (SortTarget::Create, SortOrder::None),
            (SortTarget::Key, SortOrder::None),
            (SortTarget::Key, SortOrder::Ascend),
        ][rng.below(5)];
        RangeRequest {
            key: dir.into(),
            range_end: prefix_end(dir.as_bytes()),
            sort_target,
            sort_order,
            limit: rng.below(4) as i64,
            max_create_revision: [0, 0, revision / 2, revision - 1][rng.below(4)],
            min_create_revision: [0, 0, 0, revision / 3, revision / 2 + 1][rng.below(5)],
            keys_only: rng.below(3) == 0,
            count_only: rng.below(6) == 0,
            ..Default::default()
        }
    }

    /// The walk's answer: the same history in a store with nothing registered.
    fn walked(s: &MvccStore, req: &RangeRequest) -> RangeResult {
        MvccStore::restore(s.versions(), s.revision(), s.compact_revision()).range(req).unwrap()
    }

    /// Random histories of creations (one or two keys a txn: ties in create
    /// revision), updates, deletions (of one key, of a prefix) and queue
    /// reads in txns (which register their directories): every read, in a
    /// txn or on its own, answers as the walk does, and so does the weight
    /// bound a txn is checked with.
    #[test]
    fn answers_from_the_index_are_the_walks() {
        let mut indexed = 0;
        for seed in 1..40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut s = MvccStore::default();
            for _ in 0..150 {
                let key = |rng: &mut Rng| KEYS[rng.below(KEYS.len())].as_bytes().to_vec();
                let put = |key: Vec<u8>| RequestOp::Put(PutRequest { key, value: b"v".to_vec(), ..Default::default() });
                match rng.below(6) {
                    0 | 1 => {
                        let ops = (0..1 + rng.below(2)).map(|_| put(key(&mut rng))).collect();
                        s.txn(&TxnRequest { success: ops, ..Default::default() }, &()).unwrap();
                    }
                    2 => {
                        let dir = DIRS[rng.below(DIRS.len())];
                        let req = match rng.below(2) {
                            0 => DeleteRangeRequest { key: key(&mut rng), ..Default::default() },
                            _ => DeleteRangeRequest {
                                key: dir.into(),
                                range_end: prefix_end(dir.as_bytes()),
                                ..Default::default()
                            },
                        };
                        s.delete_range(&req);
                    }
                    // A compaction, swept a few keys at a time: a directory
                    // stays registered exactly while history is under it.
                    3 if s.revision() > s.compact_revision().max(0) => {
                        let from = s.compact_revision().max(0) + 1;
                        s.compact(from + rng.below((s.revision() - from + 1) as usize) as Revision).unwrap();
                        while s.sweep(2) {
                            assert_registered_have_history(&s);
                        }
                        assert_registered_have_history(&s);
                    }
                    _ => {
                        let q = query(&mut rng, s.revision() + 1);
                        let ops = vec![put(key(&mut rng)), RequestOp::Range(q.clone())];
                        let (r, _) = s.txn(&TxnRequest { success: ops, ..Default::default() }, &()).unwrap();
                        let ResponseOp::Range(read) = &r.responses[1] else { panic!("a range") };
                        assert_eq!(read, &walked(&s, &q), "seed {seed}: in a txn, {q:?}");
                    }
                }
                for _ in 0..4 {
                    let q = query(&mut rng, s.revision());
                    let walk = walked(&s, &q);
                    assert_eq!(s.range(&q).unwrap(), walk, "seed {seed}: {q:?}");
                    indexed += usize::from(s.from_queue_index(&q, s.revision(), s.revision()).is_some());
                    // The bound a txn is checked with: at least what is
                    // answered, at most what the walk bounds it by.
                    let fresh = MvccStore::restore(s.versions(), s.revision(), s.compact_revision());
                    let answered = walk.kvs.iter().map(|kv| response_weight(&q, &kv.key, kv.value.len())).sum();
                    let bound = s.range_weight_bound(&q, usize::MAX).unwrap();
                    assert!(bound >= answered && bound <= fresh.range_weight_bound(&q, usize::MAX).unwrap(), "{q:?}");
                    // With a budget, the same bound while within it, and
                    // `None` past it (the weighing stops there).
                    for budget in [0, bound / 2, bound.saturating_sub(1), bound] {
                        let within = (bound <= budget).then_some(bound);
                        assert_eq!(s.range_weight_bound(&q, budget), within, "{q:?} within {budget}");
                    }
                }
            }
        }
        assert!(indexed > 500, "only {indexed} reads were answered from the index");
    }

    fn assert_registered_have_history(s: &MvccStore) {
        for dir in s.queues.dirs.keys() {
            assert!(s.has_history_under(dir), "{:?} registered with no history", String::from_utf8_lossy(dir));
        }
    }

    /// The first key of a queue `dir`, by create revision.
    fn head_of(dir: &str) -> RangeRequest {
        RangeRequest {
            key: dir.into(),
            range_end: prefix_end(dir.as_bytes()),
            sort_target: SortTarget::Create,
            sort_order: SortOrder::Ascend,
            limit: 1,
            ..Default::default()
        }
    }

    fn put_and_read(s: &mut MvccStore, key: &str, dir: &str) -> RangeResult {
        let put = RequestOp::Put(PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() });
        let txn = TxnRequest { success: vec![put, RequestOp::Range(head_of(dir))], ..Default::default() };
        let (mut r, _) = s.txn(&txn, &()).unwrap();
        let Some(ResponseOp::Range(read)) = r.responses.pop() else { panic!("a range") };
        read
    }

    /// A queue that empties stays registered while history is left under
    /// it (its next key is recorded without a walk of the tombstones), and
    /// goes with the last of that history when compaction sweeps it. A
    /// read of a directory with no history registers nothing.
    #[test]
    fn an_emptied_queue_stays_registered_until_its_history_is_swept() {
        let mut s = MvccStore::default();
        let registered = |s: &MvccStore, dir: &str| s.queues.dirs.contains_key(dir.as_bytes());
        s.txn(&TxnRequest { success: vec![RequestOp::Range(head_of("none/"))], ..Default::default() }, &()).unwrap();
        assert!(!registered(&s, "none/"), "nothing under it, nothing registered");

        put_and_read(&mut s, "q/1", "q/");
        put_and_read(&mut s, "q/2", "q/");
        assert!(registered(&s, "q/"));
        let delete = |key: &str| DeleteRangeRequest { key: key.into(), ..Default::default() };
        s.delete_range(&delete("q/1"));
        s.delete_range(&delete("q/2"));
        assert!(registered(&s, "q/"), "emptied, with history left");
        let empty = s.from_queue_index(&head_of("q/"), s.revision(), s.revision()).expect("answered by the index");
        assert_eq!((empty.kvs.len(), empty.count), (0, 0));
        // The next key is recorded as it is put, and read from the index.
        let read = put_and_read(&mut s, "q/3", "q/");
        assert_eq!(read.kvs.iter().map(|kv| kv.key.as_slice()).collect::<Vec<_>>(), [b"q/3".as_slice()]);
        assert_eq!(read, walked(&s, &head_of("q/")));

        s.delete_range(&delete("q/3"));
        s.compact(s.revision()).unwrap();
        s.sweep(usize::MAX);
        assert!(!registered(&s, "q/"), "its history is gone");
    }

    /// Members agree on a txn whatever they had registered: a store whose
    /// index holds the queue and one restored from the same history (nothing
    /// registered, as after a restart or a snapshot) weigh a limited, sorted
    /// read alike. (Weighed by a walk, by its heaviest keys, it would be
    /// refused by the second only.)
    #[test]
    fn members_weigh_a_queue_alike_whatever_they_had_registered() {
        let mut s = MvccStore::default();
        put_and_read(&mut s, "q/1", "q/");
        put_and_read(&mut s, "q/2", "q/");
        for key in ["q/3", "q/4"] {
            s.put(PutRequest { key: key.into(), value: vec![b'v'; 1000], ..Default::default() }, &()).unwrap();
        }
        let mut restored = MvccStore::restore(s.versions(), s.revision(), s.compact_revision());
        // Two reads of the queue's two light heads fit; of its two heaviest keys they would not.
        (s.response_limit, restored.response_limit) = (500, 500);
        let read = RequestOp::Range(RangeRequest { limit: 2, ..head_of("q/") });
        let txn = TxnRequest { success: vec![read.clone(), read], ..Default::default() };
        let registered = s.txn(&txn, &()).map(|(r, _)| r);
        assert!(registered.is_ok(), "{registered:?}");
        assert_eq!(restored.txn(&txn, &()).map(|(r, _)| r), registered);
    }

    /// A deletion before a limited read may let keys never weighed into its
    /// first `limit`: the read is weighed without its limit, before
    /// proposing as in apply. A deletion elsewhere changes nothing.
    #[test]
    fn a_read_after_a_deletion_in_its_range_is_weighed_without_its_limit() {
        let mut s = MvccStore::default();
        put_and_read(&mut s, "q/1", "q/");
        s.put(PutRequest { key: b"q/2".to_vec(), value: vec![b'v'; 1000], ..Default::default() }, &()).unwrap();
        put_and_read(&mut s, "r/1", "q/");
        s.response_limit = 500;
        let read = RequestOp::Range(head_of("q/"));
        let delete = |key: &str| RequestOp::DeleteRange(DeleteRangeRequest { key: key.into(), ..Default::default() });
        let elsewhere = TxnRequest { success: vec![delete("r/1"), read.clone()], ..Default::default() };
        assert_eq!(s.check_txn_response(&elsewhere), Ok(()));
        let ahead = TxnRequest { success: vec![delete("q/1"), read], ..Default::default() };
        assert_eq!(s.check_txn_response(&ahead), Err(MvccError::ResponseTooLarge));
        assert_eq!(s.txn(&ahead, &()).unwrap_err(), MvccError::ResponseTooLarge);
        assert!(s.txn(&elsewhere, &()).is_ok());
    }

    /// Before proposing, a queue read of a directory the index does not hold
    /// is let through, not walked; apply registers the directory, weighs
    /// the read exactly and refuses it when it is over the response limit.
    /// From then on the check before proposing refuses it too.
    #[test]
    fn only_apply_walks_an_unregistered_queue() {
        let mut s = MvccStore::default();
        for i in 0..5 {
            let put = PutRequest { key: format!("q/{i}").into(), value: vec![b'v'; 100], ..Default::default() };
            s.put(put, &()).unwrap();
        }
        s.response_limit = 300;
        let whole_queue = RangeRequest { limit: 0, ..head_of("q/") };
        let txn = TxnRequest { success: vec![RequestOp::Range(whole_queue)], ..Default::default() };
        let before = s.revision();
        assert_eq!(s.check_txn_response(&txn), Ok(()), "not walked before proposing");
        assert_eq!(s.txn(&txn, &()).unwrap_err(), MvccError::ResponseTooLarge);
        assert_eq!(s.check_txn_response(&txn), Err(MvccError::ResponseTooLarge), "registered by apply");
        assert_eq!(s.revision(), before, "refused unchanged");
    }
}
