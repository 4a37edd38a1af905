//! Reading history back in bounded steps, and removing compacted history in
//! bounded steps: the two kinds of work on the store whose cost grows with
//! the number of keys rather than with the request.
//!
//! A [`HistoryScan`] collects every change to a key range at revisions
//! `from..=to`, a few thousand keys per step, so that the caller can release
//! the store's lock between steps (appliers and readers go on meanwhile). It
//! is bounded in memory too: once the changes collected weigh more than its
//! budget, it lowers `to` to the revision where the budget runs out, so one
//! scan returns a prefix of whole revisions and the caller scans again from
//! there. Writes between steps add versions above `to` only, which the scan
//! never takes; a compaction between steps past `from` fails the next step
//! with [`MvccError::Compacted`], as a read below the compaction revision does.
//!
//! Compaction is split the same way: [`MvccStore::compact`] only moves the
//! compaction revision, which is what every read and every member agrees on;
//! [`MvccStore::sweep`] then removes the versions no read can see any more,
//! a bounded number of keys per call. Until a sweep is done the store holds
//! versions nobody can read: everything that exports or hashes the store
//! skips them ([`visible_from`]), so what a member returns does not depend on
//! how far its own sweep has come.

use super::version::{newest_is_live, Version};
use super::{Change, KeyRange, MvccError, MvccStore, Revision};

/// A scan of history over a key range (see the module doc).
#[derive(Debug)]
pub struct HistoryScan {
    range: KeyRange,
    from: Revision,
    to: Revision,
    /// The key the next step starts at; `None` before the first step.
    resume: Option<Vec<u8>>,
    finished: bool,
    changes: Vec<Change>,
    /// What `changes` weigh (keys and values).
    bytes: usize,
    budget: usize,
}

impl HistoryScan {
    /// A scan of `range` at revisions `from..=to` that keeps about `budget`
    /// bytes of changes at most (but always at least one whole revision).
    pub fn new(range: KeyRange, from: Revision, to: Revision, budget: usize) -> HistoryScan {
        HistoryScan { range, from, to, resume: None, finished: false, changes: Vec::new(), bytes: 0, budget }
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The changes found, in revision order, and the revision they are
    /// complete up to (the `to` asked for, or lower when the budget ran out).
    pub fn into_changes(mut self) -> (Vec<Change>, Revision) {
        assert!(self.finished, "a scan is read only once it is finished");
        self.trim(self.budget);
        self.changes.sort_by_key(|c| (c.revision, c.sub));
        (self.changes, self.to)
    }

    /// Keep at most `limit` bytes of changes, cutting at a revision boundary:
    /// `to` moves down to the last revision kept.
    fn trim(&mut self, limit: usize) {
        if self.bytes <= limit {
            return;
        }
        self.changes.sort_by_key(|c| (c.revision, c.sub));
        let mut bytes = 0;
        let cut = self.changes.iter().position(|c| {
            bytes += change_bytes(c);
            bytes > limit
        });
        let Some(cut) = cut else { return };
        let over = self.changes[cut].revision;
        // One revision larger than the budget is still returned whole.
        let keep_to = if over == self.changes[0].revision { over } else { over - 1 };
        self.changes.retain(|c| c.revision <= keep_to);
        self.to = keep_to;
        self.bytes = self.changes.iter().map(change_bytes).sum();
    }
}

fn change_bytes(c: &Change) -> usize {
    let kv =
        |kv: &Option<std::sync::Arc<super::KeyValue>>| kv.as_ref().map_or(0, |kv| kv.key.len() + kv.value.len() + 48);
    c.key.len() + kv(&c.kv) + kv(&c.prev) + 16
}

/// The versions of a key's history that a read at the compaction revision or
/// later can see: all of them but the ones before the version visible at
/// `compact_revision` (and that one too when it is a tombstone).
pub(super) fn visible_from(versions: &[Version], compact_revision: Revision) -> usize {
    let visible = versions.partition_point(|v| v.revision <= compact_revision);
    if visible == 0 {
        return 0;
    }
    if versions[visible - 1].is_live() {
        visible - 1
    } else {
        visible
    }
}

impl MvccStore {
    /// One step of `scan`: at most `keys` more keys of its range.
    pub fn scan_history(&self, scan: &mut HistoryScan, keys: usize) -> Result<(), MvccError> {
        if scan.from < self.compact_revision {
            return Err(MvccError::Compacted);
        }
        if scan.finished {
            return Ok(());
        }
        let (from, mut to) = (scan.from, scan.to);
        let mut next = None;
        let (range, resume) = (scan.range.clone(), scan.resume.take());
        for (seen, (key, versions)) in self.histories_from(&range, resume.as_deref()).enumerate() {
            if seen == keys {
                next = Some(key.clone());
                break;
            }
            let start = versions.partition_point(|v| v.revision < from);
            for i in start..versions.len() {
                let v = &versions[i];
                if v.revision > to {
                    break;
                }
                let prev = if i > 0 { self.load(key, &versions[i - 1]) } else { None };
                let change = Change { revision: v.revision, sub: v.sub, key: key.clone(), kv: self.load(key, v), prev };
                scan.bytes += change_bytes(&change);
                scan.changes.push(change);
            }
            // Sorting and cutting costs a pass: only once the budget is
            // exceeded twice over, back down to the budget.
            if scan.bytes > scan.budget.saturating_mul(2) {
                scan.trim(scan.budget);
                to = scan.to;
            }
        }
        match next {
            Some(key) => scan.resume = Some(key),
            None => scan.finished = true,
        }
        Ok(())
    }

    /// The histories of the keys of `range` from `resume` on (all of them
    /// when `None`), in key order.
    pub(super) fn histories_from<'a>(
        &'a self,
        range: &'a KeyRange,
        resume: Option<&'a [u8]>,
    ) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a Vec<Version>)> + 'a> {
        let Some(resume) = resume else { return self.histories(range) };
        let end = match range {
            // A single key is scanned in one step: there is nothing to resume.
            KeyRange::Single(_) => return Box::new(std::iter::empty()),
            KeyRange::Interval(_, end) => std::ops::Bound::Excluded(end.as_slice()),
            KeyRange::From(_) => std::ops::Bound::Unbounded,
        };
        let start = std::ops::Bound::Included(resume);
        if let std::ops::Bound::Excluded(end) = end {
            if resume >= end {
                return Box::new(std::iter::empty());
            }
        }
        Box::new(self.index.range::<[u8], _>((start, end)))
    }

    /// Remove, from at most `keys` keys, the versions the last compaction
    /// left unreadable. Returns whether more keys remain to sweep.
    pub fn sweep(&mut self, keys: usize) -> bool {
        let Some(resume) = self.sweep_resume.take() else { return false };
        let compact_revision = self.compact_revision;
        let mut bytes = self.bytes;
        let mut emptied = Vec::new();
        let mut next = None;
        let from = (std::ops::Bound::Included(resume.as_slice()), std::ops::Bound::Unbounded);
        for (seen, (key, versions)) in self.index.range_mut::<[u8], _>(from).enumerate() {
            if seen == keys {
                next = Some(key.clone());
                break;
            }
            let keep_from = visible_from(versions, compact_revision);
            let was_live = newest_is_live(versions);
            for v in versions.drain(..keep_from) {
                bytes -= super::version_bytes(key, v.value_len());
            }
            // Only a tombstone goes as a key's newest version (a live one
            // is visible at the compaction revision, or after it).
            debug_assert!(!was_live || newest_is_live(versions), "a sweep removed a live key");
            if versions.is_empty() {
                emptied.push(key.clone());
            }
        }
        for key in &emptied {
            self.index.remove(key);
        }
        self.forget_swept_queues(&emptied);
        self.bytes = bytes;
        self.sweep_resume = next;
        self.sweep_resume.is_some()
    }

    /// Whether versions made unreadable by a compaction are still held.
    pub fn sweep_pending(&self) -> bool {
        self.sweep_resume.is_some()
    }
}
