//! etcd's Maintenance service: Status, alarms (`crate::model::alarm`), Snapshot (the member's
//! state streamed as a backup, in raftlock's own encoding — not a bbolt file),
//! Defragment (a flush of the state store), MoveLeader (see
//! `raft::cluster::transfer`), Hash and HashKV, and Downgrade between
//! raftlock releases (`node::versions`).

use std::pin::Pin;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{auth, error, header};
use crate::base::limits::SNAPSHOT_CHUNK_BYTES;
use crate::model::alarm::{AlarmAction, AlarmKind};
use crate::node::Node;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::maintenance_server::{Maintenance, MaintenanceServer};

pub struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    pub fn server(node: Arc<Node>) -> super::served::Served<MaintenanceServer<MaintenanceService>> {
        super::served::Served(
            MaintenanceServer::new(MaintenanceService { node })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

type SnapshotStream = Pin<Box<dyn futures::Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// etcd's alarms (`crate::model::alarm`): GET lists them (all, or those of one
    /// type) as applied when a read barrier passed; ACTIVATE and DEACTIVATE
    /// go through the log. Changing alarms takes the root role while auth
    /// is on (stricter than etcd 3.5, which lets anyone disarm).
    async fn alarm(&self, req: Request<pb::AlarmRequest>) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction as Action;
        let action = Action::try_from(req.get_ref().action).map_err(|_| error::unknown_alarm_action())?;
        if action != Action::Get {
            auth::maintenance_admin(&self.node, &req).await?;
        }
        let req = req.into_inner();
        let kind = alarm_kind(req.alarm);
        let changed = match (action, kind) {
            (Action::Get, _) => {
                self.node.read_barrier().await.map_err(error::server)?;
                let alarms = self.node.state().alarms().list();
                let wanted = alarms.into_iter().filter(|(_, k)| kind.is_none_or(|kind| *k == kind));
                return Ok(Response::new(pb::AlarmResponse {
                    header: header(&self.node, self.node.revision()),
                    alarms: wanted.map(alarm_member).collect(),
                }));
            }
            // No alarm named: nothing to raise or disarm.
            (_, None) => None,
            (Action::Activate, Some(kind)) => {
                self.node.alarm(AlarmAction::Activate, req.member_id, kind).await.map_err(error::write)?
            }
            (Action::Deactivate, Some(kind)) => {
                self.node.alarm(AlarmAction::Deactivate, req.member_id, kind).await.map_err(error::write)?
            }
        };
        Ok(Response::new(pb::AlarmResponse {
            header: header(&self.node, self.node.revision()),
            alarms: changed.into_iter().map(alarm_member).collect(),
        }))
    }

    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let s = self.node.status();
        let mut errors = Vec::new();
        if s.leader == 0 {
            errors.push(error::NO_LEADER.to_string());
        }
        // As etcd prints an alarm member.
        for (member, kind) in self.node.state().alarms().list() {
            errors.push(format!("memberID:{member} alarm:{} ", kind.name()));
        }
        Ok(Response::new(pb::StatusResponse {
            header: header(&self.node, self.node.revision()),
            version: crate::base::version::ETCD_API.to_string(),
            db_size: s.db_size as i64,
            leader: s.leader,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.applied_index,
            errors,
            db_size_in_use: s.db_size as i64,
            is_learner: s.is_learner,
        }))
    }

    /// sled has no file compaction to trigger (it reclaims space itself);
    /// what remains to do is to finish removing compacted history and to
    /// push the state store to disk.
    async fn defragment(
        &self,
        req: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        auth::maintenance_admin(&self.node, &req).await?;
        self.node.compaction_swept(None).await;
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || node.sync_state())
            .await
            .map_err(|e| error::internal("syncing the state store", e))?
            .map_err(|e| error::internal("syncing the state store", e))?;
        Ok(Response::new(pb::DefragmentResponse { header: header(&self.node, self.node.revision()) }))
    }

    /// A checksum of the member's whole applied state (every version,
    /// leases, members, auth), as a Snapshot would hold it: equal on members
    /// that applied the same log.
    async fn hash(&self, req: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        auth::maintenance_admin(&self.node, &req).await?;
        let node = self.node.clone();
        let (data, revision) = tokio::task::spawn_blocking(move || node.snapshot())
            .await
            .map_err(|e| error::internal("hashing the state", e))?;
        Ok(Response::new(pb::HashResponse { header: header(&self.node, revision), hash: crc32fast::hash(&data) }))
    }

    /// etcd's HashKV: a checksum of the key-value history up to a revision
    /// (see `MvccStore::hash_kv`), served by this member from its own state.
    async fn hash_kv(&self, req: Request<pb::HashKvRequest>) -> Result<Response<pb::HashKvResponse>, Status> {
        auth::maintenance_admin(&self.node, &req).await?;
        let revision = req.into_inner().revision;
        let node = self.node.clone();
        let hashed = tokio::task::spawn_blocking(move || {
            let mvcc = node.state().mvcc();
            mvcc.hash_kv(revision).map(|(hash, compact)| (hash, compact, mvcc.revision()))
        })
        .await
        .map_err(|e| error::internal("hashing the key-value history", e))?;
        let (hash, compact_revision, current) = hashed.map_err(error::mvcc)?;
        Ok(Response::new(pb::HashKvResponse { header: header(&self.node, current), hash, compact_revision }))
    }

    type SnapshotStream = SnapshotStream;

    /// The member's whole state (every version, leases, members) in
    /// raftlock's snapshot encoding, zero-padded to a multiple of 512 bytes and
    /// followed by the SHA-256 of all that — etcd's trailer, which etcdctl
    /// checks — in chunks of [`SNAPSHOT_CHUNK_BYTES`] bytes.
    async fn snapshot(&self, req: Request<pb::SnapshotRequest>) -> Result<Response<SnapshotStream>, Status> {
        use sha2::Digest;
        auth::maintenance_admin(&self.node, &req).await?;
        // Copying and encoding the whole state is long work: not on the runtime's thread.
        let node = self.node.clone();
        let (mut data, revision) = tokio::task::spawn_blocking(move || node.snapshot())
            .await
            .map_err(|e| error::internal("taking a snapshot", e))?;
        data.resize(data.len().div_ceil(512) * 512, 0);
        let digest = sha2::Sha256::digest(&data);
        data.extend_from_slice(&digest);
        let first = header(&self.node, revision);
        let total = data.len();
        let chunks: Vec<Result<pb::SnapshotResponse, Status>> = data
            .chunks(SNAPSHOT_CHUNK_BYTES)
            .enumerate()
            .map(|(i, blob)| {
                let sent = i * SNAPSHOT_CHUNK_BYTES + blob.len();
                Ok(pb::SnapshotResponse {
                    header: if i == 0 { first } else { None },
                    remaining_bytes: (total - sent) as u64,
                    blob: blob.to_vec(),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    /// As etcd: only the leader takes it (clients send it to the leader).
    async fn move_leader(
        &self,
        req: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        auth::maintenance_admin(&self.node, &req).await?;
        self.node.move_leader(req.into_inner().target_id).await.map_err(error::transfer)?;
        Ok(Response::new(pb::MoveLeaderResponse { header: header(&self.node, self.node.revision()) }))
    }

    /// etcd 3.6's downgrade, between raftlock releases: the version asked
    /// and answered is raftlock's (`node::versions`), not the etcd API
    /// level. Root only, as etcd.
    async fn downgrade(&self, req: Request<pb::DowngradeRequest>) -> Result<Response<pb::DowngradeResponse>, Status> {
        use crate::node::versions::{DowngradeAction, DowngradeRefusal};
        auth::maintenance_admin(&self.node, &req).await?;
        let req = req.into_inner();
        let action = match pb::downgrade_request::DowngradeAction::try_from(req.action) {
            Ok(pb::downgrade_request::DowngradeAction::Validate) => DowngradeAction::Validate,
            Ok(pb::downgrade_request::DowngradeAction::Enable) => DowngradeAction::Enable,
            Ok(pb::downgrade_request::DowngradeAction::Cancel) => DowngradeAction::Cancel,
            Err(_) => return Err(Status::invalid_argument("etcdserver: unknown downgrade action")),
        };
        let version = self.node.downgrade(action, &req.version).await.map_err(|refusal| match refusal {
            DowngradeRefusal::WrongFormat | DowngradeRefusal::InvalidTarget => {
                Status::invalid_argument(refusal.to_string())
            }
            DowngradeRefusal::Unreachable(_) => Status::unavailable(refusal.to_string()),
            _ => Status::failed_precondition(refusal.to_string()),
        })?;
        Ok(Response::new(pb::DowngradeResponse {
            header: header(&self.node, self.node.revision()),
            version: version.to_string(),
        }))
    }
}

/// The alarm an AlarmRequest names (`None`: NONE, or a type unknown here).
fn alarm_kind(alarm: i32) -> Option<AlarmKind> {
    match pb::AlarmType::try_from(alarm) {
        Ok(pb::AlarmType::Nospace) => Some(AlarmKind::NoSpace),
        Ok(pb::AlarmType::Corrupt) => Some(AlarmKind::Corrupt),
        _ => None,
    }
}

fn alarm_member((member, kind): (u64, AlarmKind)) -> pb::AlarmMember {
    let alarm = match kind {
        AlarmKind::NoSpace => pb::AlarmType::Nospace,
        AlarmKind::Corrupt => pb::AlarmType::Corrupt,
    };
    pb::AlarmMember { member_id: member, alarm: alarm as i32 }
}
