//! The WAL's writer: the segment being appended to, rotation, zeroing ahead,
//! and the removal of purged segments (see the module above for the rules
//! it keeps).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::frame::encode;
use super::{EntryAt, WalRecord, WalStats, ZEROES, ZERO_AHEAD};

pub(super) struct Segment {
    pub seq: u64,
    pub max_index: Option<u64>,
}

/// The writer's state (see the module doc).
pub(super) struct Writer {
    pub(super) dir: PathBuf,
    pub(super) segment_bytes: u64,
    /// Shared with the flusher, which syncs it without holding the lock.
    pub(super) file: Arc<File>,
    pub(super) seq: u64,
    pub(super) offset: u64,
    /// The segment is zeroed (its blocks written) below this offset, which is
    /// never below `offset`.
    pub(super) zeroed_to: u64,
    /// Every segment on disk, oldest first; the last is `file`.
    pub(super) segments: Vec<Segment>,
    /// The newest value of every meta key, rewritten at the head of each segment.
    pub(super) metas: HashMap<u8, Vec<u8>>,
    pub(super) failed: bool,
    pub(super) stopping: bool,
    /// Writes made, counted.
    pub(super) written: u64,
    /// The writes (counted as `written`) known to be durable.
    pub(super) synced: u64,
    /// The last index of the log as written, and as of the last sync.
    pub(super) last_index: Option<u64>,
    pub(super) synced_index: Option<u64>,
}

impl Writer {
    pub(super) fn new(
        dir: &Path,
        segment_bytes: u64,
        file: Arc<File>,
        seq: u64,
        offset: u64,
        segments: Vec<Segment>,
        metas: HashMap<u8, Vec<u8>>,
    ) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            segment_bytes,
            file,
            seq,
            offset,
            zeroed_to: offset,
            segments,
            metas,
            failed: false,
            stopping: false,
            written: 0,
            synced: 0,
            last_index: None,
            synced_index: None,
        }
    }

    pub(super) fn create(dir: &Path, segment_bytes: u64, metas: HashMap<u8, Vec<u8>>) -> io::Result<Writer> {
        let file = Arc::new(create_segment(dir, 1, segment_bytes)?);
        let mut w = Writer::new(dir, segment_bytes, file, 1, 0, vec![Segment { seq: 1, max_index: None }], metas);
        w.write_checkpoint()?;
        Ok(w)
    }

    /// Everything written so far is durable.
    pub(super) fn mark_synced(&mut self) {
        self.synced = self.written;
        self.synced_index = self.last_index;
    }

    /// Write `records`; returns where each entry among them lies.
    pub(super) fn write(
        &mut self,
        records: &[WalRecord],
        sync: bool,
        stats: &WalStats,
    ) -> io::Result<Vec<(u64, EntryAt)>> {
        let mut buf = Vec::new();
        let mut purge = None;
        let mut batch_max = None;
        let mut last_index = self.last_index;
        // (index, the frame's start and length in `buf`)
        let mut frames = Vec::new();
        for record in records {
            let start = buf.len();
            encode(record, &mut buf);
            match record {
                WalRecord::Entry { index, .. } => {
                    frames.push((*index, start, buf.len() - start));
                    batch_max = Some(batch_max.map_or(*index, |m: u64| m.max(*index)));
                    last_index = Some(*index);
                }
                WalRecord::Meta { key, data } => {
                    self.metas.insert(*key, data.clone());
                }
                WalRecord::TruncateFrom(index) => last_index = index.checked_sub(1),
                WalRecord::PurgeUpto(index) => {
                    purge = Some(purge.map_or(*index, |p: u64| p.max(*index)));
                    last_index = last_index.max(Some(*index));
                }
            }
        }
        if self.offset > 0 && self.offset + buf.len() as u64 > self.segment_bytes {
            self.rotate()?;
        }
        if let Some(max) = batch_max {
            let seg = self.segments.last_mut().expect("a current segment");
            seg.max_index = Some(seg.max_index.map_or(max, |m| m.max(max)));
        }
        let placed = frames
            .into_iter()
            .map(|(index, start, len)| {
                (index, EntryAt { seq: self.seq, offset: self.offset + start as u64, len: len as u32 })
            })
            .collect();
        self.zero_ahead(self.offset + buf.len() as u64)?;
        self.file.write_all_at(&buf, self.offset)?;
        self.offset += buf.len() as u64;
        self.written += 1;
        self.last_index = last_index;
        if sync {
            crate::base::metrics::timed(&crate::base::metrics::metrics().wal_fsync, || self.file.sync_data())?;
            self.mark_synced();
            stats.syncs.fetch_add(1, Ordering::Relaxed);
        }
        stats.writes.fetch_add(1, Ordering::Relaxed);
        stats.records.fetch_add(records.len() as u64, Ordering::Relaxed);
        stats.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if let Some(upto) = purge {
            self.remove_purged(upto)?;
        }
        Ok(placed)
    }

    /// Called before an append that ends at `end`: unless the segment is
    /// zeroed that far, zero it from `end` (the append writes what comes
    /// before) up to the next multiple of [`ZERO_AHEAD`] at or past `end`, or
    /// the segment's end. Nothing past the write position holds a frame, so
    /// this never overwrites one.
    pub(super) fn zero_ahead(&mut self, end: u64) -> io::Result<()> {
        if end <= self.zeroed_to {
            return Ok(());
        }
        let mut at = self.zeroed_to.max(end);
        let to = end.next_multiple_of(ZERO_AHEAD).min(self.segment_bytes);
        while at < to {
            let n = (to - at).min(ZEROES.len() as u64);
            self.file.write_all_at(&ZEROES[..n as usize], at)?;
            at += n;
        }
        self.zeroed_to = to.max(end);
        Ok(())
    }

    /// Start a new segment; it opens with a checkpoint of every meta value.
    pub(super) fn rotate(&mut self) -> io::Result<()> {
        // Records written without a sync must be durable before a later
        // segment can be: replay trusts every segment but the last.
        self.file.sync_data()?;
        self.mark_synced();
        let seq = self.seq + 1;
        self.file = Arc::new(create_segment(&self.dir, seq, self.segment_bytes)?);
        self.seq = seq;
        self.offset = 0;
        self.zeroed_to = 0;
        self.segments.push(Segment { seq, max_index: None });
        self.write_checkpoint()
    }

    pub(super) fn write_checkpoint(&mut self) -> io::Result<()> {
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
        self.zeroed_to = self.zeroed_to.max(self.offset);
        Ok(())
    }

    /// Delete whole segments whose entries are all at or below `upto`.
    pub(super) fn remove_purged(&mut self, upto: u64) -> io::Result<()> {
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

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

/// Create a preallocated segment and make its existence durable.
pub(super) fn create_segment(dir: &Path, seq: u64, bytes: u64) -> io::Result<File> {
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
