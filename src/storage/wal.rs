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
//! ## Batching and syncs
//! [`Wal::write`] writes its records with one `write` and, when asked, one
//! `fdatasync`, in the caller's thread: the Raft core waits for each append to
//! be durable before it does anything else, so a hand-off to another thread
//! would only add two thread wake-ups to every write. Many client writes still
//! share one sync, because they reach the log together: the proposer batches
//! concurrent writes into one entry, and a follower receives many entries in
//! one append. Writes that need no sync of their own (the committed index) are
//! made durable by the next sync.
//!
//! ## Invariants
//! - `write(.., sync = true)` returns only after an `fdatasync` covering its records
//!   and every record written before them;
//! - a new segment starts with a checkpoint of every meta value, so that older
//!   segments can be deleted without losing the vote;
//! - a segment is deleted only when every entry in it is at or below a purge.
//!
//! ## Recovery and its caveats
//! A torn write can only be at the tail of the last segment (a new segment is
//! begun only after the previous batch was synced). Replay stops at the first
//! invalid frame of the last segment and zeroes the rest, so that stale bytes
//! can never be read as frames later. An invalid frame in any other segment is
//! corruption and fails the open, as it may hide acknowledged entries.
//! After an I/O error the WAL refuses all further work: the node must stop.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const KIND_ENTRY: u8 = 1;
const KIND_META: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
const KIND_PURGE: u8 = 4;
const FRAME_HEADER: usize = 8;

/// The default segment size. Large enough that rotation is rare, small enough
/// that purged segments give memory and disk back soon.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

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

/// What replay found.
#[derive(Debug, Default)]
pub struct Recovered {
    pub entries: BTreeMap<u64, Vec<u8>>,
    pub metas: HashMap<u8, Vec<u8>>,
    pub purged_upto: Option<u64>,
}

/// Counters for metrics and for tests of batching.
#[derive(Debug, Default)]
pub struct WalStats {
    /// fdatasync calls made for writes.
    pub syncs: AtomicU64,
    /// Calls to [`Wal::write`] (one per append / vote / truncate / purge / commit index).
    pub writes: AtomicU64,
    /// Records written.
    pub records: AtomicU64,
    /// Bytes written.
    pub bytes: AtomicU64,
}

/// Handle to the WAL. Cheap to clone; clones share one log.
#[derive(Clone)]
pub struct Wal {
    /// std Mutex: held for one write (and sync), never across an `.await`.
    writer: Arc<Mutex<Writer>>,
    stats: Arc<WalStats>,
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
        for (i, &seq) in seqs.iter().enumerate() {
            let path = segment_path(dir, seq);
            let bytes = fs::read(&path)?;
            let (end, max_index) = replay_segment(&bytes, &mut recovered);
            let is_last = i + 1 == seqs.len();
            if end < bytes.len() && !is_zero(&bytes[end..]) {
                if !is_last {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("wal: corrupt frame at offset {end} of {}", path.display()),
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
            }
        }

        let metas = recovered.metas.clone();
        let writer = match tail {
            Some((seq, offset)) => {
                let file = OpenOptions::new().read(true).write(true).open(segment_path(dir, seq))?;
                Writer { dir: dir.to_path_buf(), segment_bytes, file, seq, offset, segments, metas, failed: false }
            }
            None => Writer::create(dir, segment_bytes, metas)?,
        };
        Ok((Wal { writer: Arc::new(Mutex::new(writer)), stats: Arc::new(WalStats::default()) }, recovered))
    }

    /// Write `records` in order; with `sync`, return only once they (and
    /// everything written before them) are durable. After an I/O error every
    /// later write fails: the node must restart and recover from the files.
    pub fn write(&self, records: Vec<WalRecord>, sync: bool) -> io::Result<()> {
        let mut writer = self.writer.lock().expect("wal lock poisoned");
        if writer.failed {
            return Err(io::Error::other("wal: an earlier write failed; the node must restart"));
        }
        let result = writer.write(&records, sync, &self.stats);
        if result.is_err() {
            writer.failed = true;
        }
        result
    }

    pub fn stats(&self) -> &WalStats {
        &self.stats
    }
}

struct Segment {
    seq: u64,
    max_index: Option<u64>,
}

/// The writer thread's state (see the module doc).
struct Writer {
    dir: PathBuf,
    segment_bytes: u64,
    file: File,
    seq: u64,
    offset: u64,
    /// Every segment on disk, oldest first; the last is `file`.
    segments: Vec<Segment>,
    /// The newest value of every meta key, rewritten at the head of each segment.
    metas: HashMap<u8, Vec<u8>>,
    failed: bool,
}

impl Writer {
    fn create(dir: &Path, segment_bytes: u64, metas: HashMap<u8, Vec<u8>>) -> io::Result<Writer> {
        let file = create_segment(dir, 1, segment_bytes)?;
        let mut w = Writer {
            dir: dir.to_path_buf(),
            segment_bytes,
            file,
            seq: 1,
            offset: 0,
            segments: vec![Segment { seq: 1, max_index: None }],
            metas,
            failed: false,
        };
        w.write_checkpoint()?;
        Ok(w)
    }

    fn write(&mut self, records: &[WalRecord], sync: bool, stats: &WalStats) -> io::Result<()> {
        let mut buf = Vec::new();
        let mut purge = None;
        let mut batch_max = None;
        for record in records {
            encode(record, &mut buf);
            match record {
                WalRecord::Entry { index, .. } => batch_max = Some(batch_max.map_or(*index, |m: u64| m.max(*index))),
                WalRecord::Meta { key, data } => {
                    self.metas.insert(*key, data.clone());
                }
                WalRecord::TruncateFrom(_) => {}
                WalRecord::PurgeUpto(index) => purge = Some(purge.map_or(*index, |p: u64| p.max(*index))),
            }
        }
        if self.offset > 0 && self.offset + buf.len() as u64 > self.segment_bytes {
            self.rotate()?;
        }
        if let Some(max) = batch_max {
            let seg = self.segments.last_mut().expect("a current segment");
            seg.max_index = Some(seg.max_index.map_or(max, |m| m.max(max)));
        }
        self.file.write_all_at(&buf, self.offset)?;
        self.offset += buf.len() as u64;
        if sync {
            self.file.sync_data()?;
            stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        stats.writes.fetch_add(1, Ordering::Relaxed);
        stats.records.fetch_add(records.len() as u64, Ordering::Relaxed);
        stats.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if let Some(upto) = purge {
            self.remove_purged(upto)?;
        }
        Ok(())
    }

    /// Start a new segment; it opens with a checkpoint of every meta value.
    fn rotate(&mut self) -> io::Result<()> {
        // Records written without a sync must be durable before a later
        // segment can be: replay trusts every segment but the last.
        self.file.sync_data()?;
        let seq = self.seq + 1;
        self.file = create_segment(&self.dir, seq, self.segment_bytes)?;
        self.seq = seq;
        self.offset = 0;
        self.segments.push(Segment { seq, max_index: None });
        self.write_checkpoint()
    }

    fn write_checkpoint(&mut self) -> io::Result<()> {
        let mut buf = Vec::new();
        let mut keys: Vec<_> = self.metas.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            encode(&WalRecord::Meta { key, data: self.metas[&key].clone() }, &mut buf);
        }
        if !buf.is_empty() {
            self.file.write_all_at(&buf, 0)?;
        }
        self.file.sync_data()?;
        self.offset = buf.len() as u64;
        Ok(())
    }

    /// Delete whole segments whose entries are all at or below `upto`.
    fn remove_purged(&mut self, upto: u64) -> io::Result<()> {
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            if oldest.max_index.is_some_and(|m| m > upto) {
                break;
            }
            fs::remove_file(segment_path(&self.dir, oldest.seq))?;
            self.segments.remove(0);
        }
        Ok(())
    }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

/// Create a preallocated segment and make its existence durable.
fn create_segment(dir: &Path, seq: u64, bytes: u64) -> io::Result<File> {
    let path = segment_path(dir, seq);
    let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
    // SAFETY: `file` is an open descriptor for the duration of the call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    if rc != 0 {
        // Filesystems without fallocate still work; syncs are just slower.
        file.set_len(bytes)?;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

fn encode(record: &WalRecord, buf: &mut Vec<u8>) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    match record {
        WalRecord::Entry { index, data } => {
            buf.push(KIND_ENTRY);
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(data);
        }
        WalRecord::Meta { key, data } => {
            buf.push(KIND_META);
            buf.push(*key);
            buf.extend_from_slice(data);
        }
        WalRecord::TruncateFrom(index) => {
            buf.push(KIND_TRUNCATE);
            buf.extend_from_slice(&index.to_le_bytes());
        }
        WalRecord::PurgeUpto(index) => {
            buf.push(KIND_PURGE);
            buf.extend_from_slice(&index.to_le_bytes());
        }
    }
    let body = &buf[start + FRAME_HEADER..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Apply every valid frame of a segment to `rec`. Returns the offset just past
/// the last valid frame and the highest entry index seen.
fn replay_segment(bytes: &[u8], rec: &mut Recovered) -> (usize, Option<u64>) {
    let mut pos = 0;
    let mut max_index = None;
    while pos + FRAME_HEADER <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len == 0 || pos + FRAME_HEADER + len > bytes.len() {
            break;
        }
        let body = &bytes[pos + FRAME_HEADER..pos + FRAME_HEADER + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        let Some(record) = decode(body) else { break };
        match record {
            WalRecord::Entry { index, data } => {
                if rec.purged_upto.is_none_or(|p| index > p) {
                    rec.entries.insert(index, data);
                }
                max_index = Some(max_index.map_or(index, |m: u64| m.max(index)));
            }
            WalRecord::Meta { key, data } => {
                rec.metas.insert(key, data);
            }
            WalRecord::TruncateFrom(index) => {
                rec.entries.split_off(&index);
            }
            WalRecord::PurgeUpto(index) => {
                rec.purged_upto = Some(rec.purged_upto.map_or(index, |p| p.max(index)));
                rec.entries = rec.entries.split_off(&(index + 1));
            }
        }
        pos += FRAME_HEADER + len;
    }
    (pos, max_index)
}

fn decode(body: &[u8]) -> Option<WalRecord> {
    let (&kind, rest) = body.split_first()?;
    let u64_at = |b: &[u8]| b.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    Some(match kind {
        KIND_ENTRY => WalRecord::Entry { index: u64_at(rest)?, data: rest[8..].to_vec() },
        KIND_META => WalRecord::Meta { key: *rest.first()?, data: rest[1..].to_vec() },
        KIND_TRUNCATE => WalRecord::TruncateFrom(u64_at(rest)?),
        KIND_PURGE => WalRecord::PurgeUpto(u64_at(rest)?),
        _ => return None,
    })
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_torn_tail_is_discarded_and_wiped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
            wal.write(vec![entry(1), entry(2)], true).unwrap();
        }
        // Corrupt the second frame's payload, as a torn write would.
        let path = segment_path(dir.path(), 1);
        let bytes = fs::read(&path).unwrap();
        let mut frame_two = 0;
        let (mut pos, mut n) = (0usize, 0);
        while n < 2 {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            frame_two = pos;
            pos += FRAME_HEADER + len;
            n += 1;
        }
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"XX", (frame_two + FRAME_HEADER + 3) as u64).unwrap();
        drop(file);
        {
            let (wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), [1]);
            wal.write(vec![entry(2)], true).unwrap();
        }
        let (_, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(rec.entries.keys().copied().collect::<Vec<_>>(), [1, 2]);
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
