//! Proposal batching: many client writes, one log entry.
//!
//! openraft 0.9's core waits for each append to be flushed before it takes the
//! next one, so one log entry per client write costs one `fdatasync` per write,
//! in series. The proposer instead queues the commands that arrive while a
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

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::Raft;
use crate::command::{Command, CommandResult};

/// The most commands in one log entry.
pub const MAX_BATCH_COMMANDS: usize = 512;
/// Batches proposed and not yet answered, at most. Two lets the next batch be
/// appended while the previous one is being replicated and applied.
pub const MAX_IN_FLIGHT: usize = 2;

/// Why a proposal was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This member is not the leader (it may know who is); nothing was applied.
    NotLeader { leader: Option<u64> },
    /// Raft stopped.
    Stopped,
}

type Reply = oneshot::Sender<Result<CommandResult, ProposeError>>;

/// Handle to the batching task; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::UnboundedSender<(Command, Reply)>,
}

impl Proposer {
    /// Start the batching task for `raft`. It ends when every handle is dropped.
    pub fn start(raft: Raft) -> Proposer {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
        Proposer { queue }
    }

    /// Propose `cmd` on this member and wait for its apply result.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        let (tx, rx) = oneshot::channel();
        self.queue.send((cmd, tx)).map_err(|_| ProposeError::Stopped)?;
        rx.await.unwrap_or(Err(ProposeError::Stopped))
    }
}

async fn run(raft: Raft, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        // Wait for a free slot first, so that commands pile up meanwhile.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_COMMANDS {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            propose_batch(&raft, batch).await;
            drop(permit);
        });
    }
}

async fn propose_batch(raft: &Raft, batch: Vec<(Command, Reply)>) {
    let (cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
    let single = cmds.len() == 1;
    let cmd = if single { cmds.into_iter().next().expect("one command") } else { Command::Batch(cmds) };
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
        Ok(CommandResult::Batch(results)) if !single => {
            assert_eq!(results.len(), replies.len(), "one result per batched command");
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
        }
        Ok(result) => {
            assert!(single, "a batch must answer with a batch result");
            let _ = replies.into_iter().next().expect("one reply").send(Ok(result));
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
