//! Durable storage: the only module that names sled, and the owner of the WAL.
//!
//! Two stores with two durability contracts:
//! - [`wal::Wal`] holds the Raft log and vote, made durable with `fdatasync`
//!   (in the writing thread, or for the leader's own appends by a flusher
//!   thread, with [`wal::Durable`] telling when): this is what makes an
//!   acknowledged write survive a crash.
//! - [`StateStore`] (sled) holds the applied state machine. Batches are handed to a
//!   writer thread that merges every batch waiting into one atomic sled write
//!   (a batch, or a transaction over both trees when it holds a deferred
//!   value), in order; sled flushes lazily. After a crash the store may therefore be
//!   behind the log, at a batch boundary, and the log entries after its last
//!   applied id are applied again on restart. That is safe because apply is
//!   deterministic and each batch carries the applied id of its own effects.
//!
//! Invariant that follows: the WAL must never drop (purge) an entry that the
//! state store may not hold durably. [`StateStore::sync`] waits for the writer and
//! forces the state store to disk; purges call it first.
//!
//! Caveat: a sled write error on the writer thread cannot be handed back to the
//! apply that caused it; the process aborts, and restarts from the log.
//!
//! Keys and values here are opaque bytes; the state machine chooses the layout.
//! Values computed on the writer thread ([`StateBatch::deferred`], the large
//! ones: checkpoints) live in a tree of their own. sled rewrites a whole leaf
//! node when it consolidates one, and a leaf holding a checkpoint next to
//! keys written on every apply had its checkpoint rewritten over and over.

pub mod wal;

use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

/// The persistent copy of the state machine. Clones share one store.
#[derive(Clone)]
pub struct StateStore {
    db: sled::Db,
    tree: sled::Tree,
    /// The deferred (large) values.
    large: sled::Tree,
    dir: std::path::PathBuf,
    queue: Arc<StateQueue>,
}

/// Batches waiting for the writer thread. A queue under a mutex rather than a
/// channel: the writer is woken at most once per window (or by a barrier), not
/// once per batch, which keeps thread wake-ups off the apply path.
#[derive(Default)]
struct StateQueue {
    /// std Mutex: held only to push or take, never across I/O.
    pending: Mutex<Pending>,
    wake: Condvar,
}

#[derive(Default)]
struct Pending {
    batches: Vec<StateBatch>,
    /// Each is answered once every batch queued before it is in sled.
    barriers: Vec<std::sync::mpsc::Sender<()>>,
    /// The writer is waiting for work and must be woken.
    writer_idle: bool,
}

/// One atomic change of the state store.
#[derive(Default)]
pub struct StateBatch {
    pub puts: Vec<(Vec<u8>, Vec<u8>)>,
    pub deletes: Vec<Vec<u8>>,
    /// Puts whose value the writer thread computes (after `puts`): costly
    /// encodings that must not hold up the caller. They are kept apart from
    /// the other keys (see the module doc); a key is always written one way.
    pub deferred: Vec<(Vec<u8>, DeferredValue)>,
}

/// A value computed on the writer thread.
pub type DeferredValue = Box<dyn FnOnce() -> Vec<u8> + Send>;

fn io_err(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl StateStore {
    pub fn open(dir: &Path) -> io::Result<StateStore> {
        // sled caches up to 1 GiB of pages by default; the state store is
        // written, and read only at start (restore), so a small cache does:
        // the pages the journal writes would otherwise stay in memory.
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(Some(500))
            .cache_capacity(STATE_CACHE_BYTES)
            .open()
            .map_err(io_err)?;
        let tree = db.open_tree("state").map_err(io_err)?;
        let large = db.open_tree("large").map_err(io_err)?;
        let queue = Arc::new(StateQueue::default());
        let (writer_trees, writer_queue) = ((tree.clone(), large.clone()), queue.clone());
        std::thread::Builder::new()
            .name("raftlock-state".into())
            .spawn(move || write_loop(writer_trees, writer_queue))?;
        Ok(StateStore { db, tree, large, dir: dir.to_path_buf(), queue })
    }

    /// Queue a batch. Batches reach sled in order, each atomically (possibly
    /// merged with the ones around it): after a crash the store is at the end
    /// of some batch.
    pub fn commit(&self, batch: StateBatch) {
        let mut pending = self.queue.pending.lock().expect("state queue lock poisoned");
        pending.batches.push(batch);
        if pending.writer_idle {
            pending.writer_idle = false;
            self.queue.wake.notify_one();
        }
    }

    /// Wait until every batch queued so far is in sled.
    fn drain(&self) -> io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let mut pending = self.queue.pending.lock().expect("state queue lock poisoned");
            pending.barriers.push(tx);
            pending.writer_idle = false;
            self.queue.wake.notify_one();
        }
        rx.recv().map_err(|_| io::Error::other("state store writer stopped"))
    }

    /// A key's value, written either way. (A deferred value in the main tree
    /// was written by a raftlock that kept them there; the next deferred write
    /// of the key moves it.)
    pub fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        match self.tree.get(key).map_err(io_err)? {
            Some(v) => Ok(Some(v.to_vec())),
            None => Ok(self.large.get(key).map_err(io_err)?.map(|v| v.to_vec())),
        }
    }

    /// Every `(key, value)` under a prefix, in key order.
    pub fn scan_prefix(&self, prefix: &[u8]) -> impl Iterator<Item = io::Result<(Vec<u8>, Vec<u8>)>> + '_ {
        self.tree.scan_prefix(prefix).map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(io_err))
    }

    /// Replace the whole content with `batch` (snapshot install), atomically:
    /// after a crash the store holds the old content or the new, and it is
    /// durable when this returns.
    pub fn replace_all(&self, batch: StateBatch) -> io::Result<()> {
        self.drain()?;
        let keys = |tree: &sled::Tree| tree.iter().keys().collect::<Result<Vec<_>, _>>().map_err(io_err);
        let old = StateBatch { deletes: keys(&self.tree)?.iter().map(|k| k.to_vec()).collect(), ..Default::default() };
        let old_large = keys(&self.large)?;
        let (main, large_values) = split(vec![old, batch]);
        write_both(&self.tree, &self.large, &main, &old_large, &large_values)
            .map_err(|e| io::Error::other(format!("replacing the state store: {e}")))?;
        self.sync()
    }

    /// Push everything to disk: sled's flush, then a real fsync of its files
    /// (sled's own flush is not a durable sync).
    pub fn sync(&self) -> io::Result<()> {
        self.drain()?;
        self.db.flush().map_err(io_err)?;
        fsync_tree(&self.dir)
    }

    /// Bytes sled uses on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// sled's page cache for the state store (see `StateStore::open`).
const STATE_CACHE_BYTES: u64 = 64 << 20;

/// How long the writer gathers batches before it writes them to sled. Nothing
/// waits on the state store (the WAL already holds every entry), and each sled
/// batch costs disk writes, so fewer, larger batches are better; a barrier
/// (sync, snapshot install) ends the window at once.
const STATE_WRITE_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

/// The writer thread (it lives as long as the process): every window, merge all queued batches into one sled
/// batch (later writes to a key replace earlier ones, as applying them in turn
/// would) and apply it; answer barriers at once.
fn write_loop((tree, large): (sled::Tree, sled::Tree), queue: Arc<StateQueue>) {
    loop {
        let (batches, barriers) = {
            let mut pending = queue.pending.lock().expect("state queue lock poisoned");
            while pending.batches.is_empty() && pending.barriers.is_empty() {
                pending.writer_idle = true;
                pending = queue.wake.wait(pending).expect("state queue lock poisoned");
            }
            if pending.barriers.is_empty() {
                // Let the window fill; commits meanwhile do not wake us.
                drop(pending);
                std::thread::sleep(STATE_WRITE_WINDOW);
                pending = queue.pending.lock().expect("state queue lock poisoned");
            }
            (std::mem::take(&mut pending.batches), std::mem::take(&mut pending.barriers))
        };
        let (merged, large_values) = split(batches);
        let written = crate::metrics::timed(&crate::metrics::metrics().backend_commit, || {
            if large_values.is_empty() {
                tree.apply_batch(merged).map_err(|e| e.to_string())
            } else {
                write_both(&tree, &large, &merged, &[], &large_values)
            }
        });
        if let Err(e) = written {
            // sled fails every write after one has failed: only a restart
            // (which replays the log) can go on. After a full disk, the next
            // start waits for space (`server::disk`).
            tracing::error!(error = %e, "state store write failed; aborting so that the log is replayed");
            std::process::abort();
        }
        for reply in barriers {
            let _ = reply.send(());
        }
    }
}

/// Merge `batches`, in order, into one batch for the main tree (later writes
/// to a key replace earlier ones, as applying them in turn would) and the
/// deferred values, computed here, for the tree of large values.
fn split(batches: Vec<StateBatch>) -> (sled::Batch, Vec<(Vec<u8>, sled::IVec)>) {
    let mut merged = sled::Batch::default();
    let mut large_values = Vec::new();
    for batch in batches {
        for k in batch.deletes {
            merged.remove(k);
        }
        for (k, v) in batch.puts {
            merged.insert(k, v);
        }
        for (k, value) in batch.deferred {
            // A key is written one way; this also moves a value that an
            // earlier raftlock kept in the main tree.
            merged.remove(k.as_slice());
            large_values.push((k, sled::IVec::from(value())));
        }
    }
    (merged, large_values)
}

/// Write to both trees in one sled transaction: after a crash, all or none.
fn write_both(
    tree: &sled::Tree,
    large: &sled::Tree,
    main: &sled::Batch,
    large_removes: &[sled::IVec],
    large_values: &[(Vec<u8>, sled::IVec)],
) -> Result<(), String> {
    use sled::Transactional;
    (tree, large)
        .transaction(|(tree, large)| {
            tree.apply_batch(main)?;
            for k in large_removes {
                large.remove(k)?;
            }
            for (k, v) in large_values {
                large.insert(k.as_slice(), v.clone())?;
            }
            Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
        })
        .map_err(|e| format!("{e:?}"))
}

/// fsync every file below `dir`, then `dir` itself.
fn fsync_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let synced = match entry.file_type()?.is_dir() {
            true => fsync_tree(&entry.path()),
            false => std::fs::File::open(entry.path()).and_then(|f| f.sync_all()),
        };
        match synced {
            // sled replaces its own files meanwhile (its snapshots): a file
            // gone since the listing has nothing left to sync.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    std::fs::File::open(dir)?.sync_all()
}
