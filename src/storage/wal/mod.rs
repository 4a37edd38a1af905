//! The write-ahead log: where the Raft log and vote become durable.
//!
//! ## Why a WAL of our own
//! A Raft member may acknowledge an entry (or a vote) only once it is on stable
//! storage. sled 0.34's `flush()` ends in `sync_file_range`, which does not make
//! data durable, so the log and the vote live here instead, made durable with a
//! real `fdatasync`.
//!
//! ## Layout
//! A directory of segment files `<seq:016x>.wal`. Each segment is preallocated
//! (so that `fdatasync` need not update the file's size) and holds frames:
//!
//! ```text
//!   +---------+---------+------+----------------+
//!   | len u32 | crc u32 | kind | payload ...    |   len = 1 + payload length
//!   +---------+---------+------+----------------+   crc = crc32(kind, payload)
//! ```
//!
//! A frame with `len == 0` (the preallocated zeroes) ends a segment. Frame kinds:
//! an entry (index + opaque bytes), a meta value (small key -> opaque bytes, e.g.
//! the vote), truncate-from-index and purge-up-to-index. Replaying every frame of
//! every segment in order rebuilds the log.
//!
//! ## Zeroing ahead
//! `fallocate` reserves a segment's blocks as *unwritten* extents. The first
//! write into such a block converts its extent, a metadata change that the
//! next `fdatasync` must also write: on ext4 an inode or extent block, one more
//! synchronous disk write for nearly every sync when appends are a few KiB.
//! So the writer zeroes the segment ahead of itself, [`ZERO_AHEAD`] bytes at a
//! time: each step converts a whole MiB with one sync, and the appends after
//! it overwrite written blocks, which `fdatasync` flushes as data alone (the
//! measurements: docs/performance-notes.md).
//! Zeroes are what an unused segment tail holds anyway, so writing them never
//! changes what replay sees.
//!
//! ## Batching and syncs
//! Two ways to write, each one `write` of all its records:
//! - [`Wal::write`] with `sync` makes the records durable with one `fdatasync`
//!   in the caller's thread before it returns. A follower's appends, votes,
//!   truncations and purges go this way: nothing may be acknowledged before.
//! - [`Wal::write_deferred`] returns once the records are written, and the
//!   flusher thread makes them durable with the next `fdatasync`, shared by
//!   every write made while the previous one ran (group commit across
//!   appends). The leader's own appends go this way, so that it replicates an
//!   entry while its disk writes it (see `raft::store::log_store` for why that is safe).
//!
//! Either way [`Durable`] tells how far the log is on stable storage: the
//! index of the last entry of the log as synced.
//!
//! ## Invariants
//! - `write(.., sync = true)` returns only after an `fdatasync` covering its records
//!   and every record written before them;
//! - [`Durable`] never reports an index whose entry, or a truncation after it,
//!   is not yet synced; it moves only when a sync completes;
//! - a new segment starts with a checkpoint of every meta value, so that older
//!   segments can be deleted without losing the vote;
//! - a segment is deleted only when every entry in it is at or below a purge.
//!
//! ## Recovery and its caveats
//! A torn write can only be at the tail of the last segment (a new segment is
//! begun only after the previous batch was synced), and it shows as a frame
//! with a sector that reads as zeroes: the disk writes whole sectors, and
//! the writer zeroes a segment before it writes frames over it. Replay stops
//! at the first invalid frame; if that frame is in the last segment and torn,
//! the rest is zeroed, so that stale bytes can never be read as frames later.
//! Any other invalid frame — one in an earlier segment, or one whose every
//! sector was written but whose checksum fails — is corruption: the open
//! fails, naming the segment and the offset, because synced and acknowledged
//! entries may follow it, and dropping them silently could lose writes. A last
//! segment that lacks some meta value (a crash after creating it, before or
//! while its checkpoint was written) is followed at once by a new segment, so
//! that every segment that can outlive the ones before it holds every value.
//! After an I/O error the WAL refuses all further work: the node must stop.
//!
//! ## Where things are
//! This module: opening and recovery, [`Wal`]'s write calls, the flusher and
//! [`Durable`]. `frame`: a record's bytes, segment replay, torn-write
//! detection. `writer`: the segment being appended to, rotation, zeroing
//! ahead, purging.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::watch;

mod frame;
mod writer;

use frame::{is_zero, replay_segment, torn_at, SegmentReplay};
use writer::{segment_path, Segment, Writer};

/// The step in which the writer zeroes a segment ahead of its appends (see
/// "Zeroing ahead" in the module doc).
pub const ZERO_AHEAD: u64 = 1 << 20;

/// The zeroes that zeroing ahead writes, a chunk at a time.
static ZEROES: [u8; 1 << 18] = [0; 1 << 18];

/// One thing to make durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalRecord {
    /// A log entry at `index` (opaque to the WAL).
    Entry { index: u64, data: Vec<u8> },
    /// The newest value of a small named item (the vote, the purge point, …).
    Meta { key: u8, data: Vec<u8> },
    /// Forget every entry at or above `index`.
    TruncateFrom(u64),
    /// Entries at or below `index` are no longer needed.
    PurgeUpto(u64),
}

/// Where an entry's frame lies in the WAL: its segment, and the frame's
/// offset and length there (header included). It stays readable
/// ([`Wal::read_entry`]) until a purge past the entry removes its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryAt {
    seq: u64,
    offset: u64,
    len: u32,
}

/// Replay one segment's bytes into nothing (the fuzz targets' entry).
#[cfg(fuzzing)]
pub fn fuzz_replay(bytes: &[u8]) {
    let mut recovered = Recovered::default();
    let replayed = replay_segment(bytes, 1, &mut recovered);
    assert!(replayed.end <= bytes.len());
    if replayed.end < bytes.len() {
        let _ = torn_at(bytes, replayed.end);
    }
}

/// What replay found.
#[derive(Debug, Default)]
pub struct Recovered {
    pub entries: BTreeMap<u64, Vec<u8>>,
    /// Where each of `entries` lies.
    pub places: BTreeMap<u64, EntryAt>,
    pub metas: HashMap<u8, Vec<u8>>,
    pub purged_upto: Option<u64>,
}

/// Counters of the WAL's work (the tests of batching read them).
#[derive(Debug, Default)]
pub struct WalStats {
    /// fdatasync calls made by writes that sync.
    pub syncs: AtomicU64,
    /// fdatasync calls made by the flusher thread, for deferred writes.
    pub flusher_syncs: AtomicU64,
    /// Calls to [`Wal::write`] (one per append / vote / truncate / purge / commit index).
    pub writes: AtomicU64,
    /// Records written.
    pub records: AtomicU64,
    /// Bytes written.
    pub bytes: AtomicU64,
}

/// How much of the log is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DurableState {
    /// The last index of the log as synced (`None`: no entry is).
    index: Option<u64>,
    /// A sync failed: nothing written after the last good one can be trusted.
    failed: bool,
}

/// A view of how far the log is durable, for those that must not act on an
/// entry before it is (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct Durable {
    rx: watch::Receiver<DurableState>,
}

impl Durable {
    /// Wait until the entry at `index` is on stable storage. Fails if a sync
    /// failed: the node must stop.
    pub async fn wait_for(&mut self, index: u64) -> io::Result<()> {
        let state = self
            .rx
            .wait_for(|d| d.failed || d.index.is_some_and(|i| i >= index))
            .await
            .map_err(|_| io::Error::other("wal: closed"))?;
        if state.failed {
            return Err(io::Error::other("wal: a sync failed; the node must restart"));
        }
        Ok(())
    }

    /// The last index of the log as synced.
    pub fn index(&self) -> Option<u64> {
        self.rx.borrow().index
    }

    /// Resolves when the durable index (or the failed flag) has changed since
    /// this handle last saw it: each call marks the current state seen;
    /// [`Durable::index`] does not. Never resolves once the WAL is closed.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What the writer and the flusher thread share.
struct Shared {
    /// std Mutex: held for one write (and sync), never across an `.await`,
    /// and never by the flusher while it syncs.
    writer: Mutex<Writer>,
    /// Signalled when a deferred write waits for the flusher, and on stop.
    flush_wanted: Condvar,
    durable: watch::Sender<DurableState>,
}

/// Handle to the WAL. Cheap to clone; clones share one log. The flusher
/// thread stops when the last handle is dropped.
#[derive(Clone)]
pub struct Wal {
    dir: std::path::PathBuf,
    shared: Arc<Shared>,
    stats: Arc<WalStats>,
    _flusher: Arc<FlusherStop>,
}

/// Stops the flusher thread when dropped.
struct FlusherStop(Arc<Shared>);

impl Drop for FlusherStop {
    fn drop(&mut self) {
        lock(&self.0.writer).stopping = true;
        self.0.flush_wanted.notify_all();
    }
}

fn lock(writer: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    writer.lock().expect("wal lock poisoned")
}

impl Wal {
    /// Open (or create) the WAL in `dir` and replay it.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<(Wal, Recovered)> {
        fs::create_dir_all(dir)?;
        let mut seqs = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(hex) = name.strip_suffix(".wal") {
                if let Ok(seq) = u64::from_str_radix(hex, 16) {
                    seqs.push(seq);
                }
            }
        }
        seqs.sort_unstable();

        let mut recovered = Recovered::default();
        let mut segments = Vec::new();
        let mut tail = None;
        let mut tail_metas = Vec::new();
        for (i, &seq) in seqs.iter().enumerate() {
            let path = segment_path(dir, seq);
            let bytes = fs::read(&path)?;
            let SegmentReplay { end, max_index, meta_keys } = replay_segment(&bytes, seq, &mut recovered);
            let is_last = i + 1 == seqs.len();
            if end < bytes.len() && !is_zero(&bytes[end..]) {
                let why = if !is_last {
                    Some("in a segment that was synced whole before the next one began")
                } else if !torn_at(&bytes, end) {
                    Some("not a torn write (every sector of it was written)")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "wal: corrupt frame at offset {end} of {}: {why}, so synced and acknowledged entries \
                             may follow it; refusing to start",
                            path.display()
                        ),
                    ));
                }
                // A torn tail: wipe it so that it can never be read again.
                let file = OpenOptions::new().write(true).open(&path)?;
                file.write_all_at(&vec![0u8; bytes.len() - end], end as u64)?;
                file.sync_data()?;
                tracing::warn!(segment = %path.display(), offset = end, "wal: discarded a torn tail");
            }
            segments.push(Segment { seq, max_index });
            if is_last {
                tail = Some((seq, end as u64));
                tail_metas = meta_keys;
            }
        }

        let metas = recovered.metas.clone();
        let last_index = recovered.entries.keys().next_back().copied().or(recovered.purged_upto);
        let mut writer = match tail {
            Some((seq, offset)) => {
                let file = OpenOptions::new().read(true).write(true).open(segment_path(dir, seq))?;
                Writer::new(dir, segment_bytes, Arc::new(file), seq, offset, segments, metas)
            }
            None => Writer::create(dir, segment_bytes, metas)?,
        };
        // A crash between creating a segment and writing its checkpoint leaves
        // a tail without every meta value, and purging the segments before it
        // would then drop the only copy of the vote: start a new segment,
        // which opens with all of them.
        if tail.is_some() && !recovered.metas.keys().all(|k| tail_metas.contains(k)) {
            writer.rotate()?;
        }
        // What was replayed may be a deferred write that the OS still held
        // when the process died; it must be durable before it is reported so.
        writer.file.sync_data()?;
        writer.last_index = last_index;
        writer.synced_index = last_index;
        let (durable, _) = watch::channel(DurableState { index: last_index, failed: false });
        let shared = Arc::new(Shared { writer: Mutex::new(writer), flush_wanted: Condvar::new(), durable });
        let stats = Arc::new(WalStats::default());
        {
            let (shared, stats) = (shared.clone(), stats.clone());
            std::thread::Builder::new().name("raftlock-wal".into()).spawn(move || flusher(&shared, &stats))?;
        }
        let stop = Arc::new(FlusherStop(shared.clone()));
        Ok((Wal { dir: dir.to_path_buf(), shared, stats, _flusher: stop }, recovered))
    }

    /// Write `records` in order; with `sync`, return only once they (and
    /// everything written before them) are durable. After an I/O error every
    /// later write fails: the node must restart and recover from the files.
    pub fn write(&self, records: Vec<WalRecord>, sync: bool) -> io::Result<()> {
        self.write_placed(records, sync).map(drop)
    }

    /// [`Wal::write`], and where each entry written lies (in `records`' order).
    pub fn write_placed(&self, records: Vec<WalRecord>, sync: bool) -> io::Result<Vec<(u64, EntryAt)>> {
        let mut writer = lock(&self.shared.writer);
        if writer.failed {
            return Err(io::Error::other("wal: an earlier write failed; the node must restart"));
        }
        let result = writer.write(&records, sync, &self.stats);
        if let Err(e) = &result {
            tracing::error!(error = %e, sync, "wal: a write failed");
            writer.failed = true;
        }
        publish(&self.shared, &writer);
        result
    }

    /// Write `records` in order and return; the flusher thread makes them
    /// durable soon after ([`Durable`] tells when).
    pub fn write_deferred(&self, records: Vec<WalRecord>) -> io::Result<Vec<(u64, EntryAt)>> {
        let placed = self.write_placed(records, false)?;
        self.shared.flush_wanted.notify_one();
        Ok(placed)
    }

    /// Read back the data of the entry at `at` (what its record carried),
    /// checked against its checksum and index. Fails once a purge removed
    /// its segment.
    pub fn read_entry(&self, index: u64, at: EntryAt) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let file = fs::File::open(writer::segment_path(&self.dir, at.seq))?;
        let mut frame = vec![0u8; at.len as usize];
        file.read_exact_at(&mut frame, at.offset)?;
        match frame::decode_frame(&frame) {
            Some(WalRecord::Entry { index: found, data }) if found == index => Ok(data),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("wal: entry {index} does not read back at {at:?}"),
            )),
        }
    }

    /// How far the log is durable.
    pub fn durable(&self) -> Durable {
        Durable { rx: self.shared.durable.subscribe() }
    }

    #[cfg(test)]
    pub fn stats(&self) -> &WalStats {
        &self.stats
    }
}

/// Tell [`Durable`] watchers what the writer now knows to be synced.
fn publish(shared: &Shared, writer: &Writer) {
    let state = DurableState { index: writer.synced_index, failed: writer.failed };
    shared.durable.send_if_modified(|d| std::mem::replace(d, state) != state);
}

/// The flusher thread: sync whatever deferred writes are waiting, one
/// `fdatasync` for all of them, without holding the writer's lock meanwhile.
/// It syncs what is left before it stops.
fn flusher(shared: &Shared, stats: &WalStats) {
    let mut writer = lock(&shared.writer);
    loop {
        while writer.written == writer.synced && !writer.stopping && !writer.failed {
            writer = shared.flush_wanted.wait(writer).expect("wal lock poisoned");
        }
        if writer.failed || (writer.stopping && writer.written == writer.synced) {
            return;
        }
        let (seq, index, file) = (writer.written, writer.last_index, writer.file.clone());
        drop(writer);
        let result = crate::base::metrics::timed(&crate::base::metrics::metrics().wal_fsync, || file.sync_data());
        writer = lock(&shared.writer);
        match result {
            Ok(()) => {
                stats.flusher_syncs.fetch_add(1, Ordering::Relaxed);
                // A sync made meanwhile by a writer may have covered more.
                if seq > writer.synced {
                    writer.synced = seq;
                    writer.synced_index = index;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "wal: fdatasync failed");
                writer.failed = true;
            }
        }
        publish(shared, &writer);
    }
}

#[cfg(test)]
mod tests {
    use super::frame::{FRAME_HEADER, SECTOR};
    use super::writer::create_segment;
    use super::*;

    fn entry(i: u64) -> WalRecord {
        WalRecord::Entry { index: i, data: format!("entry-{i}").into_bytes() }
    }

    #[test]
    fn replays_entries_truncation_purge_and_metas() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, rec) = Wal::open(dir.path(), 4096).unwrap();
            assert!(rec.entries.is_empty());
            wal.write(vec![WalRecord::Meta { key: 1, data: b"vote-1".to_vec() }], true).unwrap();
            for i in 1..=100 {
                wal.write(vec![entry(i)], true).unwrap();
            }
            wal.write(vec![WalRecord::TruncateFrom(90), entry(90)], true).unwrap();
            wal.write(vec![WalRecord::Meta { key: 1, data: b"vote-2".to_vec() }], true).unwrap();
            wal.write(vec![WalRecord::PurgeUpto(50)], true).unwrap();
            assert_eq!(wal.stats().syncs.load(Ordering::Relaxed), 104);
        }
        let (_wal, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), (51..=90).collect::<Vec<_>>());
        assert_eq!(rec.entries[&90], b"entry-90");
        assert_eq!(rec.metas[&1], b"vote-2");
        assert_eq!(rec.purged_upto, Some(50));
        let segments = fs::read_dir(dir.path()).unwrap().count();
        assert!(segments < 10, "purged segments are deleted ({segments} left)");
    }

    /// The offsets of the first `n` frames of segment `seq`.
    fn frame_offsets(dir: &Path, seq: u64, n: usize) -> Vec<usize> {
        let bytes = fs::read(segment_path(dir, seq)).unwrap();
        let mut offsets = Vec::new();
        let mut pos = 0usize;
        while offsets.len() < n {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            assert!(len > 0, "segment {seq} holds fewer than {n} frames");
            offsets.push(pos);
            pos += FRAME_HEADER + len;
        }
        offsets
    }

    #[test]
    fn a_torn_tail_is_discarded_and_wiped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
            wal.write(vec![entry(1)], true).unwrap();
            // A frame that spans a sector boundary, so that a crash can leave
            // its first sector written and its second not.
            let big = WalRecord::Entry { index: 2, data: vec![7u8; 2 * SECTOR] };
            wal.write(vec![big], true).unwrap();
        }
        // The torn write: the frame's last sector never reached the disk.
        let frame_two = frame_offsets(dir.path(), 1, 2)[1];
        let inner_sector = (frame_two + FRAME_HEADER).div_ceil(SECTOR) * SECTOR;
        let file = OpenOptions::new().write(true).open(segment_path(dir.path(), 1)).unwrap();
        file.write_all_at(&[0u8; SECTOR], inner_sector as u64).unwrap();
        drop(file);
        {
            let (wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), [1]);
            wal.write(vec![entry(2)], true).unwrap();
        }
        let (_, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }

    /// A frame whose checksum fails although every sector of it was written
    /// is not a torn write but damage to synced (and maybe acknowledged)
    /// entries: the open fails, naming the segment and the offset, and
    /// nothing is wiped — not even in the last segment.
    #[test]
    fn a_corrupt_frame_in_the_last_segment_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
            wal.write(vec![WalRecord::Meta { key: 1, data: b"vote".to_vec() }], true).unwrap();
            for i in 1..=5 {
                wal.write(vec![entry(i)], true).unwrap();
            }
        }
        let frame_three = frame_offsets(dir.path(), 1, 4)[3];
        let path = segment_path(dir.path(), 1);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"X", (frame_three + FRAME_HEADER + 3) as u64).unwrap();
        drop(file);
        let before = fs::read(&path).unwrap();
        let err = Wal::open(dir.path(), 1 << 20).err().expect("a corrupt frame must fail the open");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()) && msg.contains(&format!("offset {frame_three}")), "{msg}");
        assert_eq!(fs::read(&path).unwrap(), before, "a failed open changes nothing");
    }

    #[tokio::test]
    async fn deferred_writes_are_synced_by_the_flusher() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
            let mut durable = wal.durable();
            assert_eq!(durable.index(), None);
            for i in 1..=50 {
                wal.write_deferred(vec![entry(i)]).unwrap();
            }
            durable.wait_for(50).await.unwrap();
            let syncs = wal.stats().flusher_syncs.load(Ordering::Relaxed);
            assert!((1..=50).contains(&syncs), "{syncs} syncs for 50 deferred writes");
            assert_eq!(wal.stats().syncs.load(Ordering::Relaxed), 0, "no write synced by itself");
            // A synced truncation moves the durable index back at once.
            wal.write(vec![WalRecord::TruncateFrom(41)], true).unwrap();
            assert_eq!(durable.index(), Some(40));
        }
        let (wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
        assert_eq!(wal.durable().index(), Some(40), "what was replayed is durable");
    }

    #[test]
    fn zeroing_ahead_never_overwrites_frames() {
        // Segments a little over 2.5 zeroing steps long, entries of uneven
        // sizes: steps land inside segments, at their ends and after reopens.
        let segment = 2 * ZERO_AHEAD + ZERO_AHEAD / 2 + 17;
        let dir = tempfile::tempdir().unwrap();
        let big =
            |i: u64| WalRecord::Entry { index: i, data: vec![(i % 251) as u8; 1000 + (i as usize * 7919) % 60_000] };
        let mut expected = Vec::new();
        let vote = |round: u64| format!("vote-{round}").into_bytes();
        for round in 0..3u64 {
            let (wal, rec) = Wal::open(dir.path(), segment).unwrap();
            assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), expected);
            if round > 0 {
                assert_eq!(rec.metas[&1], vote(round - 1));
            }
            wal.write(vec![WalRecord::Meta { key: 1, data: vote(round) }], true).unwrap();
            for i in round * 80 + 1..=round * 80 + 80 {
                wal.write(vec![big(i)], i % 3 == 0).unwrap();
                expected.push(i);
            }
        }
        let (_, rec) = Wal::open(dir.path(), segment).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), expected);
        assert_eq!(rec.metas[&1], vote(2));
        for (i, data) in &rec.entries {
            let WalRecord::Entry { data: want, .. } = big(*i) else { unreachable!() };
            assert_eq!(data, &want, "entry {i}");
        }
        assert!(fs::read_dir(dir.path()).unwrap().count() >= 3, "segments rotated");
    }

    #[test]
    fn a_new_segment_left_without_its_checkpoint_does_not_lose_the_vote() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 4096).unwrap();
            wal.write(vec![WalRecord::Meta { key: 1, data: b"vote".to_vec() }], true).unwrap();
            for i in 1..=10 {
                wal.write(vec![entry(i)], true).unwrap();
            }
        }
        // A crash right after the next segment was created, before its
        // checkpoint was written: a preallocated segment of zeroes.
        let mut seqs: Vec<u64> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                u64::from_str_radix(e.unwrap().file_name().to_str().unwrap().trim_end_matches(".wal"), 16).unwrap()
            })
            .collect();
        seqs.sort_unstable();
        create_segment(dir.path(), seqs.last().unwrap() + 1, 4096).unwrap();
        {
            let (wal, rec) = Wal::open(dir.path(), 4096).unwrap();
            assert_eq!(rec.metas[&1], b"vote");
            for i in 11..=40 {
                wal.write(vec![entry(i)], true).unwrap();
            }
            // Everything up to 30 is purged: the segments that held the vote go.
            wal.write(vec![WalRecord::PurgeUpto(30)], true).unwrap();
        }
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.metas.get(&1).map(Vec::as_slice), Some(&b"vote"[..]), "the vote outlives the purge");
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), (31..=40).collect::<Vec<_>>());
    }

    #[test]
    fn unsynced_writes_are_made_durable_by_the_next_sync_and_by_rotation() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 256).unwrap();
            for i in 1..=40 {
                // Every fourth write syncs; segments of 256 bytes rotate often.
                wal.write(vec![entry(i)], i % 4 == 0).unwrap();
            }
            assert_eq!(wal.stats().syncs.load(Ordering::Relaxed), 10);
            assert_eq!(wal.stats().writes.load(Ordering::Relaxed), 40);
        }
        let (_, rec) = Wal::open(dir.path(), 256).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), (1..=40).collect::<Vec<_>>());
        assert!(fs::read_dir(dir.path()).unwrap().count() >= 3, "segments rotated");
    }
}
