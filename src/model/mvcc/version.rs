//! One key's history: its versions in revision order ([`Version`]: a value
//! in memory, a superseded value in the spill, or a tombstone), and the
//! few operations every read and write of the store makes on it.
//!
//! Invariants: a key's versions strictly increase by `(revision, sub)`; a
//! history never starts with a tombstone; only a key's newest version is
//! guaranteed to be in memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::spill::{Spill, Spilled};
use super::{version_bytes, KeyValue, Revision};

/// One version of a key: its value at `(revision, sub)`, or a tombstone.
#[derive(Clone, Debug)]
pub(super) struct Version {
    pub(super) revision: Revision,
    pub(super) sub: i64,
    pub(super) held: Held,
}

/// Where a version's key-value is.
#[derive(Clone, Debug)]
pub(super) enum Held {
    Tombstone,
    /// In memory (every key's newest version, and all of them without a spill).
    Memory(Arc<KeyValue>),
    /// In the spill: a superseded version.
    Spilled(Spilled),
}

impl Version {
    pub(super) fn is_live(&self) -> bool {
        !matches!(self.held, Held::Tombstone)
    }

    /// The key-value of a live version held in memory (a key's newest
    /// version always is); `None` for a tombstone or a spilled version.
    pub(super) fn live_kv(&self) -> Option<&Arc<KeyValue>> {
        match &self.held {
            Held::Memory(kv) => Some(kv),
            _ => None,
        }
    }

    /// The length of the value; `None` for a tombstone.
    pub(super) fn value_len(&self) -> Option<usize> {
        match &self.held {
            Held::Tombstone => None,
            Held::Memory(kv) => Some(kv.value.len()),
            Held::Spilled(s) => Some(s.value_len()),
        }
    }
}

/// Run `f` on the history of `key` in `index` (empty if it has none yet):
/// one search of the index when the key exists, and the key is copied into
/// the index only when it does not.
pub(super) fn with_history<R>(
    index: &mut BTreeMap<Vec<u8>, Vec<Version>>,
    key: &[u8],
    f: impl FnOnce(&mut Vec<Version>) -> R,
) -> R {
    let versions = match index.get_mut(key) {
        Some(versions) => versions,
        None => index.entry(key.to_vec()).or_default(),
    };
    f(versions)
}

/// Whether a key's newest version is live (not a tombstone).
pub(super) fn newest_is_live(versions: &[Version]) -> bool {
    versions.last().is_some_and(Version::is_live)
}

/// Append `version` to a key's history, counting its size, and move the
/// version it supersedes to the spill (if there is one).
pub(super) fn push_onto(
    versions: &mut Vec<Version>,
    spill: &mut Option<Spill>,
    bytes: &mut u64,
    key: &[u8],
    version: Version,
) {
    *bytes += version_bytes(key, version.value_len());
    if let Some(last) = versions.last_mut() {
        assert!((last.revision, last.sub) < (version.revision, version.sub), "versions of a key must increase");
        if let Some(spill) = spill {
            spill_version(spill, key, last);
        }
    } else {
        assert!(version.is_live(), "a key's history cannot start with a tombstone");
    }
    versions.push(version);
}

/// Move a version's key-value to the spill, if it is in memory and the spill
/// takes it.
pub(super) fn spill_version(spill: &mut Spill, key: &[u8], v: &mut Version) {
    if let Held::Memory(kv) = &v.held {
        debug_assert_eq!(kv.key, key);
        if let Some(spilled) = spill.append(kv) {
            v.held = Held::Spilled(spilled);
        }
    }
}

/// The version a read at `rev` sees in a key's history (a tombstone
/// included): `None` when the key did not exist yet.
pub(super) fn visible_at(versions: &[Version], rev: Revision) -> Option<&Version> {
    // Nearly every read is at the current revision, which the newest version
    // answers: no search. A key written often (a lock's key gains two versions
    // per lock and unlock) has a long history, and searching it costs a cache
    // miss per step.
    let visible = match versions.last() {
        Some(newest) if newest.revision <= rev => versions.len(),
        _ => versions.partition_point(|v| v.revision <= rev),
    };
    versions[..visible].last()
}
