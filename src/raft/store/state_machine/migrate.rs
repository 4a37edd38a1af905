//! Stores and images written by older raftlocks: every reader of a layout
//! or an encoding that raftlock no longer writes, in one place, and how
//! each is retired.
//!
//! - **Images of formats 1 and 2** (before the auth store, then before the
//!   alarms were part of the image): [`read_older_image`] decodes them with
//!   the parts they lack empty. They live on in backups and could arrive as
//!   snapshots from a member of an old build, so they are read for ever.
//! - **The checkpoint as a sled value** (`c`, which the state store kept in
//!   its `large` tree) and **the journal as sled records** (`j<seq:8 BE>`,
//!   one `[JournalOp]` per apply call, the counters of the last one in
//!   `m/...`): [`legacy_checkpoint`] and [`legacy_journal`] read them at
//!   restore; the first checkpoint after that deletes them ([`retire`]), so
//!   each store is read this way at most until its next checkpoint.
//!
//! All three predate release 0.1.0, whose data directories (format 1,
//! `storage::format`) may still hold them if they were created by an older
//! build and never checkpointed since. A later data format that changes
//! the layout again adds its reader here, with how it is retired.
//!
//! This module reads bytes and older encodings only; the image and the
//! layout decode what it found into their own types (so that it sits below
//! both, and they never depend on each other through it).
//!
//! Caveat: the state store removes the `large` tree's entries as the keys
//! they belong to are deleted (`storage`), so that mechanism stays there;
//! which key was ever in it (`c` only) is known here.

use std::io::Read;

use serde::Deserialize;

use crate::base::codec::{DecodeError, FORMAT_V1};
use crate::model::applied::MemberAttrs;
use crate::model::auth::AuthStore;
use crate::model::mvcc::{Revision, StoredVersion};
use crate::storage::{StateBatch, StateStore};

/// Where older raftlocks kept the checkpoint: a sled value (in the state
/// store's `large` tree).
const LEGACY_CHECKPOINT: &[u8] = b"c";
/// The prefix of the journal's sled records.
const JOURNAL_PREFIX: u8 = b'j';
/// The first byte of an image of format 2 (with the auth store, without
/// alarms); format 1 starts with the encoding's own format byte.
pub(super) const IMAGE_WITH_AUTH: u8 = 2;

/// The image as written before alarms were part of it (format 2), and what
/// [`read_older_image`] makes of either older format (format 1's with the
/// empty auth store).
#[derive(Deserialize)]
pub(super) struct ImageWithoutAlarms {
    pub revision: Revision,
    pub compact_revision: Revision,
    pub versions: Vec<StoredVersion>,
    pub members: Vec<(u64, MemberAttrs)>,
    pub leases: Vec<(i64, i64)>,
    pub auth: AuthStore,
}

/// The image as written before the auth store was part of it (format 1).
#[derive(Deserialize)]
struct ImageWithoutAuth {
    revision: Revision,
    compact_revision: Revision,
    versions: Vec<StoredVersion>,
    members: Vec<(u64, MemberAttrs)>,
    leases: Vec<(i64, i64)>,
}

/// The rest of an image whose first byte was `tag`, if `tag` names an
/// older format (`None`: it does not); `options` bound the decoding as for
/// the current format.
pub(super) fn read_older_image<O: bincode::Options>(
    tag: u8,
    mut reader: impl Read,
    options: O,
) -> Option<Result<ImageWithoutAlarms, DecodeError>> {
    match tag {
        IMAGE_WITH_AUTH => Some(options.deserialize_from(reader).map_err(DecodeError::from)),
        FORMAT_V1 => Some((|| {
            let old: ImageWithoutAuth = options.deserialize_from(&mut reader)?;
            // Whole, and nothing after it: a format-1 image has no length of
            // its own, so bytes left over mean it was not one.
            let mut rest = [0u8];
            if reader.read(&mut rest).map_err(|e| DecodeError::Malformed(Box::new(bincode::ErrorKind::Io(e))))? != 0 {
                return Err(DecodeError::Malformed(Box::new(bincode::ErrorKind::Custom(
                    "bytes left after an image of the first format".into(),
                ))));
            }
            Ok(ImageWithoutAlarms {
                revision: old.revision,
                compact_revision: old.compact_revision,
                versions: old.versions,
                members: old.members,
                leases: old.leases,
                auth: AuthStore::default(),
            })
        })()),
        _ => None,
    }
}

/// The encoded image of the checkpoint an older raftlock kept as a sled
/// value (in the main tree at first, then in the `large` one).
pub(super) fn legacy_checkpoint(db: &StateStore) -> std::io::Result<Option<Vec<u8>>> {
    match db.get(LEGACY_CHECKPOINT)? {
        Some(v) => Ok(Some(v)),
        None => db.legacy_large_value(LEGACY_CHECKPOINT),
    }
}

/// The journal records (each an encoded `[JournalOp]`) an older raftlock
/// kept in sled after checkpoint `checkpoint_seq`, in order.
pub(super) fn legacy_journal(db: &StateStore, checkpoint_seq: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut records = Vec::new();
    for item in db.scan_prefix(&[JOURNAL_PREFIX]) {
        let (k, v) = item?;
        let record_seq = u64::from_be_bytes(k[1..9].try_into()?);
        if record_seq > checkpoint_seq {
            records.push(v);
        }
    }
    Ok(records)
}

/// Into the batch of a checkpoint taken after call `seq` (the one before
/// it after `previous_seq`): delete the legacy checkpoint, and with
/// `journal`, the legacy journal's records it replaces.
pub(super) fn retire(batch: &mut StateBatch, previous_seq: u64, seq: u64, journal: bool) {
    batch.deletes.push(LEGACY_CHECKPOINT.to_vec());
    if journal {
        batch.deletes.extend((previous_seq + 1..=seq).map(journal_key));
    }
}

/// The sled key of the legacy journal's record `seq`.
fn journal_key(seq: u64) -> Vec<u8> {
    let mut k = vec![JOURNAL_PREFIX];
    k.extend_from_slice(&seq.to_be_bytes());
    k
}
