//! Wall clocks a cluster can move (libfaketime), for the fault suite's
//! clock-jump nemesis: each member's wall clock is offset by what its own
//! clock file says; its monotonic clock, which lease time and elections run
//! on, is left alone.

use std::path::{Path, PathBuf};

/// Wall clocks the cluster can move: libfaketime's library, and the
/// directory of the members' clock files. Each member's wall clock is
/// offset by what its own clock file says, read again at most once a
/// second; its monotonic clock is not faked.
#[derive(Clone, Debug)]
pub struct Clocks {
    pub(crate) library: PathBuf,
    dir: PathBuf,
}

impl Clocks {
    /// Clock files under `dir`, with Debian's libfaketime (package
    /// `libfaketime`), found wherever its multiarch directory is.
    pub fn new(dir: &Path) -> anyhow::Result<Clocks> {
        let library = std::fs::read_dir("/usr/lib")?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
            .find(|p| p.exists())
            .ok_or_else(|| anyhow::anyhow!("no libfaketime under /usr/lib/*/faketime (Debian's libfaketime)"))?;
        Ok(Clocks { library, dir: dir.to_path_buf() })
    }

    pub(crate) fn file(&self, i: usize) -> PathBuf {
        self.dir.join(format!("m{i}.clock"))
    }

    /// Member `i`'s wall clock `offset_secs` from the true one: written
    /// aside and renamed, so that libfaketime never reads half of it.
    pub(crate) fn set(&self, i: usize, offset_secs: i64) -> anyhow::Result<()> {
        let file = self.file(i);
        let aside = file.with_extension("next");
        std::fs::write(&aside, format!("{offset_secs:+}\n"))?;
        std::fs::rename(&aside, &file)?;
        Ok(())
    }
}
