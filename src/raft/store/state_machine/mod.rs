//! The Raft state machine: openraft's `RaftStateMachine` over raftlock's
//! applied state. Three parts:
//! - [`apply`]: the deterministic apply of a command (no openraft, no I/O);
//! - [`layout`]: what is persisted in the state store and how it is restored
//!   (journal, checkpoints, counters; the snapshot and backup image);
//! - this module: the adapter openraft drives — apply calls, snapshots.
//!
//! Each `apply` call applies its entries to the in-memory state, then hands
//! one atomic batch to the state store (the journal record and counters, see
//! `layout`), then publishes the changes to watchers. A failure to persist is
//! not deterministic: the process aborts (see `storage`) rather than let its
//! state diverge.
//!
//! An entry is applied only once it is durable in the local log: the leader
//! syncs its own appends while it replicates them (see `raft::store::log_store`).
//!
//! The configuration (members, voters) a membership entry or a snapshot
//! brings is published to the member list ([`AppliedConfiguration`]) before
//! the apply call returns, so that a reader that waited for an index to be
//! applied lists the members as of that index.
//!
//! Snapshots are the whole state (every version, leases, members) in a file,
//! `snapshot-<id>.image`, in the state store's file directory. openraft asks
//! for one when the log since the last is large (see `raft::store::log_bound`); a
//! snapshot is then a checkpoint taken at that moment (`layout`): the state is
//! captured on the apply path, streamed into the checkpoint's file on the
//! state store's writer thread, and the file is given the snapshot's name as a
//! second name (a hard link), so the whole state is written once for both.
//! The snapshot's file is what is sent, chunk by chunk, to members that the
//! purged log can no longer catch up; a snapshot received is written to a file
//! of its own, then read from it. Only the newest snapshot's file is kept, and
//! none survives a restart (the first one asked for after it is built anew).
//! No whole-state image is held in memory: the capture shares the store's
//! key-values (no copy of keys or values), but it still walks every version
//! on the apply path, and writing the whole state shows in the latency of
//! that moment.

mod apply;
mod image;
mod layout;
mod migrate;

use std::path::PathBuf;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError, StoredMembership};

/// How a restore moves the backup's revision (see `crate::restore`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RevisionBump {
    /// Added to the backup's revision.
    pub by: crate::model::mvcc::Revision,
    /// The new revision is also the compaction revision.
    pub mark_compacted: bool,
}

use crate::base::limits::CHECKPOINT_MIN_BYTES;
use crate::model::applied::AppliedState;
use crate::model::command::CommandResult;
use crate::model::mvcc::KeyRange;
use crate::model::watch_routes::AppliedChanges;
use crate::raft::types::{Entry, LogId, MemberNode, TypeConfig};
use crate::raft::write::forwarded::ForwardedAnswers;
use crate::storage::wal::Durable;
use crate::storage::StateStore;
use apply::Apply;
pub use image::encode_state;
use image::SnapshotImage;
use layout::{Membership, Persisted, Position};

pub struct StateMachine {
    state: Arc<AppliedState>,
    /// The state store's journal and checkpoints.
    persisted: Persisted,
    /// The last entry applied and the configuration.
    position: Position,
    /// The configuration as applied, shared with the API's readers.
    configuration: AppliedConfiguration,
    /// The last snapshot built or received, and its file: what is sent to
    /// members that are too far behind for the log.
    last_snapshot: Arc<std::sync::Mutex<Option<SnapshotFile>>>,
    /// Snapshot streams begun, to name each one's file.
    incoming_count: u64,
    /// When set, an entry is applied only once it is durable in the local log
    /// (the leader syncs its own appends while it replicates them: see
    /// `raft::store::log_store`).
    durable_log: Option<Durable>,
    /// The waiters of this member's forwarded writes (`raft::write::forwarded`).
    forwarded: Option<Arc<ForwardedAnswers>>,
}

/// The configuration (members, voters) as the state machine last applied
/// it, from a membership entry or a snapshot. Set before the apply call that
/// reached it returns, so a reader that waited until this member applied an
/// index sees the configuration as of at least that index; openraft's
/// metrics, by contrast, publish the applied index a moment before the
/// configuration, and their configuration is the newest appended, applied
/// or not.
#[derive(Clone)]
pub struct AppliedConfiguration(Arc<std::sync::RwLock<Membership>>);

impl AppliedConfiguration {
    /// The applied configuration.
    pub fn get(&self) -> openraft::Membership<u64, MemberNode> {
        self.0.read().expect("configuration lock poisoned").membership().clone()
    }

    fn set(&self, membership: &Membership) {
        *self.0.write().expect("configuration lock poisoned") = membership.clone();
    }
}

/// A snapshot kept as a file (see the module doc).
struct SnapshotFile {
    meta: SnapshotMeta<u64, MemberNode>,
    path: PathBuf,
}

/// The name of the file that a snapshot with id `id` is kept in.
fn snapshot_file(id: &str) -> String {
    format!("snapshot-{id}.image")
}

/// The files snapshots being received are written to start so; one is
/// named for each stream begun, and only the newest is kept.
const INCOMING_SNAPSHOT: &str = "snapshot-incoming-";

/// Make `file` the member's current snapshot, unless the current one is at
/// least as new (a build that finished late), and remove the file of the one
/// not kept. A reader that has that file open reads on: the file goes with
/// its last handle.
fn keep_snapshot(last: &std::sync::Mutex<Option<SnapshotFile>>, file: SnapshotFile) {
    let dropped = {
        let mut current = last.lock().expect("snapshot lock poisoned");
        match current.as_ref() {
            Some(c) if c.path == file.path => None, // built again under its id: the file was replaced
            Some(c) if c.meta.last_log_id > file.meta.last_log_id => Some(file.path),
            _ => current.replace(file).map(|old| old.path),
        }
    };
    if let Some(path) = dropped {
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(error = %e, path = %path.display(), "removing an old snapshot's file");
        }
    }
}

/// Open the current snapshot's file, under the lock that replacing it takes
/// (so that it is not removed between choosing and opening it).
fn open_current(last: &std::sync::Mutex<Option<SnapshotFile>>) -> std::io::Result<Option<Snapshot<TypeConfig>>> {
    let current = last.lock().expect("snapshot lock poisoned");
    current.as_ref().map(SnapshotFile::open).transpose()
}

impl SnapshotFile {
    /// The snapshot, read from its file.
    fn open(&self) -> std::io::Result<Snapshot<TypeConfig>> {
        let data = std::fs::File::open(&self.path)?;
        Ok(Snapshot { meta: self.meta.clone(), snapshot: Box::new(tokio::fs::File::from_std(data)) })
    }
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::read_state_machine(&std::io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Load the persisted state into `state` (which must be empty): the
    /// checkpoint, then every journal record after it.
    pub fn open(db: StateStore, state: Arc<AppliedState>) -> anyhow::Result<StateMachine> {
        Self::open_with(db, state, CHECKPOINT_MIN_BYTES)
    }

    fn open_with(db: StateStore, state: Arc<AppliedState>, checkpoint_min: u64) -> anyhow::Result<StateMachine> {
        let (persisted, position) = Persisted::restore(db, &state, checkpoint_min)?;
        // The watch routes count from the restored revision: no session
        // existed before it, so every change up to it counts as routed.
        let revision = state.mvcc().revision();
        state.publish(AppliedChanges::new(revision, Vec::new()));
        let configuration = AppliedConfiguration(Arc::new(std::sync::RwLock::new(position.membership.clone())));
        Ok(StateMachine {
            state,
            persisted,
            position,
            configuration,
            last_snapshot: Default::default(),
            incoming_count: 0,
            durable_log: None,
            forwarded: None,
        })
    }

    /// Keep the values of superseded versions in a spill in `dir` rather than
    /// in memory (see `mvcc::spill`); those the restore loaded move there now.
    pub fn spilling_history(self, dir: &std::path::Path) -> anyhow::Result<StateMachine> {
        use anyhow::Context;
        let spill = crate::model::mvcc::Spill::open(dir)
            .with_context(|| format!("opening the history spill {}", dir.display()))?;
        self.state.mvcc_mut().spill_into(spill);
        Ok(self)
    }

    /// Stretch this member's checkpoint interval by a share derived from its
    /// id (0 to 50%), so that the members of a cluster, which apply the same
    /// entries, do not all checkpoint at once: a checkpoint encodes and writes
    /// the whole state, and while one member does, the others still make a
    /// quorum at full speed. A snapshot install starts a member's count
    /// afresh, so phases can still meet; the stretch spreads checkpoints, it
    /// does not schedule them.
    pub fn staggering_checkpoints(mut self, member_id: u64) -> StateMachine {
        self.persisted.stagger(member_id);
        self
    }

    /// Apply entries only once `durable` says they are on stable storage.
    pub fn applying_only_durable(mut self, durable: Durable) -> StateMachine {
        self.durable_log = Some(durable);
        self
    }

    /// Hand this member's forwarded writes their results as they are
    /// applied, and publish the applied term there (see `raft::write::forwarded`).
    pub fn answering_forwarded(mut self, answers: Arc<ForwardedAnswers>) -> StateMachine {
        answers.applied(self.applied_term());
        self.forwarded = Some(answers);
        self
    }

    /// The term of the last entry applied (0: none).
    pub fn applied_term(&self) -> u64 {
        self.position.last_applied.map_or(0, |l| l.leader_id.term)
    }

    /// The configuration as this state machine applies it (see
    /// [`AppliedConfiguration`]).
    pub fn configuration(&self) -> AppliedConfiguration {
        self.configuration.clone()
    }

    fn snapshot_meta(&self, revision: i64) -> SnapshotMeta<u64, MemberNode> {
        let id = match self.position.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, revision),
            None => format!("0-0-{revision}"),
        };
        SnapshotMeta {
            last_log_id: self.position.last_applied,
            last_membership: self.position.membership.clone(),
            snapshot_id: id,
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError<u64>> {
        Ok((self.position.last_applied, self.position.membership.clone()))
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
        let started = std::time::Instant::now();
        let mut apply = Apply::new(&self.state, self.forwarded.as_ref().map(|f| f.me()));
        let mut results = Vec::with_capacity(entries.len());
        for entry in entries {
            self.position.last_applied = Some(entry.log_id);
            let result = match entry.payload {
                EntryPayload::Blank => CommandResult::Empty,
                EntryPayload::Normal(cmd) => {
                    let membership = self.position.membership.membership();
                    apply.command(cmd, entry.log_id.leader_id.term, &|id| membership.get_node(&id).is_some())
                }
                EntryPayload::Membership(m) => {
                    apply.configuration(&|id| m.get_node(&id).is_some());
                    self.position.membership = StoredMembership::new(Some(entry.log_id), m);
                    self.configuration.set(&self.position.membership);
                    CommandResult::Empty
                }
            };
            results.push(result);
        }
        let Apply { journal, published, answered, lease_ended, .. } = apply;
        self.persisted.commit_apply(&self.state, &journal, &self.position);
        if !published.is_empty() {
            let revision = self.state.mvcc().revision();
            self.state.publish(AppliedChanges { lease_ended, ..AppliedChanges::new(revision, published) });
        }
        // Answers first, then the term: a waiter that sees the term move on
        // has already been handed its result if it had one here.
        if let Some(forwarded) = &self.forwarded {
            forwarded.deliver(answered);
            forwarded.applied(self.applied_term());
        }
        if started.elapsed() > crate::base::metrics::SLOW_APPLY {
            crate::base::metrics::metrics().slow_apply.inc();
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // Capture the state here, on the apply path, as a checkpoint that
        // the state store's writer streams into its file and names as the
        // snapshot too; the builder, which openraft runs in a task of its
        // own, waits for that while apply goes on.
        let meta = self.snapshot_meta(self.state.mvcc().revision());
        let name = snapshot_file(&meta.snapshot_id);
        self.persisted.checkpoint_as_snapshot(&self.state, &self.position, name);
        SnapshotBuilder { meta: Some(meta), db: self.persisted.db().clone(), last: self.last_snapshot.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError<u64>> {
        // A file of its own per stream: an older stream's file (abandoned,
        // or still to be installed, which reads it through its handle) is
        // unlinked, never truncated.
        let dir = self.persisted.files_dir();
        let err = |e: std::io::Error| StorageError::from(StorageIOError::write_snapshot(None, &e));
        for entry in std::fs::read_dir(dir).map_err(err)? {
            let entry = entry.map_err(err)?;
            if entry.file_name().to_string_lossy().starts_with(INCOMING_SNAPSHOT) {
                std::fs::remove_file(entry.path()).map_err(err)?;
            }
        }
        self.incoming_count += 1;
        let path = dir.join(format!("{INCOMING_SNAPSHOT}{}.tmp", self.incoming_count));
        let file =
            tokio::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).await.map_err(err)?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, MemberNode>,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<u64>> {
        // Read on a blocking thread: decoding the whole state takes long.
        let file = snapshot.into_std().await;
        let inode = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map_err(sm_err)?.ino()
        };
        let image = tokio::task::spawn_blocking(move || SnapshotImage::read_file(file))
            .await
            .map_err(sm_err)?
            .map_err(sm_err)?;
        let revision = image.revision;
        let before = self.state.mvcc().revision();
        image.install(&self.state);
        self.position = Position { last_applied: meta.last_log_id, membership: meta.last_membership.clone() };
        self.configuration.set(&self.position.membership);
        // Watchers and lock waiters here look at the store as it was at
        // `before`: publish what the snapshot skipped over, as history
        // still has it — all of it only if no compaction reached past
        // `before` (a compaction at c drops the versions at or below c, a
        // deletion at c too). Before the store is persisted, so that they are
        // told even if persisting fails.
        let (skipped, current, compacted) = {
            let mvcc = self.state.mvcc();
            let skipped = (mvcc.compact_revision() <= before)
                .then(|| mvcc.changes_between(&KeyRange::new(&[0], &[0]), before + 1, mvcc.revision()).ok())
                .flatten();
            (skipped, mvcc.revision(), mvcc.compact_revision())
        };
        match skipped {
            Some(changes) => self.state.publish(AppliedChanges::new(current, changes)),
            // Compacted past what the readers here have seen: they must look
            // at the store again (watchers get cancelled with the
            // compact revision, lock waiters look at their queue again).
            None => {
                tracing::info!(
                    before,
                    compacted,
                    "an installed snapshot skipped compacted changes; watchers and waiters resync"
                );
                self.state.publish(AppliedChanges::resync(current));
            }
        }
        // The entries the snapshot covers are not applied here: a forwarded
        // write among them has no result to hand out.
        if let Some(forwarded) = &self.forwarded {
            forwarded.forget_all();
            forwarded.applied(self.applied_term());
        }
        // The whole store becomes one checkpoint of the installed state.
        self.persisted
            .replace_all(&self.state, &self.position)
            .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        tracing::info!(snapshot = %meta.snapshot_id, revision, "installed a snapshot from the leader");
        // It is this member's snapshot now, should it have to send one: its
        // file, found by its inode (a newer stream may have begun meanwhile),
        // unless that stream unlinked it. Not kept, the next one asked for
        // is built.
        let dir = self.persisted.files_dir();
        let path = dir.join(snapshot_file(&meta.snapshot_id));
        let received = std::fs::read_dir(dir).ok().into_iter().flatten().flatten().find(|entry| {
            use std::os::unix::fs::MetadataExt;
            entry.file_name().to_string_lossy().starts_with(INCOMING_SNAPSHOT)
                && entry.metadata().is_ok_and(|m| m.ino() == inode)
        });
        match received.map(|entry| std::fs::rename(entry.path(), &path)) {
            Some(Ok(())) => keep_snapshot(&self.last_snapshot, SnapshotFile { meta: meta.clone(), path }),
            Some(Err(e)) => tracing::warn!(error = %e, "keeping a received snapshot's file"),
            None => {}
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let current = open_current(&self.last_snapshot)
            .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, &e)))?;
        if let Some(snapshot) = current {
            return Ok(Some(snapshot));
        }
        // None built since this member started (its log may be purged all the
        // same): build one now, on the apply path. Rare: once per restart.
        let mut builder = self.get_snapshot_builder().await;
        builder.build_snapshot().await.map(Some)
    }
}

/// Writes the state captured when the builder was made into a file, and
/// keeps it as the member's current snapshot.
pub struct SnapshotBuilder {
    /// The snapshot whose checkpoint is queued.
    meta: Option<SnapshotMeta<u64, MemberNode>>,
    /// The state store whose writer makes the snapshot's file, in its file
    /// directory.
    db: StateStore,
    last: Arc<std::sync::Mutex<Option<SnapshotFile>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let meta = self.meta.take().ok_or_else(|| sm_err("snapshot already built"))?;
        // The checkpoint takes long to write: wait for it off the runtime's
        // threads, where it would hold up heartbeats and requests.
        let db = self.db.clone();
        let written = tokio::task::spawn_blocking(move || db.drain()).await.map_err(sm_err)?;
        written.map_err(|e| StorageError::from(StorageIOError::write_snapshot(Some(meta.signature()), &e)))?;
        let path = self.db.files_dir().join(snapshot_file(&meta.snapshot_id));
        tracing::info!(snapshot = %meta.snapshot_id, "built a snapshot (its checkpoint)");
        // Opened before it is kept: a newer one kept meanwhile removes it,
        // and this handle reads on.
        let file = SnapshotFile { meta, path };
        let snapshot = file
            .open()
            .map_err(|e| StorageError::from(StorageIOError::read_snapshot(Some(file.meta.signature()), &e)))?;
        keep_snapshot(&self.last, file);
        Ok(snapshot)
    }
}

/// Make `db` (a new member's empty state store) hold the state of a backup
/// (a Maintenance.Snapshot image, as `snapshot save` wrote it), applied up to
/// `applied` under the configuration `members`: the start of a new cluster
/// whose members are all restored from the same backup. The old cluster's
/// published member attributes and its alarms (about members that are not in
/// the new cluster) are left out. Returns the image's revision.
pub fn restore_backup(
    db: StateStore,
    image: &[u8],
    applied: LogId,
    members: std::collections::BTreeMap<u64, MemberNode>,
    bump: RevisionBump,
) -> anyhow::Result<crate::model::mvcc::Revision> {
    let mut image = SnapshotImage::decode(image).map_err(|e| anyhow::anyhow!("decoding the snapshot: {e}"))?;
    image.members.clear();
    image.alarms = Default::default();
    let revision =
        image.revision.checked_add(bump.by).ok_or_else(|| anyhow::anyhow!("the bumped revision overflows"))?;
    image.revision = revision;
    let state = Arc::new(AppliedState::default());
    let mut sm = StateMachine::open(db, state.clone())?;
    anyhow::ensure!(sm.position.last_applied.is_none(), "the state store is not empty");
    image.install(&state);
    if bump.mark_compacted && bump.by > 0 {
        // History before the jump is unreadable: a watch or read from an
        // old revision learns it was compacted. (Its versions are swept at
        // the restored cluster's first compaction.)
        state.mvcc_mut().compact(revision).map_err(|e| anyhow::anyhow!("marking {revision} compacted: {e}"))?;
    }
    let voters = members.keys().copied().collect::<std::collections::BTreeSet<u64>>();
    let membership = openraft::Membership::new(vec![voters], members);
    sm.position =
        Position { last_applied: Some(applied), membership: StoredMembership::new(Some(applied), membership) };
    sm.persisted.replace_all(&state, &sm.position)?;
    Ok(revision)
}

/// A small applied state for the fuzz targets: a few keys, one attached to
/// a lease, a compaction.
#[cfg(fuzzing)]
pub(crate) fn fuzz_state() -> AppliedState {
    let state = AppliedState::default();
    let mut apply = apply::Apply::new(&state, Some(1));
    let put = |k: &str, lease| {
        crate::model::command::Command::Put(crate::model::mvcc::PutRequest {
            key: k.into(),
            value: k.into(),
            lease,
            ..Default::default()
        })
    };
    apply.command(crate::model::command::Command::LeaseGrant { id: 7, ttl: 60 }, 1, &|_| true);
    for (k, lease) in [("a", 0), ("b", 7), ("c", 0), ("a", 0)] {
        apply.command(put(k, lease), 1, &|_| true);
    }
    apply.command(crate::model::command::Command::Compact { revision: 3 }, 1, &|_| true);
    state
}

/// Apply one command to `state` as member 1 in term 1 (fuzz targets).
#[cfg(fuzzing)]
pub(crate) fn fuzz_apply(
    state: &AppliedState,
    command: crate::model::command::Command,
) -> crate::model::command::CommandResult {
    apply::Apply::new(state, Some(1)).command(command, 1, &|id| id < 4)
}

/// Decode an image and, if it decodes, install it (fuzz targets).
#[cfg(fuzzing)]
pub(crate) fn fuzz_image(bytes: &[u8]) {
    if let Ok(image) = SnapshotImage::decode(bytes) {
        image.install(&AppliedState::default());
    }
}

/// Decode journal frames (fuzz targets).
#[cfg(fuzzing)]
pub(crate) fn fuzz_journal(bytes: &[u8]) {
    layout::fuzz_journal(bytes);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::image::image_of;
    use super::*;
    use crate::base::codec::encode;
    use crate::model::alarm::{AlarmAction, AlarmKind};
    use crate::model::command::Command;
    use crate::model::mvcc::{DeleteRangeRequest, PutRequest, RangeRequest, Revision, StoredVersion};
    use openraft::{CommittedLeaderId, LogId};

    fn entry(index: u64, cmd: Command) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(cmd) }
    }

    fn put(k: &str, v: &str) -> Command {
        Command::Put(PutRequest { key: k.into(), value: v.into(), ..Default::default() })
    }

    /// Send `sent` to `receiver` as a member receives a snapshot, and install it.
    async fn install(receiver: &mut StateMachine, sent: &mut Snapshot<TypeConfig>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut incoming = receiver.begin_receiving_snapshot().await.unwrap();
        let mut bytes = Vec::new();
        sent.snapshot.read_to_end(&mut bytes).await.unwrap();
        incoming.write_all(&bytes).await.unwrap();
        incoming.shutdown().await.unwrap();
        receiver.install_snapshot(&sent.meta, incoming).await.unwrap();
    }

    fn dump(state: &AppliedState) -> (Vec<StoredVersion>, Revision, Revision) {
        let mvcc = state.mvcc();
        (mvcc.versions().collect(), mvcc.revision(), mvcc.compact_revision())
    }

    /// Apply records a write's versions in the journal sharing the store's
    /// key-values; they must encode exactly as the stored versions the
    /// journal is read back as (and older raftlocks wrote), for a put and
    /// for a deletion's tombstone.
    #[test]
    fn journal_records_share_values_and_encode_as_stored_versions() {
        use crate::model::mvcc::{MvccStore, SharedVersion};
        let mut store = MvccStore::default();
        let value: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
        let (_, mut changes) =
            store.put(PutRequest { key: b"k/1".to_vec(), value, lease: 0, ..Default::default() }, &()).unwrap();
        let (_, deleted) =
            store.delete_range(&DeleteRangeRequest { key: b"k/1".to_vec(), range_end: Vec::new(), prev_kv: false });
        changes.extend(deleted);
        assert_eq!(changes.len(), 2);
        for change in &changes {
            let stored = StoredVersion {
                revision: change.revision,
                sub: change.sub,
                key: change.key.clone(),
                kv: change.kv.as_deref().cloned(),
            };
            let written = encode(&layout::JournalOp::Version(SharedVersion::of_change(change)));
            assert_eq!(written, encode(&layout::JournalOp::Version(stored.clone())));
            match crate::base::codec::decode::<layout::JournalOp>(&written).unwrap() {
                layout::JournalOp::Version(read) => assert_eq!(read, stored),
                _ => panic!("a version reads back as another record"),
            }
        }
    }

    /// The directory of a test's store: when it goes, the store's writer
    /// first finishes what it was given (a checkpoint file written into a
    /// directory removed meanwhile would fail, and abort the process).
    struct StoreDir {
        _dir: tempfile::TempDir,
        db: StateStore,
    }

    impl Drop for StoreDir {
        fn drop(&mut self) {
            self.db.sync().unwrap();
        }
    }

    /// A state machine over a fresh store; the store's directory lives as
    /// long as the returned guard.
    fn fresh(checkpoint_min: u64) -> (StoreDir, StateStore, Arc<AppliedState>, StateMachine) {
        let dir = tempfile::tempdir().unwrap();
        let db = StateStore::open(&dir.path().join("state"), &dir.path().join("images")).unwrap();
        let state = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), state.clone(), checkpoint_min).unwrap();
        (StoreDir { _dir: dir, db: db.clone() }, db, state, sm)
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
            auth: captured.auth.clone(),
            alarms: captured.alarms.clone(),
        };
        assert_eq!(stored.versions.len(), 5, "four puts and a tombstone");
        assert_eq!(encode(&captured), encode(&stored));
    }

    /// Images written before the auth store was part of them (checkpoints,
    /// snapshots, backups) still decode, with auth off and no users.
    #[test]
    fn an_image_without_the_auth_store_decodes_with_an_empty_one() {
        #[derive(serde::Serialize)]
        struct Before {
            revision: Revision,
            compact_revision: Revision,
            versions: Vec<StoredVersion>,
            members: Vec<(u64, crate::model::applied::MemberAttrs)>,
            leases: Vec<(i64, i64)>,
        }
        let before = Before {
            revision: 7,
            compact_revision: 3,
            versions: vec![],
            members: vec![(1, Default::default())],
            leases: vec![(5, 60)],
        };
        let image = SnapshotImage::decode(&encode(&before)).expect("an image of the first format");
        assert_eq!((image.revision, image.compact_revision, image.leases), (7, 3, vec![(5, 60)]));
        assert_eq!(image.auth, crate::model::auth::AuthStore::default());
        assert!(SnapshotImage::decode(&encode(&before)[..10]).is_err(), "a cut image is still refused");
        // An image of the current format is tagged, and never read as one of
        // the first, even cut short inside its auth store.
        let (dir, _db, state, _sm) = fresh(1000);
        state.auth_mut().enabled = true;
        state.alarms_mut().apply(AlarmAction::Activate, 9, AlarmKind::NoSpace);
        let current = image::encode_image(&image_of(&state));
        let decoded = SnapshotImage::decode(&current).unwrap();
        assert!(decoded.auth.enabled);
        assert_eq!(decoded.alarms.list(), vec![(9, AlarmKind::NoSpace)]);
        assert!(SnapshotImage::decode(&current[..current.len() - 1]).is_err());
        // The second format (with the auth store, without alarms) decodes
        // with no alarm raised.
        #[derive(serde::Serialize)]
        struct SecondFormat {
            revision: Revision,
            compact_revision: Revision,
            versions: Vec<StoredVersion>,
            members: Vec<(u64, crate::model::applied::MemberAttrs)>,
            leases: Vec<(i64, i64)>,
            auth: crate::model::auth::AuthStore,
        }
        let second = SecondFormat {
            revision: 7,
            compact_revision: 3,
            versions: vec![],
            members: vec![],
            leases: vec![],
            auth: state.auth().clone(),
        };
        let mut bytes = encode(&second);
        bytes[0] = migrate::IMAGE_WITH_AUTH;
        let decoded = SnapshotImage::decode(&bytes).expect("an image of the second format");
        assert!(decoded.auth.enabled && decoded.alarms.is_empty());
        drop(dir);
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
        let batch = Command::Batch(Arc::new(vec![put("b1", "x"), put("b2", "y")]));
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
        let applied = sm.position.last_applied;
        assert!(sm.persisted.checkpoint_seq > 1, "checkpoints were written");
        db.sync().unwrap();
        // Only the last checkpoint's file is kept.
        let seq = sm.persisted.checkpoint_seq;
        assert_eq!(db.file_names().unwrap(), vec![format!("checkpoint-{seq:016x}.image")]);
        drop(sm);

        let restored = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), restored.clone(), 30).unwrap();
        assert_eq!(dump(&restored), before);
        assert_eq!(sm.position.last_applied, applied);
        let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
        assert_eq!(restored.mvcc().range(&all).unwrap().count, 5);
    }

    /// A snapshot is built into a file, sent from it, received into a file
    /// and installed from it; a newer snapshot's file replaces the older's.
    #[tokio::test]
    async fn snapshots_are_files_sent_and_installed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (_dir, db, state, mut sm) = fresh(1 << 20);
        for i in 1..=20u64 {
            sm.apply([entry(i, put(&format!("k{}", i % 3), &format!("v{i}")))]).await.unwrap();
        }
        let first = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        sm.apply([entry(21, put("late", "x"))]).await.unwrap();
        let mut sent = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        // The snapshot is the checkpoint taken for it: one file, two names;
        // the older snapshot's file and checkpoint are gone.
        let mut names = db.file_names().unwrap();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with("checkpoint-"), "{names:?}");
        assert_eq!(names[1], format!("snapshot-{}.image", sent.meta.snapshot_id));
        let inode =
            |name: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(db.files_dir().join(name)).unwrap());
        assert_eq!(inode(&names[0]), inode(&names[1]), "written once for both");
        drop(first);

        let (_dir2, db2, received_state, mut receiver) = fresh(1 << 20);
        let mut incoming = receiver.begin_receiving_snapshot().await.unwrap();
        let mut bytes = Vec::new();
        sent.snapshot.read_to_end(&mut bytes).await.unwrap();
        for chunk in bytes.chunks(7) {
            incoming.write_all(chunk).await.unwrap();
        }
        incoming.shutdown().await.unwrap();
        receiver.install_snapshot(&sent.meta, incoming).await.unwrap();
        assert_eq!(dump(&received_state), dump(&state));
        assert_eq!(receiver.position.last_applied.map(|l| l.index), Some(21));
        // The receiver keeps it as its own snapshot (and a checkpoint of it).
        let again = receiver.get_current_snapshot().await.unwrap().expect("a current snapshot");
        assert_eq!(again.meta.snapshot_id, sent.meta.snapshot_id);
        let mut names = db2.file_names().unwrap();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].starts_with("checkpoint-") && names[1] == format!("snapshot-{}.image", sent.meta.snapshot_id));
    }

    /// A member that installs a snapshot compacted at the very revision of a
    /// deletion it has not applied must have the waits on that key and the
    /// followers of its keys look again: the compaction dropped the deletion
    /// from history, so apply cannot hand it on.
    #[tokio::test]
    async fn a_snapshot_compacted_past_the_members_revision_wakes_the_waits() {
        let (_dir, _db, _state, mut sm) = fresh(1 << 20);
        let (_dir2, _db2, received_state, mut receiver) = fresh(1 << 20);
        for i in 1..=3u64 {
            sm.apply([entry(i, put(&format!("w/{i}"), "x"))]).await.unwrap();
            receiver.apply([entry(i, put(&format!("w/{i}"), "x"))]).await.unwrap();
        }
        let before = received_state.mvcc().revision();
        let delete = Command::DeleteRange(DeleteRangeRequest { key: "w/1".into(), range_end: vec![], prev_kv: false });
        sm.apply([entry(4, delete)]).await.unwrap();
        sm.apply([entry(5, Command::Compact { revision: before + 1 })]).await.unwrap();
        let mut sent = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();

        let wait = received_state.wait_for_deletion(vec![b"w/1".to_vec()]);
        let followed = received_state.follow(&KeyRange::with_prefix(b"w/"));
        install(&mut receiver, &mut sent).await;
        let woken = tokio::time::timeout(std::time::Duration::from_secs(1), wait.deleted()).await;
        assert!(woken.is_ok(), "the wait on the key the snapshot deleted was not woken");
        assert!(followed.take().lost_after.is_some(), "the followers of its keys must look at the store again");
        assert!(received_state
            .mvcc()
            .range(&RangeRequest { key: "w/1".into(), ..Default::default() })
            .unwrap()
            .kvs
            .is_empty());
    }

    /// The configuration the API lists is the one applied: a membership
    /// entry's once the apply call that holds it returns, a snapshot's once
    /// it is installed, and the persisted one after a restart.
    #[tokio::test]
    async fn the_applied_configuration_follows_apply_install_and_restart() {
        let node = |port: u16| MemberNode { name: String::new(), peer_url: format!("http://127.0.0.1:{port}") };
        let configuration = |voters: &[u64], learners: &[u64]| {
            let nodes: std::collections::BTreeMap<u64, MemberNode> =
                voters.iter().chain(learners).map(|&id| (id, node(id as u16))).collect();
            openraft::Membership::new(vec![voters.iter().copied().collect()], nodes)
        };
        let ids = |m: openraft::Membership<u64, MemberNode>| {
            (m.voter_ids().collect::<Vec<_>>(), m.nodes().map(|(id, _)| *id).collect::<Vec<_>>())
        };
        let (_dir, db, _state, mut sm) = fresh(1 << 20);
        let listed = sm.configuration();
        assert_eq!(ids(listed.get()), (vec![], vec![]));
        let membership = |index: u64, m| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Membership(m),
        };
        sm.apply([membership(1, configuration(&[1, 2, 3], &[]))]).await.unwrap();
        assert_eq!(ids(listed.get()), (vec![1, 2, 3], vec![1, 2, 3]));
        // Several entries in one call: the last configuration among them.
        sm.apply([entry(2, put("k", "v")), membership(3, configuration(&[1, 2, 3], &[4])), entry(4, put("k", "w"))])
            .await
            .unwrap();
        assert_eq!(ids(listed.get()), (vec![1, 2, 3], vec![1, 2, 3, 4]));

        db.sync().unwrap();
        let reopened = StateMachine::open_with(db.clone(), Arc::new(AppliedState::default()), 1 << 20).unwrap();
        assert_eq!(ids(reopened.configuration().get()), (vec![1, 2, 3], vec![1, 2, 3, 4]));
        drop(reopened);

        // A member that installs a snapshot lists the snapshot's configuration.
        let mut sent = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (_dir2, _db2, _received, mut receiver) = fresh(1 << 20);
        let received = receiver.configuration();
        receiver.apply([membership(1, configuration(&[1, 2, 3], &[]))]).await.unwrap();
        install(&mut receiver, &mut sent).await;
        assert_eq!(ids(received.get()), (vec![1, 2, 3], vec![1, 2, 3, 4]));
    }

    /// A snapshot's checkpoint is a checkpoint like any other: a restart
    /// loads it and replays the journal written after it.
    #[tokio::test]
    async fn a_snapshots_checkpoint_restores_with_the_journal_after_it() {
        let (_dir, db, state, mut sm) = fresh(1 << 20);
        for i in 1..=10u64 {
            sm.apply([entry(i, put(&format!("k{}", i % 4), &format!("v{i}")))]).await.unwrap();
        }
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(10));
        for i in 11..=15u64 {
            sm.apply([entry(i, put(&format!("k{i}"), "after"))]).await.unwrap();
        }
        db.sync().unwrap();
        let restored = Arc::new(AppliedState::default());
        let reopened = StateMachine::open_with(db.clone(), restored.clone(), 1 << 20).unwrap();
        assert_eq!(dump(&restored), dump(&state));
        assert_eq!(reopened.position.last_applied.map(|l| l.index), Some(15));
    }

    /// A store whose checkpoint an older raftlock kept in sled restores from
    /// it, and its next checkpoint (a file) replaces it.
    #[tokio::test]
    async fn a_checkpoint_kept_in_sled_is_read_and_replaced() {
        let (dir, db, state, mut sm) = fresh(1 << 20);
        for i in 1..=10u64 {
            sm.apply([entry(i, put(&format!("k{i}"), "v"))]).await.unwrap();
        }
        let before = dump(&state);
        let applied = sm.position.last_applied;
        let membership = sm.position.membership.clone();
        drop(sm);
        // What an older raftlock left: the checkpoint as a sled value, the
        // journal it covers gone, the counters in sled.
        db.sync().unwrap();
        let mut batch = crate::storage::StateBatch::default();
        batch.puts.push((b"c".to_vec(), image::encode_image(&image_of(&state))));
        batch.puts.push((b"m/checkpoint".to_vec(), encode(&10u64)));
        batch.puts.push((b"m/seq".to_vec(), encode(&10u64)));
        batch.puts.push((b"m/applied".to_vec(), encode(&applied)));
        batch.puts.push((b"m/membership".to_vec(), encode(&membership)));
        batch.puts.push((b"m/revision".to_vec(), encode(&state.mvcc().revision())));
        batch.puts.push((b"m/compact".to_vec(), encode(&state.mvcc().compact_revision())));
        batch.deletes.extend((1..=10u64).map(|seq| [&[b'j'][..], &seq.to_be_bytes()].concat()));
        db.commit(batch);
        db.sync().unwrap();

        let restored = Arc::new(AppliedState::default());
        let mut sm = StateMachine::open_with(db.clone(), restored.clone(), 1).unwrap();
        assert_eq!(dump(&restored), before);
        assert_eq!(sm.position.last_applied, applied);
        // Enough journal after it for the next checkpoint.
        let mut index = 10;
        while sm.persisted.checkpoint_seq == 10 {
            index += 1;
            assert!(index < 1000, "no checkpoint after {index} puts");
            sm.apply([entry(index, put(&format!("after{index}"), "v"))]).await.unwrap();
        }
        db.sync().unwrap();
        assert!(db.get(b"c").unwrap().is_none(), "the sled checkpoint is gone");
        assert_eq!(db.file_names().unwrap().len(), 1);
        let expected = dump(&restored);
        drop(sm);
        let again = Arc::new(AppliedState::default());
        StateMachine::open_with(db.clone(), again.clone(), 1).unwrap();
        assert_eq!(dump(&again), expected);
        drop(dir);
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
                if sm.persisted.checkpoint_seq > 0 {
                    return sm.persisted.checkpoint_seq;
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
        // checkpoint is a fixed factor larger than the one before (here about
        // 1.6: a journal frame weighs more than the version it adds, since it
        // carries the counters too) and they come at growing intervals; a
        // fixed 500-byte interval would take about a thousand.
        let (_dir, db, _state, mut sm) = fresh(500);
        let mut checkpoints = Vec::new(); // (seq, journal bytes before it, size of the one before it)
        let mut journal_before = 0;
        for i in 1..=3000u64 {
            let before = (sm.persisted.checkpoint_seq, sm.persisted.checkpoint_bytes.load(Ordering::Relaxed));
            sm.apply([entry(i, put(&format!("key-{i}"), "a value of some length"))]).await.unwrap();
            if sm.persisted.checkpoint_seq != before.0 {
                checkpoints.push((sm.persisted.checkpoint_seq, journal_before, before.1));
                // Let the writer thread encode it, so its size is known.
                db.sync().unwrap();
            }
            journal_before = sm.persisted.journal_bytes;
        }
        for &(seq, journal, previous) in &checkpoints {
            assert!(
                journal + 200 >= previous.max(500),
                "checkpoint at {seq} came after only {journal} journal bytes; the one before was {previous} bytes"
            );
        }
        assert!(
            (4..=16).contains(&checkpoints.len()),
            "3,000 growing puts took {} checkpoints: {checkpoints:?}",
            checkpoints.len()
        );
        // And the state survives a restart from the last checkpoint and the
        // journal after it, which counts the journal and the checkpoint's size
        // as apply did.
        db.sync().unwrap();
        let (journal, size) = (sm.persisted.journal_bytes, sm.persisted.checkpoint_bytes.load(Ordering::Relaxed));
        assert!(journal > 0, "the journal holds records after the last checkpoint");
        drop(sm);
        let restored = Arc::new(AppliedState::default());
        let reopened = StateMachine::open_with(db, restored.clone(), 500).unwrap();
        assert_eq!(
            (reopened.persisted.journal_bytes, reopened.persisted.checkpoint_bytes.load(Ordering::Relaxed)),
            (journal, size)
        );
        let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
        assert_eq!(restored.mvcc().range(&all).unwrap().count, 3000);
    }

    /// A journal file that ends in a torn frame (a crash in the middle of an
    /// append) restores up to the frame before it, with that frame's
    /// applied id, so the log applies the rest again; it is cut back, so
    /// that the frames appended after the restart are read at the next one.
    #[tokio::test]
    async fn a_torn_journal_frame_is_cut_off_and_the_journal_goes_on() {
        let (_dir, db, state, mut sm) = fresh(1 << 20);
        for i in 1..=10u64 {
            sm.apply([entry(i, put(&format!("k{i}"), "v"))]).await.unwrap();
        }
        let before = dump(&state);
        drop(sm);
        db.sync().unwrap();
        let journal = db.file_names().unwrap().into_iter().find(|n| n.starts_with("journal-")).expect("a journal file");
        let path = db.files_dir().join(&journal);
        // Half of a frame for entry 11: a length, a CRC, and too few bytes.
        let mut torn = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut torn, &[200, 0, 0, 0, 1, 2, 3, 4, 5, 6]).unwrap();
        drop(torn);

        let restored = Arc::new(AppliedState::default());
        let mut sm = StateMachine::open_with(db.clone(), restored.clone(), 1 << 20).unwrap();
        assert_eq!(dump(&restored), before);
        assert_eq!(sm.position.last_applied.map(|l| l.index), Some(10));
        for i in 11..=15u64 {
            sm.apply([entry(i, put(&format!("k{i}"), "w"))]).await.unwrap();
        }
        let after = dump(&restored);
        drop(sm);
        db.sync().unwrap();
        let again = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), again.clone(), 1 << 20).unwrap();
        assert_eq!(dump(&again), after, "the frames after the cut are read");
        assert_eq!(sm.position.last_applied.map(|l| l.index), Some(15));

        // A frame whose bytes changed ends the journal before it too.
        drop(sm);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let damaged = Arc::new(AppliedState::default());
        let sm = StateMachine::open_with(db.clone(), damaged.clone(), 1 << 20).unwrap();
        assert_eq!(sm.position.last_applied.map(|l| l.index), Some(14));
        assert_eq!(damaged.mvcc().revision(), after.1 - 1);
    }

    /// A store an older raftlock wrote, its journal records in sled with
    /// the counters, restores from them; the frames written after them go
    /// to a journal file, and the next checkpoint deletes the sled records.
    #[tokio::test]
    async fn a_journal_kept_in_sled_is_read_and_replaced() {
        use crate::model::mvcc::KeyValue;
        let (_dir, db, _state, sm) = fresh(1 << 20);
        let membership = sm.position.membership.clone();
        drop(sm);
        let mut batch = crate::storage::StateBatch::default();
        for seq in 1..=3u64 {
            let revision = seq as i64 + 1;
            let kv = KeyValue {
                key: format!("old{seq}").into(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                value: b"v".to_vec(),
                lease: 0,
            };
            let op = layout::JournalOp::Version(StoredVersion { revision, sub: 0, key: kv.key.clone(), kv: Some(kv) });
            batch.puts.push(([&[b'j'][..], &seq.to_be_bytes()].concat(), encode(&vec![op])));
        }
        let applied = Some(LogId::new(CommittedLeaderId::new(1, 1), 3));
        batch.puts.push((b"m/seq".to_vec(), encode(&3u64)));
        batch.puts.push((b"m/applied".to_vec(), encode(&applied)));
        batch.puts.push((b"m/membership".to_vec(), encode(&membership)));
        batch.puts.push((b"m/revision".to_vec(), encode(&4i64)));
        batch.puts.push((b"m/compact".to_vec(), encode(&-1i64)));
        db.commit(batch);
        db.sync().unwrap();

        let restored = Arc::new(AppliedState::default());
        let mut sm = StateMachine::open_with(db.clone(), restored.clone(), 1 << 20).unwrap();
        assert_eq!(sm.position.last_applied, applied);
        assert_eq!(restored.mvcc().revision(), 4);
        sm.apply([entry(4, put("new", "v"))]).await.unwrap();
        let expected = dump(&restored);
        assert_eq!(expected.0.len(), 4);
        drop(sm);
        db.sync().unwrap();
        let again = Arc::new(AppliedState::default());
        let mut sm = StateMachine::open_with(db.clone(), again.clone(), 1).unwrap();
        assert_eq!(dump(&again), expected, "sled's records, then the journal file's frame");
        // A checkpoint (due at once with a 1-byte minimum) deletes the sled records.
        sm.apply([entry(5, put("newer", "v"))]).await.unwrap();
        db.sync().unwrap();
        assert_eq!(db.scan_prefix(b"j").count(), 0, "no journal records left in sled");
        let expected = dump(&again);
        drop(sm);
        let last = Arc::new(AppliedState::default());
        StateMachine::open_with(db.clone(), last.clone(), 1).unwrap();
        assert_eq!(dump(&last), expected);
    }
}
