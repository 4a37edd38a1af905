//! The data directory's format version, in `format.json` at its top:
//! `{"format": N, "written_by": "0.2.0"}` — the layout of everything in it
//! (WAL, state store, journal, checkpoints), and the last raftlock release
//! that opened it.
//!
//! [`open`] runs before anything else reads the directory. A format newer
//! than this binary reads is refused, with a message naming both releases,
//! before a byte of it is read (an older binary would misread it, or write
//! over what it does not understand). An older format is migrated forward
//! (format 1 is the first; the layouts of builds before it that format 1
//! may still hold are read by `raft::store::state_machine::migrate`). A directory with data
//! but no file is format 1: raftlock 0.1.0 wrote none, and made its
//! directories 0755, which later releases refuse; so a later release's first
//! start on one makes it private ([`make_first_release_private`]).
//!
//! Invariant: [`CURRENT`] changes exactly when a release writes something
//! an older one cannot read; the formats a release reads are 1..=CURRENT.
//!
//! Caveat: raftlock 0.1.0 knows nothing of this file; it opens a directory
//! of any format. Going back to it is safe only from format 1 (see the
//! downgrade notes in docs/operations.md).

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::base::version::RAFTLOCK;

/// The file's name, in the data directory.
pub const FILE: &str = "format.json";
/// The format this release writes, and the newest it reads.
pub const CURRENT: u32 = 1;
/// The release that wrote a directory without the file.
const FIRST_RELEASE: &str = "0.1.0";

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    format: u32,
    written_by: String,
}

/// What [`open`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// The format the directory was in (before any migration).
    pub format: u32,
    /// The release that last opened it (`None` for a new directory).
    pub written_by: Option<String>,
}

/// Before the directory's permissions are checked (`data_dir::prepare`):
/// a directory with data and no format file was written by 0.1.0, which
/// created it 0755; this release keeps data directories private (0700) and
/// refuses others, so the first start of a later release on it makes it
/// private. Returns whether it did.
pub fn make_first_release_private(dir: &Path, has_data: bool) -> anyhow::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    if !has_data || dir.join(FILE).exists() {
        return Ok(false);
    }
    let mode = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?.permissions().mode();
    if mode & 0o077 == 0 {
        return Ok(false);
    }
    let private = std::fs::Permissions::from_mode(super::data_dir::PRIVATE_DIR_MODE);
    std::fs::set_permissions(dir, private).with_context(|| format!("making {} private", dir.display()))?;
    Ok(true)
}

/// Check the format of data directory `dir` (which exists), migrate it to
/// [`CURRENT`] if older, and record this release as the last to open it.
/// `has_data`: whether it holds a member's data already.
pub fn open(dir: &Path, has_data: bool) -> anyhow::Result<Opened> {
    let path = dir.join(FILE);
    let found = match std::fs::read(&path) {
        Ok(bytes) => {
            let marker: Marker = serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a data format file this raftlock ({RAFTLOCK}) can read", path.display())
            })?;
            Some(marker)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let opened = match found {
        Some(m) => Opened { format: m.format, written_by: Some(m.written_by) },
        None if has_data => Opened { format: 1, written_by: Some(FIRST_RELEASE.to_string()) },
        None => Opened { format: CURRENT, written_by: None },
    };
    if opened.format > CURRENT || opened.format == 0 {
        bail!(
            "the data directory {} is in data format {}, written by raftlock {}; this raftlock ({RAFTLOCK}) reads \
             data formats 1 to {CURRENT}. Run raftlock {} or later on it, or start this member afresh (remove it \
             from the cluster and add it again) or from a backup this release can read",
            dir.display(),
            opened.format,
            opened.written_by.as_deref().unwrap_or("unknown"),
            opened.written_by.as_deref().unwrap_or("unknown"),
        );
    }
    // Formats older than CURRENT would be migrated here, one step at a time.
    let marker = Marker { format: CURRENT, written_by: RAFTLOCK.to_string() };
    if opened.format != marker.format || opened.written_by.as_deref() != Some(RAFTLOCK) {
        let bytes = serde_json::to_vec(&marker).expect("a marker encodes");
        let content: super::files::FileContent = Box::new(move |out| {
            out.write_all(&bytes)?;
            Ok(bytes.len() as u64)
        });
        super::files::write_file(dir, FILE, content, true).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(dir: &Path) -> Marker {
        serde_json::from_slice(&std::fs::read(dir.join(FILE)).unwrap()).unwrap()
    }

    #[test]
    fn a_new_directory_is_marked_with_this_release() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(open(dir.path(), false).unwrap(), Opened { format: CURRENT, written_by: None });
        assert_eq!(marker(dir.path()), Marker { format: CURRENT, written_by: RAFTLOCK.into() });
        // Opened again: as this release left it.
        let again = open(dir.path(), true).unwrap();
        assert_eq!(again, Opened { format: CURRENT, written_by: Some(RAFTLOCK.into()) });
    }

    #[test]
    fn data_without_the_file_was_written_by_the_first_release() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(dir.path(), true).unwrap();
        assert_eq!(opened, Opened { format: 1, written_by: Some("0.1.0".into()) });
        assert_eq!(marker(dir.path()).written_by, RAFTLOCK);
    }

    #[test]
    fn the_first_releases_open_directory_is_made_private_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |d: &Path| std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!make_first_release_private(dir.path(), false).unwrap(), "no data: prepare decides");
        assert!(make_first_release_private(dir.path(), true).unwrap());
        assert_eq!(mode(dir.path()), 0o700);
        // A directory a later release opened is left to prepare's check.
        open(dir.path(), true).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!make_first_release_private(dir.path(), true).unwrap());
        assert_eq!(mode(dir.path()), 0o755);
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_releases_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let newer = br#"{"format": 7, "written_by": "9.1.0"}"#;
        std::fs::write(dir.path().join(FILE), newer).unwrap();
        let e = open(dir.path(), true).unwrap_err().to_string();
        assert!(e.contains("data format 7") && e.contains("9.1.0") && e.contains(RAFTLOCK), "{e}");
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), newer);
        std::fs::write(dir.path().join(FILE), b"not json").unwrap();
        assert!(open(dir.path(), true).unwrap_err().to_string().contains("not a data format file"));
    }
}
