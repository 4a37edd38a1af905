//! Writes: Put, DeleteRange and Txn, in etcd's order of evaluation.
//!
//! A write request runs as one *write transaction* that starts at the store's
//! revision `begin`. Its changes take main revision `begin + 1` and sub revisions
//! 0, 1, … in the order they are made; the store's revision moves to `begin + 1`
//! only if something changed (a DeleteRange that deletes nothing, or a txn that
//! only reads, leaves it alone).
//!
//! A Txn is evaluated as etcd does, in three steps, so that it is atomic:
//! 1. every compare on the chosen path (the outer guard, then the guards of the
//!    nested txns in the chosen branch, recursively) is evaluated against the
//!    store as it was before the txn;
//! 2. every request on that path is checked (lease exists, `ignore_*` keys exist,
//!    read revisions are neither compacted nor in the future), also against the
//!    state before the txn — a failing check fails the whole txn unchanged;
//!    so does an answer that could weigh more than the response limit, counted
//!    over all the txn's ranges together (`ResponseBudget`): apply is bounded,
//!    and decides this the same way on every member;
//! 3. the requests run in order, each seeing the changes of those before it.

use std::borrow::Cow;

use super::*;

/// What a write needs to know about leases: whether one exists.
pub trait LeaseView {
    fn lease_exists(&self, id: i64) -> bool;
}

/// A store without leases: any lease named by a write is unknown.
impl LeaseView for () {
    fn lease_exists(&self, _id: i64) -> bool {
        false
    }
}

/// The path a txn takes: its guard's outcome and the paths of the nested txns
/// in the chosen branch, in order.
pub(super) struct TxnPath {
    pub(super) succeeded: bool,
    nested: Vec<TxnPath>,
}

/// What is left of a txn's response limit while its path is checked: the
/// key-values of all its ranges (and of its deletions' `prev_kv`) together
/// must weigh no more than one range may ([`MAX_RANGE_RESPONSE_BYTES`]).
/// Without it a txn of 128 ranges, each within the limit, answered 128
/// times as much — enough to exhaust a member's memory in apply, on every
/// member and again at every restart, since the entry is committed.
///
/// Each op is weighed on the store as it is before the txn
/// ([`MvccStore::range_weight_bound`]), plus everything the txn's puts on
/// the chosen path could add inside its range, and without its limit if a
/// deletion before it on the path overlaps its range (the deletion may let
/// keys never weighed into its first `limit`): an upper bound on what the
/// op can answer once the ops before it have run, so the check is decided
/// before anything changes and is the same on every member.
struct ResponseBudget<'t> {
    left: usize,
    /// The puts on the chosen path (any depth).
    puts: Vec<&'t PutRequest>,
    /// The ranges deleted by the ops weighed so far.
    deleted: Vec<KeyRange>,
    /// How a read of a queue directory that is not registered (`queues`)
    /// is weighed.
    unindexed: Unindexed,
}

/// How a check weighs a queue read that only a walk of every history under
/// its directory could bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unindexed {
    /// Walk: apply's check (and a read-only txn's), which must bound the
    /// answer, and bound it alike on every member.
    Walk,
    /// Let it through, weighing nothing: the check before proposing, which
    /// runs once per request on a runtime worker holding the store, where a
    /// walk per acquire of a lock with a long history stalled members (#55).
    /// Apply weighs it again (after registering the directory), so a txn let
    /// through here costs an entry at most.
    Pass,
}

impl ResponseBudget<'_> {
    fn spend_range(&mut self, store: &MvccStore, r: &RangeRequest) -> Result<(), MvccError> {
        if r.count_only || (self.unindexed == Unindexed::Pass && store.reads_unindexed_queue(r)) {
            return Ok(());
        }
        let range = KeyRange::new(&r.key, &r.range_end);
        let unlimited;
        let r = if r.limit > 0 && self.deleted.iter().any(|d| d.overlaps(&range)) {
            unlimited = RangeRequest { limit: 0, ..r.clone() };
            &unlimited
        } else {
            r
        };
        let added: usize = self
            .puts
            .iter()
            .filter(|p| range.contains(&p.key))
            .map(|p| response_weight(r, &p.key, p.value.len()))
            .sum();
        let budget = self.left.checked_sub(added).ok_or(MvccError::ResponseTooLarge)?;
        let weight = store.range_weight_bound(r, budget).ok_or(MvccError::ResponseTooLarge)?;
        self.left = budget - weight;
        Ok(())
    }

    fn spend_delete(&mut self, store: &MvccStore, d: &DeleteRangeRequest) -> Result<(), MvccError> {
        if d.prev_kv {
            let as_range = RangeRequest { key: d.key.clone(), range_end: d.range_end.clone(), ..Default::default() };
            self.spend_range(store, &as_range)?;
        }
        self.deleted.push(KeyRange::new(&d.key, &d.range_end));
        Ok(())
    }
}

/// The puts on a txn's chosen path, at any depth.
fn collect_puts<'t>(req: &'t TxnRequest, path: &TxnPath, out: &mut Vec<&'t PutRequest>) {
    let ops = if path.succeeded { &req.success } else { &req.failure };
    let mut nested = path.nested.iter();
    for op in ops {
        match op {
            RequestOp::Put(p) => out.push(p),
            RequestOp::Txn(t) => collect_puts(t, nested.next().expect("path per txn"), out),
            RequestOp::Range(_) | RequestOp::DeleteRange(_) => {}
        }
    }
}

/// A write in progress (see the module doc).
struct WriteTxn<'a> {
    store: &'a mut MvccStore,
    begin: Revision,
    changes: Vec<Change>,
}

impl WriteTxn<'_> {
    /// The revision reads inside this write see: including its own changes.
    fn read_revision(&self) -> Revision {
        if self.changes.is_empty() {
            self.begin
        } else {
            self.begin + 1
        }
    }

    /// Put one key. An owned request gives its key and value to the new
    /// version (a put on its own); a borrowed one (a txn's) is copied.
    fn put(&mut self, req: Cow<'_, PutRequest>) -> PutResult {
        let revision = self.begin + 1;
        let sub = self.changes.len() as i64;
        let (ignore_value, ignore_lease, lease, want_prev) =
            (req.ignore_value, req.ignore_lease, req.lease, req.prev_kv);
        let (key, value) = match req {
            Cow::Owned(r) => (r.key, r.value),
            Cow::Borrowed(r) => (r.key.clone(), r.value.clone()),
        };
        let change_key = key.clone();
        let (kv, prev) = self.store.push_live_version(&change_key, revision, sub, |prev| {
            let (create_revision, version) = match prev {
                Some(p) => (p.create_revision, p.version + 1),
                None => (revision, 1),
            };
            let value = match prev {
                Some(p) if ignore_value => p.value.clone(),
                _ => value,
            };
            let lease = match prev {
                Some(p) if ignore_lease => p.lease,
                _ => lease,
            };
            KeyValue { key, create_revision, mod_revision: revision, version, value, lease }
        });
        let prev_kv = if want_prev { prev.as_deref().cloned() } else { None };
        self.changes.push(Change { revision, sub, key: change_key, kv: Some(kv), prev });
        PutResult { revision, prev_kv }
    }

    fn delete_range(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResult {
        let range = KeyRange::new(&req.key, &req.range_end);
        let mut doomed = Vec::new();
        self.store.visit_live(&range, self.read_revision(), |kv| doomed.push(kv));
        let revision = self.begin + 1;
        for kv in &doomed {
            let sub = self.changes.len() as i64;
            self.store.push_version(&kv.key, revision, sub, None);
            self.changes.push(Change { revision, sub, key: kv.key.clone(), kv: None, prev: Some(kv.clone()) });
        }
        let deleted = doomed.len() as i64;
        let prev_kvs = if req.prev_kv { doomed.iter().map(|kv| kv.as_ref().clone()).collect() } else { Vec::new() };
        DeleteRangeResult { revision: self.read_revision(), deleted, prev_kvs }
    }

    fn range(&mut self, req: &RangeRequest) -> Result<RangeResult, MvccError> {
        self.store.range_at(req, self.read_revision())
    }

    fn txn(&mut self, req: &TxnRequest, path: &TxnPath) -> TxnResult {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(match op {
                RequestOp::Range(r) => {
                    // Checked before the txn started; a read cannot fail now.
                    ResponseOp::Range(self.range(r).expect("txn range was checked"))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put(Cow::Borrowed(p))),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete_range(d)),
                RequestOp::Txn(t) => {
                    let p = nested.next().expect("a path for every nested txn");
                    ResponseOp::Txn(self.txn(t, p))
                }
            });
        }
        TxnResult { succeeded: path.succeeded, responses, revision: 0 }
    }

    /// Start the lock-delays this write's deletions call for
    /// ([`crate::model::lock_delay`]), inside this write: put each lock's
    /// delay marker and, outside a lease's end, delete the settings the
    /// write left orphaned. Costs nothing for a write that deletes nothing.
    fn mark_lock_delays(&mut self, lease_end: bool) {
        use crate::model::lock_delay::{format_ms, is_setting, lock_of_owner, marker_key, parse_ms, setting_key};
        if !self.changes.iter().any(|c| c.kv.is_none()) {
            return;
        }
        // The settings this write deleted, with their delays.
        let deleted_settings: std::collections::HashMap<&[u8], Option<u32>> = self
            .changes
            .iter()
            .filter(|c| c.kv.is_none() && is_setting(&c.key))
            .map(|c| (c.key.as_slice(), c.prev.as_ref().and_then(|p| parse_ms(&p.value))))
            .collect();
        let read_at = self.read_revision();
        // (lock, delay) for each involuntary end; and the orphaned settings.
        let mut ended: Vec<(Vec<u8>, u32)> = Vec::new();
        let mut orphans: Vec<Vec<u8>> = Vec::new();
        for c in self.changes.iter().filter(|c| c.kv.is_none()) {
            let Some(lock) = lock_of_owner(&c.key) else { continue };
            let setting = setting_key(&c.key);
            if let Some(deleted) = deleted_settings.get(setting.as_slice()) {
                // Deleted together: a lease's end, or a release.
                if let (true, Some(ms)) = (lease_end, deleted) {
                    ended.push((lock.to_vec(), *ms));
                }
                continue;
            }
            if lease_end {
                // A setting on another lease is not this grant's.
                continue;
            }
            let mut alive = None;
            self.store.visit_live(&KeyRange::Single(setting.clone()), read_at, |kv| alive = Some(kv));
            if let Some(kv) = alive {
                if let Some(ms) = parse_ms(&kv.value) {
                    ended.push((lock.to_vec(), ms));
                    orphans.push(setting);
                }
            }
        }
        for setting in orphans {
            self.delete_range(&DeleteRangeRequest { key: setting, range_end: Vec::new(), prev_kv: false });
        }
        ended.sort();
        // One marker per lock, with the longest delay asked for (or already there).
        let mut last: Option<Vec<u8>> = None;
        for (lock, ms) in ended.into_iter().rev() {
            if last.as_ref() == Some(&lock) {
                continue;
            }
            let marker = marker_key(&lock);
            let mut current = None;
            self.store.visit_live(&KeyRange::Single(marker.clone()), self.read_revision(), |kv| current = Some(kv));
            let ms = current.and_then(|kv| parse_ms(&kv.value)).map_or(ms, |old| old.max(ms));
            let put = PutRequest { key: marker, value: format_ms(ms), ..Default::default() };
            self.put(Cow::Owned(put));
            last = Some(lock);
        }
    }

    /// Ends the write: moves the store's revision if anything changed.
    fn finish(self) -> (Revision, Vec<Change>) {
        let revision = self.read_revision();
        self.store.revision = revision;
        (revision, self.changes)
    }
}

impl MvccStore {
    fn begin_write(&mut self) -> WriteTxn<'_> {
        let begin = self.revision;
        WriteTxn { store: self, begin, changes: Vec::new() }
    }

    /// Put one key. Always creates a new revision.
    pub fn put(&mut self, req: PutRequest, leases: &dyn LeaseView) -> Result<(PutResult, Vec<Change>), MvccError> {
        self.check_put(&req, leases)?;
        let mut w = self.begin_write();
        let result = w.put(Cow::Owned(req));
        let (_, changes) = w.finish();
        Ok((result, changes))
    }

    /// Delete the given keys (those that are live) in one revision, as a lease
    /// revoke does. A new revision only if one was deleted.
    pub fn delete_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k Vec<u8>>) -> (Revision, Vec<Change>) {
        let mut w = self.begin_write();
        for key in keys {
            w.delete_range(&DeleteRangeRequest { key: key.clone(), range_end: Vec::new(), prev_kv: false });
        }
        w.mark_lock_delays(true);
        w.finish()
    }

    /// Delete every live key in a range. A new revision only if one was deleted.
    pub fn delete_range(&mut self, req: &DeleteRangeRequest) -> (DeleteRangeResult, Vec<Change>) {
        let mut w = self.begin_write();
        let result = w.delete_range(req);
        w.mark_lock_delays(false);
        let (_, changes) = w.finish();
        (result, changes)
    }

    /// A transaction (see the module doc for the order of evaluation).
    pub fn txn(&mut self, req: &TxnRequest, leases: &dyn LeaseView) -> Result<(TxnResult, Vec<Change>), MvccError> {
        let path = self.choose_path(req);
        self.index_queues_read(req, &path);
        self.check_path(req, &path, leases)?;
        let mut w = self.begin_write();
        let mut result = w.txn(req, &path);
        w.mark_lock_delays(false);
        let (revision, changes) = w.finish();
        result.revision = revision;
        Ok((result, changes))
    }

    /// Whether `req`'s response, as it would run on the store now, is within
    /// the response limit ([`ResponseBudget`]): what a member checks before
    /// proposing a txn, so that one bound to be refused costs no log entry.
    /// Apply checks again against the state the txn meets there. It never
    /// walks a queue directory the index does not hold ([`Unindexed::Pass`]):
    /// such a read is left to apply, which registers the directory first.
    pub fn check_txn_response(&self, req: &TxnRequest) -> Result<(), MvccError> {
        if !req.answers_values() {
            return Ok(());
        }
        self.check_response(req, &self.choose_path(req), Unindexed::Pass)
    }

    /// Register the directories the ranges on `path` read as queues
    /// ([`MvccStore::index_queue`]), before the txn is checked: its check
    /// and its reads then answer from the index. This is also what keeps
    /// members agreeing: a walk bounds a limited, sorted read by its
    /// heaviest keys, the index by the keys it answers, so a member that
    /// walked (nothing registered since its restart) could refuse a txn that
    /// another accepted.
    fn index_queues_read(&mut self, req: &TxnRequest, path: &TxnPath) {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        for op in ops {
            match op {
                RequestOp::Range(r) => self.index_queue(r),
                RequestOp::Txn(t) => self.index_queues_read(t, nested.next().expect("path per txn")),
                RequestOp::Put(_) | RequestOp::DeleteRange(_) => {}
            }
        }
    }

    fn spend_path(&self, req: &TxnRequest, path: &TxnPath, budget: &mut ResponseBudget<'_>) -> Result<(), MvccError> {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        for op in ops {
            match op {
                RequestOp::Range(r) => budget.spend_range(self, r)?,
                RequestOp::DeleteRange(d) => budget.spend_delete(self, d)?,
                RequestOp::Put(_) => {}
                RequestOp::Txn(t) => self.spend_path(t, nested.next().expect("path per txn"), budget)?,
            }
        }
        Ok(())
    }

    /// A txn with no write in it (see [`TxnRequest::is_read_only`]), evaluated
    /// without changing the store: what a read-only txn served locally needs.
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResult, MvccError> {
        assert!(req.is_read_only(), "read_txn given a txn that writes");
        let path = self.choose_path(req);
        self.check_path(req, &path, &())?;
        let mut result = self.read_path(req, &path);
        result.revision = self.revision;
        Ok(result)
    }

    fn read_path(&self, req: &TxnRequest, path: &TxnPath) -> TxnResult {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        let responses = ops
            .iter()
            .map(|op| match op {
                RequestOp::Range(r) => {
                    ResponseOp::Range(self.range_at(r, self.revision).expect("txn range was checked"))
                }
                RequestOp::Txn(t) => ResponseOp::Txn(self.read_path(t, nested.next().expect("path per txn"))),
                RequestOp::Put(_) | RequestOp::DeleteRange(_) => unreachable!("checked read-only"),
            })
            .collect();
        TxnResult { succeeded: path.succeeded, responses, revision: 0 }
    }

    pub(super) fn choose_path(&self, req: &TxnRequest) -> TxnPath {
        let succeeded = req.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded { &req.success } else { &req.failure };
        let nested = ops
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(t) => Some(self.choose_path(t)),
                _ => None,
            })
            .collect();
        TxnPath { succeeded, nested }
    }

    /// Checks every request on the chosen path against the store before
    /// the txn (see the module doc), then the whole txn's response against
    /// the response limit.
    fn check_path(&self, req: &TxnRequest, path: &TxnPath, leases: &dyn LeaseView) -> Result<(), MvccError> {
        self.check_requests(req, path, leases)?;
        self.check_response(req, path, Unindexed::Walk)
    }

    fn check_requests(&self, req: &TxnRequest, path: &TxnPath, leases: &dyn LeaseView) -> Result<(), MvccError> {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        for op in ops {
            match op {
                RequestOp::Range(r) => self.check_range(r)?,
                RequestOp::Put(p) => self.check_put(p, leases)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(t) => self.check_requests(t, nested.next().expect("path per txn"), leases)?,
            }
        }
        Ok(())
    }

    /// Whether what the txn answers on `path` fits the response limit
    /// ([`ResponseBudget`]).
    fn check_response(&self, req: &TxnRequest, path: &TxnPath, unindexed: Unindexed) -> Result<(), MvccError> {
        // Most txns (a lock's, a put's) answer no key-values: nothing to
        // weigh, and no walk of the index.
        if !req.answers_values() {
            return Ok(());
        }
        let mut puts = Vec::new();
        collect_puts(req, path, &mut puts);
        let mut budget = ResponseBudget { left: self.response_limit, puts, deleted: Vec::new(), unindexed };
        self.spend_path(req, path, &mut budget)
    }

    fn check_range(&self, req: &RangeRequest) -> Result<(), MvccError> {
        if req.revision > 0 && req.revision > self.revision {
            return Err(MvccError::FutureRevision);
        }
        if req.revision > 0 && req.revision < self.compact_revision {
            return Err(MvccError::Compacted);
        }
        Ok(())
    }

    fn check_put(&self, req: &PutRequest, leases: &dyn LeaseView) -> Result<(), MvccError> {
        if (req.ignore_value || req.ignore_lease) && self.get_live(&req.key).is_none() {
            return Err(MvccError::KeyNotFound);
        }
        if req.lease != 0 && !leases.lease_exists(req.lease) {
            return Err(MvccError::LeaseNotFound);
        }
        Ok(())
    }

    /// One txn guard against the current state. A guard on a range holds when it
    /// holds for every key in it; on no key at all, a missing key's zero values
    /// are compared — except for VALUE, which then never holds (etcd: a missing
    /// value cannot be told from an empty one).
    fn compare(&self, c: &Compare) -> bool {
        let range = KeyRange::new(&c.key, &c.range_end);
        let mut kvs = Vec::new();
        self.visit_live(&range, self.revision, |kv| kvs.push(kv));
        if kvs.is_empty() {
            return c.target != CompareTarget::Value && compare_kv(c, &KeyValue::default());
        }
        kvs.iter().all(|kv| compare_kv(c, kv))
    }
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    use std::cmp::Ordering;
    let ord: Ordering = match c.target {
        CompareTarget::Value => kv.value.as_slice().cmp(c.value.as_slice()),
        CompareTarget::Version => kv.version.cmp(&c.number),
        CompareTarget::Create => kv.create_revision.cmp(&c.number),
        CompareTarget::Mod => kv.mod_revision.cmp(&c.number),
        CompareTarget::Lease => kv.lease.cmp(&c.number),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
        CompareResult::NotEqual => ord != Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::tests::put;

    /// The response limit holds for a whole txn, not for each of its ranges:
    /// many ranges, each within the limit, are refused together before anything
    /// runs (the store is unchanged), as are ranges over what the txn's own puts
    /// add and deletions that return their previous values. A read-only txn
    /// served locally is bounded the same way.
    #[test]
    fn a_txn_is_bounded_as_a_whole() {
        let mut s = MvccStore::default().with_response_limit(1000);
        for k in 0..3 {
            put(&mut s, &format!("k{k}"), &"v".repeat(100));
        }
        let all = RangeRequest { key: "k".into(), range_end: "l".into(), ..Default::default() };
        assert!(s.range(&all).is_ok(), "one range is within the limit");
        let ranges =
            |n| TxnRequest { compare: vec![], success: vec![RequestOp::Range(all.clone()); n], failure: vec![] };
        assert!(s.txn(&ranges(2), &()).is_ok());
        assert_eq!(s.read_txn(&ranges(3)).unwrap_err(), MvccError::ResponseTooLarge);
        let delete =
            RequestOp::DeleteRange(DeleteRangeRequest { key: "k".into(), range_end: "l".into(), prev_kv: true });
        let mut poison = ranges(2);
        poison.success.push(delete);
        let before = s.revision();
        assert_eq!(s.txn(&poison, &()).unwrap_err(), MvccError::ResponseTooLarge);
        assert_eq!((s.revision(), s.live_keys()), (before, 3), "nothing ran");
        // What the txn's own puts add counts before they run.
        let big = RequestOp::Put(PutRequest { key: "k9".into(), value: vec![b'x'; 600], ..Default::default() });
        let grows = TxnRequest { compare: vec![], success: vec![big, RequestOp::Range(all.clone())], failure: vec![] };
        assert_eq!(s.txn(&grows, &()).unwrap_err(), MvccError::ResponseTooLarge);
        // Count-only ranges weigh nothing.
        let counts = RequestOp::Range(RangeRequest { count_only: true, ..all.clone() });
        assert!(s.txn(&TxnRequest { compare: vec![], success: vec![counts; 64], failure: vec![] }, &()).is_ok());
    }

    /// A sorted range with a limit is weighed by the keys it can return, not by
    /// the first keys in key order: here the one heavy key sorts first by value.
    #[test]
    fn a_sorted_range_is_weighed_by_what_it_can_return() {
        let mut s = MvccStore::default().with_response_limit(1000);
        put(&mut s, "a", "1");
        put(&mut s, "b", &"z".repeat(2000));
        let sorted = RangeRequest {
            key: "a".into(),
            range_end: "c".into(),
            limit: 1,
            sort_target: SortTarget::Value,
            sort_order: SortOrder::Descend,
            ..Default::default()
        };
        assert_eq!(s.range(&sorted).unwrap_err(), MvccError::ResponseTooLarge);
        let txn = TxnRequest { compare: vec![], success: vec![RequestOp::Range(sorted.clone())], failure: vec![] };
        assert_eq!(s.read_txn(&txn).unwrap_err(), MvccError::ResponseTooLarge);
        assert_eq!(s.txn(&txn, &()).unwrap_err(), MvccError::ResponseTooLarge);
        // A target other than the key with no order sorts ascending (as etcd):
        // "0…" comes before "1", so the heavy key is the one returned.
        put(&mut s, "b", &"0".repeat(2000));
        let by_value = RangeRequest { sort_target: SortTarget::Value, sort_order: SortOrder::None, ..sorted };
        let txn = TxnRequest { compare: vec![], success: vec![RequestOp::Range(by_value)], failure: vec![] };
        assert_eq!(s.read_txn(&txn).unwrap_err(), MvccError::ResponseTooLarge);
    }
}
