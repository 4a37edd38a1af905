//! Range reads in bounded steps.
//!
//! A [`RangeScan`] reads a key range at one revision a number of keys per
//! step ([`MvccStore::range_step`]), so that a server can release the
//! store's lock between steps: one range over every key, at an old revision
//! whose values must be read back from the spill, no longer holds up apply
//! (and every other reader and writer) for its whole length. What a step
//! collects are shared key-values, not copies; filtering, sorting, the limit
//! and the copy into the response happen in [`RangeScan::finish`], with no
//! lock held.
//!
//! A lock queue's range by create revision is answered from the queue
//! index at once (`queues`), when the store has it registered.
//!
//! A count-only range loads no value at all (it only asks which keys are
//! live at the revision), and a plain range in key order stops collecting
//! at its limit and fails as soon as what it collected weighs more than the
//! response limit, so neither loads more than it answers. Both still walk
//! every key of the range, to count them (etcd's `count`); a reader that
//! needs no count and pages through a long range reads with
//! [`MvccStore::first_live`], which stops at its limit.
//!
//! Between steps, writes only add versions above the scan's revision, which
//! it never reads. A compaction past the revision fails the next step with
//! [`MvccError::Compacted`], exactly as a read below the compaction
//! revision fails — the scan never answers from a half-swept history.

use std::sync::Arc;

use super::{
    response_weight, visible_at, KeyRange, KeyValue, MvccError, MvccStore, RangeRequest, RangeResult, Revision,
    SortOrder, SortTarget, Version,
};

/// A range read in progress (see the module doc).
#[derive(Debug)]
pub struct RangeScan {
    req: RangeRequest,
    range: KeyRange,
    /// The revision read at.
    rev: Revision,
    /// The header's revision: the store's when the scan began.
    current: Revision,
    /// The most bytes the response may weigh (`None`: not checked here).
    bound: Option<usize>,
    /// How many key-values are kept at most (`None`: all).
    fetch_limit: Option<usize>,
    filtered: bool,
    order: SortOrder,
    /// The key the next step starts at; `None` before the first step.
    resume: Option<Vec<u8>>,
    finished: bool,
    count: i64,
    kvs: Vec<Arc<KeyValue>>,
    /// What `kvs` weigh in the response, while it is kept in key order.
    weight: usize,
}

impl RangeScan {
    /// A scan of `req` on `store` as it is now, bounded by the store's
    /// response limit.
    pub fn new(store: &MvccStore, req: RangeRequest) -> Result<RangeScan, MvccError> {
        RangeScan::at(store, req, store.revision, Some(store.response_limit))
    }

    /// A scan whose view of the store is at `current` (see
    /// `MvccStore::range_at`).
    pub(super) fn at(
        store: &MvccStore,
        req: RangeRequest,
        current: Revision,
        bound: Option<usize>,
    ) -> Result<RangeScan, MvccError> {
        if req.revision > current {
            return Err(MvccError::FutureRevision);
        }
        let rev = if req.revision <= 0 { current } else { req.revision };
        if rev < store.compact_revision {
            return Err(MvccError::Compacted);
        }
        let filtered = req.is_filtered();
        // Sorting on anything but (key, ascending) needs every key first.
        let order = req.order();
        // One more than asked, so that `more` can be told.
        let fetch_limit = req.kv_limit().filter(|_| order == SortOrder::None && !filtered).map(|l| l.saturating_add(1));
        let range = KeyRange::new(&req.key, &req.range_end);
        let indexed = store.from_queue_index(&req, rev, current);
        let mut scan = RangeScan {
            req,
            range,
            rev,
            current,
            bound,
            fetch_limit,
            filtered,
            order,
            resume: None,
            finished: false,
            count: 0,
            kvs: Vec::new(),
            weight: 0,
        };
        if let Some(indexed) = indexed {
            // Answered already, filtered and in the response's order:
            // `finish` only cuts it to the limit and copies it.
            (scan.fetch_limit, scan.filtered, scan.order, scan.finished) = (None, false, SortOrder::None, true);
            (scan.count, scan.kvs) = (indexed.count, indexed.kvs);
        }
        Ok(scan)
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The response: the key-values collected, filtered, sorted, cut to the
    /// limit and copied. Call once the scan is finished.
    pub fn finish(self) -> Result<RangeResult, MvccError> {
        assert!(self.finished, "a range scan is answered only once it is finished");
        let RangeScan { req, current, bound, filtered, order, count, mut kvs, .. } = self;
        if req.count_only {
            return Ok(RangeResult { kvs: Vec::new(), more: false, count, revision: current });
        }
        if filtered {
            kvs.retain(|kv| {
                !(req.max_mod_revision != 0 && kv.mod_revision > req.max_mod_revision
                    || req.min_mod_revision != 0 && kv.mod_revision < req.min_mod_revision
                    || req.max_create_revision != 0 && kv.create_revision > req.max_create_revision
                    || req.min_create_revision != 0 && kv.create_revision < req.min_create_revision)
            });
        }
        if order != SortOrder::None {
            match req.sort_target {
                SortTarget::Key => kvs.sort_by(|a, b| a.key.cmp(&b.key)),
                SortTarget::Version => kvs.sort_by_key(|kv| kv.version),
                SortTarget::Create => kvs.sort_by_key(|kv| kv.create_revision),
                SortTarget::Mod => kvs.sort_by_key(|kv| kv.mod_revision),
                SortTarget::Value => kvs.sort_by(|a, b| a.value.cmp(&b.value)),
            }
            if order == SortOrder::Descend {
                kvs.reverse();
            }
        }
        let mut more = false;
        if let Some(limit) = req.kv_limit().filter(|l| kvs.len() > *l) {
            kvs.truncate(limit);
            more = true;
        }
        if bound.is_some_and(|bound| {
            kvs.iter().map(|kv| response_weight(&req, &kv.key, kv.value.len())).sum::<usize>() > bound
        }) {
            return Err(MvccError::ResponseTooLarge);
        }
        let kvs = kvs
            .into_iter()
            .map(|kv| match req.keys_only {
                false => kv.as_ref().clone(),
                true => KeyValue { key: kv.key.clone(), value: Vec::new(), ..*kv },
            })
            .collect();
        Ok(RangeResult { kvs, more, count, revision: current })
    }
}

impl MvccStore {
    /// The first `most` live key-values of `range` at the newest revision,
    /// in key order, and whether a live key follows them: a read that stops
    /// at its limit. [`MvccStore::range`] goes on past its limit to count
    /// every live key of the range (etcd's `count`), so paging through a
    /// directory of `n` keys with it walks about `n² / page` of them; the
    /// lock listing, which pages through directories in key order and needs
    /// no count, reads with this instead. It walks the histories between the
    /// live keys it answers (deleted keys compaction has not swept yet).
    /// `most` is a count, not etcd's limit: 0 answers nothing.
    pub fn first_live(&self, range: &KeyRange, most: usize) -> (Vec<Arc<KeyValue>>, bool) {
        let mut kvs = Vec::new();
        for (_, versions) in self.histories(range) {
            let Some(kv) = versions.last().and_then(Version::live_kv) else { continue };
            if kvs.len() == most {
                return (kvs, true);
            }
            kvs.push(kv.clone());
        }
        (kvs, false)
    }

    /// One step of `scan`: at most `keys` more keys of its range.
    pub fn range_step(&self, scan: &mut RangeScan, keys: usize) -> Result<(), MvccError> {
        if scan.rev < self.compact_revision {
            return Err(MvccError::Compacted);
        }
        if scan.finished {
            return Ok(());
        }
        let in_key_order = scan.order == SortOrder::None && !scan.filtered;
        let resume = scan.resume.take();
        let mut next = None;
        for (seen, (key, versions)) in self.histories_from(&scan.range, resume.as_deref()).enumerate() {
            if seen == keys {
                next = Some(key.clone());
                break;
            }
            let Some(v) = visible_at(versions, scan.rev).filter(|v| v.is_live()) else { continue };
            scan.count += 1;
            if scan.req.count_only || scan.fetch_limit.is_some_and(|l| scan.kvs.len() >= l) {
                continue;
            }
            if in_key_order {
                // What is collected is answered (up to the limit): stop
                // reading as soon as it is more than may be answered.
                let len = Version::value_len(v).unwrap_or(0);
                scan.weight += response_weight(&scan.req, key, len);
                let within = scan.fetch_limit.is_some_and(|l| scan.kvs.len() + 1 >= l);
                if !within && scan.bound.is_some_and(|b| scan.weight > b) {
                    return Err(MvccError::ResponseTooLarge);
                }
            }
            if let Some(kv) = self.load(key, v) {
                scan.kvs.push(kv);
            }
        }
        match next {
            Some(key) => scan.resume = Some(key),
            None => scan.finished = true,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::tests::put;
    use crate::model::mvcc::*;

    /// A range read in steps answers what one read at its revision answers,
    /// whatever is written between the steps; a compaction past its revision
    /// between steps fails it as compacted.
    #[test]
    fn a_range_in_steps_reads_one_revision() {
        let mut s = MvccStore::default();
        for k in 0..10 {
            put(&mut s, &format!("k{k}"), "old");
        }
        let all = RangeRequest { key: "k".into(), range_end: "l".into(), ..Default::default() };
        let whole = s.range(&all).unwrap();
        let mut scan = RangeScan::new(&s, all.clone()).unwrap();
        s.range_step(&mut scan, 3).unwrap();
        assert!(!scan.finished());
        put(&mut s, "k5", "new");
        put(&mut s, "k55", "new");
        s.delete_range(&DeleteRangeRequest { key: "k9".into(), ..Default::default() });
        while !scan.finished() {
            s.range_step(&mut scan, 3).unwrap();
        }
        assert_eq!(scan.finish().unwrap(), whole, "the revision the scan began at");
        let counted = RangeRequest { count_only: true, ..all.clone() };
        let mut scan = RangeScan::new(&s, counted).unwrap();
        s.range_step(&mut scan, 4).unwrap();
        put(&mut s, "k77", "x");
        s.compact(s.revision()).unwrap();
        assert_eq!(s.range_step(&mut scan, 4), Err(MvccError::Compacted));
    }

    /// A read that stops at its limit answers what a limited range answers
    /// (the same keys, `more` alike), past deleted and rewritten keys, at
    /// every limit and from every start.
    #[test]
    fn first_live_is_a_limited_range() {
        let mut s = MvccStore::default();
        for k in 0..12 {
            put(&mut s, &format!("k{k:02}"), "v");
        }
        for k in [0, 3, 4, 5, 11] {
            s.delete_range(&DeleteRangeRequest { key: format!("k{k:02}").into_bytes(), ..Default::default() });
        }
        put(&mut s, "k07", "again");
        put(&mut s, "l", "outside");
        for start in ["k", "k03", "k06", "k10", "k11"] {
            for limit in 1..10usize {
                let req = RangeRequest {
                    key: start.into(),
                    range_end: "l".into(),
                    limit: limit as i64,
                    ..Default::default()
                };
                let expected = s.range(&req).unwrap();
                let (kvs, more) = s.first_live(&KeyRange::new(&req.key, &req.range_end), limit);
                let kvs: Vec<KeyValue> = kvs.iter().map(|kv| kv.as_ref().clone()).collect();
                assert_eq!((kvs, more), (expected.kvs, expected.more), "from {start}, {limit} at most");
            }
        }
    }
}
