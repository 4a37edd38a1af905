//! The Raft log store: openraft's `RaftLogStorage` over raftlock's WAL.
//!
//! Entries are kept in an in-memory map (replication and apply read from it) and
//! written to the WAL, which syncs before openraft is told they are durable.
//! The vote is written through the same WAL, so vote and log writes are durable
//! in the order they were made, as openraft requires.
//!
//! The committed index is not persisted (openraft's `save_committed` is
//! optional): it would cost a write per commit, and a restarted member learns
//! it from the leader within a heartbeat and then applies what it is missing.
//!
//! Invariants:
//! - the in-memory entries are contiguous and all above `last_purged`;
//! - a purge first makes the state store durable (`StateDb::sync`), since the
//!   state store may otherwise be behind the entries being dropped.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

use super::{decode, encode, Entry, LogId, TypeConfig};
use crate::storage::wal::{Wal, WalRecord};
use crate::storage::StateDb;

const META_VOTE: u8 = 1;
/// Meta key 2 is retired (it held the committed index, which raftlock no
/// longer persists: see the module doc).
const META_PURGED: u8 = 3;

#[derive(Default)]
struct LogCache {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote<u64>>,
}

/// The log store; clones share one log (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    /// std Mutex, not tokio's: it is never held across an `.await`.
    cache: Arc<Mutex<LogCache>>,
    wal: Wal,
    state_db: StateDb,
}

fn write_err(e: &io::Error) -> StorageError<u64> {
    StorageIOError::write_logs(e).into()
}

impl LogStore {
    /// Open the WAL in `dir` and load what it holds.
    pub fn open(dir: &std::path::Path, segment_bytes: u64, state_db: StateDb) -> anyhow::Result<LogStore> {
        let (wal, recovered) = Wal::open(dir, segment_bytes)?;
        let mut cache = LogCache::default();
        for (index, bytes) in recovered.entries {
            let entry: Entry = decode(&bytes).map_err(|e| anyhow::anyhow!("wal entry {index}: {e}"))?;
            assert_eq!(entry.log_id.index, index, "wal entry index mismatch");
            cache.entries.insert(index, entry);
        }
        let metas = &recovered.metas;
        if let Some(b) = metas.get(&META_VOTE) {
            cache.vote = Some(decode(b).map_err(anyhow::Error::msg)?);
        }
        if let Some(b) = metas.get(&META_PURGED) {
            cache.last_purged = decode(b).map_err(anyhow::Error::msg)?;
        }
        let indexes: Vec<u64> = cache.entries.keys().copied().collect();
        assert!(indexes.windows(2).all(|w| w[1] == w[0] + 1), "wal entries are not contiguous");
        Ok(LogStore { cache: Arc::new(Mutex::new(cache)), wal, state_db })
    }

    pub fn wal(&self) -> &Wal {
        &self.wal
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
        Ok(self.cache().entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let cache = self.cache();
        let last_log_id = cache.entries.values().next_back().map(|e| e.log_id).or(cache.last_purged);
        Ok(LogState { last_purged_log_id: cache.last_purged, last_log_id })
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
        let mut records = Vec::new();
        {
            let mut cache = self.cache();
            for entry in entries {
                let index = entry.log_id.index;
                if let Some((&last, _)) = cache.entries.iter().next_back() {
                    assert_eq!(index, last + 1, "log entries must be contiguous");
                }
                records.push(WalRecord::Entry { index, data: encode(&entry) });
                cache.entries.insert(index, entry);
            }
        }
        // Written and synced here: openraft waits for this append to be durable
        // before it goes on, so handing it to another thread would only add
        // latency (see storage::wal).
        callback.log_io_completed(self.wal.write(records, true));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        self.cache().entries.split_off(&log_id.index);
        self.wal.write(vec![WalRecord::TruncateFrom(log_id.index)], true).map_err(|e| write_err(&e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        // The state store must hold everything being dropped from the log.
        self.state_db.sync().map_err(|e| write_err(&e))?;
        {
            let mut cache = self.cache();
            assert!(cache.last_purged.is_none_or(|p| p.index <= log_id.index), "purge must move forward");
            cache.entries = cache.entries.split_off(&(log_id.index + 1));
            cache.last_purged = Some(log_id);
        }
        let records =
            vec![WalRecord::Meta { key: META_PURGED, data: encode(&Some(log_id)) }, WalRecord::PurgeUpto(log_id.index)];
        self.wal.write(records, true).map_err(|e| write_err(&e))
    }
}
