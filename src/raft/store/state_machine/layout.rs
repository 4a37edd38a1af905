//! The state machine's persisted layout in the state store: the journal of
//! apply calls, checkpoints that replace it, the counters, and restore.
//!
//! Each apply call becomes one *journal frame*, appended to the journal file
//! of the last checkpoint: every change the call made, with the last applied
//! log id and the counters after it (and the membership, when it changed). The entries are already
//! durable in the WAL, so the state store may lag: after a crash its journal
//! ends at some frame (a torn one is cut off), and openraft applies the later
//! log entries again — the same results, since apply is deterministic. The
//! WAL drops entries only after a `StateStore::sync`, which makes the
//! journal durable first.
//!
//! Keys (sled) and files (the state store's file directory):
//! ```text
//!   m/checkpoint   -> seq              the last checkpoint: the whole state after call `seq`,
//!   file checkpoint-<seq:016x>.image   ... a SnapshotImage
//!   file journal-<seq:016x>            ... and the frames of the calls after it (JournalFrame)
//!   m/applied, m/membership, m/revision, m/compact, m/seq     counters as of the checkpoint
//! ```
//! (and the layouts of older raftlocks, read and retired by `migrate`).
//! A checkpoint is streamed into its file on the state store's writer
//! thread (never encoded whole into memory), and that file is durable
//! before the batch that names it (see `storage`). The checkpoint's batch
//! retires the journal file it replaces once it is durable; until then a
//! restart reads the old checkpoint and journal.
//! Why a journal and not one sled key per MVCC version: sled's cost is per key
//! written, and one record per apply call (which carries a whole proposal
//! batch) cut a member's write CPU by about a quarter. Why a file and not
//! sled: sled kept the journal's values in memory, far past its page cache
//! (150-220 MB of a member's heap after 100k puts of 1 KiB). Restart = load
//! the checkpoint, replay the journal after it.
//!
//! A new checkpoint replaces the journal once the journal since the last one
//! holds as many bytes as that checkpoint did, and at least
//! [`CHECKPOINT_MIN_BYTES`](crate::base::limits::CHECKPOINT_MIN_BYTES). A checkpoint costs in proportion to the state,
//! which (without compaction) grows with every write; with a fixed interval,
//! checkpoint work per write would grow with the state too. Under this rule
//! each checkpoint is paid for by at least as many journal bytes, so it costs
//! at most about two bytes of encoding per journal byte written, however large
//! the state gets. Each member stretches the interval by its own share (up to a
//! half, derived from its id), so that the members of a cluster, which apply
//! the same entries, do not all checkpoint at the same moment.
//!
//! The image a checkpoint holds is also the snapshot format (sent to a member
//! the purged log cannot catch up) and the backup format (Maintenance.Snapshot,
//! [`encode_state`]). A snapshot openraft asks for *is* a checkpoint, taken
//! then ([`Persisted::checkpoint_as_snapshot`]): its file gets the snapshot's
//! name as a second name, so the state is written once for both, and the
//! checkpoint resets the journal count, so the regular checkpoint rule rarely
//! fires between snapshots (whose own rule, `raft::store::log_bound`, is the same
//! size rule on the log).
//!
//! Caveat: a restart replays up to about 1.5 × max(64 MiB, the checkpoint's
//! size) of journal after loading the checkpoint. For a small state that is far
//! more journal than state (the price of never checkpointing a small store
//! often).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::StoredMembership;
use serde::{Deserialize, Serialize};

use super::image::{image_of, write_image, SnapshotImage};
use crate::base::codec::{decode, encode};
use crate::model::alarm::Alarms;
use crate::model::applied::{AppliedState, MemberAttrs};
use crate::model::auth::AuthStore;
use crate::model::lease::LeaseTable;
use crate::model::mvcc::{MvccStore, Revision, SharedVersion, StoredVersion};
use crate::raft::types::{LogId, MemberNode};
use crate::storage::{StateBatch, StateStore};

const APPLIED: &[u8] = b"m/applied";
const MEMBERSHIP: &[u8] = b"m/membership";
const REVISION: &[u8] = b"m/revision";
const COMPACT: &[u8] = b"m/compact";
const SEQ: &[u8] = b"m/seq";
const CHECKPOINT_SEQ: &[u8] = b"m/checkpoint";

pub(super) type Membership = StoredMembership<u64, MemberNode>;

/// One change in the journal, replayed in order on restart. Appended to
/// only, as the log's `Command` is: records written by an older raftlock
/// must replay the same. Read back with its versions as [`StoredVersion`]s;
/// written with them as [`SharedVersion`]s, which share the store's
/// key-values and encode the same.
#[derive(Serialize, Deserialize)]
pub(super) enum JournalOp<V = StoredVersion> {
    Version(V),
    Compact(Revision),
    Member(u64, MemberAttrs),
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke(i64),
    /// A member left the configuration: its published attributes go.
    MemberGone(u64),
    /// The auth store after a change, whole.
    Auth(AuthStore),
    /// The alarms after a change, whole.
    Alarms(Alarms),
}

/// One apply call in the journal file: its changes and where apply stood
/// after it. Encoded from [`JournalFrameRef`] (the same fields, borrowed).
#[derive(Deserialize)]
struct JournalFrame {
    seq: u64,
    last_applied: Option<LogId>,
    /// The membership, when it differs from the one before this frame.
    membership: Option<Membership>,
    revision: Revision,
    compact: Revision,
    ops: Vec<JournalOp>,
}

#[derive(Serialize)]
struct JournalFrameRef<'a> {
    seq: u64,
    last_applied: &'a Option<LogId>,
    membership: Option<&'a Membership>,
    revision: Revision,
    compact: Revision,
    ops: &'a [JournalOp<SharedVersion>],
}

/// Decode every journal frame in `bytes` (the fuzz targets' entry).
#[cfg(fuzzing)]
pub(super) fn fuzz_journal(bytes: &[u8]) {
    for body in crate::storage::framing::bodies(bytes) {
        let _ = decode::<JournalFrame>(body);
    }
}

fn journal_file(checkpoint_seq: u64) -> String {
    format!("{}{checkpoint_seq:016x}", crate::storage::JOURNAL_FILE_PREFIX)
}

/// The name of the file holding the checkpoint after apply call `seq`.
fn checkpoint_file(seq: u64) -> String {
    format!("checkpoint-{seq:016x}.image")
}

/// Where the applied state stands in the state store: the journal's
/// numbering and the checkpoint policy's counts.
pub(super) struct Persisted {
    db: StateStore,
    /// The number of the last journal record written.
    pub seq: u64,
    /// The journal record the last checkpoint covers up to.
    pub checkpoint_seq: u64,
    /// Journal bytes written since the last checkpoint.
    pub journal_bytes: u64,
    /// The fewest journal bytes between checkpoints.
    checkpoint_min: u64,
    /// This member's stretch of the interval, in 1/2048ths (below 1024).
    checkpoint_stretch: u64,
    /// The size of the last checkpoint, once encoded (on the state store's
    /// writer thread, hence shared).
    pub checkpoint_bytes: Arc<AtomicU64>,
    /// The log id of the membership the store last wrote (frames carry the
    /// membership only when it changed).
    membership_written: Option<LogId>,
    /// The journal has records in sled, as older raftlocks kept it: the next
    /// checkpoint deletes them (`migrate`).
    legacy_journal: bool,
}

/// Where apply stands: the last entry applied and the configuration.
pub(super) struct Position {
    pub last_applied: Option<LogId>,
    pub membership: Membership,
}

impl Persisted {
    /// Load the persisted state into `state` (which must be empty): the
    /// checkpoint, then every journal record after it.
    pub fn restore(db: StateStore, state: &AppliedState, checkpoint_min: u64) -> anyhow::Result<(Persisted, Position)> {
        fn get<T: for<'de> Deserialize<'de>>(db: &StateStore, key: &[u8]) -> anyhow::Result<Option<T>> {
            match db.get(key)? {
                Some(b) => Ok(Some(decode(&b)?)),
                None => Ok(None),
            }
        }
        let mut last_applied: Option<LogId> = get(&db, APPLIED)?.flatten();
        let mut membership: Membership = get(&db, MEMBERSHIP)?.unwrap_or_default();
        let mut revision: Revision = get(&db, REVISION)?.unwrap_or(1);
        let mut compact: Revision = get(&db, COMPACT)?.unwrap_or(-1);
        let mut seq: u64 = get(&db, SEQ)?.unwrap_or(0);
        let checkpoint_seq: u64 = get(&db, CHECKPOINT_SEQ)?.unwrap_or(0);

        // The checkpoint: its file, or where an older raftlock kept it. A
        // file of no checkpoint (an older one, or a snapshot's) is stale, and
        // so is a journal other than this checkpoint's (an older one, or the
        // next one's when its checkpoint never became durable).
        let file = checkpoint_file(checkpoint_seq);
        let journal = journal_file(checkpoint_seq);
        for name in db.file_names()? {
            if name != file && name != journal {
                std::fs::remove_file(db.files_dir().join(name))?;
            }
        }
        let path = db.files_dir().join(&file);
        let (checkpoint, checkpoint_bytes) = if path.exists() {
            (Some(SnapshotImage::read_file(std::fs::File::open(&path)?)?), std::fs::metadata(&path)?.len())
        } else if let Some(b) = super::migrate::legacy_checkpoint(&db)? {
            (Some(SnapshotImage::decode(&b)?), b.len() as u64)
        } else {
            anyhow::ensure!(checkpoint_seq == 0, "state store: checkpoint {checkpoint_seq} is missing ({file})");
            (None, 0)
        };
        let (mut mvcc, mut members, mut leases, mut auth, mut alarms) = match checkpoint {
            Some(image) => (
                MvccStore::restore(image.versions, image.revision, image.compact_revision),
                image.members.into_iter().collect(),
                image.leases.into_iter().collect(),
                image.auth,
                image.alarms,
            ),
            None => (MvccStore::default(), BTreeMap::new(), BTreeMap::new(), AuthStore::default(), Alarms::default()),
        };
        let mut journal_bytes = 0;
        let mut legacy_journal = false;
        let mut replay = |ops: Vec<JournalOp>| -> anyhow::Result<()> {
            for op in ops {
                match op {
                    JournalOp::Version(v) => mvcc.replay(v),
                    JournalOp::Compact(rev) => {
                        mvcc.compact(rev).map_err(|e| anyhow::anyhow!("journal: compaction at {rev}: {e}"))?;
                        mvcc.sweep(usize::MAX);
                    }
                    JournalOp::Member(id, attrs) => {
                        members.insert(id, attrs);
                    }
                    JournalOp::LeaseGrant { id, ttl } => {
                        leases.insert(id, ttl);
                    }
                    JournalOp::LeaseRevoke(id) => {
                        leases.remove(&id);
                    }
                    JournalOp::MemberGone(id) => {
                        members.remove(&id);
                    }
                    JournalOp::Auth(store) => auth = store,
                    JournalOp::Alarms(raised) => alarms = raised,
                }
            }
            Ok(())
        };
        // The journal as an older raftlock kept it, in sled.
        for record in super::migrate::legacy_journal(&db, checkpoint_seq)? {
            journal_bytes += record.len() as u64;
            legacy_journal = true;
            replay(decode(&record)?)?;
        }
        // The journal file: each frame carries the counters after it.
        let journal = db.files_dir().join(&journal);
        if journal.exists() {
            let frames = crate::storage::read_journal(&journal)?;
            journal_bytes += frames.len() as u64;
            for f in crate::storage::framing::bodies(&frames) {
                let f: JournalFrame = decode(f)?;
                anyhow::ensure!(f.seq > seq, "journal: frame {} follows {seq}", f.seq);
                replay(f.ops)?;
                (seq, last_applied, revision, compact) = (f.seq, f.last_applied, f.revision, f.compact);
                if let Some(changed) = f.membership {
                    membership = changed;
                }
            }
        }
        anyhow::ensure!(
            mvcc.revision() <= revision && mvcc.compact_revision() == compact,
            "state store is inconsistent: journal ends at revision {} (compacted at {}), counters say {revision} ({compact})",
            mvcc.revision(),
            mvcc.compact_revision()
        );
        mvcc.set_revision(revision);
        *state.leases_mut() = LeaseTable::restore(leases, mvcc.leased_keys());
        *state.mvcc_mut() = mvcc;
        *state.members_mut() = members;
        *state.auth_mut() = auth;
        *state.alarms_mut() = alarms;
        let persisted = Persisted {
            db,
            seq,
            checkpoint_seq,
            journal_bytes,
            checkpoint_min,
            checkpoint_stretch: 0,
            checkpoint_bytes: Arc::new(AtomicU64::new(checkpoint_bytes)),
            membership_written: *membership.log_id(),
            legacy_journal,
        };
        Ok((persisted, Position { last_applied, membership }))
    }

    /// The state store's file directory (snapshots are kept there too).
    pub fn files_dir(&self) -> &std::path::Path {
        self.db.files_dir()
    }

    /// Stretch the checkpoint interval by `member_id`'s share (see
    /// `StateMachine::staggering_checkpoints`).
    pub fn stagger(&mut self, member_id: u64) {
        self.checkpoint_stretch = crate::raft::store::log_bound::member_stretch(member_id);
    }

    /// Persist one apply call: its journal frame, with the counters after
    /// it, or, when one is due, a checkpoint that covers it too and the
    /// counters.
    pub fn commit_apply(&mut self, state: &AppliedState, journal: &[JournalOp<SharedVersion>], position: &Position) {
        let mut batch = StateBatch::default();
        self.seq += 1;
        let frame = {
            let mvcc = state.mvcc();
            let record = JournalFrameRef {
                seq: self.seq,
                last_applied: &position.last_applied,
                membership: (self.membership_written != *position.membership.log_id()).then_some(&position.membership),
                revision: mvcc.revision(),
                compact: mvcc.compact_revision(),
                ops: journal,
            };
            crate::storage::frame(|body| crate::base::codec::encode_onto(body, &record))
        };
        self.journal_bytes += frame.len() as u64;
        if self.checkpoint_due() {
            self.checkpoint(state, &mut batch);
            self.counters(state, position, &mut batch);
        } else {
            self.membership_written = *position.membership.log_id();
            batch.journal = Some((journal_file(self.checkpoint_seq), frame));
        }
        self.db.commit(batch);
    }

    /// Checkpoint now, in a batch of its own, and have the store name the
    /// checkpoint's file `snapshot` too once it is written: a snapshot asked
    /// for is this checkpoint, so one whole-state write serves both (and the
    /// journal starts afresh, which puts the next checkpoint off). The
    /// checkpoint is queued; [`StateStore::drain`] tells when `snapshot` is
    /// there.
    pub fn checkpoint_as_snapshot(&mut self, state: &AppliedState, position: &Position, snapshot: String) {
        let mut batch = self.checkpoint_alone(state, position);
        batch.links.push((checkpoint_file(self.checkpoint_seq), snapshot));
        self.db.commit(batch);
    }

    /// A batch of its own (no apply call's journal record) holding a
    /// checkpoint of `state` and the counters.
    fn checkpoint_alone(&mut self, state: &AppliedState, position: &Position) -> StateBatch {
        let mut batch = StateBatch::default();
        self.seq += 1;
        self.checkpoint(state, &mut batch);
        self.counters(state, position, &mut batch);
        batch
    }

    /// The state store.
    pub fn db(&self) -> &StateStore {
        &self.db
    }

    /// Replace the whole store with one checkpoint of `state` (just installed
    /// from a snapshot).
    pub fn replace_all(&mut self, state: &AppliedState, position: &Position) -> std::io::Result<()> {
        let batch = self.checkpoint_alone(state, position);
        self.db.replace_all(batch)
    }

    /// The counters every checkpoint's batch carries (journal frames carry
    /// their own).
    fn counters(&mut self, state: &AppliedState, position: &Position, batch: &mut StateBatch) {
        self.membership_written = *position.membership.log_id();
        let mvcc = state.mvcc();
        batch.puts.push((REVISION.to_vec(), encode(&mvcc.revision())));
        batch.puts.push((COMPACT.to_vec(), encode(&mvcc.compact_revision())));
        batch.puts.push((APPLIED.to_vec(), encode(&position.last_applied)));
        batch.puts.push((MEMBERSHIP.to_vec(), encode(&position.membership)));
        batch.puts.push((SEQ.to_vec(), encode(&self.seq)));
    }

    /// Add to `batch` a checkpoint of the current state that replaces every
    /// journal record since the previous checkpoint, and the previous
    /// checkpoint. The state is captured here (sharing its key-values) and
    /// streamed into the checkpoint's file on the state store's writer
    /// thread, off the apply path.
    fn checkpoint(&mut self, state: &AppliedState, batch: &mut StateBatch) {
        let image = image_of(state);
        let seq = self.seq;
        let size = self.checkpoint_bytes.clone();
        batch.files.push((
            checkpoint_file(seq),
            Box::new(move |out| {
                let started = std::time::Instant::now();
                let bytes = write_image(&image, out)?;
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(seq, bytes, write_ms = ms, "checkpoint written");
                size.store(bytes, Ordering::Relaxed);
                Ok(bytes)
            }),
        ));
        batch.puts.push((CHECKPOINT_SEQ.to_vec(), encode(&self.seq)));
        batch.retired_files.push(checkpoint_file(self.checkpoint_seq));
        batch.retired_files.push(journal_file(self.checkpoint_seq));
        super::migrate::retire(batch, self.checkpoint_seq, self.seq, self.legacy_journal);
        self.legacy_journal = false;
        self.checkpoint_seq = self.seq;
        self.journal_bytes = 0;
    }

    /// Whether the journal since the last checkpoint is due to be replaced
    /// by a new one (see the module doc). Until a checkpoint's encoding is
    /// done, the size of the one before it stands in for it.
    fn checkpoint_due(&self) -> bool {
        let interval = self.checkpoint_min.max(self.checkpoint_bytes.load(Ordering::Relaxed));
        self.journal_bytes >= interval + interval.saturating_mul(self.checkpoint_stretch) / 2048
    }
}
