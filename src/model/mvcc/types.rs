//! Request and result types of the MVCC data model.
//!
//! These are raftlock's own types, not protobuf wire types: `Command` (in
//! `crate::model::command`) embeds the request types, so they are part of the replicated
//! log format and are encoded with serde/bincode. A field may only be added at the
//! end of a struct together with a new command version; never reorder fields.
//!
//! The API layer converts etcd's protobuf messages into these types and back;
//! where etcd's wire encoding has oddities (a compare whose target union does not
//! match its target reads as zero), the conversion reproduces them so that this
//! module only deals with plain values.

use std::sync::Arc;

use crate::base::limits::MAX_TXN_DEPTH;
use serde::{Deserialize, Serialize};

/// A main revision: one per write request that changes something. The store
/// starts at revision 1 (as etcd does), so the first write is revision 2.
pub type Revision = i64;

/// A key's value at one revision, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub version: i64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: i64,
}

/// The end of the prefix range `prefix..`: etcd's `GetPrefixRangeEnd`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Which keys a request names: one key, a half-open interval, or every key from
/// `key` on. Built from etcd's `(key, range_end)` pair by [`KeyRange::new`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyRange {
    Single(Vec<u8>),
    /// `[start, end)`; empty when `end <= start`.
    Interval(Vec<u8>, Vec<u8>),
    /// Every key `>= start` (etcd's `range_end == "\0"`).
    From(Vec<u8>),
}

impl KeyRange {
    /// etcd's rule: no range_end is a single key; range_end `"\0"` means every
    /// key from `key` on; anything else is the interval `[key, range_end)`.
    pub fn new(key: &[u8], range_end: &[u8]) -> KeyRange {
        if range_end.is_empty() {
            KeyRange::Single(key.to_vec())
        } else if range_end == [0] {
            KeyRange::From(key.to_vec())
        } else {
            KeyRange::Interval(key.to_vec(), range_end.to_vec())
        }
    }

    pub fn contains(&self, k: &[u8]) -> bool {
        match self {
            KeyRange::Single(key) => key.as_slice() == k,
            KeyRange::Interval(start, end) => start.as_slice() <= k && k < end.as_slice(),
            KeyRange::From(start) => start.as_slice() <= k,
        }
    }

    /// Every key that starts with `prefix` (etcd's `--prefix`).
    pub fn with_prefix(prefix: &[u8]) -> KeyRange {
        KeyRange::new(prefix, &prefix_end(prefix))
    }

    /// The bytes every key of this range starts with, when the range is
    /// exactly the keys that do (`[p, prefix_end(p))`: etcd's `--prefix`).
    /// Not for an end of `"\0"`: `prefix_end` of an empty or all-0xff `p`,
    /// where the interval is not those keys (`KeyRange::new` makes such a
    /// pair `From`).
    pub fn prefix(&self) -> Option<&[u8]> {
        match self {
            KeyRange::Interval(start, end) if *end != [0] && *end == prefix_end(start) => Some(start),
            _ => None,
        }
    }

    /// True when the two ranges share at least one key.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        fn bounds(r: &KeyRange) -> (&[u8], Option<Vec<u8>>) {
            match r {
                KeyRange::Single(k) => {
                    let mut next = k.clone();
                    next.push(0);
                    (k.as_slice(), Some(next))
                }
                KeyRange::Interval(s, e) => (s.as_slice(), Some(e.clone())),
                KeyRange::From(s) => (s.as_slice(), None),
            }
        }
        let (s1, e1) = bounds(self);
        let (s2, e2) = bounds(other);
        let s1_before_e2 = e2.as_deref().is_none_or(|e| s1 < e);
        let s2_before_e1 = e1.as_deref().is_none_or(|e| s2 < e);
        s1_before_e2 && s2_before_e1
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    pub limit: i64,
    pub revision: Revision,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: Revision,
    pub max_mod_revision: Revision,
    pub min_create_revision: Revision,
    pub max_create_revision: Revision,
}

impl RangeRequest {
    /// Whether it keeps only some of the keys it matches, by their mod or
    /// create revision.
    pub fn is_filtered(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }

    /// The most key-values it answers (`None`: no limit, etcd's 0).
    pub fn kv_limit(&self) -> Option<usize> {
        usize::try_from(self.limit).ok().filter(|l| *l > 0)
    }

    /// The order its answer is sorted in, as etcd reads the two fields:
    /// `None` for key order (the index's own: (key, ascending) and no order
    /// at all), `Ascend` for another target given no order.
    pub fn order(&self) -> SortOrder {
        match (self.sort_target, self.sort_order) {
            (SortTarget::Key, SortOrder::Ascend) => SortOrder::None,
            (t, SortOrder::None) if t != SortTarget::Key => SortOrder::Ascend,
            (_, o) => o,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    /// Keys in the range at the read revision, before limit and filters.
    pub count: i64,
    /// The header revision: the store's revision, not the one read at.
    pub revision: Revision,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutResult {
    pub revision: Revision,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRangeResult {
    pub revision: Revision,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version,
    Create,
    Mod,
    Value,
    Lease,
}

/// One txn guard. `number` carries the version/create/mod/lease operand and
/// `value` the value operand; the one that does not belong to `target` is zero.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    pub number: i64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(#[serde(deserialize_with = "nested_txn")] TxnRequest),
}

thread_local! {
    /// How deep the txn being decoded on this thread is nested.
    static TXN_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Decode a nested txn, counting the depth (see [`MAX_TXN_DEPTH`]).
fn nested_txn<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<TxnRequest, D::Error> {
    struct Level;
    impl Drop for Level {
        fn drop(&mut self) {
            TXN_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    let depth = TXN_DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    let _level = Level;
    if depth > MAX_TXN_DEPTH {
        return Err(serde::de::Error::custom(format!("txn nested deeper than {MAX_TXN_DEPTH}")));
    }
    TxnRequest::deserialize(deserializer)
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

impl PutRequest {
    /// What the put adds to the state's size at most (the space quota's
    /// measure: its version, see `MvccStore::size_bytes`).
    pub fn quota_cost(&self) -> u64 {
        self.key.len() as u64 + self.value.len() as u64 + super::VERSION_OVERHEAD
    }
}

impl TxnRequest {
    /// What the txn's puts add at most: the heavier branch's, at any depth
    /// (0 for a txn that puts nothing; deletions add tombstones, which the
    /// quota lets through, as etcd's does).
    pub fn quota_cost(&self) -> u64 {
        let branch = |ops: &[RequestOp]| -> u64 {
            ops.iter()
                .map(|op| match op {
                    RequestOp::Put(p) => p.quota_cost(),
                    RequestOp::Txn(t) => t.quota_cost(),
                    RequestOp::Range(_) | RequestOp::DeleteRange(_) => 0,
                })
                .sum()
        };
        branch(&self.success).max(branch(&self.failure))
    }

    /// Whether any branch, at any depth, answers key-values: a range that
    /// is not count-only, or a delete with `prev_kv`. A txn that does not
    /// has nothing to weigh against the response limit.
    pub fn answers_values(&self) -> bool {
        self.success.iter().chain(&self.failure).any(|op| match op {
            RequestOp::Range(r) => !r.count_only,
            RequestOp::DeleteRange(d) => d.prev_kv,
            RequestOp::Txn(t) => t.answers_values(),
            RequestOp::Put(_) => false,
        })
    }

    /// True when no branch, at any depth, writes.
    pub fn is_read_only(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| match op {
            RequestOp::Range(_) => true,
            RequestOp::Txn(t) => t.is_read_only(),
            RequestOp::Put(_) | RequestOp::DeleteRange(_) => false,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    Range(RangeResult),
    Put(PutResult),
    DeleteRange(DeleteRangeResult),
    Txn(TxnResult),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResult {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
    /// Header revision; 0 for a txn nested in another (as etcd fills it).
    pub revision: Revision,
}

/// Deterministic failures of a request: every replica reaches the same one, so
/// they are results of apply, never reasons to stop the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MvccError {
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("key not found")]
    KeyNotFound,
    #[error("requested lease not found")]
    LeaseNotFound,
    /// A grant named a lease ID that is in use.
    #[error("lease already exists")]
    LeaseExists,
    /// A NOSPACE alarm is raised (`crate::model::alarm`), or the write would take
    /// the state past the space quota.
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// A range (alone or in a txn) whose key-values would weigh more than
    /// [`MAX_RANGE_RESPONSE_BYTES`](super::MAX_RANGE_RESPONSE_BYTES).
    #[error("mvcc: range response is too large")]
    ResponseTooLarge,
    /// A command no proposer of this code makes (a batch inside a batch, a
    /// forwarded batch): only a hostile or broken peer can put one in the
    /// log. Apply answers it with this instead of running it, on every
    /// member alike.
    #[error("invalid command")]
    Malformed,
}

/// One change made by a write, in (main, sub) revision order: what the state
/// machine persists and what watchers see as an event.
///
/// The key-values are shared with the store's versions, not copied: the
/// watch sessions' inboxes keep recent apply calls for slow readers, and
/// with copies they held each written value twice more (value and previous
/// value) beside the store's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub revision: Revision,
    pub sub: i64,
    pub key: Vec<u8>,
    /// The new value, or `None` for a deletion (tombstone).
    pub kv: Option<Arc<KeyValue>>,
    /// The key's value just before this change, if it had one.
    pub prev: Option<Arc<KeyValue>>,
}
