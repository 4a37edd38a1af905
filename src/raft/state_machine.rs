//! The Raft state machine: applies committed commands to the MVCC store and
//! persists the result.
//!
//! Each `apply` call applies its entries to the in-memory store, then queues one
//! atomic batch for the state store: a *journal record* holding every change
//! the call made, together with the last applied log id, the membership and the
//! counters. The entries are already durable in the WAL, so the state store may
//! lag: after a crash it is behind, at a batch boundary, and openraft applies
//! the later log entries again — the same results, since apply is
//! deterministic.
//!
//! Deterministic failures (a compacted revision, an unknown lease) are results
//! (`CommandResult::Rejected`). A failure to persist is not deterministic: the
//! process aborts (see `storage`) rather than let its state diverge.
//!
//! An entry is applied only once it is durable in the local log: the leader
//! syncs its own appends while it replicates them (see `raft::log_store`).
//!
//! Persistent layout (sled keys; `c` is written deferred, so it lives in the
//! state store's tree of large values — in the main one in older stores):
//! ```text
//!   j<seq:8 BE>    -> [JournalOp]      what apply call `seq` changed, in order
//!   c              -> SnapshotImage    a checkpoint: the whole state after call
//!   m/checkpoint   -> seq              ... number `seq`; older journal records are gone
//!   m/applied, m/membership, m/revision, m/compact, m/seq     counters
//! ```
//! Why a journal and not one sled key per MVCC version: sled's cost is per key
//! written, and one record per apply call (which carries a whole proposal
//! batch) cut a member's write CPU by about a quarter. Restart = load the
//! checkpoint, replay the journal after it.
//!
//! A new checkpoint replaces the journal once the journal since the last one
//! holds as many bytes as that checkpoint did, and at least
//! [`CHECKPOINT_MIN_BYTES`]. A checkpoint costs in proportion to the state,
//! which (without compaction) grows with every write; with a fixed interval,
//! checkpoint work per write would grow with the state too. Under this rule
//! each checkpoint is paid for by at least as many journal bytes, so it costs
//! at most about two bytes of encoding per journal byte written, however large
//! the state gets. Each member stretches the interval by its own share (up to a
//! half, derived from its id), so that the members of a cluster, which apply
//! the same entries, do not all checkpoint at the same moment.
//!
//! Caveat: a restart replays up to about 1.5 × max(64 MiB, the checkpoint's
//! size) of journal after loading the checkpoint. For a small state that is far
//! more journal than state (the price of never checkpointing a small store
//! often).
//!
//! Snapshots are the whole state (every version, leases, members) encoded in
//! one buffer. openraft asks for one every `--snapshot-count` entries: the
//! state is copied on the apply path and encoded in openraft's snapshot task,
//! and the result is kept in memory as the snapshot sent to members that the
//! purged log can no longer catch up. Checkpoints are likewise captured on the
//! apply path and encoded on the state store's writer thread. The capture
//! shares the store's key-values (no copy of keys or values), but it still
//! walks every version on the apply path; and encoding and writing the whole
//! state at once shows in the latency of that moment.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError, StoredMembership};
use serde::{Deserialize, Serialize};

use super::{decode, encode, encode_large, Entry, LogId, MemberNode, TypeConfig};
use crate::command::{Command, CommandResult};
use crate::lease::LeaseTable;
use crate::mvcc::MvccError;
use crate::mvcc::{Change, KeyRange, MvccStore, Revision, SharedVersion, StoredVersion};
use crate::state::{AppliedChanges, AppliedState, MemberAttrs};
use crate::storage::wal::Durable;
use crate::storage::{StateBatch, StateDb};

const APPLIED: &[u8] = b"m/applied";
const MEMBERSHIP: &[u8] = b"m/membership";
const REVISION: &[u8] = b"m/revision";
const COMPACT: &[u8] = b"m/compact";
const SEQ: &[u8] = b"m/seq";
const CHECKPOINT_SEQ: &[u8] = b"m/checkpoint";
const CHECKPOINT: &[u8] = b"c";
const JOURNAL_PREFIX: u8 = b'j';

/// The fewest journal bytes between two checkpoints, before a member's stretch
/// (see the module doc).
pub const CHECKPOINT_MIN_BYTES: u64 = 64 << 20;

type Membership = StoredMembership<u64, MemberNode>;

/// One change in the journal, replayed in order on restart.
#[derive(Serialize, Deserialize)]
enum JournalOp {
    Version(StoredVersion),
    Compact(Revision),
    Member(u64, MemberAttrs),
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke(i64),
    /// A member left the configuration: its published attributes go.
    MemberGone(u64),
}

pub struct StateMachine {
    state: Arc<AppliedState>,
    db: StateDb,
    last_applied: Option<LogId>,
    membership: Membership,
    /// The number of the last journal record written.
    seq: u64,
    /// The journal record the last checkpoint covers up to.
    checkpoint_seq: u64,
    /// Journal bytes written since the last checkpoint.
    journal_bytes: u64,
    /// The fewest journal bytes between checkpoints.
    checkpoint_min: u64,
    /// This member's stretch of the interval, in 1/2048ths (below 1024).
    checkpoint_stretch: u64,
    /// The size of the last checkpoint, once encoded (on the state store's
    /// writer thread, hence shared).
    checkpoint_bytes: Arc<AtomicU64>,
    /// The last snapshot built, encoded: what is sent to members that are
    /// too far behind for the log.
    last_snapshot: Arc<std::sync::Mutex<Option<Snapshot<TypeConfig>>>>,
    /// When set, an entry is applied only once it is durable in the local log
    /// (the leader syncs its own appends while it replicates them: see
    /// `raft::log_store`).
    durable_log: Option<Durable>,
}

/// The content of a snapshot (and of a checkpoint). Decoded with stored
/// versions; captured from the live state with shared ones
/// ([`CapturedImage`]), which encode the same.
#[derive(Serialize, Deserialize)]
struct SnapshotImage<V = StoredVersion> {
    revision: Revision,
    compact_revision: Revision,
    versions: Vec<V>,
    members: Vec<(u64, MemberAttrs)>,
    /// (id, granted TTL); attached keys are found again from the versions.
    leases: Vec<(i64, i64)>,
}

/// The state captured on the apply path: the versions share their
/// key-values with the store, so capturing copies no keys or values (but
/// tombstones' keys), and encoding can happen elsewhere, later.
type CapturedImage = SnapshotImage<SharedVersion>;

fn journal_key(seq: u64) -> Vec<u8> {
    let mut k = vec![JOURNAL_PREFIX];
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::read_state_machine(&std::io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Load the persisted state into `state` (which must be empty): the
    /// checkpoint, then every journal record after it.
    pub fn open(db: StateDb, state: Arc<AppliedState>) -> anyhow::Result<StateMachine> {
        Self::open_with(db, state, CHECKPOINT_MIN_BYTES)
    }

    fn open_with(db: StateDb, state: Arc<AppliedState>, checkpoint_min: u64) -> anyhow::Result<StateMachine> {
        fn get<T: for<'de> Deserialize<'de>>(db: &StateDb, key: &[u8]) -> anyhow::Result<Option<T>> {
            match db.get(key)? {
                Some(b) => Ok(Some(decode(&b).map_err(anyhow::Error::msg)?)),
                None => Ok(None),
            }
        }
        let last_applied: Option<LogId> = get(&db, APPLIED)?.flatten();
        let membership: Membership = get(&db, MEMBERSHIP)?.unwrap_or_default();
        let revision: Revision = get(&db, REVISION)?.unwrap_or(1);
        let compact: Revision = get(&db, COMPACT)?.unwrap_or(-1);
        let seq: u64 = get(&db, SEQ)?.unwrap_or(0);
        let checkpoint_seq: u64 = get(&db, CHECKPOINT_SEQ)?.unwrap_or(0);

        let checkpoint = db.get(CHECKPOINT)?;
        let checkpoint_bytes = checkpoint.as_ref().map_or(0, |b| b.len() as u64);
        let (mut mvcc, mut members, mut leases) = match checkpoint {
            Some(b) => {
                let image: SnapshotImage = decode(&b).map_err(anyhow::Error::msg)?;
                (
                    MvccStore::restore(image.versions, image.revision, image.compact_revision),
                    image.members.into_iter().collect(),
                    image.leases.into_iter().collect(),
                )
            }
            None => (MvccStore::default(), std::collections::BTreeMap::new(), std::collections::BTreeMap::new()),
        };
        let mut journal_bytes = 0;
        for item in db.scan_prefix(&[JOURNAL_PREFIX]) {
            let (k, v) = item?;
            let record_seq = u64::from_be_bytes(k[1..9].try_into()?);
            if record_seq <= checkpoint_seq {
                continue;
            }
            let ops: Vec<JournalOp> = decode(&v).map_err(anyhow::Error::msg)?;
            journal_bytes += v.len() as u64;
            for op in ops {
                match op {
                    JournalOp::Version(v) => mvcc.replay(v),
                    JournalOp::Compact(rev) => {
                        mvcc.compact(rev).map_err(|e| anyhow::anyhow!("journal: compaction at {rev}: {e}"))?;
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
        Ok(StateMachine {
            state,
            db,
            last_applied,
            membership,
            seq,
            checkpoint_seq,
            journal_bytes,
            checkpoint_min,
            checkpoint_stretch: 0,
            checkpoint_bytes: Arc::new(AtomicU64::new(checkpoint_bytes)),
            last_snapshot: Default::default(),
            durable_log: None,
        })
    }

    /// Stretch this member's checkpoint interval by a share derived from its
    /// id (0 to 50%), so that the members of a cluster, which apply the same
    /// entries, do not all checkpoint at once: a checkpoint encodes and writes
    /// the whole state, and while one member does, the others still make a
    /// quorum at full speed. A snapshot install starts a member's count
    /// afresh, so phases can still meet; the stretch spreads checkpoints, it
    /// does not schedule them.
    pub fn staggering_checkpoints(mut self, member_id: u64) -> StateMachine {
        self.checkpoint_stretch = checkpoint_stretch(member_id);
        self
    }

    /// Apply entries only once `durable` says they are on stable storage.
    pub fn applying_only_durable(mut self, durable: Durable) -> StateMachine {
        self.durable_log = Some(durable);
        self
    }

    /// Record a write's changes: in the journal, in the lease table's
    /// attachments, and for the watchers.
    fn record(&self, ops: &mut Vec<JournalOp>, published: &mut Vec<Change>, changes: Vec<Change>) {
        self.state.leases_mut().track(&changes);
        ops.extend(changes.iter().map(|c| {
            JournalOp::Version(StoredVersion { revision: c.revision, sub: c.sub, key: c.key.clone(), kv: c.kv.clone() })
        }));
        published.extend(changes);
    }

    /// Apply one command of an entry appended in `term`.
    fn apply_command(
        &self,
        cmd: Command,
        term: u64,
        ops: &mut Vec<JournalOp>,
        published: &mut Vec<Change>,
    ) -> CommandResult {
        if let Command::Batch(cmds) = cmd {
            return CommandResult::Batch(
                cmds.into_iter()
                    .map(|c| {
                        assert!(!matches!(c, Command::Batch(_)), "batches are never nested");
                        self.apply_command(c, term, ops, published)
                    })
                    .collect(),
            );
        }
        let mut mvcc = self.state.mvcc_mut();
        let rejected = |error, mvcc: &MvccStore| CommandResult::Rejected { error, revision: mvcc.revision() };
        match cmd {
            Command::Put(req) => {
                // The lease guard must be gone before `record` locks the table.
                let outcome = mvcc.put(&req, &*self.state.leases());
                match outcome {
                    Ok((result, changes)) => {
                        self.record(ops, published, changes);
                        CommandResult::Put(result)
                    }
                    Err(e) => rejected(e, &mvcc),
                }
            }
            Command::DeleteRange(req) => {
                let (result, changes) = mvcc.delete_range(&req);
                self.record(ops, published, changes);
                CommandResult::DeleteRange(result)
            }
            Command::Txn(req) => {
                let outcome = mvcc.txn(&req, &*self.state.leases());
                match outcome {
                    Ok((result, changes)) => {
                        self.record(ops, published, changes);
                        CommandResult::Txn(result)
                    }
                    Err(e) => rejected(e, &mvcc),
                }
            }
            Command::LeaseGrant { id, ttl } => {
                if self.state.leases_mut().grant(id, ttl) {
                    ops.push(JournalOp::LeaseGrant { id, ttl });
                    CommandResult::LeaseGranted { id, ttl, revision: mvcc.revision() }
                } else {
                    rejected(MvccError::LeaseExists, &mvcc)
                }
            }
            Command::LeaseExpire { term: decided_in, .. } if decided_in != term => {
                CommandResult::ExpiryOfAnotherTerm { revision: mvcc.revision() }
            }
            Command::LeaseRevoke { id } | Command::LeaseExpire { id, .. } => {
                let keys = self.state.leases_mut().revoke(id);
                match keys {
                    Some(keys) => {
                        ops.push(JournalOp::LeaseRevoke(id));
                        let (revision, changes) = mvcc.delete_keys(&keys);
                        self.record(ops, published, changes);
                        CommandResult::LeaseRevoked { revision }
                    }
                    None => rejected(MvccError::LeaseNotFound, &mvcc),
                }
            }
            Command::Compact { revision } => match mvcc.compact(revision) {
                Ok(_) => {
                    ops.push(JournalOp::Compact(revision));
                    CommandResult::Compacted { revision: mvcc.revision() }
                }
                Err(e) => rejected(e, &mvcc),
            },
            Command::PublishMember { id, name, client_urls } => {
                // A publish that commits after its member was removed is
                // void: a member added back must start as a new one.
                if self.membership.membership().get_node(&id).is_some() {
                    let attrs = MemberAttrs { name, client_urls };
                    ops.push(JournalOp::Member(id, attrs.clone()));
                    self.state.members_mut().insert(id, attrs);
                }
                CommandResult::MemberPublished { revision: mvcc.revision() }
            }
            Command::Batch(_) => unreachable!("handled above"),
        }
    }

    /// The counters every state-store batch carries.
    fn counters(&self, batch: &mut StateBatch) {
        let mvcc = self.state.mvcc();
        batch.puts.push((REVISION.to_vec(), encode(&mvcc.revision())));
        batch.puts.push((COMPACT.to_vec(), encode(&mvcc.compact_revision())));
        batch.puts.push((APPLIED.to_vec(), encode(&self.last_applied)));
        batch.puts.push((MEMBERSHIP.to_vec(), encode(&self.membership)));
        batch.puts.push((SEQ.to_vec(), encode(&self.seq)));
    }

    /// Add to `batch` a checkpoint of the current state that replaces every
    /// journal record since the previous checkpoint. The state is copied here
    /// and encoded on the state store's writer thread, off the apply path.
    fn checkpoint(&mut self, batch: &mut StateBatch) {
        let image = self.image();
        let seq = self.seq;
        let size = self.checkpoint_bytes.clone();
        batch.deferred.push((
            CHECKPOINT.to_vec(),
            Box::new(move || {
                let started = std::time::Instant::now();
                let bytes = encode_large(&image);
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(seq, bytes = bytes.len(), encode_ms = ms, "checkpoint encoded");
                size.store(bytes.len() as u64, Ordering::Relaxed);
                bytes
            }),
        ));
        batch.puts.push((CHECKPOINT_SEQ.to_vec(), encode(&self.seq)));
        batch.deletes.extend((self.checkpoint_seq + 1..=self.seq).map(journal_key));
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

    fn image(&self) -> CapturedImage {
        image_of(&self.state)
    }

    fn snapshot_meta(&self, image: &CapturedImage) -> SnapshotMeta<u64, MemberNode> {
        let id = match self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, image.revision),
            None => format!("0-0-{}", image.revision),
        };
        SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id: id }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError<u64>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if let (Some(durable), Some(last)) = (&mut self.durable_log, entries.last()) {
            durable.wait_for(last.log_id.index).await.map_err(|e| StorageIOError::write_logs(&e))?;
        }
        let mut ops = Vec::new();
        let mut published = Vec::new();
        let mut results = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let result = match entry.payload {
                EntryPayload::Blank => CommandResult::Empty,
                EntryPayload::Normal(cmd) => {
                    self.apply_command(cmd, entry.log_id.leader_id.term, &mut ops, &mut published)
                }
                EntryPayload::Membership(m) => {
                    // A member that left forgets what it published: added
                    // again, it is a new member (see `server::refuse_if_bootstrapped`).
                    let mut members = self.state.members_mut();
                    let gone: Vec<u64> = members.keys().copied().filter(|id| m.get_node(id).is_none()).collect();
                    for id in gone {
                        members.remove(&id);
                        ops.push(JournalOp::MemberGone(id));
                    }
                    drop(members);
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    CommandResult::Empty
                }
            };
            results.push(result);
        }
        let mut batch = StateBatch::default();
        self.seq += 1;
        let record = encode(&ops);
        self.journal_bytes += record.len() as u64;
        if self.checkpoint_due() {
            // The checkpoint covers this call's changes too: no journal record.
            self.checkpoint(&mut batch);
        } else {
            batch.puts.push((journal_key(self.seq), record));
        }
        self.counters(&mut batch);
        self.db.commit(batch);
        if !published.is_empty() {
            let revision = self.state.mvcc().revision();
            self.state.publish(AppliedChanges { revision, changes: published, resync: false });
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // Copy the state here, on the apply path; encode it in the builder,
        // which openraft runs in a task of its own, while apply goes on.
        let image = self.image();
        let meta = self.snapshot_meta(&image);
        SnapshotBuilder { image: Some((meta, image)), last: self.last_snapshot.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, MemberNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let image: SnapshotImage = decode(snapshot.get_ref()).map_err(sm_err)?;
        let before = self.state.mvcc().revision();
        {
            // All at once (in the state's lock order): no reader sees the new
            // store with the old leases or members.
            let mut mvcc = self.state.mvcc_mut();
            let mut leases = self.state.leases_mut();
            let mut members = self.state.members_mut();
            *mvcc = MvccStore::restore(image.versions, image.revision, image.compact_revision);
            *leases = LeaseTable::restore(image.leases, mvcc.leased_keys());
            *members = image.members.into_iter().collect();
        }
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        // The whole store becomes one checkpoint of the installed state.
        let mut batch = StateBatch::default();
        self.seq += 1;
        self.checkpoint(&mut batch);
        self.counters(&mut batch);
        self.db.replace_all(batch).map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        // Watchers and lock waiters here follow the feed: hand them what the
        // snapshot skipped over, as history still has it.
        let changes = {
            let mvcc = self.state.mvcc();
            mvcc.changes_between(&KeyRange::new(&[0], &[0]), before + 1, mvcc.revision()).map(|c| (c, mvcc.revision()))
        };
        match changes {
            Ok((changes, revision)) => self.state.publish(AppliedChanges { revision, changes, resync: false }),
            // Compacted past what followers of the feed here have seen: they
            // must look at the store again (watchers get cancelled with the
            // compact revision, lock waiters count again).
            Err(e) => {
                tracing::info!(error = %e, "an installed snapshot skipped compacted changes; feed followers resync");
                let revision = self.state.mvcc().revision();
                self.state.publish(AppliedChanges { revision, changes: Vec::new(), resync: true });
            }
        }
        tracing::info!(snapshot = %meta.snapshot_id, revision = image.revision, "installed a snapshot from the leader");
        // It is this member's snapshot now, should it have to send one.
        let data = snapshot.into_inner();
        *self.last_snapshot.lock().expect("snapshot lock poisoned") =
            Some(Snapshot { meta: meta.clone(), snapshot: Box::new(Cursor::new(data)) });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        if let Some(s) = self.last_snapshot.lock().expect("snapshot lock poisoned").as_ref() {
            let data = s.snapshot.get_ref().clone();
            return Ok(Some(Snapshot { meta: s.meta.clone(), snapshot: Box::new(Cursor::new(data)) }));
        }
        // None built since this member started (its log may be purged all the
        // same): build one now, on the apply path. Rare: once per restart.
        let mut builder = self.get_snapshot_builder().await;
        builder.build_snapshot().await.map(Some)
    }
}

/// The whole applied state, consistent: every lock is held at once (in the
/// state's lock order), so no apply falls between the parts.
fn image_of(state: &AppliedState) -> CapturedImage {
    let mvcc = state.mvcc();
    let leases = state.leases();
    let members = state.members();
    SnapshotImage {
        revision: mvcc.revision(),
        compact_revision: mvcc.compact_revision(),
        versions: mvcc.shared_versions().collect(),
        members: members.iter().map(|(id, a)| (*id, a.clone())).collect(),
        leases: leases.grants(),
    }
}

/// How much `member_id` stretches its checkpoint interval, in 1/2048ths:
/// spread over `[0, 1024)` by a multiplicative hash, since member ids are
/// random but need not be uniform in their low bits.
fn checkpoint_stretch(member_id: u64) -> u64 {
    (member_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 1024
}

/// The member's applied state, encoded as a snapshot is, and its revision:
/// what Maintenance.Snapshot streams to a backup file.
pub fn encode_state(state: &AppliedState) -> (Vec<u8>, Revision) {
    let image = image_of(state);
    (encode_large(&image), image.revision)
}

/// Encodes the state captured when the builder was made, and keeps the result
/// as the member's current snapshot.
pub struct SnapshotBuilder {
    image: Option<(SnapshotMeta<u64, MemberNode>, CapturedImage)>,
    last: Arc<std::sync::Mutex<Option<Snapshot<TypeConfig>>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let (meta, image) = self.image.take().ok_or_else(|| sm_err("snapshot already built"))?;
        let data = encode_large(&image);
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "built a snapshot");
        let snapshot = Snapshot { meta: meta.clone(), snapshot: Box::new(Cursor::new(data.clone())) };
        *self.last.lock().expect("snapshot lock poisoned") =
            Some(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) });
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{DeleteRangeRequest, PutRequest, RangeRequest};
    use openraft::{CommittedLeaderId, LogId};

    fn entry(index: u64, cmd: Command) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(cmd) }
    }

    fn put(k: &str, v: &str) -> Command {
        Command::Put(PutRequest { key: k.into(), value: v.into(), ..Default::default() })
    }

    fn dump(state: &AppliedState) -> (Vec<StoredVersion>, Revision, Revision) {
        let mvcc = state.mvcc();
        (mvcc.versions().collect(), mvcc.revision(), mvcc.compact_revision())
    }

    /// A state machine over a fresh store; the store's directory lives as
    /// long as the returned guard.
    fn fresh(checkpoint_min: u64) -> (tempfile::TempDir, StateDb, Arc<AppliedState>, StateMachine) {
        let dir = tempfile::tempdir().unwrap();
        let db = StateDb::open(dir.path()).unwrap();
        let state = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), state.clone(), checkpoint_min).unwrap();
        (dir, db, state, sm)
    }

    /// An expiry counts only in the term it was decided in: a deposed
    /// leader's expiry, appended by the next leader in a later term, is void.
    #[tokio::test]
    async fn an_expiry_is_applied_only_in_the_term_that_decided_it() {
        let (_dir, _db, state, mut sm) = fresh(1000);
        let in_term = |term: u64, index: u64, cmd: Command| Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(cmd),
        };
        sm.apply([in_term(1, 1, Command::LeaseGrant { id: 7, ttl: 5 })]).await.unwrap();
        let attached = PutRequest { key: "held".into(), value: "v".into(), lease: 7, ..Default::default() };
        sm.apply([in_term(1, 2, Command::Put(attached))]).await.unwrap();
        let results = sm.apply([in_term(2, 3, Command::LeaseExpire { id: 7, term: 1 })]).await.unwrap();
        assert_eq!(results, [CommandResult::ExpiryOfAnotherTerm { revision: 2 }]);
        assert!(state.leases().get(7).is_some(), "the lease outlived a stale expiry");
        let batch = Command::Batch(vec![Command::LeaseExpire { id: 7, term: 2 }]);
        let results = sm.apply([in_term(2, 4, batch)]).await.unwrap();
        assert_eq!(results, [CommandResult::Batch(vec![CommandResult::LeaseRevoked { revision: 3 }])]);
        assert!(state.leases().get(7).is_none());
    }

    #[tokio::test]
    async fn a_captured_image_encodes_as_a_stored_one() {
        let (_dir, _db, state, mut sm) = fresh(1000);
        let cmds = [
            put("a", "1"),
            put("b", "2"),
            put("a", "3"),
            Command::DeleteRange(DeleteRangeRequest { key: "b".into(), range_end: vec![], prev_kv: false }),
            put("b", "4"),
        ];
        for (i, cmd) in cmds.into_iter().enumerate() {
            sm.apply([entry(i as u64 + 1, cmd)]).await.unwrap();
        }
        let captured = image_of(&state);
        let mvcc = state.mvcc();
        let stored = SnapshotImage {
            revision: mvcc.revision(),
            compact_revision: mvcc.compact_revision(),
            versions: mvcc.versions().collect(),
            members: captured.members.clone(),
            leases: captured.leases.clone(),
        };
        assert_eq!(stored.versions.len(), 5, "four puts and a tombstone");
        assert_eq!(encode(&captured), encode(&stored));
    }

    #[tokio::test]
    async fn checkpoint_and_journal_replay_restore_the_same_state() {
        let (_dir, db, state, mut sm) = fresh(30);
        let mut index = 0;
        let mut next = |cmd| {
            index += 1;
            entry(index, cmd)
        };
        for i in 0..50 {
            sm.apply([next(put(&format!("k{}", i % 7), &format!("v{i}")))]).await.unwrap();
        }
        sm.apply([next(Command::Compact { revision: 40 })]).await.unwrap();
        // A batch entry, a delete and a compaction that removes the newest versions.
        let batch = Command::Batch(vec![put("b1", "x"), put("b2", "y")]);
        sm.apply([
            next(batch),
            next(Command::DeleteRange(DeleteRangeRequest { key: "k".into(), range_end: "l".into(), prev_kv: false })),
        ])
        .await
        .unwrap();
        let rev = state.mvcc().revision();
        sm.apply([next(Command::DeleteRange(DeleteRangeRequest {
            key: "b".into(),
            range_end: "c".into(),
            prev_kv: false,
        }))])
        .await
        .unwrap();
        sm.apply([next(Command::Compact { revision: rev + 1 })]).await.unwrap();
        for i in 0..5 {
            sm.apply([next(put(&format!("z{i}"), "after"))]).await.unwrap();
        }
        let before = dump(&state);
        let applied = sm.last_applied;
        assert!(sm.checkpoint_seq > 0, "a checkpoint was written");
        db.sync().unwrap();
        drop(sm);

        let restored = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), restored.clone(), 30).unwrap();
        assert_eq!(dump(&restored), before);
        assert_eq!(sm.last_applied, applied);
        let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
        assert_eq!(restored.mvcc().range(&all).unwrap().count, 5);
    }

    #[tokio::test]
    async fn members_checkpoint_at_different_points() {
        // Three member ids (derived from peer URLs and the cluster token in
        // practice); each member applies the same puts with a checkpoint due
        // after 2,000 to 3,000 journal bytes (a record here is under 100).
        let first_checkpoint = |member_id: u64| async move {
            let (_dir, _db, _state, sm) = fresh(2000);
            let mut sm = sm.staggering_checkpoints(member_id);
            for i in 1..=200 {
                sm.apply([entry(i, put("k", "v"))]).await.unwrap();
                if sm.checkpoint_seq > 0 {
                    return sm.checkpoint_seq;
                }
            }
            panic!("member {member_id:x} took no checkpoint in 200 operations");
        };
        let ids = [0x8e9e_0d3b_51f4_c6a1_u64, 0x2c1a_77f0_9b3e_44d2, 0xd04f_3a61_e8c7_1b95];
        let mut points = Vec::new();
        for id in ids {
            points.push(first_checkpoint(id).await);
        }
        points.sort_unstable();
        points.dedup();
        assert_eq!(points.len(), 3, "each member checkpoints at its own point: {points:?}");
    }

    #[tokio::test]
    async fn checkpoints_grow_rarer_as_the_state_grows() {
        // Every put adds a version, so the state only grows. With a checkpoint
        // due after max(500 bytes, the last checkpoint's size) of journal, each
        // checkpoint is about twice the one before and they come at roughly
        // doubling intervals; a fixed 500-byte interval would take hundreds.
        let (_dir, db, _state, mut sm) = fresh(500);
        let mut checkpoints = Vec::new(); // (seq, journal bytes before it, size of the one before it)
        let mut journal_before = 0;
        for i in 1..=3000u64 {
            let before = (sm.checkpoint_seq, sm.checkpoint_bytes.load(Ordering::Relaxed));
            sm.apply([entry(i, put(&format!("key-{i}"), "a value of some length"))]).await.unwrap();
            if sm.checkpoint_seq != before.0 {
                checkpoints.push((sm.checkpoint_seq, journal_before, before.1));
                // Let the writer thread encode it, so its size is known.
                db.sync().unwrap();
            }
            journal_before = sm.journal_bytes;
        }
        for &(seq, journal, previous) in &checkpoints {
            assert!(
                journal + 200 >= previous.max(500),
                "checkpoint at {seq} came after only {journal} journal bytes; the one before was {previous} bytes"
            );
        }
        assert!(
            (4..=12).contains(&checkpoints.len()),
            "3,000 growing puts took {} checkpoints: {checkpoints:?}",
            checkpoints.len()
        );
        // And the state survives a restart from the last checkpoint and the
        // journal after it, which counts the journal and the checkpoint's size
        // as apply did.
        db.sync().unwrap();
        let (journal, size) = (sm.journal_bytes, sm.checkpoint_bytes.load(Ordering::Relaxed));
        assert!(journal > 0, "the journal holds records after the last checkpoint");
        drop(sm);
        let restored = Arc::new(AppliedState::default());
        let reopened = StateMachine::open_with(db, restored.clone(), 500).unwrap();
        assert_eq!((reopened.journal_bytes, reopened.checkpoint_bytes.load(Ordering::Relaxed)), (journal, size));
        let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
        assert_eq!(restored.mvcc().range(&all).unwrap().count, 3000);
    }
}
