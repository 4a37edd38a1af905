//! Durable storage: the only module that names sled, and the owner of the WAL.
//!
//! Two stores with two durability contracts:
//! - [`wal::Wal`] holds the Raft log and vote, made durable with `fdatasync`
//!   (in the writing thread, or for the leader's own appends by a flusher
//!   thread, with [`wal::Durable`] telling when): this is what makes an
//!   acknowledged write survive a crash.
//! - [`StateStore`] (sled) holds the applied state machine. Batches are handed to a
//!   writer thread that merges every batch waiting into one atomic sled write
//!   (after writing their files, see below), in order; sled flushes lazily. After a crash the store may therefore be
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
//!
//! ## The journal beside sled
//! A batch may carry a journal frame ([`StateBatch::journal`]): the writer
//! appends it to a journal file in the file directory, unsynced, and
//! [`StateStore::sync`] makes the journal files durable before sled. The
//! frames are the state machine's record of each apply call; sled, which kept
//! them as values before, held them in memory far past its page cache. A
//! journal file ends at a whole frame after a crash, or in a torn one that
//! [`read_journal`] cuts off.
//!
//! ## Files beside sled
//! Whole-state encodings (checkpoints) are not sled values but files in a
//! directory of their own, written on the writer thread and streamed there
//! ([`StateBatch::files`]): as a sled value, one was encoded whole into memory
//! first (a buffer as large as the state) and then held in sled's cache, and
//! sled rewrote it whenever it consolidated its leaf. A batch's files are
//! durable (written, synced, renamed into place) before any of its keys is
//! in sled, so a key that names a file never outlives it; files a batch
//! retires are removed only once that batch is durable in sled. Stores
//! written by an older raftlock kept such values in a second sled tree
//! (`large`); they are read by the state machine's migration
//! ([`StateStore::legacy_large_value`]), and removed by the first batch
//! that deletes their key.

pub mod data_dir;
pub mod downgrade;
pub mod files;
pub mod format;
pub mod framing;
pub mod wal;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use files::FileContent;
use files::{fsync_tree, link_file, write_file};

/// The persistent copy of the state machine. Clones share one store.
#[derive(Clone)]
pub struct StateStore {
    db: sled::Db,
    tree: sled::Tree,
    /// Large values of older raftlocks (see the module doc): read, and
    /// emptied as their keys are deleted.
    legacy_large: sled::Tree,
    /// sled's directory.
    dir: PathBuf,
    /// The directory of the store's files.
    files: PathBuf,
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
    /// [`StateStore::close`] was called: the writer ends once idle.
    closed: bool,
}

/// One atomic change of the state store.
#[derive(Default)]
pub struct StateBatch {
    pub puts: Vec<(Vec<u8>, Vec<u8>)>,
    pub deletes: Vec<Vec<u8>>,
    /// Files (name, content) the writer thread writes into the store's file
    /// directory, durably, before the keys: costly encodings that must not
    /// hold up the caller (see the module doc).
    pub files: Vec<(String, FileContent)>,
    /// Files removed once this batch is durable.
    pub retired_files: Vec<String>,
    /// `(file, name)`: once the batch's files are in place, `name` becomes a
    /// second name of `file` (a hard link, replacing any file so named), which
    /// outlives the store's own retiring of `file`. Not synced: a name that
    /// must survive a crash is a file of its own. A snapshot's file is its
    /// checkpoint's this way (`raft::store::state_machine`). Where hard links cannot
    /// be made, the file is copied; a name that can be made neither way is
    /// logged and missing (whoever waits for it finds it missing).
    pub links: Vec<(String, String)>,
    /// `(file, frame)`: a journal frame ([`frame`]) appended to `file` in
    /// the file directory, after the batch's files are written. Not synced
    /// until [`StateStore::sync`]: after a crash a journal file ends at some
    /// frame, possibly a torn one, which [`read_journal`] cuts off.
    pub journal: Option<(String, Vec<u8>)>,
}

fn io_err(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl StateStore {
    /// Open the store: sled in `dir`, its files in `files` (both made if
    /// missing). A file left half-written by a crash is removed.
    pub fn open(dir: &Path, files: &Path) -> io::Result<StateStore> {
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
        let legacy_large = db.open_tree("large").map_err(io_err)?;
        if !files.exists() {
            std::fs::create_dir_all(files)?;
            // The new directory's entry must survive a crash too.
            if let Some(parent) = files.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
        }
        for entry in std::fs::read_dir(files)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                std::fs::remove_file(&path)?;
            }
        }
        let queue = Arc::new(StateQueue::default());
        let store = StateStore { db, tree, legacy_large, dir: dir.to_path_buf(), files: files.to_path_buf(), queue };
        let writer = store.clone();
        std::thread::Builder::new().name("raftlock-state".into()).spawn(move || write_loop(writer))?;
        Ok(store)
    }

    /// The directory of the store's files.
    pub fn files_dir(&self) -> &Path {
        &self.files
    }

    /// The names of the store's files.
    pub fn file_names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.files)? {
            names.extend(entry?.file_name().into_string().ok());
        }
        Ok(names)
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

    /// Wait until every batch queued so far is in sled (its files written and
    /// linked).
    pub fn drain(&self) -> io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let mut pending = self.queue.pending.lock().expect("state queue lock poisoned");
            pending.barriers.push(tx);
            pending.writer_idle = false;
            self.queue.wake.notify_one();
        }
        rx.recv().map_err(|_| io::Error::other("state store writer stopped"))
    }

    /// A key's value.
    pub fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.tree.get(key).map_err(io_err)?.map(|v| v.to_vec()))
    }

    /// A key's value in the tree of large values an older raftlock kept
    /// (see the module doc; what was kept there is the state machine's
    /// business, `raft::store::state_machine::migrate`).
    pub fn legacy_large_value(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.legacy_large.get(key).map_err(io_err)?.map(|v| v.to_vec()))
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
        let mut merged = Merged::of(vec![old, batch], false);
        merged.place_files(&self.files)?;
        let old_large = keys(&self.legacy_large)?;
        write_both(&self.tree, &self.legacy_large, &merged.main, &old_large)
            .map_err(|e| io::Error::other(format!("replacing the state store: {e}")))?;
        self.sync()?;
        self.remove_files(&merged.retired_files)
    }

    fn remove_files(&self, names: &[String]) -> io::Result<()> {
        for name in names {
            match std::fs::remove_file(self.files.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Let the writer thread end once everything queued is written: what a
    /// stopping node calls last, after [`StateStore::sync`]. Once every
    /// clone is dropped, the store's files and sled's lock are released, so
    /// that the member can be opened again in the same process. Nothing may
    /// be committed after it (it would never be written).
    pub fn close(&self) {
        let mut pending = self.queue.pending.lock().expect("state queue lock poisoned");
        pending.closed = true;
        self.queue.wake.notify_all();
    }

    /// Push everything to disk: the journal files (and their directory),
    /// then sled's flush and a real fsync of its files (sled's own flush is
    /// not a durable sync).
    pub fn sync(&self) -> io::Result<()> {
        self.drain()?;
        let mut synced = false;
        for name in self.file_names()? {
            if name.starts_with(JOURNAL_FILE_PREFIX) && !name.ends_with(".tmp") {
                match std::fs::File::open(self.files.join(&name)).and_then(|f| f.sync_data()) {
                    // Retired by a checkpoint since the listing.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    other => other?,
                }
                synced = true;
            }
        }
        if synced {
            std::fs::File::open(&self.files)?.sync_all()?;
        }
        self.flush_sled()
    }

    fn flush_sled(&self) -> io::Result<()> {
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

/// The writer thread (it lives until the store is closed): every window, merge all queued batches into one sled
/// batch (later writes to a key replace earlier ones, as applying them in turn
/// would) and apply it, after writing their files; answer barriers at once.
fn write_loop(store: StateStore) {
    let queue = &store.queue;
    let mut journal = JournalWriter::default();
    loop {
        let (batches, barriers) = {
            let mut pending = queue.pending.lock().expect("state queue lock poisoned");
            while pending.batches.is_empty() && pending.barriers.is_empty() {
                if pending.closed {
                    return;
                }
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
        let mut merged = Merged::of(batches, !store.legacy_large.is_empty());
        let written = crate::base::metrics::timed(&crate::base::metrics::metrics().backend_commit, || {
            merged.place_files(&store.files).map_err(|e| e.to_string())?;
            journal.append(&store.files, &merged.journal).map_err(|e| format!("appending to the journal: {e}"))?;
            if merged.sled_writes == 0 {
                Ok(())
            } else if merged.legacy_deletes.is_empty() {
                store.tree.apply_batch(std::mem::take(&mut merged.main)).map_err(|e| e.to_string())
            } else {
                write_both(&store.tree, &store.legacy_large, &merged.main, &merged.legacy_deletes)
            }
        });
        // Retired files go once the batch that retired them is durable.
        let retired = match written {
            Ok(()) if merged.retired_files.is_empty() => Ok(()),
            Ok(()) => {
                store.flush_sled().and_then(|()| store.remove_files(&merged.retired_files)).map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = retired {
            // sled fails every write after one has failed: only a restart
            // (which replays the log) can go on. After a full disk, the next
            // start waits for space (`node::disk`).
            tracing::error!(error = %e, "state store write failed; aborting so that the log is replayed");
            std::process::abort();
        }
        for reply in barriers {
            let _ = reply.send(());
        }
    }
}

/// Queued batches merged into one.
struct Merged {
    /// For the main tree: later writes to a key replace earlier ones, as
    /// applying the batches in turn would.
    main: sled::Batch,
    /// The keys `main` puts or removes.
    sled_writes: usize,
    /// Every key deleted, for the legacy tree of large values (when it
    /// holds any).
    legacy_deletes: Vec<sled::IVec>,
    files: Vec<(String, FileContent)>,
    retired_files: Vec<String>,
    links: Vec<(String, String)>,
    journal: Vec<(String, Vec<u8>)>,
}

impl Merged {
    /// Merge `batches`; with `legacy`, note the keys deleted for the legacy tree.
    fn of(batches: Vec<StateBatch>, legacy: bool) -> Merged {
        let mut merged = Merged {
            main: sled::Batch::default(),
            sled_writes: 0,
            legacy_deletes: Vec::new(),
            files: Vec::new(),
            retired_files: Vec::new(),
            links: Vec::new(),
            journal: Vec::new(),
        };
        for batch in batches {
            merged.sled_writes += batch.deletes.len() + batch.puts.len();
            for k in batch.deletes {
                if legacy {
                    merged.legacy_deletes.push(sled::IVec::from(k.as_slice()));
                }
                merged.main.remove(k);
            }
            for (k, v) in batch.puts {
                merged.main.insert(k, v);
            }
            merged.files.extend(batch.files);
            merged.retired_files.extend(batch.retired_files);
            merged.links.extend(batch.links);
            merged.journal.extend(batch.journal);
        }
        merged
    }

    /// Write the batches' files durably into `dir`, then make their links
    /// (see [`StateBatch::links`]; a link that cannot be made is logged and
    /// missing). Before any key of the batches reaches sled.
    fn place_files(&mut self, dir: &Path) -> io::Result<()> {
        for (name, content) in self.files.drain(..) {
            write_file(dir, &name, content, true)
                .map_err(|e| io::Error::new(e.kind(), format!("writing {name}: {e}")))?;
        }
        for (file, name) in &self.links {
            if let Err(e) = link_file(dir, file, name) {
                tracing::warn!(error = %e, file, name, "linking a file");
            }
        }
        Ok(())
    }
}

/// What the names of journal files start with (see [`StateBatch::journal`]).
pub const JOURNAL_FILE_PREFIX: &str = "journal-";

/// The writer thread's open journal file: frames go to one file until a
/// checkpoint starts the next.
#[derive(Default)]
struct JournalWriter {
    open: Option<(String, std::fs::File)>,
}

impl JournalWriter {
    /// Append `frames` in order, each run of frames for one file in one
    /// vectored write (more if the file takes a part of it).
    fn append(&mut self, dir: &Path, frames: &[(String, Vec<u8>)]) -> io::Result<()> {
        let mut i = 0;
        while i < frames.len() {
            let name = &frames[i].0;
            let run = frames[i..].iter().take_while(|(n, _)| n == name).count();
            if self.open.as_ref().is_none_or(|(open, _)| open != name) {
                let file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name))?;
                self.open = Some((name.clone(), file));
            }
            let file = &mut self.open.as_mut().expect("just opened").1;
            let mut slices: Vec<io::IoSlice<'_>> =
                frames[i..i + run].iter().map(|(_, f)| io::IoSlice::new(f)).collect();
            write_all_vectored(file, &mut slices)?;
            i += run;
        }
        Ok(())
    }
}

/// Write all of `slices` to `out`, in as few `writev` calls as it takes
/// (std's `write_all_vectored` is not stable): the frames of a window go to
/// the journal as they are, not copied into one buffer first.
fn write_all_vectored(out: &mut impl Write, mut slices: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match out.write_vectored(slices) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "failed to write whole journal frames")),
            Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A journal frame ([`framing`]) whose body `body` writes into it, in place.
pub fn frame(body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    framing::append(&mut out, body);
    out
}

/// The whole frames a journal file starts with (read them with
/// [`framing::bodies`]). A crash can leave a torn frame at the end (or, after
/// a power loss, anything past the last sync): the file is cut back to the
/// last whole frame, so that later appends follow it.
pub fn read_journal(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = std::fs::read(path)?;
    let whole: usize = framing::bodies(&bytes).map(|body| framing::HEADER + body.len()).sum();
    if whole < bytes.len() {
        tracing::warn!(path = %path.display(), kept = whole, dropped = bytes.len() - whole, "journal ends in a torn frame; cut back");
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.set_len(whole as u64)?;
        file.sync_all()?;
        bytes.truncate(whole);
    }
    Ok(bytes)
}

/// Apply `main` to the main tree and remove `large_removes` from the legacy
/// tree in one sled transaction: after a crash, all or none.
fn write_both(
    tree: &sled::Tree,
    large: &sled::Tree,
    main: &sled::Batch,
    large_removes: &[sled::IVec],
) -> Result<(), String> {
    use sled::Transactional;
    (tree, large)
        .transaction(|(tree, large)| {
            tree.apply_batch(main)?;
            for k in large_removes {
                large.remove(k)?;
            }
            Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
        })
        .map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file whose vectored writes take at most a few bytes, across slice
    /// boundaries, as a short `writev` may; every other call is interrupted.
    struct Trickle {
        written: Vec<u8>,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[io::IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let mut left = 5;
            for buf in bufs {
                let n = buf.len().min(left);
                self.written.extend_from_slice(&buf[..n]);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            Ok(5 - left)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn vectored_journal_writes_survive_short_writes_in_order() {
        let frames: Vec<Vec<u8>> =
            (0u8..5).map(|i| frame(|b| b.extend(std::iter::repeat_n(i + 1, 7 * i as usize + 1)))).collect();
        // Frames of 9 to 37 bytes, taken 5 bytes a call, with empty slices
        // before, between and after them.
        let mut slices: Vec<io::IoSlice<'_>> = vec![io::IoSlice::new(&[])];
        for f in &frames {
            slices.push(io::IoSlice::new(f));
            slices.push(io::IoSlice::new(&[]));
        }
        let mut out = Trickle { written: Vec::new(), calls: 0 };
        write_all_vectored(&mut out, &mut slices).unwrap();
        assert_eq!(out.written, frames.concat());
        assert!(out.calls > 2 * frames.len(), "the writes were short: {} calls", out.calls);
        let bodies: Vec<&[u8]> = framing::bodies(&out.written).collect();
        assert_eq!(bodies.len(), 5);
        assert!(bodies.iter().enumerate().all(|(i, b)| b.len() == 7 * i + 1 && b.iter().all(|&x| x as usize == i + 1)));

        let mut nothing = Trickle { written: Vec::new(), calls: 0 };
        write_all_vectored(&mut nothing, &mut [io::IoSlice::new(&[]), io::IoSlice::new(&[])]).unwrap();
        assert_eq!((nothing.written.len(), nothing.calls), (0, 0), "only empty slices: no write at all");
    }

    /// A file that takes nothing: the write fails instead of looping.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Ok(0)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_file_that_takes_nothing_fails_the_journal_write() {
        let frame = frame(|b| b.push(1));
        let err = write_all_vectored(&mut Full, &mut [io::IoSlice::new(&frame)]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WriteZero);
    }
}
