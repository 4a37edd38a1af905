//! The data directory's permissions: private to the user that runs raftlock.
//!
//! A data directory holds what must not leak: the WAL carries live auth
//! tokens (simple tokens are handed out through the log), the state store
//! the users' bcrypt hashes and every key. [`prepare`] therefore makes a new
//! directory mode 0700, tightens an empty one (a fresh container volume,
//! which Docker creates 0755), and refuses to start on a non-empty one that
//! group or others can read, enter or write, with the command that mends it.
//! (etcd 3.5 creates its directory 0700 too, but only warns about a looser
//! one; raftlock refuses, as a lock service's tokens are its safety.) The
//! server also runs with umask 077 (`main.rs`), so the files it creates are
//! 0600.
//!
//! Caveat: only the directory itself is checked; its parent may be anything.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context};

/// The mode a data directory has: owner only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Whether `dir` holds a member's data (its WAL), as opposed to nothing or
/// an empty volume: a member with data is a member already, and neither
/// bootstraps nor asks discovery who its peers are.
pub fn holds_member_data(dir: &Path) -> bool {
    dir.join("wal").exists()
}

/// Make `dir` a private data directory, creating it (and its parents) if
/// needed; refuses one that others may use (see the module doc).
pub fn prepare(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        // The mode given is masked by the umask; the directory's own mode
        // is set outright.
        return fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE))
            .with_context(|| format!("making {} private", dir.display()));
    }
    let meta = fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("the data directory {} is not a directory", dir.display());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let empty = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.next().is_none();
    if empty {
        return fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE))
            .with_context(|| format!("making {} private", dir.display()));
    }
    bail!(
        "the data directory {} has permissions {mode:04o}, and others may read it: it holds auth tokens, password \
         hashes and every key. Make it private first: chmod 700 {}",
        dir.display(),
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_directory_is_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/m.raftlock");
        prepare(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        prepare(&dir).unwrap();
    }

    #[test]
    fn an_empty_open_directory_is_tightened_and_a_used_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("volume");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        prepare(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        fs::write(dir.join("wal"), b"x").unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        let refused = prepare(&dir).unwrap_err().to_string();
        assert!(refused.contains("permissions 0750") && refused.contains("chmod 700"), "{refused}");
        assert_eq!(mode(&dir), 0o750, "left as it was");
    }
}
