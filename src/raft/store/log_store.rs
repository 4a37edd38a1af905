//! The Raft log store: openraft's `RaftLogStorage` over raftlock's WAL.
//!
//! Entries are written to the WAL, and the newest of them (about
//! [`HOT_LOG_BYTES`]) are also kept decoded in memory, where replication and
//! apply find them; an older entry is read back from the WAL when asked for
//! (a follower far behind, apply far behind). What the log holds in memory
//! while it serves is so bounded whatever its length (at start, the WAL's
//! replay still reads all of it once); how much log the WAL keeps is the
//! snapshot policy's business (`raft::store::log_bound`). An entry becomes readable only once it is
//! written, so nothing reads (and replicates) an entry that a failed write
//! did not keep.
//! The vote is written through the same WAL, so vote and log writes are
//! durable in the order they were made, as openraft requires.
//!
//! ## When an append counts as done
//! A follower's append, a vote, a truncation and a purge are synced before
//! openraft is told they are done: a follower's acknowledgement counts
//! towards a quorum, and nothing may be acknowledged before it is durable.
//!
//! The leader's own appends (recognised by the stored vote: committed, and
//! ours) are reported done once written, and synced by the WAL's flusher
//! thread meanwhile. openraft 0.9 waits for an append to be done before it
//! sends the entries to followers, so the leader's disk write would otherwise
//! come in series with theirs; this way the two overlap (the Raft thesis,
//! 10.2.1). The price is that openraft counts the leader's copy towards a
//! quorum before it is synced, so an entry can be *committed* in the leader's
//! memory with fewer than a quorum of durable copies. No one may act on such
//! an entry, and no one does, because everything that exposes a committed
//! entry waits for the leader's sync ([`crate::storage::wal::Durable`]):
//! - the leader applies an entry (and so answers its client, serves it to
//!   readers and watchers) only once it is durable here;
//! - followers learn that an entry is committed only from AppendEntries, and
//!   the leader sends none whose commit index is not durable here.
//!
//! So an entry is applied anywhere only once it is durable on the leader and
//! on enough followers for a quorum: losing an un-synced tail in an OS crash
//! of the leader loses only entries that no one has seen, the same as losing
//! an entry that was never replicated. Two more things keep it so:
//! - a member that led when it stopped does not resume in the same term
//!   (openraft 0.9 would): its lost tail may be on followers, and a new
//!   entry at a lost index would carry the same log id as theirs;
//! - membership changes wait for the previous configuration to be applied
//!   (`raft::cluster::membership`), since openraft only checks that it is committed.
//!
//! The committed index is not persisted (openraft's `save_committed` is
//! optional): it would cost a write per commit, and a restarted member learns
//! it from the leader within a heartbeat and then applies what it is missing.
//!
//! Invariants:
//! - the entries held are contiguous and all above `last_purged`;
//! - the entries kept in memory are a suffix of the entries held;
//! - an entry's place in the WAL is taken under the log's lock and read after
//!   it; a purge may remove the segment meanwhile, and such a read then
//!   fails as NotFound, which readers take as the entry having been purged;
//! - a purge first makes the state store durable (`StateStore::sync`), since the
//!   state store may otherwise be behind the entries being dropped.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use tokio::sync::watch;

use crate::base::codec::{decode, encode};
use crate::base::limits::HOT_LOG_BYTES;
use crate::raft::types::{Entry, LogId, TypeConfig};
use crate::storage::wal::{Durable, EntryAt, Wal, WalRecord};
use crate::storage::StateStore;

const META_VOTE: u8 = 1;
/// Meta key 2 is retired (it held the committed index, which raftlock no
/// longer persists: see the module doc).
const META_PURGED: u8 = 3;

/// Why [`LogStore::entries_after`] cannot continue from where it was asked to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogMoved {
    #[error("the vote changed: this member no longer leads in that term")]
    VoteChanged,
    #[error("the log no longer holds that entry: it was truncated or replaced")]
    Diverged,
    #[error("the log is purged past that entry: the follower needs a snapshot")]
    Purged,
    #[error("an entry could not be read back from the WAL")]
    Unreadable,
}

/// What the log knows of an entry it holds.
#[derive(Clone, Copy)]
struct Held {
    log_id: LogId,
    /// Its encoded size (what the log holds in bytes, see
    /// [`LogStore::bytes_between`]).
    size: u64,
    /// A running total: the sizes of the entries held up to and including
    /// this one, counted from an arbitrary start (only differences are
    /// used). What a range of entries holds is the difference of two of
    /// these, found without a walk over the range (see [`LogCache::bytes_in`]).
    through: u64,
    at: EntryAt,
}

impl Held {
    /// The running sum just before this entry.
    fn before(&self) -> u64 {
        self.through - self.size
    }
}

struct LogCache {
    /// Every entry the log holds.
    held: BTreeMap<u64, Held>,
    /// The newest entries, decoded: a suffix of `held` holding at most
    /// `hot_limit` bytes, but for its last entry.
    hot: BTreeMap<u64, Entry>,
    hot_bytes: u64,
    hot_limit: u64,
    last_purged: Option<LogId>,
    vote: Option<Vote<u64>>,
}

impl LogCache {
    fn new() -> LogCache {
        LogCache {
            held: BTreeMap::new(),
            hot: BTreeMap::new(),
            hot_bytes: 0,
            hot_limit: HOT_LOG_BYTES,
            last_purged: None,
            vote: None,
        }
    }

    /// Hold `entry`, written at `at`, after every entry held.
    fn push(&mut self, entry: Entry, size: u64, at: EntryAt) {
        let index = entry.log_id.index;
        let through = self.held.values().next_back().map_or(0, |last| last.through) + size;
        self.held.insert(index, Held { log_id: entry.log_id, size, through, at });
        self.hot.insert(index, entry);
        self.hot_bytes += size;
        self.evict();
    }

    /// Drop the oldest entries kept in memory beyond `hot_limit`.
    fn evict(&mut self) {
        while self.hot_bytes > self.hot_limit && self.hot.len() > 1 {
            let (oldest, _) = self.hot.pop_first().expect("more than one hot entry");
            self.hot_bytes -= self.held[&oldest].size;
        }
    }

    /// Drop the entries at `index` and above.
    fn truncate(&mut self, index: u64) {
        let dropped = self.hot.split_off(&index);
        self.hot_bytes -= dropped.keys().map(|i| self.held[i].size).sum::<u64>();
        self.held.split_off(&index);
    }

    /// Drop the entries at `index` and below.
    fn purge(&mut self, index: u64) {
        let kept = self.hot.split_off(&(index + 1));
        let dropped = std::mem::replace(&mut self.hot, kept);
        self.hot_bytes -= dropped.keys().map(|i| self.held[i].size).sum::<u64>();
        self.held = self.held.split_off(&(index + 1));
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.held.values().next_back().map(|h| h.log_id).or(self.last_purged)
    }

    /// The encoded bytes of the entries held with index in `from..=upto`:
    /// two lookups, however many entries lie between (the snapshot policy
    /// asks twice a second, under the log's lock, and a log of small
    /// entries holds hundreds of thousands).
    fn bytes_in(&self, from: u64, upto: u64) -> u64 {
        if from > upto {
            return 0;
        }
        let mut range = self.held.range(from..=upto);
        let Some((_, first)) = range.next() else { return 0 };
        let last = range.next_back().map_or(first, |(_, last)| last);
        last.through - first.before()
    }

    /// See [`LogStore::keep_at_most`]. The entries held are contiguous and
    /// their running sums grow with their index, so the answer is found by
    /// bisection.
    fn keep_at_most(&self, upto: u64, bytes: u64) -> u64 {
        let Some((&first, _)) = self.held.first_key_value() else { return upto };
        let nothing_to_drop = first.saturating_sub(1);
        let Some((&last, last_held)) = self.held.range(..=upto).next_back() else { return nothing_to_drop };
        // The bytes of the entries from `i` through `last`.
        let from = |i: u64| last_held.through - self.held.get(&i).expect("the entries held are contiguous").before();
        if from(first) <= bytes {
            return nothing_to_drop;
        }
        if last_held.size > bytes {
            return last;
        }
        // Throughout: from(lo) > bytes >= from(hi).
        let (mut lo, mut hi) = (first, last);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if from(mid) > bytes {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The log store; clones share one log (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    /// std Mutex, not tokio's: it is never held across an `.await`.
    cache: Arc<Mutex<LogCache>>,
    /// The index of the last entry in the log, published after every change
    /// (replication pipelines follow it: `raft::peer::pipeline`).
    last_index: Arc<watch::Sender<Option<u64>>>,
    wal: Wal,
    state_store: StateStore,
    /// This member's id: whose vote makes an append the leader's own.
    id: u64,
}

fn write_err(e: &io::Error) -> StorageError<u64> {
    StorageIOError::write_logs(e).into()
}

impl LogStore {
    /// Keep at most `bytes` of the newest entries decoded in memory (but the
    /// last one); [`HOT_LOG_BYTES`] unless told.
    pub fn keeping_in_memory(self, bytes: u64) -> LogStore {
        {
            let mut cache = self.cache();
            cache.hot_limit = bytes;
            cache.evict();
        }
        self
    }

    /// Open the WAL in `dir` and load what it holds.
    pub fn open(
        dir: &std::path::Path,
        segment_bytes: u64,
        state_store: StateStore,
        id: u64,
    ) -> anyhow::Result<LogStore> {
        let (wal, recovered) = Wal::open(dir, segment_bytes)?;
        let mut cache = LogCache::new();
        for (index, bytes) in recovered.entries {
            let entry: Entry = decode(&bytes).map_err(|e| anyhow::anyhow!("wal entry {index}: {e}"))?;
            assert_eq!(entry.log_id.index, index, "wal entry index mismatch");
            cache.push(entry, bytes.len() as u64, recovered.places[&index]);
        }
        let metas = &recovered.metas;
        if let Some(b) = metas.get(&META_VOTE) {
            let mut vote: Vote<u64> = decode(b).map_err(anyhow::Error::msg)?;
            if vote.committed && vote.leader_id.node_id == id {
                // We led when we stopped. openraft would lead again in the
                // same term, but an OS crash may have lost the tail of our
                // own appends, which followers hold: an entry proposed anew
                // at a lost index would carry the same log id as theirs and
                // pass for it. Led no more, we must win a new term, and the
                // followers' longer log wins it (see the module doc).
                vote.committed = false;
                wal.write(vec![WalRecord::Meta { key: META_VOTE, data: encode(&vote) }], true)?;
            }
            cache.vote = Some(vote);
        }
        if let Some(b) = metas.get(&META_PURGED) {
            cache.last_purged = decode(b).map_err(anyhow::Error::msg)?;
        }
        let indexes: Vec<u64> = cache.held.keys().copied().collect();
        assert!(indexes.windows(2).all(|w| w[1] == w[0] + 1), "wal entries are not contiguous");
        let (last_index, _) = watch::channel(indexes.last().copied());
        Ok(LogStore { cache: Arc::new(Mutex::new(cache)), last_index: Arc::new(last_index), wal, state_store, id })
    }

    /// How far the log is durable (see the module doc).
    pub fn durable(&self) -> Durable {
        self.wal.durable()
    }

    /// Up to `max` entries and (but for the first) `max_bytes` of encoded
    /// entries after `prev`, for a leader that replicates under
    /// `vote` — provided the log still is that leader's: the stored vote is
    /// `vote`, and the log holds `prev` (it was not truncated or replaced
    /// since, nor purged past it). Checked under the lock that appends,
    /// truncations and purges take, so the answer is one consistent view.
    pub fn entries_after(
        &self,
        vote: &Vote<u64>,
        prev: Option<LogId>,
        max: usize,
        max_bytes: u64,
    ) -> Result<Vec<Entry>, LogMoved> {
        let cache = self.cache();
        if cache.vote.as_ref() != Some(vote) {
            return Err(LogMoved::VoteChanged);
        }
        let from = match prev {
            None if cache.last_purged.is_some() => return Err(LogMoved::Purged),
            None => 0,
            Some(p) => {
                match cache.held.get(&p.index) {
                    Some(h) if h.log_id == p => {}
                    Some(_) => return Err(LogMoved::Diverged),
                    None if cache.last_purged == Some(p) => {}
                    None if cache.last_purged.is_some_and(|l| p.index <= l.index) => return Err(LogMoved::Purged),
                    None => return Err(LogMoved::Diverged),
                }
                p.index + 1
            }
        };
        let slots = Self::slots(&cache, within(cache.held.range(from..).take(max), max_bytes));
        drop(cache);
        let mut entries = Vec::with_capacity(slots.len());
        for slot in slots {
            match self.fill(slot) {
                Ok(entry) => entries.push(entry),
                // Purged meanwhile: its segment is gone (see `fill`).
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(LogMoved::Purged),
                Err(e) => {
                    tracing::error!(error = %e, "reading the log back from the WAL");
                    return Err(LogMoved::Unreadable);
                }
            }
        }
        Ok(entries)
    }

    /// Entries held in `range`, at most `max_bytes` of them but for the
    /// first, read as openraft reads (an entry purged meanwhile is left out
    /// with those before it: a purge removes a prefix).
    fn read_range(&self, range: impl RangeBounds<u64>, max_bytes: u64) -> io::Result<Vec<Entry>> {
        let slots = {
            let cache = self.cache();
            Self::slots(&cache, within(cache.held.range(range), max_bytes))
        };
        let mut entries = Vec::with_capacity(slots.len());
        for slot in slots {
            match self.fill(slot) {
                Ok(entry) => entries.push(entry),
                Err(e) if e.kind() == io::ErrorKind::NotFound => entries.clear(),
                Err(e) => {
                    tracing::error!(error = %e, "reading the log back from the WAL");
                    return Err(e);
                }
            }
        }
        Ok(entries)
    }

    /// What the log holds of `wanted` (indexes it holds, in order): the
    /// entries kept in memory, and where the others are in the WAL. A copy
    /// of a batch entry shares its commands with the one kept here
    /// (`Command::Batch`), so each reader's copy costs a reference count.
    fn slots(cache: &LogCache, wanted: Vec<(u64, Held)>) -> Vec<Result<Entry, (u64, Held)>> {
        wanted.into_iter().map(|(index, held)| cache.hot.get(&index).cloned().ok_or((index, held))).collect()
    }

    /// The entry of a slot: kept in memory, or read back from the WAL. Read
    /// without the log's lock, so that appends never wait for the disk: a
    /// purge meanwhile may remove the entry's segment, and the read then
    /// fails with NotFound (a truncation removes no segment; its entries
    /// still read back, as they would have been read a moment earlier).
    fn fill(&self, slot: Result<Entry, (u64, Held)>) -> io::Result<Entry> {
        let (index, held) = match slot {
            Ok(entry) => return Ok(entry),
            Err(cold) => cold,
        };
        let bytes = self.wal.read_entry(index, held.at)?;
        let entry: Entry = decode(&bytes).map_err(|e| io::Error::other(format!("wal entry {index}: {e}")))?;
        if entry.log_id != held.log_id {
            return Err(io::Error::other(format!("wal entry {index} reads back as {}", entry.log_id)));
        }
        Ok(entry)
    }

    /// The encoded bytes of the entries held with index in `(after, upto]`.
    pub fn bytes_between(&self, after: Option<u64>, upto: u64) -> u64 {
        self.cache().bytes_in(after.map_or(0, |a| a + 1), upto)
    }

    /// The lowest index `p` such that the entries in `(p, upto]` hold at
    /// most `bytes` (`p = upto` when the entry at `upto` alone holds more).
    pub fn keep_at_most(&self, upto: u64, bytes: u64) -> u64 {
        self.cache().keep_at_most(upto, bytes)
    }

    /// The id of the log's last entry, or of the last one purged when the
    /// log holds none: how far this member's log goes, as a vote judges it.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.cache().last_log_id()
    }

    /// Follow the index of the log's last entry (`None`: the log holds no entry).
    pub fn last_index(&self) -> watch::Receiver<Option<u64>> {
        self.last_index.subscribe()
    }

    /// Publish the log's last index after a change.
    fn publish_last_index(&self, cache: &LogCache) {
        let last = cache.held.keys().next_back().copied();
        self.last_index.send_if_modified(|l| std::mem::replace(l, last) != last);
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, LogCache> {
        self.cache.lock().expect("log cache lock poisoned")
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        self.read_range(range, u64::MAX).map_err(|e| StorageIOError::read_logs(&e).into())
    }

    /// openraft's own replication (when raftlock's pipe is not serving a
    /// follower) reads at most as many bytes as a pipe request carries:
    /// entries read back from the WAL for a follower far behind are not
    /// all decoded into memory at once.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError<u64>> {
        self.read_range(start..end, crate::base::limits::MAX_APPEND_BYTES)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

/// The entries of `held` (in index order) that fit in `max_bytes`, but for
/// the first, which always does. Each entry's encoded size was noted when it
/// was written: no walk over its commands on every request.
fn within<'a>(held: impl Iterator<Item = (&'a u64, &'a Held)>, max_bytes: u64) -> Vec<(u64, Held)> {
    let mut bytes = 0u64;
    held.take_while(|(_, h)| {
        let first = bytes == 0;
        bytes = bytes.saturating_add(h.size.max(1));
        first || bytes <= max_bytes
    })
    .map(|(index, h)| (*index, *h))
    .collect()
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let cache = self.cache();
        Ok(LogState { last_purged_log_id: cache.last_purged, last_log_id: cache.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.cache().vote = Some(*vote);
        self.wal
            .write(vec![WalRecord::Meta { key: META_VOTE, data: encode(vote) }], true)
            .map_err(|e| StorageError::from(StorageIOError::write_vote(&e)))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.cache().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let own = {
            let cache = self.cache();
            let mut next = cache.held.keys().next_back().map(|last| last + 1);
            for entry in &entries {
                assert!(next.is_none_or(|n| n == entry.log_id.index), "log entries must be contiguous");
                next = Some(entry.log_id.index + 1);
            }
            // Only the leader of the stored vote appends entries under it; a
            // follower stores its leader's vote before it appends for it.
            cache.vote.is_some_and(|v| v.committed && v.leader_id.node_id == self.id)
        };
        let records: Vec<WalRecord> =
            entries.iter().map(|e| WalRecord::Entry { index: e.log_id.index, data: encode(e) }).collect();
        let sizes: Vec<u64> = records
            .iter()
            .filter_map(|r| match r {
                WalRecord::Entry { data, .. } => Some(data.len() as u64),
                _ => None,
            })
            .collect();
        let written = if own {
            // The leader's own entries: done once written (see the module doc).
            self.wal.write_deferred(records)
        } else {
            self.wal.write_placed(records, true)
        };
        let written = written.map(|placed| {
            // Readers (replication included) see an entry only once it is written.
            let mut cache = self.cache();
            for ((entry, size), (_, at)) in entries.into_iter().zip(sizes).zip(placed) {
                cache.push(entry, size, at);
            }
            self.publish_last_index(&cache);
        });
        callback.log_io_completed(written);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        {
            let mut cache = self.cache();
            cache.truncate(log_id.index);
            self.publish_last_index(&cache);
        }
        self.wal.write(vec![WalRecord::TruncateFrom(log_id.index)], true).map_err(|e| write_err(&e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        // The state store must hold everything being dropped from the log.
        self.state_store.sync().map_err(|e| write_err(&e))?;
        {
            let mut cache = self.cache();
            assert!(cache.last_purged.is_none_or(|p| p.index <= log_id.index), "purge must move forward");
            cache.purge(log_id.index);
            cache.last_purged = Some(log_id);
            self.publish_last_index(&cache);
        }
        let records =
            vec![WalRecord::Meta { key: META_PURGED, data: encode(&Some(log_id)) }, WalRecord::PurgeUpto(log_id.index)];
        self.wal.write(records, true).map_err(|e| write_err(&e))?;
        tracing::info!(upto = log_id.index, "purged the log");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::LeaderId;

    use super::*;

    #[tokio::test]
    async fn a_member_that_led_does_not_lead_the_same_term_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let db = StateStore::open(&dir.path().join("state"), &dir.path().join("images")).unwrap();
        let wal_dir = dir.path().join("wal");
        {
            let mut store = LogStore::open(&wal_dir, 1 << 20, db.clone(), 7).unwrap();
            store.save_vote(&Vote::new_committed(3, 7)).await.unwrap();
        }
        let mut store = LogStore::open(&wal_dir, 1 << 20, db.clone(), 7).unwrap();
        let vote = store.read_vote().await.unwrap().unwrap();
        assert_eq!(vote.leader_id, LeaderId::new(3, 7), "the vote itself is kept");
        assert!(!vote.committed, "no longer the leader of term 3");
        drop(store);

        // A follower's vote is kept as it was.
        let mut store = LogStore::open(&wal_dir, 1 << 20, db.clone(), 8).unwrap();
        store.save_vote(&Vote::new_committed(4, 9)).await.unwrap();
        drop(store);
        let mut store = LogStore::open(&wal_dir, 1 << 20, db, 8).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new_committed(4, 9)));
    }

    fn log_id(term: u64, leader: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, leader), index)
    }

    /// Puts blank entries into the log as an append does: written to the
    /// WAL, then held (each counted as 10 bytes).
    fn put_entries(store: &LogStore, ids: impl IntoIterator<Item = LogId>) {
        let entries: Vec<Entry> =
            ids.into_iter().map(|log_id| Entry { log_id, payload: openraft::EntryPayload::Blank }).collect();
        let records = entries.iter().map(|e| WalRecord::Entry { index: e.log_id.index, data: encode(e) }).collect();
        let placed = store.wal.write_placed(records, true).unwrap();
        let mut cache = store.cache();
        for (entry, (_, at)) in entries.into_iter().zip(placed) {
            cache.push(entry, 10, at);
        }
        store.publish_last_index(&cache);
    }

    /// The byte sums the snapshot policy asks for, against a walk over the
    /// entries, as entries of different sizes are appended, truncated and
    /// purged.
    #[tokio::test]
    async fn byte_sums_over_the_log_match_a_walk_through_appends_truncations_and_purges() {
        let dir = tempfile::tempdir().unwrap();
        let db = StateStore::open(&dir.path().join("state"), &dir.path().join("images")).unwrap();
        let store = LogStore::open(&dir.path().join("wal"), 1 << 20, db, 1).unwrap();
        let append = |from: u64, to: u64, term: u64| {
            let entries: Vec<Entry> = (from..=to)
                .map(|i| Entry { log_id: log_id(term, 1, i), payload: openraft::EntryPayload::Blank })
                .collect();
            let records = entries.iter().map(|e| WalRecord::Entry { index: e.log_id.index, data: encode(e) }).collect();
            let placed = store.wal.write_placed(records, true).unwrap();
            let mut cache = store.cache();
            for (entry, (_, at)) in entries.into_iter().zip(placed) {
                let size = 1 + (entry.log_id.index * 7 + term) % 13;
                cache.push(entry, size, at);
            }
        };
        let check = |store: &LogStore| {
            let sizes: BTreeMap<u64, u64> = store.cache().held.iter().map(|(&i, h)| (i, h.size)).collect();
            let (lo, hi) = (
                sizes.keys().next().map_or(0, |&f| f.saturating_sub(2)),
                sizes.keys().next_back().map_or(3, |&l| l + 2),
            );
            for after in std::iter::once(None).chain((lo..=hi).map(Some)) {
                for upto in lo..=hi {
                    let from = after.map_or(0, |a| a + 1);
                    let walked: u64 = sizes.iter().filter(|(&i, _)| from <= i && i <= upto).map(|(_, s)| s).sum();
                    assert_eq!(store.bytes_between(after, upto), walked, "({after:?}, {upto}]");
                }
            }
            for upto in lo..=hi {
                for bytes in [0, 1, 5, 13, 20, 40, 100, 1000] {
                    let mut held = 0;
                    let mut walked = sizes.keys().next().map_or(upto, |f| f.saturating_sub(1));
                    for (&i, s) in sizes.range(..=upto).rev() {
                        held += s;
                        if held > bytes {
                            walked = i;
                            break;
                        }
                    }
                    assert_eq!(store.keep_at_most(upto, bytes), walked, "keep {bytes} bytes up to {upto}");
                }
            }
        };
        enum Step {
            Append { from: u64, to: u64, term: u64 },
            Truncate(u64),
            Purge(u64),
        }
        check(&store);
        for step in [
            Step::Append { from: 1, to: 30, term: 1 },
            Step::Truncate(18),
            Step::Append { from: 18, to: 40, term: 2 },
            Step::Purge(25),
            Step::Append { from: 41, to: 45, term: 2 },
            Step::Purge(45),
            Step::Append { from: 46, to: 50, term: 3 },
        ] {
            match step {
                Step::Append { from, to, term } => append(from, to, term),
                Step::Truncate(index) => store.cache().truncate(index),
                Step::Purge(index) => store.cache().purge(index),
            }
            check(&store);
        }
    }

    fn indexes(read: Result<Vec<Entry>, LogMoved>) -> Result<Vec<u64>, LogMoved> {
        read.map(|entries| entries.iter().map(|e| e.log_id.index).collect())
    }

    /// Only the newest entries stay in memory; older ones are read back
    /// from the WAL, by replication and by openraft alike, until purged.
    #[tokio::test]
    async fn entries_beyond_the_memory_bound_are_read_back_from_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let db = StateStore::open(&dir.path().join("state"), &dir.path().join("images")).unwrap();
        // Small segments, so that a purge removes some.
        let mut store = LogStore::open(&dir.path().join("wal"), 4096, db.clone(), 1).unwrap();
        let ours = Vote::new_committed(2, 1);
        store.save_vote(&ours).await.unwrap();
        store.cache().hot_limit = 30;
        put_entries(&store, (1..=100).map(|i| log_id(2, 1, i)));
        {
            let cache = store.cache();
            assert_eq!(cache.hot.keys().copied().collect::<Vec<_>>(), vec![98, 99, 100], "30 bytes: three entries");
            assert_eq!(cache.hot_bytes, 30);
        }
        let all: Vec<u64> = (1..=100).collect();
        assert_eq!(indexes(store.entries_after(&ours, None, 1000, u64::MAX)), Ok(all.clone()));
        let read = store.try_get_log_entries(1..=100).await.unwrap();
        let limited = store.limited_get_log_entries(1, 101).await.unwrap();
        assert_eq!(limited.len(), 100, "all fit in a request's bytes");
        assert_eq!(
            read.iter().map(|e| e.log_id).collect::<Vec<_>>(),
            all.iter().map(|&i| log_id(2, 1, i)).collect::<Vec<_>>()
        );
        // A restart holds the same entries, the newest in memory.
        drop(store);
        let mut store = LogStore::open(&dir.path().join("wal"), 4096, db, 1).unwrap();
        assert_eq!(store.cache().hot.len(), 100, "the default bound holds them all");
        store.cache().hot_limit = 0;
        put_entries(&store, [log_id(2, 1, 101)]);
        assert_eq!(store.cache().hot.keys().copied().collect::<Vec<_>>(), vec![101], "the last entry always stays");
        // Truncated and purged entries are gone, memory and disk alike.
        store.truncate(log_id(2, 1, 90)).await.unwrap();
        store.purge(log_id(2, 1, 60)).await.unwrap();
        assert_eq!(store.cache().hot_bytes, 0);
        let read = store.try_get_log_entries(0..).await.unwrap();
        assert_eq!(read.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), (61..=89).collect::<Vec<_>>());
        // (A member that led does not lead the same term after a restart.)
        let again = Vote::new_committed(3, 1);
        store.save_vote(&again).await.unwrap();
        assert_eq!(
            indexes(store.entries_after(&again, Some(log_id(2, 1, 70)), 5, u64::MAX)),
            Ok(vec![71, 72, 73, 74, 75])
        );
    }

    #[tokio::test]
    async fn a_deposed_leader_reads_nothing_more_to_replicate() {
        let dir = tempfile::tempdir().unwrap();
        let db = StateStore::open(&dir.path().join("state"), &dir.path().join("images")).unwrap();
        let mut store = LogStore::open(&dir.path().join("wal"), 1 << 20, db, 1).unwrap();
        let ours = Vote::new_committed(2, 1);
        store.save_vote(&ours).await.unwrap();
        put_entries(&store, (1..=5).map(|i| log_id(2, 1, i)));
        assert_eq!(indexes(store.entries_after(&ours, None, 64, u64::MAX)), Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(indexes(store.entries_after(&ours, Some(log_id(2, 1, 3)), 1, u64::MAX)), Ok(vec![4]));
        // What the log holds in bytes (each entry here: 10), and where to
        // purge to keep at most some bytes behind an index.
        assert_eq!(store.bytes_between(None, 5), 50);
        assert_eq!(store.bytes_between(Some(2), 4), 20);
        assert_eq!(store.keep_at_most(5, 25), 3, "entries 4 and 5 fit in 25 bytes");
        assert_eq!(store.keep_at_most(5, 100), 0, "everything fits: nothing to purge");
        // A byte bound (each entry here: 10 bytes) stops a request early,
        // but the first entry always travels.
        assert_eq!(indexes(store.entries_after(&ours, None, 64, 20)), Ok(vec![1, 2]));
        assert_eq!(indexes(store.entries_after(&ours, None, 64, 0)), Ok(vec![1]));
        assert_eq!(indexes(store.entries_after(&ours, Some(log_id(2, 1, 5)), 64, u64::MAX)), Ok(vec![]));

        // Member 2 wins term 3: the vote is stored before its entries replace ours.
        let theirs = Vote::new_committed(3, 2);
        store.save_vote(&theirs).await.unwrap();
        assert_eq!(
            indexes(store.entries_after(&ours, Some(log_id(2, 1, 3)), 64, u64::MAX)),
            Err(LogMoved::VoteChanged)
        );
        store.truncate(log_id(2, 1, 4)).await.unwrap();
        put_entries(&store, [log_id(3, 2, 4), log_id(3, 2, 5)]);
        assert_eq!(
            indexes(store.entries_after(&ours, Some(log_id(2, 1, 3)), 64, u64::MAX)),
            Err(LogMoved::VoteChanged)
        );

        // Under the stored vote, a read continues only from an entry still held.
        assert_eq!(indexes(store.entries_after(&theirs, Some(log_id(2, 1, 4)), 64, u64::MAX)), Err(LogMoved::Diverged));
        assert_eq!(indexes(store.entries_after(&theirs, Some(log_id(3, 2, 9)), 64, u64::MAX)), Err(LogMoved::Diverged));
        assert_eq!(indexes(store.entries_after(&theirs, Some(log_id(2, 1, 3)), 64, u64::MAX)), Ok(vec![4, 5]));

        store.purge(log_id(2, 1, 3)).await.unwrap();
        assert_eq!(indexes(store.entries_after(&theirs, None, 64, u64::MAX)), Err(LogMoved::Purged));
        assert_eq!(indexes(store.entries_after(&theirs, Some(log_id(2, 1, 2)), 64, u64::MAX)), Err(LogMoved::Purged));
        assert_eq!(indexes(store.entries_after(&theirs, Some(log_id(2, 1, 3)), 64, u64::MAX)), Ok(vec![4, 5]));
    }
}
