//! Durable storage: the only module that names sled, and the owner of the WAL.
//!
//! Two stores with two durability contracts:
//! - [`wal::Wal`] holds the Raft log and vote. A write is reported done only
//!   after `fdatasync`: this is what makes an acknowledged write survive a crash.
//! - [`StateDb`] (sled) holds the applied state machine. It is written in atomic
//!   batches but flushed lazily: after a crash it may be behind the log, and the
//!   log entries after its last applied id are applied again on restart. That is
//!   safe because apply is deterministic and the batch that records the applied
//!   log id is the batch that holds that entry's effects.
//!
//! Invariant that follows: the WAL must never drop (purge) an entry that the
//! state store may not hold durably. [`StateDb::sync`] forces the state store to
//! disk before a purge.
//!
//! Keys and values here are opaque bytes; the state machine chooses the layout.

pub mod wal;

use std::io;
use std::path::Path;

/// The persistent copy of the state machine.
#[derive(Clone)]
pub struct StateDb {
    db: sled::Db,
    tree: sled::Tree,
    dir: std::path::PathBuf,
}

/// One atomic change of the state store.
#[derive(Debug, Default)]
pub struct StateBatch {
    pub puts: Vec<(Vec<u8>, Vec<u8>)>,
    pub deletes: Vec<Vec<u8>>,
}

fn io_err(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl StateDb {
    pub fn open(dir: &Path) -> io::Result<StateDb> {
        let db = sled::Config::new().path(dir).flush_every_ms(Some(500)).open().map_err(io_err)?;
        let tree = db.open_tree("state").map_err(io_err)?;
        Ok(StateDb { db, tree, dir: dir.to_path_buf() })
    }

    /// Apply a batch atomically: after a crash either all of it is there or none.
    pub fn commit(&self, batch: StateBatch) -> io::Result<()> {
        let mut b = sled::Batch::default();
        for k in batch.deletes {
            b.remove(k);
        }
        for (k, v) in batch.puts {
            b.insert(k, v);
        }
        self.tree.apply_batch(b).map_err(io_err)
    }

    pub fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.tree.get(key).map_err(io_err)?.map(|v| v.to_vec()))
    }

    /// Every `(key, value)` under a prefix, in key order.
    pub fn scan_prefix(&self, prefix: &[u8]) -> impl Iterator<Item = io::Result<(Vec<u8>, Vec<u8>)>> + '_ {
        self.tree.scan_prefix(prefix).map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(io_err))
    }

    /// Replace the whole content (snapshot install). Not atomic across a crash;
    /// callers write a marker last and check it on open.
    pub fn replace_all(&self, batch: StateBatch) -> io::Result<()> {
        self.tree.clear().map_err(io_err)?;
        self.commit(batch)?;
        self.sync()
    }

    /// Push everything to disk: sled's flush, then a real fsync of its files
    /// (sled's own flush is not a durable sync).
    pub fn sync(&self) -> io::Result<()> {
        self.db.flush().map_err(io_err)?;
        fsync_tree(&self.dir)
    }

    /// Bytes sled uses on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// fsync every file below `dir`, then `dir` itself.
fn fsync_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            fsync_tree(&entry.path())?;
        } else {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}
