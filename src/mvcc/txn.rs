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

    fn range(&self, req: &RangeRequest) -> Result<RangeResult, MvccError> {
        self.store.range_at(req, self.read_revision(), None)
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
        w.finish()
    }

    /// Delete every live key in a range. A new revision only if one was deleted.
    pub fn delete_range(&mut self, req: &DeleteRangeRequest) -> (DeleteRangeResult, Vec<Change>) {
        let mut w = self.begin_write();
        let result = w.delete_range(req);
        let (_, changes) = w.finish();
        (result, changes)
    }

    /// A transaction (see the module doc for the order of evaluation).
    pub fn txn(&mut self, req: &TxnRequest, leases: &dyn LeaseView) -> Result<(TxnResult, Vec<Change>), MvccError> {
        let path = self.choose_path(req);
        self.check_path(req, &path, leases)?;
        let mut w = self.begin_write();
        let mut result = w.txn(req, &path);
        let (revision, changes) = w.finish();
        result.revision = revision;
        Ok((result, changes))
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
                    ResponseOp::Range(self.range_at(r, self.revision, None).expect("txn range was checked"))
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

    fn check_path(&self, req: &TxnRequest, path: &TxnPath, leases: &dyn LeaseView) -> Result<(), MvccError> {
        let ops = if path.succeeded { &req.success } else { &req.failure };
        let mut nested = path.nested.iter();
        for op in ops {
            match op {
                RequestOp::Range(r) => self.check_range(r)?,
                RequestOp::Put(p) => self.check_put(p, leases)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(t) => self.check_path(t, nested.next().expect("path per txn"), leases)?,
            }
        }
        Ok(())
    }

    fn check_range(&self, req: &RangeRequest) -> Result<(), MvccError> {
        if req.revision > 0 && req.revision > self.revision {
            return Err(MvccError::FutureRevision);
        }
        if req.revision > 0 && req.revision < self.compact_revision {
            return Err(MvccError::Compacted);
        }
        if !self.range_within_limit(req) {
            return Err(MvccError::ResponseTooLarge);
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
