//! The spill: where the values of superseded versions live, out of memory.
//!
//! A key's newest version is what nearly every read wants (locks, elections
//! and most applications read at the current revision), so it stays in
//! memory. The versions a newer one replaced are history: read only by reads
//! at an old revision, by watchers catching up, by HashKV and by checkpoints.
//! When a version is superseded its value moves to the spill, and the index
//! keeps a [`Spilled`] reference (16 bytes) in place of the key-value.
//!
//! The spill is a cache of the state, not part of its durable copy: the state
//! store's checkpoint and journal hold every value, so nothing in it is ever
//! synced, and a restart builds a new one. Its files are unlinked as soon as
//! they are created: a segment's space is freed when the last reference to it
//! goes (its versions compacted and swept, the store replaced, captures
//! written out), and nothing is left behind by a crash.
//!
//! Records are appended to a write buffer and written to the current segment
//! in large writes. Versions are superseded in revision order and compaction
//! removes them in about that order, so segments empty roughly oldest first.
//!
//! Invariants:
//! - a record is immutable once appended; a [`Spilled`] names its segment, so
//!   the segment lives as long as any reference to it;
//! - a record still in the write buffer is read from there ([`Spill::read`]);
//!   a reference handed outside the store ([`Spill::flushed`]) is always to
//!   a record on file.
//!
//! Caveats: after a failed write (a full disk) the spill stops taking values
//! and keeps its buffer: versions stay in memory, nothing is lost. A failed
//! read cannot be answered and the member aborts, as on a state store write
//! failure: the restart rebuilds everything from the state store.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::KeyValue;

/// A segment's largest size: its space is freed only once every record in
/// it is gone, so smaller segments free space sooner.
const SEGMENT_BYTES: u64 = 64 << 20;
/// The write buffer is written out once it holds this much.
const BUFFER_BYTES: usize = 256 << 10;
/// What a record carries besides the value: create, mod, version, lease.
const HEADER: usize = 32;

/// One segment file (unlinked: it goes with its last reference).
#[derive(Debug)]
pub struct Segment {
    file: File,
}

/// Where one spilled value is: 16 bytes in the index instead of a key-value.
#[derive(Clone, Debug)]
pub struct Spilled {
    segment: Arc<Segment>,
    offset: u32,
    len: u32,
}

impl Spilled {
    /// The length of the spilled value.
    pub fn value_len(&self) -> usize {
        self.len as usize - HEADER
    }

    /// Read the key-value back from its segment (a record on file only).
    pub fn load(&self, key: &[u8]) -> KeyValue {
        let mut record = vec![0; self.len as usize];
        if let Err(e) = self.segment.file.read_exact_at(&mut record, self.offset as u64) {
            failed_read(&e);
        }
        decode(key, record)
    }
}

/// The spill of one store: its directory, the segment being written and the
/// write buffer.
#[derive(Debug)]
pub struct Spill {
    dir: PathBuf,
    segment: Option<Arc<Segment>>,
    /// Bytes of `segment` on file; the buffer follows them.
    written: u64,
    buffer: Vec<u8>,
    /// A write failed: no more values are taken.
    failed: bool,
    /// The segments no longer written, and their sizes: held while anything
    /// refers to them.
    closed: Vec<(Weak<Segment>, u64)>,
    /// [`SEGMENT_BYTES`]; smaller in tests.
    segment_bytes: u64,
}

static SEGMENT_NAMES: AtomicU64 = AtomicU64::new(0);

impl Spill {
    /// A spill in `dir`, created if need be; files left there (by a crash
    /// between a segment's creation and its unlinking) are removed.
    pub fn open(dir: &Path) -> std::io::Result<Spill> {
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(dir)? {
            std::fs::remove_file(entry?.path())?;
        }
        Ok(Spill::new_in(dir.to_path_buf()))
    }

    fn new_in(dir: PathBuf) -> Spill {
        Spill {
            dir,
            segment: None,
            written: 0,
            buffer: Vec::new(),
            failed: false,
            closed: Vec::new(),
            segment_bytes: SEGMENT_BYTES,
        }
    }

    #[cfg(test)]
    pub(super) fn with_segment_bytes(self, segment_bytes: u64) -> Spill {
        Spill { segment_bytes, ..self }
    }

    /// The bytes the spill holds: its segments that anything still refers
    /// to, and the write buffer.
    pub fn held_bytes(&self) -> u64 {
        let closed: u64 = self.closed.iter().filter(|(s, _)| s.strong_count() > 0).map(|(_, len)| len).sum();
        let current = if self.segment.is_some() { self.written } else { 0 };
        closed + current + self.buffer.len() as u64
    }

    /// The segments the spill has made that are still held (the one being
    /// written included).
    pub fn segments_held(&self) -> usize {
        self.closed.iter().filter(|(s, _)| s.strong_count() > 0).count() + usize::from(self.segment.is_some())
    }

    /// A new spill in the same directory, for a store that replaces this
    /// one's (the old segments go with the old store).
    pub fn fresh(&self) -> Spill {
        Spill::new_in(self.dir.clone())
    }

    /// Append `kv`'s value and fields; `None` when the spill takes no more
    /// values (after a failed write) or the record could never fit.
    pub fn append(&mut self, kv: &KeyValue) -> Option<Spilled> {
        let len = HEADER + kv.value.len();
        if self.failed || len as u64 > self.segment_bytes {
            return None;
        }
        if self.segment.is_none() || self.written + (self.buffer.len() + len) as u64 > self.segment_bytes {
            self.write_out()?;
            let segment = Arc::new(self.new_segment()?);
            if let Some(closed) = self.segment.replace(segment) {
                self.closed.retain(|(s, _)| s.strong_count() > 0);
                self.closed.push((Arc::downgrade(&closed), self.written));
            }
            self.written = 0;
        }
        let offset = (self.written + self.buffer.len() as u64) as u32;
        for n in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
            self.buffer.extend_from_slice(&n.to_le_bytes());
        }
        self.buffer.extend_from_slice(&kv.value);
        let segment = self.segment.clone().expect("a segment is open");
        if self.buffer.len() >= BUFFER_BYTES {
            // A failure keeps the buffer, so this record stays readable.
            self.write_out();
        }
        Some(Spilled { segment, offset, len: len as u32 })
    }

    /// The key-value a spilled reference of this store names.
    pub fn read(&self, key: &[u8], spilled: &Spilled) -> KeyValue {
        match self.buffered(spilled) {
            Some(at) => decode(key, self.buffer[at..at + spilled.len as usize].to_vec()),
            None => spilled.load(key),
        }
    }

    /// Whether `spilled` is on file, so that it can be read without this
    /// spill (by a capture written out elsewhere).
    pub fn flushed(&self, spilled: &Spilled) -> bool {
        self.buffered(spilled).is_none()
    }

    /// Where in the buffer a record still there starts.
    fn buffered(&self, spilled: &Spilled) -> Option<usize> {
        let current = self.segment.as_ref().is_some_and(|s| Arc::ptr_eq(s, &spilled.segment));
        (current && spilled.offset as u64 >= self.written).then(|| (spilled.offset as u64 - self.written) as usize)
    }

    /// Write the buffer to the current segment. `None` (and no more values
    /// taken) on failure, the buffer kept.
    fn write_out(&mut self) -> Option<()> {
        if self.buffer.is_empty() {
            return Some(());
        }
        let segment = self.segment.as_ref().expect("a buffer belongs to a segment");
        match segment.file.write_all_at(&self.buffer, self.written) {
            Ok(()) => {
                self.written += self.buffer.len() as u64;
                self.buffer.clear();
                Some(())
            }
            Err(e) => {
                self.give_up(&e);
                None
            }
        }
    }

    fn new_segment(&mut self) -> Option<Segment> {
        let name = format!("segment-{}-{}", std::process::id(), SEGMENT_NAMES.fetch_add(1, Ordering::Relaxed));
        let path = self.dir.join(name);
        let opened = File::options().read(true).write(true).create_new(true).open(&path);
        match opened.and_then(|file| std::fs::remove_file(&path).map(|()| file)) {
            Ok(file) => Some(Segment { file }),
            Err(e) => {
                self.give_up(&e);
                None
            }
        }
    }

    fn give_up(&mut self, e: &std::io::Error) {
        tracing::error!(error = %e, dir = %self.dir.display(), "history spill write failed; superseded values stay in memory");
        self.failed = true;
    }
}

fn decode(key: &[u8], record: Vec<u8>) -> KeyValue {
    let n = |i: usize| i64::from_le_bytes(record[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let (create_revision, mod_revision, version, lease) = (n(0), n(1), n(2), n(3));
    let mut value = record;
    value.drain(..HEADER);
    KeyValue { key: key.to_vec(), create_revision, mod_revision, version, value, lease }
}

fn failed_read(e: &std::io::Error) -> ! {
    tracing::error!(error = %e, "history spill read failed; aborting so that the state is rebuilt from the state store");
    std::process::abort();
}
