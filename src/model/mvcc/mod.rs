//! The revisioned key-value store: etcd's MVCC semantics as a pure data model.
//!
//! Every write request that changes something gets the next *main revision*; the
//! changes inside it are numbered by *sub revision* (0, 1, …). Each key keeps its
//! history as a list of versions, oldest first:
//!
//! ```text
//!   key "a":  (2,0) put v1  ->  (5,0) put v2  ->  (7,1) tombstone  ->  (9,0) put v1'
//!             create=2 ver=1    create=2 ver=2                        create=9 ver=1
//!   read "a" at revision 6 -> v2 (the last version with main <= 6)
//!   read "a" at revision 8 -> nothing (the last version is a tombstone)
//! ```
//!
//! A tombstone ends a key's *generation*: the next put starts again at version 1
//! with a new create_revision. History stays until [`MvccStore::compact`], which
//! keeps for each key only what a read at the compaction revision or later can
//! still see; reads below the compaction revision fail with
//! [`MvccError::Compacted`], reads above the current one with
//! [`MvccError::FutureRevision`].
//!
//! Invariants (asserted where they are established):
//! - a key's versions are strictly increasing in (main, sub);
//! - a live version's key-value carries its key (captures rely on it);
//! - no key has an empty version list and none starts with a tombstone;
//! - `compact_revision <= revision`.
//!
//! One addition to etcd's semantics: a write that ends a lock grant which
//! asked for a lock-delay also puts that lock's delay marker, in the same
//! revision (`crate::model::lock_delay`).
//!
//! This module is deterministic: no clocks, no randomness, and no I/O but
//! the spill's, which changes where a value is and never what is answered.
//! The state machine drives it in log order and persists the [`Change`]s it
//! returns; on restart the store is rebuilt from them with
//! [`MvccStore::restore`].
//!
//! The index of every version (until compaction) lives in memory, as etcd's
//! does. Each key's newest value is kept there too; once a store has a
//! [`Spill`] ([`MvccStore::spill_into`]), the value of every version a newer
//! one replaced moves to it, out of memory, and is read back from it by
//! reads of history. The spill is a cache of the state (see `spill`): what
//! the store answers does not depend on where a value is.
//!
//! Caveat: a restore decodes a whole checkpoint into memory before its
//! history is spilled, so a member's peak memory at start is the state's size.

mod history;
mod queues;
mod range;
pub mod spill;
mod txn;
pub mod types;
mod version;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::base::limits::MAX_RANGE_RESPONSE_BYTES;
use history::visible_from;
pub use history::HistoryScan;
pub use range::RangeScan;
pub use spill::Spill;
use spill::Spilled;
pub use txn::LeaseView;
pub use types::*;
use version::{newest_is_live, push_onto, spill_version, visible_at, with_history, Held, Version};

/// The MVCC store. Not internally synchronized: the state machine owns it behind
/// a lock and applies writes one at a time.
#[derive(Debug)]
pub struct MvccStore {
    index: BTreeMap<Vec<u8>, Vec<Version>>,
    /// The latest main revision; 1 in an empty store.
    revision: Revision,
    /// The last compaction revision; -1 before the first compaction.
    compact_revision: Revision,
    /// What the versions weigh ([`version_bytes`]): the size the space
    /// quota counts. It falls only as compacted versions are swept, so two
    /// members may count differently for a moment after a compaction.
    bytes: u64,
    /// Where the sweep of compacted versions resumes; `None` when every
    /// version held is readable at the compaction revision or later.
    sweep_resume: Option<Vec<u8>>,
    /// [`MAX_RANGE_RESPONSE_BYTES`]; smaller in tests.
    response_limit: usize,
    /// Where superseded values go; `None`: they stay in memory.
    spill: Option<Spill>,
    /// The keys whose newest version is live ([`MvccStore::live_keys`]):
    /// counted once when a store is restored, then kept as versions are
    /// pushed, so that reading it walks nothing.
    live: usize,
    /// Lock queues' keys by create revision (see `queues`).
    queues: queues::QueueIndex,
}

/// What one version is counted as beyond its key and value: the memory it
/// holds in the index (its entry, its shared key-value, the key's copy in the
/// key-value) and in the state store's journal, roughly.
pub const VERSION_OVERHEAD: u64 = 128;

/// The size one version is counted as (see [`MvccStore::size_bytes`]),
/// from its key and its value's length (`None`: a tombstone).
fn version_bytes(key: &[u8], value_len: Option<usize>) -> u64 {
    key.len() as u64 + value_len.unwrap_or(0) as u64 + VERSION_OVERHEAD
}

impl Default for MvccStore {
    fn default() -> Self {
        MvccStore {
            index: BTreeMap::new(),
            revision: 1,
            compact_revision: -1,
            bytes: 0,
            sweep_resume: None,
            response_limit: MAX_RANGE_RESPONSE_BYTES,
            spill: None,
            live: 0,
            queues: Default::default(),
        }
    }
}

/// A persisted record of the store: one version of one key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredVersion {
    pub revision: Revision,
    pub sub: i64,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub kv: Option<KeyValue>,
}

/// One version of one key that shares its key-value with the store, so that
/// the whole store can be captured without copying it (checkpoints and
/// snapshots capture it on the apply path), and a write's changes recorded
/// in the journal without copying their keys and values. It encodes exactly
/// as the [`StoredVersion`] it stands for.
#[derive(Debug)]
pub struct SharedVersion {
    revision: Revision,
    sub: i64,
    value: SharedValue,
}

#[derive(Debug)]
enum SharedValue {
    /// A live version: its key-value (which carries the key).
    Live(Arc<KeyValue>),
    /// A live version in the spill, on file: read as it is written out.
    Spilled(Vec<u8>, Spilled),
    /// A tombstone of this key.
    Tombstone(Vec<u8>),
}

impl SharedVersion {
    /// The version a change made, sharing its key-value.
    pub fn of_change(change: &Change) -> SharedVersion {
        let value = match &change.kv {
            Some(kv) => SharedValue::Live(kv.clone()),
            None => SharedValue::Tombstone(change.key.clone()),
        };
        SharedVersion { revision: change.revision, sub: change.sub, value }
    }
}

impl serde::Serialize for SharedVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let loaded;
        let (key, kv) = match &self.value {
            SharedValue::Live(kv) => (&kv.key, Some(&**kv)),
            SharedValue::Spilled(key, spilled) => {
                loaded = spilled.load(key);
                (key, Some(&loaded))
            }
            SharedValue::Tombstone(key) => (key, None),
        };
        // The fields of StoredVersion, in its order.
        let mut s = serializer.serialize_struct("StoredVersion", 4)?;
        s.serialize_field("revision", &self.revision)?;
        s.serialize_field("sub", &self.sub)?;
        s.serialize_field("key", serde_bytes::Bytes::new(key))?;
        s.serialize_field("kv", &kv)?;
        s.end()
    }
}

impl MvccStore {
    pub fn revision(&self) -> Revision {
        self.revision
    }

    #[cfg(test)]
    fn with_response_limit(self, response_limit: usize) -> MvccStore {
        MvccStore { response_limit, ..self }
    }

    pub fn compact_revision(&self) -> Revision {
        self.compact_revision
    }

    /// What the history weighs: the sum, over every version kept, of its key,
    /// its value and [`VERSION_OVERHEAD`]. Deterministic (a function of the
    /// history), so every member counts the same.
    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of keys with a live value at the current revision (a gauge
    /// read on every metrics scrape, under the store's lock: kept as a
    /// count, not walked over every key).
    pub fn live_keys(&self) -> usize {
        self.live
    }

    /// [`MvccStore::live_keys`] the long way round.
    fn count_live_keys(&self) -> usize {
        self.index.values().filter(|v| newest_is_live(v)).count()
    }

    /// From now on, keep the values of superseded versions in `spill`; those
    /// already superseded move there now.
    pub fn spill_into(&mut self, spill: Spill) {
        self.spill = Some(spill);
        let spill = self.spill.as_mut().expect("just set");
        for (key, versions) in self.index.iter_mut() {
            let newest = versions.len() - 1;
            for v in &mut versions[..newest] {
                spill_version(spill, key, v);
            }
        }
    }

    /// The spill this store keeps superseded values in, if any.
    pub fn spill(&self) -> Option<&Spill> {
        self.spill.as_ref()
    }

    /// A version's key-value, wherever it is; `None` for a tombstone.
    fn load(&self, key: &[u8], v: &Version) -> Option<Arc<KeyValue>> {
        match &v.held {
            Held::Tombstone => None,
            Held::Memory(kv) => Some(kv.clone()),
            Held::Spilled(s) => {
                Some(Arc::new(self.spill.as_ref().expect("a spilled version has a spill").read(key, s)))
            }
        }
    }

    /// Rebuild a store from persisted versions (any order) and its two counters.
    pub fn restore(
        versions: impl IntoIterator<Item = StoredVersion>,
        revision: Revision,
        compact_revision: Revision,
    ) -> MvccStore {
        let mut store = MvccStore {
            index: BTreeMap::new(),
            revision,
            compact_revision,
            bytes: 0,
            sweep_resume: None,
            response_limit: MAX_RANGE_RESPONSE_BYTES,
            spill: None,
            live: 0,
            queues: Default::default(),
        };
        for v in versions {
            assert!(v.kv.as_ref().is_none_or(|kv| kv.key == v.key), "a version's key-value carries its key");
            store.bytes += version_bytes(&v.key, v.kv.as_ref().map(|kv| kv.value.len()));
            store.index.entry(v.key).or_default().push(Version {
                revision: v.revision,
                sub: v.sub,
                held: v.kv.map_or(Held::Tombstone, |kv| Held::Memory(Arc::new(kv))),
            });
        }
        for versions in store.index.values_mut() {
            versions.sort_by_key(|v| (v.revision, v.sub));
            assert!(versions.windows(2).all(|w| (w[0].revision, w[0].sub) < (w[1].revision, w[1].sub)));
        }
        store.live = store.count_live_keys();
        assert!(compact_revision <= revision, "compact revision {compact_revision} above revision {revision}");
        store
    }

    /// Re-apply one persisted version on top of the store, in the order it was
    /// first made (journal replay after a restart). Moves the revision with it.
    pub fn replay(&mut self, v: StoredVersion) {
        self.push_version(&v.key, v.revision, v.sub, v.kv.map(Arc::new));
        self.revision = self.revision.max(v.revision);
    }

    /// After a journal replay: set the revision the store had reached. It may be
    /// above every surviving version, when compaction removed the newest ones.
    pub fn set_revision(&mut self, revision: Revision) {
        assert!(revision >= self.revision, "the revision never goes back");
        self.revision = revision;
    }

    /// The changes to keys in `range` at revisions `from..=to`, in revision
    /// order, with the previous value of each key where history still has it:
    /// what a watcher that fell behind reads to catch up.
    pub fn changes_between(&self, range: &KeyRange, from: Revision, to: Revision) -> Result<Vec<Change>, MvccError> {
        let mut scan = HistoryScan::new(range.clone(), from, to, usize::MAX);
        self.scan_history(&mut scan, usize::MAX)?;
        Ok(scan.into_changes().0)
    }

    /// Every live key that is attached to a lease, with its lease.
    pub fn leased_keys(&self) -> Vec<(Vec<u8>, i64)> {
        self.index
            .iter()
            .filter_map(|(k, versions)| {
                self.load(k, versions.last()?).filter(|kv| kv.lease != 0).map(|kv| (k.clone(), kv.lease))
            })
            .collect()
    }

    /// The live key-values whose key `keep` accepts: a walk of every key's
    /// name (the lock-delay keeper's look for markers, at start and after a
    /// snapshot replaced the store).
    pub fn live_where(&self, keep: impl Fn(&[u8]) -> bool) -> Vec<Arc<KeyValue>> {
        self.index.iter().filter(|(k, _)| keep(k)).filter_map(|(k, versions)| self.load(k, versions.last()?)).collect()
    }

    /// Every key's readable history (see [`history::visible_from`]): what
    /// is exported or hashed, whatever the sweep has removed so far.
    fn readable(&self) -> impl Iterator<Item = (&Vec<u8>, &[Version])> + '_ {
        let compact_revision = self.compact_revision;
        self.index.iter().filter_map(move |(key, versions)| {
            let versions = &versions[visible_from(versions, compact_revision)..];
            (!versions.is_empty()).then_some((key, versions))
        })
    }

    /// Every readable version, key by key: the content of a snapshot.
    pub fn versions(&self) -> impl Iterator<Item = StoredVersion> + '_ {
        self.readable().flat_map(move |(key, versions)| {
            versions.iter().map(move |v| StoredVersion {
                revision: v.revision,
                sub: v.sub,
                key: key.clone(),
                kv: self.load(key, v).as_deref().cloned(),
            })
        })
    }

    /// Every version, as [`MvccStore::versions`], sharing the key-values:
    /// those in memory by reference, those in the spill by their place in
    /// it (read when the capture is written; a record still in the spill's
    /// write buffer is copied now).
    pub fn shared_versions(&self) -> impl Iterator<Item = SharedVersion> + '_ {
        self.readable().flat_map(move |(key, versions)| {
            versions.iter().map(move |v| SharedVersion {
                revision: v.revision,
                sub: v.sub,
                value: match &v.held {
                    Held::Memory(kv) => SharedValue::Live(kv.clone()),
                    Held::Spilled(s) if self.spill.as_ref().is_some_and(|spill| spill.flushed(s)) => {
                        SharedValue::Spilled(key.clone(), s.clone())
                    }
                    Held::Spilled(_) => SharedValue::Live(self.load(key, v).expect("a spilled version is live")),
                    Held::Tombstone => SharedValue::Tombstone(key.clone()),
                },
            })
        })
    }

    /// A checksum of every version up to `revision` (0: the current one)
    /// that the store still holds, and the compaction revision: equal on
    /// every member that applied the same log up to there (etcd's HashKV).
    /// CRC-32 over each version's revision, sub revision, key and key-value,
    /// in key order then version order; raftlock's own encoding, so it
    /// compares raftlock members, not raftlock with etcd.
    pub fn hash_kv(&self, revision: Revision) -> Result<(u32, Revision), MvccError> {
        if revision > self.revision {
            return Err(MvccError::FutureRevision);
        }
        let upto = if revision <= 0 { self.revision } else { revision };
        if upto < self.compact_revision {
            return Err(MvccError::Compacted);
        }
        let mut hash = crc32fast::Hasher::new();
        for (key, versions) in self.readable() {
            for v in versions.iter().take_while(|v| v.revision <= upto) {
                hash.update(&v.revision.to_be_bytes());
                hash.update(&v.sub.to_be_bytes());
                hash.update(&(key.len() as u64).to_be_bytes());
                hash.update(key);
                match self.load(key, v) {
                    None => hash.update(&[0]),
                    Some(kv) => {
                        hash.update(&[1]);
                        for n in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
                            hash.update(&n.to_be_bytes());
                        }
                        hash.update(&(kv.value.len() as u64).to_be_bytes());
                        hash.update(&kv.value);
                    }
                }
            }
        }
        Ok((hash.finalize(), self.compact_revision))
    }

    /// A read at the store's current revision (or `req.revision`), in one
    /// step. Fails with [`MvccError::ResponseTooLarge`] past the response
    /// limit. A reader that may meet a large range reads it in steps
    /// instead ([`RangeScan`]), releasing the store between them.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResult, MvccError> {
        let mut scan = RangeScan::new(self, req.clone())?;
        self.range_step(&mut scan, usize::MAX)?;
        scan.finish()
    }

    /// A read as seen by a write in progress whose view is at `current`
    /// (the store's revision, or one more once the write has changed something).
    /// A range in a txn is not bounded here (a txn must not fail halfway):
    /// `check_path` weighed the whole txn before it started
    /// ([`MvccStore::range_weight_bound`]).
    fn range_at(&self, req: &RangeRequest, current: Revision) -> Result<RangeResult, MvccError> {
        let mut scan = RangeScan::at(self, req.clone(), current, None)?;
        self.range_step(&mut scan, usize::MAX)?;
        scan.finish()
    }

    /// An upper bound on what the key-values of `req` weigh in its response
    /// ([`response_weight`]), judged on the store as it is now; `None` once
    /// it passes `budget` (the scan stops there). Exact for a plain range in
    /// key order (its first `limit` live keys); for a sorted or filtered one
    /// it is the weight of the `limit` heaviest live keys it matches (all of
    /// them without a limit), which no choice among them can exceed. Reads
    /// only the index: no value is loaded.
    pub(super) fn range_weight_bound(&self, req: &RangeRequest, budget: usize) -> Option<usize> {
        if req.count_only {
            return Some(0);
        }
        let rev = if req.revision <= 0 { self.revision } else { req.revision };
        if let Some(weight) = self.weigh_from_queue_index(req, rev, budget) {
            return weight;
        }
        let range = KeyRange::new(&req.key, &req.range_end);
        let in_key_order = req.order() == SortOrder::None;
        let filtered = req.is_filtered();
        let limit = req.kv_limit();
        let weights = self.histories(&range).filter_map(|(key, versions)| {
            let value_len = visible_at(versions, rev).and_then(Version::value_len)?;
            Some(response_weight(req, key, value_len))
        });
        match limit {
            Some(limit) if !in_key_order || filtered => {
                // The heaviest `limit` seen so far; their sum only grows.
                let mut heaviest = std::collections::BinaryHeap::new();
                let mut sum = 0usize;
                for w in weights {
                    heaviest.push(std::cmp::Reverse(w));
                    sum += w;
                    if heaviest.len() > limit {
                        sum -= heaviest.pop().expect("more than limit").0;
                    }
                    if sum > budget {
                        return None;
                    }
                }
                Some(sum)
            }
            _ => {
                let mut sum = 0usize;
                for w in weights.take(limit.unwrap_or(usize::MAX)) {
                    sum += w;
                    if sum > budget {
                        return None;
                    }
                }
                Some(sum)
            }
        }
    }

    /// Calls `f` for every key in `range` that has a live value at `rev`, in key order.
    fn visit_live(&self, range: &KeyRange, rev: Revision, mut f: impl FnMut(Arc<KeyValue>)) {
        for (key, versions) in self.histories(range) {
            if let Some(kv) = visible_at(versions, rev).and_then(|v| self.load(key, v)) {
                f(kv)
            }
        }
    }

    /// The history of every key in `range`, in key order.
    fn histories<'a>(&'a self, range: &'a KeyRange) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a Vec<Version>)> + 'a> {
        match range {
            KeyRange::Single(key) => Box::new(self.index.get_key_value(key).into_iter()),
            KeyRange::Interval(start, end) if start < end => {
                let bounds = (Bound::Included(start.as_slice()), Bound::Excluded(end.as_slice()));
                Box::new(self.index.range::<[u8], _>(bounds))
            }
            KeyRange::Interval(..) => Box::new(std::iter::empty()),
            KeyRange::From(start) => {
                Box::new(self.index.range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded)))
            }
        }
    }

    /// The live value of one key at the current revision (always in memory:
    /// only superseded versions are spilled).
    fn get_live(&self, key: &[u8]) -> Option<&Arc<KeyValue>> {
        match &self.index.get(key)?.last()?.held {
            Held::Memory(kv) => Some(kv),
            Held::Tombstone => None,
            Held::Spilled(_) => unreachable!("a key's newest version is never spilled"),
        }
    }

    /// Record a new version of `key` at `(revision, sub)`; the one it
    /// supersedes moves to the spill.
    fn push_version(&mut self, key: &[u8], revision: Revision, sub: i64, kv: Option<Arc<KeyValue>>) {
        assert!(kv.as_ref().is_none_or(|kv| kv.key == key), "a version's key-value carries its key");
        let created = kv.as_ref().map(|kv| kv.create_revision);
        let held = kv.map_or(Held::Tombstone, Held::Memory);
        let (spill, bytes, live, queues) = (&mut self.spill, &mut self.bytes, &mut self.live, &mut self.queues);
        with_history(&mut self.index, key, |versions| {
            let ended = versions.last().and_then(|v| v.live_kv()).map(|kv| kv.create_revision);
            push_onto(versions, spill, bytes, key, Version { revision, sub, held });
            match (ended, created) {
                (None, Some(create)) => {
                    *live += 1;
                    queues.record(key, create, true);
                }
                (Some(create), None) => {
                    *live -= 1;
                    queues.record(key, create, false);
                }
                _ => {}
            }
        });
    }

    /// Record a new live version of `key` at `(revision, sub)`, built by
    /// `build` from the live version it supersedes (if any), with one search
    /// of the index when the key exists (a put's usual case). Returns the
    /// new version and the one it supersedes.
    fn push_live_version(
        &mut self,
        key: &[u8],
        revision: Revision,
        sub: i64,
        build: impl FnOnce(Option<&KeyValue>) -> KeyValue,
    ) -> (Arc<KeyValue>, Option<Arc<KeyValue>>) {
        let (spill, bytes, live, queues) = (&mut self.spill, &mut self.bytes, &mut self.live, &mut self.queues);
        with_history(&mut self.index, key, |versions| {
            let prev = versions.last().and_then(|v| match &v.held {
                Held::Memory(kv) => Some(kv.clone()),
                Held::Tombstone => None,
                Held::Spilled(_) => unreachable!("a key's newest version is never spilled"),
            });
            let kv = Arc::new(build(prev.as_deref()));
            assert!(kv.key == key, "a version's key-value carries its key");
            let version = Version { revision, sub, held: Held::Memory(kv.clone()) };
            if prev.is_none() {
                *live += 1;
                queues.record(key, kv.create_revision, true);
            }
            push_onto(versions, spill, bytes, key, version);
            (kv, prev)
        })
    }

    /// Compact at `rev`: reads below it fail from now on, and the history
    /// no read at `rev` or later can see is removed by [`MvccStore::sweep`]
    /// steps (`sweep(usize::MAX)` removes it at once).
    pub fn compact(&mut self, rev: Revision) -> Result<(), MvccError> {
        if rev <= self.compact_revision {
            return Err(MvccError::Compacted);
        }
        if rev > self.revision {
            return Err(MvccError::FutureRevision);
        }
        self.compact_revision = rev;
        // Keys already swept for an earlier compaction need it again.
        self.sweep_resume = Some(Vec::new());
        Ok(())
    }
}

/// What one key-value weighs in the response to `req` (see
/// [`MAX_RANGE_RESPONSE_BYTES`]).
fn response_weight(req: &RangeRequest, key: &[u8], value_len: usize) -> usize {
    key.len() + if req.keys_only { 0 } else { value_len } + 64
}

#[cfg(test)]
mod tests;
