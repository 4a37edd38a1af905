//! The replicated command: what a Raft log entry asks the state machine to do.
//!
//! `Command` is raftlock's own type — never a protobuf message — so that the
//! client API can change without changing the log format. It is encoded with
//! serde/bincode inside the WAL and on the peer wire.
//!
//! Compatibility rule: bincode numbers enum variants by position, so variants are
//! only ever *appended*, and a variant's fields never change. A change of meaning
//! gets a new variant; the old one keeps being applied as before so that logs
//! written by an older raftlock replay identically.
//!
//! Every field a command needs to be applied deterministically travels in it
//! (e.g. a lease ID chosen by the proposer): apply reads no clock and draws no
//! random number.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::alarm::{AlarmAction, AlarmKind};
use crate::model::auth::{AuthCommand, AuthError};
use crate::model::mvcc::{
    DeleteRangeRequest, DeleteRangeResult, MvccError, PutRequest, PutResult, Revision, TxnRequest, TxnResult,
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact {
        revision: Revision,
    },
    /// A member announces the client URLs it serves on (etcd's "publish"), so
    /// that MemberList can show them on every node.
    PublishMember {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
    /// Several client commands proposed as one entry (see `raft::write::proposer`);
    /// applied one after the other, each with its own result. Never nested.
    /// Shared: the log keeps the newest entries in memory and hands out a
    /// copy to each reader (apply, and each follower's replication), which
    /// is then a reference count, not the batch's keys and values. An `Arc`
    /// encodes as what it holds, so the bytes are those of a `Vec<Command>`.
    Batch(Arc<Vec<Command>>),
    /// Grant lease `id` (chosen by the proposer) for `ttl` seconds (already
    /// raised to the floor).
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    /// Revoke a lease and delete its keys, in one revision. Proposed by clients
    /// and by the leader when a lease expires.
    LeaseRevoke {
        id: i64,
    },
    /// Revoke a lease whose deadline passed, as the leader of `term` decided
    /// (`node::lease::keeper`). Applied only if the entry was appended in
    /// `term`: lease time is the leader's, so the word of a leader that has
    /// since been deposed — whose deadlines missed every keepalive the next
    /// leader took — must never revoke a lease, whichever way its proposal
    /// reached the log.
    LeaseExpire {
        id: i64,
        term: u64,
    },
    /// A change of etcd's auth store (users, roles, on/off) or a simple
    /// token handed out. Clients' changes arrive wrapped in `AsUser`.
    Auth(AuthCommand),
    /// A client's command with who sent it: while auth is on, apply runs it
    /// only if the auth store, as it stands then, lets `user` do it
    /// (`auth_revision` is the store revision the caller was identified at;
    /// 0 with an empty user: nobody). While auth is off it is `command`.
    AsUser {
        user: String,
        auth_revision: u64,
        command: UserCommand,
    },
    /// Raise or disarm an alarm (`crate::model::alarm`) for member `member`: raised
    /// by a member itself (quota, disk), disarmed by an operator.
    Alarm {
        action: AlarmAction,
        member: u64,
        kind: AlarmKind,
    },
    /// A write member `origin` forwarded to the leader, as the leader
    /// proposed it: applied as `command`, and the member that forwarded it
    /// answers its client from its own apply, where it finds its `tag`
    /// (`raft::write::forwarded`). Never holds a batch or another forwarded write.
    /// Caveat: raftlocks before it cannot decode it. In a rolling upgrade,
    /// once a member of this version leads and another one forwards to it,
    /// a member still on an older version stops applying until it is
    /// upgraded too (a follower of an older version still forwards: its
    /// batches are proposed as they are).
    Forwarded {
        origin: u64,
        tag: u64,
        command: Box<Command>,
    },
}

/// What a client may ask for in a `Command::AsUser`: a separate type, so
/// that an `AsUser` can never hold another (no nesting to bound on decode).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserCommand {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact { revision: Revision },
    LeaseGrant { id: i64, ttl: i64 },
    LeaseRevoke { id: i64 },
    Auth(AuthCommand),
}

impl From<UserCommand> for Command {
    fn from(c: UserCommand) -> Command {
        match c {
            UserCommand::Put(r) => Command::Put(r),
            UserCommand::DeleteRange(r) => Command::DeleteRange(r),
            UserCommand::Txn(r) => Command::Txn(r),
            UserCommand::Compact { revision } => Command::Compact { revision },
            UserCommand::LeaseGrant { id, ttl } => Command::LeaseGrant { id, ttl },
            UserCommand::LeaseRevoke { id } => Command::LeaseRevoke { id },
            UserCommand::Auth(a) => Command::Auth(a),
        }
    }
}

/// The outcome of applying one log entry, identical on every replica. The
/// leader's copy becomes the client's response.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// A blank or membership entry: nothing for a client.
    #[default]
    Empty,
    Put(PutResult),
    DeleteRange(DeleteRangeResult),
    Txn(TxnResult),
    /// A compaction; `revision` is the store's revision for the header.
    Compacted {
        revision: Revision,
    },
    MemberPublished {
        revision: Revision,
    },
    /// A deterministic rejection: the store is unchanged.
    Rejected {
        error: MvccError,
        revision: Revision,
    },
    /// The results of a `Command::Batch`, in order.
    Batch(Vec<CommandResult>),
    LeaseGranted {
        id: i64,
        ttl: i64,
        revision: Revision,
    },
    LeaseRevoked {
        revision: Revision,
    },
    /// A `Command::LeaseExpire` whose entry was appended in another term
    /// than the one it was decided in: nothing changed.
    ExpiryOfAnotherTerm {
        revision: Revision,
    },
    /// An auth command was applied.
    AuthChanged {
        revision: Revision,
    },
    /// Auth refused a command (`AsUser`) or an auth change: nothing changed.
    Denied {
        error: AuthError,
        revision: Revision,
    },
    /// An alarm command: the alarm it raised, found raised, or disarmed
    /// (`None`: disarming one that was not raised).
    Alarm {
        alarm: Option<(u64, AlarmKind)>,
        revision: Revision,
    },
}

impl Command {
    /// The command's kind, for errors and logs.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Command::Put(_) => "a put",
            Command::DeleteRange(_) => "a delete",
            Command::Txn(_) => "a txn",
            Command::Compact { .. } => "a compaction",
            Command::PublishMember { .. } => "a member's publish",
            Command::Batch(_) => "a batch",
            Command::LeaseGrant { .. } => "a lease grant",
            Command::LeaseRevoke { .. } => "a lease revoke",
            Command::LeaseExpire { .. } => "a lease expiry",
            Command::Auth(_) => "an auth change without its caller",
            Command::AsUser { .. } => "a user's command",
            Command::Alarm { .. } => "an alarm",
            Command::Forwarded { .. } => "a forwarded write",
        }
    }

    /// The command's size as the log encodes it (bincode), found without
    /// encoding it: what proposal batches and queues are bounded by.
    pub fn encoded_len(&self) -> u64 {
        bincode::serialized_size(self).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::codec::{decode, encode};

    /// A batch is shared in memory and encodes as the plain list of commands
    /// that entries written before held: bincode's variant index (Batch is
    /// the sixth variant), then the list.
    #[test]
    fn a_shared_batch_encodes_as_its_list_of_commands() {
        let cmds = vec![
            Command::Put(PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() }),
            Command::LeaseRevoke { id: 7 },
        ];
        let batch = Command::Batch(Arc::new(cmds.clone()));
        let mut written_before = encode(&5u32);
        written_before.extend(bincode::serialize(&cmds).expect("encodes"));
        assert_eq!(encode(&batch), written_before);
        assert_eq!(decode::<Command>(&written_before).expect("decodes"), batch);
    }
}
