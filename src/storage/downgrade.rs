//! The cluster's downgrade setting as this member holds it, in
//! `downgrade.json` in the data directory: `{"generation": N, "target":
//! "0.1.0", "started": false}` while a downgrade is enabled (`started` once
//! a member was seen running the target), `"target": null` once it was
//! cancelled, completed or abandoned.
//!
//! The setting travels between members with their releases (`Peer.Version`
//! answers carry it, `Peer.SetDowngrade` pushes it): the one of the highest
//! generation wins, and a member that learns a newer one writes it here
//! before it goes by it. While a target is set, the member takes the
//! cluster version as no higher than the target (`node::versions`), so it
//! uses nothing the target release lacks — across its own restarts too.
//!
//! Invariant: the generation only grows; two settings of one generation are
//! ordered by `started` (false first), then their targets (`None` first),
//! so every member picks the same.
//!
//! Caveat: a release older than 0.2.0 neither reads nor writes this file;
//! it needs neither, since it uses nothing later releases added.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::base::version::Version;

/// The file's name, in the data directory.
pub const FILE: &str = "downgrade.json";

/// A downgrade setting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    /// Grows with every enable, cancel and completion.
    pub generation: u64,
    /// The release the cluster is being downgraded to; `None`: no downgrade.
    pub target: Option<String>,
    /// Whether a member has been seen running the target since.
    #[serde(default)]
    pub started: bool,
}

impl Setting {
    /// The target, parsed (a target this release cannot parse is none).
    pub fn target(&self) -> Option<Version> {
        self.target.as_deref().and_then(Version::parse)
    }

    /// Whether `self` replaces `held` (see the module's invariant).
    fn newer_than(&self, held: &Setting) -> bool {
        (self.generation, self.started, &self.target) > (held.generation, held.started, &held.target)
    }
}

/// The member's setting, read at start and written on every change.
pub struct Downgrade {
    dir: PathBuf,
    held: Mutex<Setting>,
}

impl Downgrade {
    /// Read the setting in `dir` (none if there is no file).
    pub fn open(dir: &Path) -> anyhow::Result<Downgrade> {
        let path = dir.join(FILE);
        let held = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Setting::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Downgrade { dir: dir.to_path_buf(), held: Mutex::new(held) })
    }

    /// The setting held now.
    pub fn get(&self) -> Setting {
        self.held.lock().expect("downgrade lock poisoned").clone()
    }

    /// The target of the setting held now, if any (what every check of the
    /// cluster version asks, without copying the setting).
    pub fn target(&self) -> Option<Version> {
        self.held.lock().expect("downgrade lock poisoned").target()
    }

    /// Take `setting` if it is newer than the one held, written to disk
    /// first. Returns whether it was taken.
    pub fn adopt(&self, setting: &Setting) -> anyhow::Result<bool> {
        let mut held = self.held.lock().expect("downgrade lock poisoned");
        if !setting.newer_than(&held) {
            return Ok(false);
        }
        let bytes = serde_json::to_vec(setting)?;
        let content: super::files::FileContent = Box::new(move |out| {
            out.write_all(&bytes)?;
            Ok(bytes.len() as u64)
        });
        super::files::write_file(&self.dir, FILE, content, true)
            .with_context(|| format!("writing {}", self.dir.join(FILE).display()))?;
        *held = setting.clone();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(generation: u64, target: Option<&str>) -> Setting {
        Setting { generation, target: target.map(str::to_string), started: false }
    }

    #[test]
    fn a_newer_setting_is_kept_across_a_restart_and_an_older_one_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let d = Downgrade::open(dir.path()).unwrap();
        assert_eq!(d.get(), Setting::default());
        assert!(d.adopt(&setting(1, Some("0.1.0"))).unwrap());
        assert!(!d.adopt(&setting(1, Some("0.1.0"))).unwrap(), "the same setting again changes nothing");
        assert!(!d.adopt(&setting(0, None)).unwrap());
        let reopened = Downgrade::open(dir.path()).unwrap();
        assert_eq!(reopened.get(), setting(1, Some("0.1.0")));
        assert_eq!(reopened.get().target(), Version::parse("0.1.0"));
        assert!(reopened.adopt(&setting(2, None)).unwrap(), "a cancel");
        assert_eq!(Downgrade::open(dir.path()).unwrap().get(), setting(2, None));
    }

    #[test]
    fn settings_of_one_generation_are_ordered_alike_everywhere() {
        let (a, b) = (setting(3, None), setting(3, Some("0.1.0")));
        assert!(b.newer_than(&a) && !a.newer_than(&b));
        let started = Setting { started: true, ..b.clone() };
        assert!(started.newer_than(&b) && !b.newer_than(&started));
        assert!(setting(4, None).newer_than(&started));
    }
}
