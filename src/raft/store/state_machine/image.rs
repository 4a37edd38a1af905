//! The snapshot image: the whole applied state in one encoding, as
//! snapshots sent to a lagging follower, local checkpoints and backups
//! (`raftlock restore`) carry it. Decoded with stored versions, captured
//! from the live state with shared ones ([`CapturedImage`]), which encode
//! the same.
//!
//! Invariants: the first byte names the image's format; every format ever
//! written still decodes (older ones with the parts they lack empty, read
//! by `migrate`); an
//! image is checked ([`SnapshotImage::check`]) before it is installed, so a
//! damaged or hostile one is refused rather than half-installed.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::base::codec::DecodeError;
use crate::model::alarm::Alarms;
use crate::model::applied::{AppliedState, MemberAttrs};
use crate::model::auth::AuthStore;
use crate::model::lease::LeaseTable;
use crate::model::mvcc::{MvccStore, Revision, SharedVersion, StoredVersion};

/// The content of a snapshot, a checkpoint and a backup. Decoded with stored
/// versions; captured from the live state with shared ones
/// ([`CapturedImage`]), which encode the same.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotImage<V = StoredVersion> {
    pub revision: Revision,
    pub compact_revision: Revision,
    pub versions: Vec<V>,
    pub members: Vec<(u64, MemberAttrs)>,
    /// (id, granted TTL); attached keys are found again from the versions.
    pub leases: Vec<(i64, i64)>,
    /// Users, roles, whether auth is on. Added after the first format: an
    /// image without it decodes with the empty store (see `decode`).
    pub auth: AuthStore,
    /// The alarms raised. Added in the third format: an older image decodes
    /// with none.
    pub alarms: Alarms,
}

/// The first byte of an image that also holds the alarms: the current format.
pub(super) const IMAGE_WITH_ALARMS: u8 = 3;

/// Encode a captured image, tagged as the current format, into one buffer
/// (sized first, so that it is allocated once).
pub(super) fn encode_image(image: &CapturedImage) -> Vec<u8> {
    let size = bincode::serialized_size(image).expect("sizing in memory cannot fail") as usize;
    let mut bytes = Vec::with_capacity(1 + size);
    write_image(image, &mut bytes).expect("writing to memory cannot fail");
    bytes
}

/// Stream a captured image, tagged as the current format, into `out`;
/// returns the bytes written.
pub(super) fn write_image(image: &CapturedImage, out: &mut dyn Write) -> io::Result<u64> {
    struct Counting<'a> {
        out: &'a mut dyn Write,
        bytes: u64,
    }
    impl Write for Counting<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = self.out.write(buf)?;
            self.bytes += n as u64;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            self.out.flush()
        }
    }
    let mut counting = Counting { out, bytes: 0 };
    counting.write_all(&[IMAGE_WITH_ALARMS])?;
    bincode::serialize_into(&mut counting, image).map_err(|e| match *e {
        bincode::ErrorKind::Io(e) => e,
        other => io::Error::other(other),
    })?;
    Ok(counting.bytes)
}

/// The state captured on the apply path: the versions share their
/// key-values with the store, so capturing copies no keys or values (but
/// tombstones' keys), and encoding can happen elsewhere, later.
pub(super) type CapturedImage = SnapshotImage<SharedVersion>;

impl SnapshotImage {
    /// Decode an image of the current format, or of an older one
    /// (`migrate::read_older_image`: the parts it lacks empty; one of the
    /// first format must be whole, so that an image of a later format is
    /// never taken for one of the first).
    pub fn decode(bytes: &[u8]) -> Result<SnapshotImage, DecodeError> {
        Self::read(bytes, bytes.len() as u64)
    }

    /// [`SnapshotImage::decode`] from a reader of `len` bytes (a file),
    /// streamed: the image is never held encoded in memory. Bounded as
    /// `base::codec::decode` is: no length inside may claim more than `len`.
    pub fn read(reader: impl Read, len: u64) -> Result<SnapshotImage, DecodeError> {
        let image = Self::read_unchecked(reader, len)?;
        image.check().map_err(|why| DecodeError::Malformed(Box::new(bincode::ErrorKind::Custom(why))))?;
        Ok(image)
    }

    /// What installing an image takes for granted (`MvccStore::restore`'s
    /// invariants), checked: an image that breaks them — damaged on disk
    /// past its checksum, or sent by a broken or hostile peer — is refused
    /// as malformed rather than stopping the member that installs it.
    fn check(&self) -> Result<(), String> {
        if self.compact_revision > self.revision {
            return Err(format!("compact revision {} above revision {}", self.compact_revision, self.revision));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.versions.len());
        for v in &self.versions {
            if v.kv.as_ref().is_some_and(|kv| kv.key != v.key) {
                return Err("a version's key-value names another key".into());
            }
            if v.revision > self.revision {
                return Err(format!("a version at revision {} above the image's {}", v.revision, self.revision));
            }
            if !seen.insert((v.key.as_slice(), v.revision, v.sub)) {
                return Err(format!("two versions of one key at ({}, {})", v.revision, v.sub));
            }
        }
        Ok(())
    }

    fn read_unchecked(mut reader: impl Read, len: u64) -> Result<SnapshotImage, DecodeError> {
        use bincode::Options;
        let mut tag = [0u8];
        reader.read_exact(&mut tag).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => DecodeError::Empty,
            _ => DecodeError::Malformed(Box::new(bincode::ErrorKind::Io(e))),
        })?;
        let options = || bincode::DefaultOptions::new().with_fixint_encoding().with_limit(len.saturating_sub(1));
        match tag[0] {
            IMAGE_WITH_ALARMS => Ok(options().deserialize_from(reader)?),
            older => match super::migrate::read_older_image(older, reader, options()) {
                Some(old) => old.map(|old| SnapshotImage {
                    revision: old.revision,
                    compact_revision: old.compact_revision,
                    versions: old.versions,
                    members: old.members,
                    leases: old.leases,
                    auth: old.auth,
                    alarms: Alarms::default(),
                }),
                None => Err(DecodeError::UnknownFormat(older)),
            },
        }
    }

    /// Read the image that `file` holds, from its start.
    pub fn read_file(mut file: std::fs::File) -> anyhow::Result<SnapshotImage> {
        use std::io::Seek;
        file.seek(io::SeekFrom::Start(0))?;
        let len = file.metadata()?.len();
        Ok(SnapshotImage::read(io::BufReader::with_capacity(1 << 20, file), len)?)
    }

    /// Make `state` this image, all at once (in the state's lock order): no
    /// reader sees the new store with the old leases or members.
    pub fn install(self, state: &AppliedState) {
        let mut mvcc = state.mvcc_mut();
        let mut leases = state.leases_mut();
        let mut members = state.members_mut();
        let spill = mvcc.spill().map(crate::model::mvcc::Spill::fresh);
        *mvcc = MvccStore::restore(self.versions, self.revision, self.compact_revision);
        if let Some(spill) = spill {
            mvcc.spill_into(spill);
        }
        *leases = LeaseTable::restore(self.leases, mvcc.leased_keys());
        *members = self.members.into_iter().collect();
        *state.auth_mut() = self.auth;
        *state.alarms_mut() = self.alarms;
        // Tokens handed out or forgotten by the entries the snapshot skipped
        // are unknown here: forget them all (clients authenticate again).
        state.tokens().forget_all();
    }
}

/// The whole applied state, consistent: every lock is held at once (in the
/// state's lock order), so no apply falls between the parts.
pub(super) fn image_of(state: &AppliedState) -> CapturedImage {
    let mvcc = state.mvcc();
    let leases = state.leases();
    let members = state.members();
    let auth = state.auth();
    let alarms = state.alarms();
    SnapshotImage {
        revision: mvcc.revision(),
        compact_revision: mvcc.compact_revision(),
        versions: mvcc.shared_versions().collect(),
        members: members.iter().map(|(id, a)| (*id, a.clone())).collect(),
        leases: leases.grants(),
        auth: auth.clone(),
        alarms: alarms.clone(),
    }
}

/// The member's applied state, encoded as a snapshot is, and its revision:
/// what Maintenance.Snapshot streams to a backup file.
pub fn encode_state(state: &AppliedState) -> (Vec<u8>, Revision) {
    let image = image_of(state);
    (encode_image(&image), image.revision)
}
