//! The Raft state machine: applies committed commands to the MVCC store and
//! persists the result.
//!
//! Each `apply` call applies its entries to the in-memory store, then queues one
//! atomic batch for the state store holding every change, the last applied log
//! id and the membership. The entries are already durable in the WAL, so the
//! state store may lag: after a crash it is behind, at a batch boundary, and
//! openraft applies the later log entries again — the same results, since apply
//! is deterministic.
//!
//! Deterministic failures (a compacted revision, an unknown lease) are results
//! (`CommandResult::Rejected`). A failure to persist is not deterministic: the
//! process aborts (see `storage`) rather than let its state diverge.
//!
//! Persistent layout (sled keys):
//! ```text
//!   v<revision:8 BE><sub:8 BE>  -> (key, Option<KeyValue>)   one MVCC version
//!   a<member id:8 BE>           -> MemberAttrs               published attributes
//!   m/applied, m/membership, m/revision, m/compact           counters
//! ```
//!
//! Snapshots are the whole state (every version, counters, members) encoded in
//! one buffer; they are built from memory on demand.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::{decode, encode, Entry, LogId, MemberNode, TypeConfig};
use crate::command::{Command, CommandResult};
use crate::mvcc::{Change, MvccStore, Revision, StoredVersion};
use crate::state::{AppliedState, MemberAttrs};
use crate::storage::{StateBatch, StateDb};

const APPLIED: &[u8] = b"m/applied";
const MEMBERSHIP: &[u8] = b"m/membership";
const REVISION: &[u8] = b"m/revision";
const COMPACT: &[u8] = b"m/compact";
const VERSION_PREFIX: u8 = b'v';
const MEMBER_PREFIX: u8 = b'a';

type Membership = StoredMembership<u64, MemberNode>;

pub struct StateMachine {
    state: Arc<AppliedState>,
    db: StateDb,
    last_applied: Option<LogId>,
    membership: Membership,
}

/// The content of a snapshot.
#[derive(Serialize, Deserialize)]
struct SnapshotImage {
    revision: Revision,
    compact_revision: Revision,
    versions: Vec<StoredVersion>,
    members: Vec<(u64, MemberAttrs)>,
}

fn version_key(revision: Revision, sub: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(VERSION_PREFIX);
    k.extend_from_slice(&(revision as u64).to_be_bytes());
    k.extend_from_slice(&(sub as u64).to_be_bytes());
    k
}

fn member_key(id: u64) -> Vec<u8> {
    let mut k = vec![MEMBER_PREFIX];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::read_state_machine(&std::io::Error::other(e.to_string())).into()
}

impl StateMachine {
    /// Load the persisted state into `state` (which must be empty).
    pub fn open(db: StateDb, state: Arc<AppliedState>) -> anyhow::Result<StateMachine> {
        let get = |key: &[u8]| -> anyhow::Result<Option<Vec<u8>>> { Ok(db.get(key)?) };
        let last_applied: Option<LogId> = match get(APPLIED)? {
            Some(b) => decode(&b).map_err(anyhow::Error::msg)?,
            None => None,
        };
        let membership: Membership = match get(MEMBERSHIP)? {
            Some(b) => decode(&b).map_err(anyhow::Error::msg)?,
            None => Membership::default(),
        };
        let revision: Revision = match get(REVISION)? {
            Some(b) => decode(&b).map_err(anyhow::Error::msg)?,
            None => 1,
        };
        let compact: Revision = match get(COMPACT)? {
            Some(b) => decode(&b).map_err(anyhow::Error::msg)?,
            None => -1,
        };
        let mut versions = Vec::new();
        for item in db.scan_prefix(&[VERSION_PREFIX]) {
            let (k, v) = item?;
            let revision = u64::from_be_bytes(k[1..9].try_into()?) as i64;
            let sub = u64::from_be_bytes(k[9..17].try_into()?) as i64;
            let (key, kv) = decode(&v).map_err(anyhow::Error::msg)?;
            versions.push(StoredVersion {
                revision,
                sub,
                key,
                kv,
            });
        }
        *state.mvcc_mut() = MvccStore::restore(versions, revision, compact);
        let mut members = state.members_mut();
        for item in db.scan_prefix(&[MEMBER_PREFIX]) {
            let (k, v) = item?;
            let id = u64::from_be_bytes(k[1..9].try_into()?);
            members.insert(id, decode(&v).map_err(anyhow::Error::msg)?);
        }
        drop(members);
        Ok(StateMachine {
            state,
            db,
            last_applied,
            membership,
        })
    }

    fn persist_changes(batch: &mut StateBatch, changes: Vec<Change>) {
        for c in changes {
            batch
                .puts
                .push((version_key(c.revision, c.sub), encode(&(c.key, c.kv))));
        }
    }

    fn apply_command(&self, cmd: Command, batch: &mut StateBatch) -> CommandResult {
        if let Command::Batch(cmds) = cmd {
            return CommandResult::Batch(
                cmds.into_iter()
                    .map(|c| {
                        assert!(!matches!(c, Command::Batch(_)), "batches are never nested");
                        self.apply_command(c, batch)
                    })
                    .collect(),
            );
        }
        let mut mvcc = self.state.mvcc_mut();
        let rejected = |error, mvcc: &MvccStore| CommandResult::Rejected {
            error,
            revision: mvcc.revision(),
        };
        match cmd {
            Command::Put(req) => match mvcc.put(&req, &()) {
                Ok((result, changes)) => {
                    Self::persist_changes(batch, changes);
                    CommandResult::Put(result)
                }
                Err(e) => rejected(e, &mvcc),
            },
            Command::DeleteRange(req) => {
                let (result, changes) = mvcc.delete_range(&req);
                Self::persist_changes(batch, changes);
                CommandResult::DeleteRange(result)
            }
            Command::Txn(req) => match mvcc.txn(&req, &()) {
                Ok((result, changes)) => {
                    Self::persist_changes(batch, changes);
                    CommandResult::Txn(result)
                }
                Err(e) => rejected(e, &mvcc),
            },
            Command::Compact { revision } => match mvcc.compact(revision) {
                Ok(removed) => {
                    batch.deletes.extend(
                        removed
                            .into_iter()
                            .map(|(_, rev, sub)| version_key(rev, sub)),
                    );
                    CommandResult::Compacted {
                        revision: mvcc.revision(),
                    }
                }
                Err(e) => rejected(e, &mvcc),
            },
            Command::PublishMember {
                id,
                name,
                client_urls,
            } => {
                let attrs = MemberAttrs { name, client_urls };
                batch.puts.push((member_key(id), encode(&attrs)));
                self.state.members_mut().insert(id, attrs);
                CommandResult::MemberPublished {
                    revision: mvcc.revision(),
                }
            }
            Command::Batch(_) => unreachable!("handled above"),
        }
    }

    fn image(&self) -> SnapshotImage {
        let mvcc = self.state.mvcc();
        SnapshotImage {
            revision: mvcc.revision(),
            compact_revision: mvcc.compact_revision(),
            versions: mvcc.versions().collect(),
            members: self
                .state
                .members()
                .iter()
                .map(|(id, a)| (*id, a.clone()))
                .collect(),
        }
    }

    fn snapshot_of(&self, image: &SnapshotImage) -> Snapshot<TypeConfig> {
        let id = match self.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, image.revision),
            None => format!("0-0-{}", image.revision),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: id,
        };
        Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(encode(image))),
        }
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
        let mut batch = StateBatch::default();
        let mut results = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let result = match entry.payload {
                EntryPayload::Blank => CommandResult::Empty,
                EntryPayload::Normal(cmd) => self.apply_command(cmd, &mut batch),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    CommandResult::Empty
                }
            };
            results.push(result);
        }
        {
            let mvcc = self.state.mvcc();
            batch
                .puts
                .push((REVISION.to_vec(), encode(&mvcc.revision())));
            batch
                .puts
                .push((COMPACT.to_vec(), encode(&mvcc.compact_revision())));
        }
        batch
            .puts
            .push((APPLIED.to_vec(), encode(&self.last_applied)));
        batch
            .puts
            .push((MEMBERSHIP.to_vec(), encode(&self.membership)));
        self.db.commit(batch);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        let image = self.image();
        SnapshotBuilder {
            snapshot: Some(self.snapshot_of(&image)),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, MemberNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let image: SnapshotImage = decode(snapshot.get_ref()).map_err(sm_err)?;
        let mut batch = StateBatch::default();
        for v in &image.versions {
            batch.puts.push((
                version_key(v.revision, v.sub),
                encode(&(v.key.clone(), v.kv.clone())),
            ));
        }
        for (id, attrs) in &image.members {
            batch.puts.push((member_key(*id), encode(attrs)));
        }
        batch
            .puts
            .push((REVISION.to_vec(), encode(&image.revision)));
        batch
            .puts
            .push((COMPACT.to_vec(), encode(&image.compact_revision)));
        batch
            .puts
            .push((APPLIED.to_vec(), encode(&meta.last_log_id)));
        batch
            .puts
            .push((MEMBERSHIP.to_vec(), encode(&meta.last_membership)));
        self.db
            .replace_all(batch)
            .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        *self.state.mvcc_mut() =
            MvccStore::restore(image.versions, image.revision, image.compact_revision);
        *self.state.members_mut() = image.members.into_iter().collect();
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let image = self.image();
        Ok(Some(self.snapshot_of(&image)))
    }
}

/// Hands out a snapshot captured when the builder was made.
pub struct SnapshotBuilder {
    snapshot: Option<Snapshot<TypeConfig>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        self.snapshot
            .take()
            .ok_or_else(|| sm_err("snapshot already built"))
    }
}
