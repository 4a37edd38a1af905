//! Whole files written safely: into a temporary file of their own, synced,
//! then renamed into place (so a name only ever stands for a complete
//! file), with the kernel's write-back paced so a large file does not stall
//! the WAL's syncs; and a directory tree synced file by file.
//!
//! Caveat: Linux only — the pacing calls `sync_file_range`.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// What a file holds: written into a buffered file, it returns the bytes
/// it wrote.
pub type FileContent = Box<dyn FnOnce(&mut dyn Write) -> io::Result<u64> + Send>;

/// Write file `name` in `dir` whole: into a temporary file of its own (two
/// writers of one name never share one) that is synced (when `durable`) and
/// then renamed into place, so that the name only ever stands for a
/// complete file. Returns the bytes written.
pub fn write_file(dir: &Path, name: &str, content: FileContent, durable: bool) -> io::Result<u64> {
    let tmp = temporary(dir, name);
    let mut out = io::BufWriter::with_capacity(1 << 20, WrittenBack::new(std::fs::File::create(&tmp)?));
    let bytes = content(&mut out)?;
    let file = out.into_inner().map_err(|e| e.into_error())?.file;
    if durable {
        file.sync_data()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(bytes)
}

/// How much of a file [`WrittenBack`] lets the kernel hold unwritten.
const WRITEBACK_CHUNK: u64 = 8 << 20;

/// A file written as a stream, whose pages are handed to the disk as they
/// are written: once a [`WRITEBACK_CHUNK`] is full it is sent
/// (`sync_file_range`, write), and the writer waits for the chunk before it
/// to be on the disk. So at most about two chunks are waiting to be written
/// at any time. Without this, a checkpoint of hundreds of megabytes stayed
/// in the page cache until the final `fdatasync`, which then wrote it all at
/// once, and the WAL's syncs, on the same disk, waited behind it: writes
/// stalled for 50-270 ms each time a member wrote a large checkpoint
/// (docs/performance-notes.md). The final sync still makes the whole file
/// durable; this only spreads the writing out. On a filesystem without
/// `sync_file_range` the file is written as before.
struct WrittenBack {
    file: std::fs::File,
    /// Bytes written so far.
    written: u64,
    /// Where the first chunk not yet sent to the disk begins.
    sent_to: u64,
    /// False once the filesystem said it cannot do `sync_file_range`.
    pacing: bool,
}

impl WrittenBack {
    fn new(file: std::fs::File) -> WrittenBack {
        WrittenBack { file, written: 0, sent_to: 0, pacing: true }
    }

    /// Send the full chunks written since the last call; wait for the chunk
    /// before each. A write error the wait reports is this file's: the
    /// kernel reports it once, so it is returned here, not left for the
    /// final sync (which would not see it again).
    fn write_back(&mut self) -> io::Result<()> {
        while self.pacing && self.written - self.sent_to >= WRITEBACK_CHUNK {
            let start = self.sent_to;
            let mut sent = sync_range(&self.file, start, WRITEBACK_CHUNK, libc::SYNC_FILE_RANGE_WRITE);
            if sent.is_ok() && start >= WRITEBACK_CHUNK {
                let wait =
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
                sent = sync_range(&self.file, start - WRITEBACK_CHUNK, WRITEBACK_CHUNK, wait);
            }
            match sent {
                Ok(()) => self.sent_to += WRITEBACK_CHUNK,
                // Not for this file: written as before, all at the final sync.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOSYS | libc::EINVAL | libc::ESPIPE | libc::EOPNOTSUPP)
                    ) =>
                {
                    self.pacing = false
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// `sync_file_range` on `file`.
fn sync_range(file: &std::fs::File, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the call (borrowed from `file`);
    // the call reads no memory of ours.
    let done = unsafe { libc::sync_file_range(file.as_raw_fd(), offset as libc::off64_t, len as libc::off64_t, flags) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Write for WrittenBack {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        self.write_back()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// A temporary path in `dir` for what will be renamed to `name`: unique in
/// the process, so two writers of one name never share one, and ending in
/// `.tmp`, which `StateStore::open` removes as left half-made by a crash.
pub(super) fn temporary(dir: &Path, name: &str) -> PathBuf {
    static TEMPORARY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TEMPORARY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{name}.{n}.tmp"))
}

/// Make `name` in `dir` a second name of `file` (see [`StateBatch::links`]):
/// a link under a temporary name, renamed over `name`, so that `name` always
/// stands for a whole file. On a filesystem without hard links, a copy.
pub(super) fn link_file(dir: &Path, file: &str, name: &str) -> io::Result<()> {
    let tmp = temporary(dir, name);
    if let Err(e) = std::fs::hard_link(dir.join(file), &tmp) {
        tracing::debug!(error = %e, file, "no hard link; copying");
        std::fs::copy(dir.join(file), &tmp)?;
    }
    std::fs::rename(&tmp, dir.join(name))
}

/// fsync every file below `dir`, then `dir` itself.
pub(super) fn fsync_tree(dir: &Path) -> io::Result<()> {
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
