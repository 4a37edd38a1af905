//! Queues by creation: for directories that lock recipes read as queues,
//! their live keys in (create_revision, key) order, so that "the first
//! `limit` keys under `name/` by create revision" — what etcd's Lock, the
//! etcd client mutex and raftlock's own acquire ask in apply on every
//! request, and what a waiter asks when its turn may have come — costs the
//! keys answered, not a walk and a sort of the whole queue.
//!
//! A directory is a prefix ending in `/`. It is registered the first time a
//! write's txn reads it sorted by create revision ([`MvccStore::index_queue`]):
//! its live keys are walked once then, and from then on every key created
//! or deleted under it is recorded as its version is pushed. A directory
//! whose last key goes is dropped (registering it again walks nothing).
//!
//! Invariant: a registered directory's set holds exactly the live keys
//! under it at the store's newest revision, each with its create revision.
//! So an answer from it ([`MvccStore::from_queue_index`]) is the answer the
//! walk would give, ties in create revision (keys created by one txn) in
//! key order as the walk's stable sort leaves them; the property test in
//! `tests.rs` compares the two on random histories.
//!
//! Caveats: only reads at the newest revision are answered from it (older
//! revisions walk, as before); it is derived data, rebuilt lazily after a
//! restore, and not counted in the space quota (it holds a copy of each
//! indexed key: the memory of the keys under registered directories twice).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::version::Held;
use super::{prefix_end, KeyRange, KeyValue, MvccStore, RangeRequest, Revision, SortOrder, SortTarget};

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
        for slash in key.iter().enumerate().filter(|(_, b)| **b == b'/').map(|(i, _)| i) {
            let dir = &key[..=slash];
            let Some(set) = self.dirs.get_mut(dir) else { continue };
            if live {
                set.insert((create, key.to_vec()));
            } else {
                set.remove(&(create, key.to_vec()));
                if set.is_empty() {
                    self.dirs.remove(dir);
                }
            }
        }
    }
}

/// The directory `req` reads as a queue: its key ends in `/` and its range
/// is every key under it.
fn queue_dir(req: &RangeRequest) -> Option<&[u8]> {
    (req.key.last() == Some(&b'/') && req.range_end == prefix_end(&req.key)).then_some(req.key.as_slice())
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
        for (key, versions) in self.histories(&KeyRange::new(dir, &prefix_end(dir))) {
            if let Some(Held::Memory(kv)) = versions.last().map(|v| &v.held) {
                set.insert((kv.create_revision, key.clone()));
            }
        }
        if !set.is_empty() {
            self.queues.dirs.insert(dir.to_vec(), set);
        }
    }

    /// `req`'s answer from the index, read at `rev` (`current`: the newest
    /// revision), when it can give it (see [`answerable`]); `None`: walk.
    pub(super) fn from_queue_index(&self, req: &RangeRequest, rev: Revision, current: Revision) -> Option<Indexed> {
        if rev != current || !answerable(req) {
            return None;
        }
        let set = self.queues.dirs.get(queue_dir(req)?)?;
        let count = set.len() as i64;
        if req.count_only {
            return Some(Indexed { kvs: Vec::new(), count });
        }
        let take = usize::try_from(req.limit).ok().filter(|l| *l > 0).map_or(usize::MAX, |l| l.saturating_add(1));
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
                return Some(Indexed { kvs: Vec::new(), count });
            }
        }
        let upto = set.range((from, to));
        let load = |(_, key): &(Revision, Vec<u8>)| self.get_live(key).cloned().expect("an indexed key is live");
        let kvs = match req.order() {
            SortOrder::Descend => upto.rev().take(take).map(load).collect(),
            SortOrder::Ascend => upto.take(take).map(load).collect(),
            SortOrder::None => {
                let mut ahead: Vec<Arc<KeyValue>> = upto.map(load).collect();
                ahead.sort_by(|a, b| a.key.cmp(&b.key));
                ahead.truncate(take);
                ahead
            }
        };
        Some(Indexed { kvs, count })
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
                match rng.below(5) {
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
                }
            }
        }
        assert!(indexed > 500, "only {indexed} reads were answered from the index");
    }
}
