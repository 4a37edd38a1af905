//! The write path's facade: one typed method per replicated operation, each
//! answering with that operation's own result or why it has none.
//!
//! Every write goes through `Node::write`: on the leader, its proposer
//! (`raft::write::proposer`, which batches concurrent commands into one entry); on a
//! follower, the peer protocol's forwarder (`raft::write::forward`), which
//! hands it to the leader's proposer. It is retried only when it certainly
//! was not applied (the target was not the leader, or could not be reached);
//! anything ambiguous is reported to the client, as etcd does.
//!
//! Invariant (apply's contract, `raft::store::state_machine::apply`): a command is answered with
//! its own result variant, or `Rejected` with the store unchanged. Any other
//! answer is a bug, reported once, in [`mismatch`].

use tokio::time::Instant;

use super::route::{Attempt, Route};
use super::{Node, ServerError};
use crate::model::alarm::{AlarmAction, AlarmKind};
use crate::model::applied::LEASE_BYTES;
use crate::model::auth::{AuthCommand, AuthError, Caller};
use crate::model::command::{Command, CommandResult, UserCommand};
use crate::model::mvcc::{
    DeleteRangeRequest, DeleteRangeResult, MvccError, PutRequest, PutResult, Revision, TxnRequest, TxnResult,
};
use crate::raft::ForwardFailure;
use crate::raft::ProposeError;

/// Why a write did not change the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// It could not be replicated (or its fate is unknown).
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Apply refused it, deterministically, on every member.
    #[error(transparent)]
    Rejected(#[from] MvccError),
    /// Auth refused it when it was applied (or, for an auth change, the
    /// change was not possible).
    #[error(transparent)]
    Denied(#[from] AuthError),
}

/// A lease as granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedLease {
    pub id: i64,
    /// The TTL granted, in seconds (raised to the floor).
    pub ttl: i64,
    pub revision: Revision,
}

/// How many server-chosen lease IDs are drawn before a grant gives up.
const LEASE_ID_DRAWS: usize = 8;

/// On whose behalf a write is made: a client (`Some`: apply checks its
/// permissions while auth is on), or raftlock itself (`None`: the lock
/// recipes, checked when their request arrived).
pub type OnBehalf<'a> = Option<&'a Caller>;

impl Node {
    pub async fn put(&self, req: PutRequest, by: OnBehalf<'_>) -> Result<PutResult, WriteError> {
        self.check_quota(req.quota_cost()).await?;
        match self.write(as_user(by, UserCommand::Put(req))).await? {
            CommandResult::Put(r) => Ok(r),
            other => Err(rejected("put", other)),
        }
    }

    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
        by: OnBehalf<'_>,
    ) -> Result<DeleteRangeResult, WriteError> {
        match self.write(as_user(by, UserCommand::DeleteRange(req))).await? {
            CommandResult::DeleteRange(r) => Ok(r),
            other => Err(rejected("delete range", other)),
        }
    }

    pub async fn txn(&self, req: TxnRequest, by: OnBehalf<'_>) -> Result<TxnResult, WriteError> {
        self.check_quota(req.quota_cost()).await?;
        // Refused here, a txn whose answer is over the limit costs no entry.
        self.state.mvcc().check_txn_response(&req)?;
        match self.write(as_user(by, UserCommand::Txn(req))).await? {
            CommandResult::Txn(r) => Ok(r),
            other => Err(rejected("txn", other)),
        }
    }

    /// Compact history up to `revision`; returns the store's revision.
    pub async fn compact(&self, revision: Revision, by: OnBehalf<'_>) -> Result<Revision, WriteError> {
        match self.write(as_user(by, UserCommand::Compact { revision })).await? {
            CommandResult::Compacted { revision } => Ok(revision),
            other => Err(rejected("compaction", other)),
        }
    }

    /// Grant a lease of `ttl` seconds (raised to the floor, `min_lease_ttl`)
    /// with ID `id`, or with an ID this member draws when `id` is 0 (drawn
    /// again if it happens to be taken).
    pub async fn grant_lease(&self, id: i64, ttl: i64, by: OnBehalf<'_>) -> Result<GrantedLease, WriteError> {
        let ttl = ttl.max(self.min_lease_ttl);
        self.check_quota(LEASE_BYTES).await?;
        for _ in 0..LEASE_ID_DRAWS {
            let chosen = if id != 0 { id } else { random_lease_id() };
            match self.write(as_user(by, UserCommand::LeaseGrant { id: chosen, ttl })).await? {
                CommandResult::LeaseGranted { id, ttl, revision } => return Ok(GrantedLease { id, ttl, revision }),
                CommandResult::Rejected { error: MvccError::LeaseExists, .. } if id == 0 => continue,
                other => return Err(rejected("lease grant", other)),
            }
        }
        // Eight random 63-bit IDs all taken: the generator is broken.
        Err(MvccError::LeaseExists.into())
    }

    /// Revoke lease `id` and delete its keys; returns the revision.
    pub async fn revoke_lease(&self, id: i64, by: OnBehalf<'_>) -> Result<Revision, WriteError> {
        match self.write(as_user(by, UserCommand::LeaseRevoke { id })).await? {
            CommandResult::LeaseRevoked { revision } => Ok(revision),
            other => Err(rejected("lease revoke", other)),
        }
    }

    /// Change the auth store (or hand out a simple token) for `by`; returns
    /// the store's revision.
    pub async fn change_auth(&self, cmd: AuthCommand, by: &Caller) -> Result<Revision, WriteError> {
        match self.write(as_user(Some(by), UserCommand::Auth(cmd))).await? {
            CommandResult::AuthChanged { revision } => Ok(revision),
            other => Err(rejected("auth change", other)),
        }
    }

    /// Raise or disarm `member`'s alarm of `kind`; returns the alarm raised
    /// (or found raised) or disarmed, `None` if there was none to disarm.
    pub async fn alarm(
        &self,
        action: AlarmAction,
        member: u64,
        kind: AlarmKind,
    ) -> Result<Option<(u64, AlarmKind)>, WriteError> {
        match self.write(Command::Alarm { action, member, kind }).await? {
            CommandResult::Alarm { alarm, .. } => Ok(alarm),
            other => Err(rejected("alarm", other)),
        }
    }

    /// etcd's space quota, checked by the member that takes a write which
    /// adds `cost` bytes: if the state would weigh more than the quota, this
    /// member raises its NOSPACE alarm (through the log, so that every member
    /// refuses such writes from then on) and the write is refused. The check
    /// is against this member's applied state, which may trail the log: the
    /// quota can be passed by what is in flight, never for long.
    async fn check_quota(&self, cost: u64) -> Result<(), WriteError> {
        // A write that adds nothing (a txn that only reads or deletes: a
        // lock's release) always goes through, as etcd's.
        if cost == 0 {
            return Ok(());
        }
        if self.disk_low.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(MvccError::NoSpace.into());
        }
        let Some(quota) = self.quota else { return Ok(()) };
        if self.state.size_bytes().saturating_add(cost) <= quota {
            return Ok(());
        }
        let raised = self.state.alarms().list().contains(&(self.id, AlarmKind::NoSpace));
        if !raised {
            tracing::warn!(quota, size = self.state.size_bytes(), "space quota exceeded; raising alarm NOSPACE");
            if let Err(e) = self.alarm(AlarmAction::Activate, self.id, AlarmKind::NoSpace).await {
                tracing::warn!(error = %e, "raising alarm NOSPACE");
            }
        }
        Err(MvccError::NoSpace.into())
    }

    /// Whether the state weighs more than the quota.
    pub(super) fn over_quota(&self) -> bool {
        self.quota.is_some_and(|quota| self.state.size_bytes() > quota)
    }

    /// Announce this member's client URLs through the log (etcd's publish).
    pub(super) async fn publish_member(&self, name: String, client_urls: Vec<String>) -> Result<(), WriteError> {
        match self.write(Command::PublishMember { id: self.id, name, client_urls }).await? {
            CommandResult::MemberPublished { .. } => Ok(()),
            other => Err(rejected("member publish", other)),
        }
    }

    /// Replicate `cmd` and return its apply result (see the module doc).
    async fn write(&self, cmd: Command) -> Result<CommandResult, ServerError> {
        self.routed(|route, deadline| {
            let cmd = cmd.clone();
            async move { self.write_attempt(route, deadline, cmd).await }
        })
        .await
    }

    /// One attempt of `Node::write`.
    async fn write_attempt(
        &self,
        route: Route,
        deadline: Instant,
        cmd: Command,
    ) -> Attempt<CommandResult, ServerError> {
        match route {
            Route::Here => match tokio::time::timeout_at(deadline, self.replica.proposer.propose(cmd)).await {
                Err(_) => Attempt::Done(Err(ServerError::Timeout)),
                Ok(Ok(result)) => Attempt::Done(Ok(result)),
                // Not handed to openraft: safe to retry.
                Ok(Err(ProposeError::NotLeader { .. })) => Attempt::Retry,
                // Appended, then the lead was lost: its fate is unknown.
                Ok(Err(ProposeError::LeaderChanged)) => Attempt::Done(Err(ServerError::LeaderChanged)),
                Ok(Err(ProposeError::Stopped)) => Attempt::Done(Err(ServerError::Stopped)),
                Ok(Err(ProposeError::Overloaded)) => Attempt::Done(Err(ServerError::TooManyRequests)),
                Ok(Err(ProposeError::Superseded)) => unreachable!("only the keeper's lease expiries are superseded"),
            },
            Route::Leader { url, .. } => {
                let forwarded = self.replica.forwarder.forward(url, cmd);
                match tokio::time::timeout_at(deadline, forwarded).await {
                    Err(_) => Attempt::Done(Err(ServerError::Timeout)),
                    Ok(Ok(result)) => Attempt::Done(Ok(result)),
                    Ok(Err(ForwardFailure::NotLeader { leader })) => {
                        tracing::debug!(?leader, "forwarded write reached a member that does not lead");
                        Attempt::Retry
                    }
                    Ok(Err(ForwardFailure::Overloaded)) => Attempt::Done(Err(ServerError::TooManyRequests)),
                    Ok(Err(ForwardFailure::Unreachable(why))) => {
                        tracing::debug!(%why, "forwarded write never reached the leader");
                        Attempt::Retry
                    }
                    Ok(Err(ForwardFailure::Unknown(e))) => {
                        tracing::debug!(error = %e, "forwarded write failed");
                        Attempt::Done(Err(if Instant::now() >= deadline {
                            ServerError::Timeout
                        } else {
                            ServerError::LeaderChanged
                        }))
                    }
                }
            }
        }
    }
}

/// The error of a write that apply answered with `result` instead of the
/// operation's own result: a rejection, or (see [`mismatch`]) a bug.
fn rejected(operation: &str, result: CommandResult) -> WriteError {
    match result {
        CommandResult::Rejected { error, .. } => WriteError::Rejected(error),
        CommandResult::Denied { error, .. } => WriteError::Denied(error),
        other => mismatch(operation, other),
    }
}

/// Apply answered a command with another command's result: apply's contract
/// (see the module doc) is broken, and nothing this member answers can be
/// trusted to be what was asked. Not an input error: a bug.
fn mismatch(operation: &str, result: CommandResult) -> ! {
    panic!("raftlock bug: apply answered a {operation} with {result:?}")
}

/// `cmd` as `by` sent it (see [`OnBehalf`]).
fn as_user(by: OnBehalf<'_>, cmd: UserCommand) -> Command {
    match by {
        Some(caller) => Command::AsUser { user: caller.user.clone(), auth_revision: caller.revision, command: cmd },
        None => cmd.into(),
    }
}

/// A random positive lease ID (from a generator seeded by the OS).
fn random_lease_id() -> i64 {
    (rand::random::<u64>() & i64::MAX as u64).max(1) as i64
}
