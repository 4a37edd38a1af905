//! raftlock's versions: its own release (semver, from Cargo.toml), the etcd
//! API level it implements (what etcd's clients read from
//! `Maintenance.Status.version` and gate features on), and how both are
//! printed (`raftlock --version`, `raftlockctl version`, `/version`, the
//! build-info metric).
//!
//! Invariant: [`RAFTLOCK`] parses as a [`Version`]; releases are listed in
//! CHANGELOG.md, release 0.1.0 being commit 71620aa (2026-11-28).
//!
//! Caveat: the commit is known only when the build sets `RAFTLOCK_GIT_SHA`
//! (`scripts/release.sh` does); otherwise it reads "unknown".

use std::fmt;

/// This raftlock's release.
pub const RAFTLOCK: &str = env!("CARGO_PKG_VERSION");
/// The etcd API raftlock implements: `Maintenance.Status.version`, and the
/// cluster version etcd's clients are shown.
pub const ETCD_API: &str = "3.5.0";
/// The etcd API as etcdctl prints it (major.minor).
pub const ETCD_API_MINOR: &str = "3.5";
/// The commit this binary was built from, when the build said so.
pub const GIT_SHA: &str = match option_env!("RAFTLOCK_GIT_SHA") {
    Some(sha) => sha,
    None => "unknown",
};
/// The compiler that built this binary.
pub const RUSTC: &str = env!("RAFTLOCK_RUSTC_VERSION");

/// What `raftlock --version` (and `raftlockctl --version`) print after the
/// program's name: the release, the commit, the etcd API level, the compiler.
pub fn long() -> &'static str {
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LONG.get_or_init(|| format!("{RAFTLOCK}\nGit SHA: {GIT_SHA}\netcd API: {ETCD_API}\nRust: {RUSTC}"))
}

/// A release number, major.minor.patch (pre-release and build suffixes are
/// not used by raftlock, and are refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version { major, minor, patch }
    }

    /// This binary's release.
    pub fn current() -> Version {
        Version::parse(RAFTLOCK).expect("Cargo.toml's version is major.minor.patch")
    }

    /// `major.minor.patch`, each a decimal number; anything else is `None`.
    pub fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.');
        let mut next = || -> Option<u32> {
            let part = parts.next()?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 9 {
                return None;
            }
            part.parse().ok()
        };
        let v = Version { major: next()?, minor: next()?, patch: next()? };
        parts.next().is_none().then_some(v)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order_as_numbers() {
        assert_eq!(Version::parse("0.10.2"), Some(Version::new(0, 10, 2)));
        assert!(Version::new(0, 10, 0) > Version::new(0, 9, 7));
        assert!(Version::new(1, 0, 0) > Version::new(0, 99, 99));
        for bad in ["", "1", "1.2", "1.2.3.4", "1.-2.3", "1.2.3-rc1", "a.b.c", "1..3", "9999999999.0.0"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Version::new(3, 5, 0).to_string(), "3.5.0");
    }

    #[test]
    fn this_release_and_the_etcd_api_level_parse() {
        assert_eq!(Version::current().to_string(), RAFTLOCK);
        let api = Version::parse(ETCD_API).unwrap();
        assert_eq!(format!("{}.{}", api.major, api.minor), ETCD_API_MINOR);
        assert!(long().starts_with(RAFTLOCK) && long().contains(ETCD_API) && long().contains(GIT_SHA));
    }
}
