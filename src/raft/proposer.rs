//! Proposal batching: many client writes, one log entry.
//!
//! Every log entry costs each member an `fdatasync` (on the leader, overlapped
//! with replication), so one log entry per client write would cost a sync per
//! write. The proposer instead queues the commands that arrive while a
//! proposal is in flight and proposes them together as one
//! [`Command::Batch`]: one entry, one flush, one round of replication. Each
//! command in a batch is still applied on its own (its own revision, its own
//! result), in queue order, so a batch is indistinguishable from its commands
//! proposed one after the other.
//!
//! Invariants: a command is proposed at most once; every caller gets exactly
//! one answer. "Not leader" is only reported for a batch openraft refused to
//! append (or truncated before commit), so the caller may retry elsewhere.
//!
//! Limits: a batch holds at most [`MAX_BATCH_COMMANDS`] commands; at most
//! [`MAX_IN_FLIGHT`] batches are proposed at once.

use openraft::error::{ClientWriteError, RaftError};

use super::Raft;
use crate::batcher::Batcher;
use crate::command::{Command, CommandResult};

/// The most commands in one log entry.
pub const MAX_BATCH_COMMANDS: usize = 512;
/// Batches proposed and not yet answered, at most. More than one lets the next
/// batches be appended while earlier ones are replicated and applied (the
/// measurements: docs/performance-notes.md).
pub const MAX_IN_FLIGHT: usize = 4;

/// Why a proposal was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This member is not the leader (it may know who is); nothing was applied.
    NotLeader { leader: Option<u64> },
    /// Raft stopped.
    Stopped,
}

/// Handle to the batching task; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    batcher: Batcher<Command, Result<CommandResult, ProposeError>>,
}

impl Proposer {
    /// Start the batching task for `raft`. It ends when every handle is dropped.
    pub fn start(raft: Raft) -> Proposer {
        let batcher = Batcher::start(MAX_BATCH_COMMANDS, MAX_IN_FLIGHT, move |cmds| {
            let raft = raft.clone();
            async move { propose_batch(&raft, cmds).await }
        });
        Proposer { batcher }
    }

    /// Propose `cmd` on this member and wait for its apply result.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        self.batcher.call(cmd).await.unwrap_or(Err(ProposeError::Stopped))
    }
}

async fn propose_batch(raft: &Raft, cmds: Vec<Command>) -> Vec<Result<CommandResult, ProposeError>> {
    let n = cmds.len();
    let cmd = if n == 1 { cmds.into_iter().next().expect("one command") } else { Command::Batch(cmds) };
    let outcome = match raft.client_write(cmd).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ProposeError::NotLeader { leader: f.leader_id })
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            unreachable!("a command is not a membership change: {e}")
        }
        Err(RaftError::Fatal(_)) => Err(ProposeError::Stopped),
    };
    match outcome {
        Ok(CommandResult::Batch(results)) if n > 1 => {
            assert_eq!(results.len(), n, "one result per batched command");
            results.into_iter().map(Ok).collect()
        }
        Ok(result) => {
            assert_eq!(n, 1, "a batch must answer with a batch result");
            vec![Ok(result)]
        }
        Err(e) => vec![Err(e); n],
    }
}
