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
//! Each batch is admitted by `raft::write::lease_order` before it is proposed: a
//! lease grant may wait there for an expiry of its ID, and a lease expiry
//! that a grant of its ID has overtaken is answered
//! [`ProposeError::Superseded`] instead of proposed.
//!
//! Invariants: a command is proposed at most once; every caller gets exactly
//! one answer. "Not leader" is only reported for a batch that was not handed
//! to openraft (this member did not lead, or led but must not propose), so
//! the caller may retry elsewhere. A batch openraft took and then answered
//! "forward to the leader" is [`ProposeError::LeaderChanged`]: openraft
//! answers so both when it refuses to append and when it truncates an entry
//! it appended, and a truncated entry may still be committed by a later
//! leader that holds a copy (with five voters, an entry on two of them can
//! be truncated on one and committed from the other).
//!
//! Limits: a batch holds at most [`MAX_BATCH_COMMANDS`] commands and
//! [`MAX_BATCH_BYTES`] of encoded commands (a larger command travels alone);
//! at most [`BATCHES_IN_FLIGHT`] batches are proposed at once; at most
//! [`MAX_QUEUED_COMMANDS`] commands and [`MAX_QUEUED_BYTES`] wait behind them,
//! beyond which a proposal is refused with [`ProposeError::Overloaded`]
//! (etcd's "too many requests") rather than queued. A command whose caller
//! gave up before its batch formed is not proposed.

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};

use crate::base::batcher::{Batcher, CallError, Limits};
use crate::base::limits::{
    BATCHES_IN_FLIGHT, MAX_BATCH_BYTES, MAX_BATCH_COMMANDS, MAX_QUEUED_BYTES, MAX_QUEUED_COMMANDS,
};
use crate::model::command::{Command, CommandResult};
use crate::raft::cluster::prevote::Elections;
use crate::raft::types::Raft;
use crate::raft::write::lease_order::{Admitted, LeaseOrder, Mark};

/// The proposer's bounds (see the module doc).
const LIMITS: Limits = Limits {
    max_batch: MAX_BATCH_COMMANDS,
    max_batch_weight: MAX_BATCH_BYTES,
    max_in_flight: BATCHES_IN_FLIGHT,
    max_queued: MAX_QUEUED_COMMANDS,
    max_queued_weight: MAX_QUEUED_BYTES,
};

/// Why a proposal was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// This member is not the leader (it may know who is); nothing was applied.
    NotLeader { leader: Option<u64> },
    /// This member lost the lead after the batch was handed to openraft: it
    /// may or may not be applied (see the module doc).
    LeaderChanged,
    /// Raft stopped.
    Stopped,
    /// The queue is full: nothing was proposed.
    Overloaded,
    /// A lease expiry not proposed: a grant of its ID was in flight, or was
    /// made after the expiry was decided, or the decision is no longer
    /// known (see `raft::write::lease_order`).
    Superseded,
}

/// Handle to the batching task; cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    batcher: Batcher<Command, Result<CommandResult, ProposeError>>,
    /// Orders each lease ID's grants and expiries (see `raft::write::lease_order`).
    lease_order: Arc<LeaseOrder>,
}

impl Proposer {
    /// Start the batching task for `raft`. It ends when every handle is
    /// dropped. A leader that `elections` says may not propose (no quorum
    /// acknowledges it, or it is handing leadership over) answers
    /// `NotLeader`, leader unknown, at once: nothing was proposed, and the
    /// caller tries again once there is news of a leader.
    pub fn start(raft: Raft, elections: Arc<Elections>) -> Proposer {
        let lease_order = Arc::new(LeaseOrder::default());
        let order = lease_order.clone();
        let batcher = Batcher::start(LIMITS, Command::encoded_len, move |cmds: Vec<Command>| {
            let (raft, elections, order) = (raft.clone(), elections.clone(), order.clone());
            async move {
                if !elections.may_propose() {
                    return vec![Err(ProposeError::NotLeader { leader: None }); cmds.len()];
                }
                let n = cmds.len();
                let Admitted { commands, dropped, in_flight, waited } = order.admit(cmds).await;
                let proposed = if commands.is_empty() {
                    Vec::new()
                } else if waited && !elections.may_propose() {
                    // It waited for an expiry (see `raft::write::lease_order`): asked again.
                    vec![Err(ProposeError::NotLeader { leader: None }); commands.len()]
                } else if in_flight.is_empty() {
                    propose_batch(&raft, commands).await
                } else {
                    // Its grants and expiries stay in flight until the entry
                    // is answered (applied, or refused), even if the caller
                    // running this batch stops waiting (see `crate::base::batcher`).
                    let len = commands.len();
                    let proposal = tokio::spawn(async move {
                        let results = propose_batch(&raft, commands).await;
                        in_flight.answered(&results);
                        results
                    });
                    match proposal.await {
                        Ok(results) => results,
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(_) => vec![Err(ProposeError::Stopped); len],
                    }
                };
                if dropped.is_empty() {
                    return proposed;
                }
                let mut proposed = proposed.into_iter();
                (0..n)
                    .map(|i| {
                        if dropped.contains(&i) {
                            Err(ProposeError::Superseded)
                        } else {
                            proposed.next().expect("a result for each command proposed")
                        }
                    })
                    .collect()
            }
        });
        Proposer { batcher, lease_order }
    }

    /// A mark for the lease keeper to take before it reads the lease table
    /// to decide expiries (see `raft::write::lease_order`).
    pub fn lease_mark(&self) -> Mark {
        self.lease_order.mark()
    }

    /// Propose the expiry of lease `id`, decided by the leader of `term`
    /// from a lease table read after `mark`; `Superseded` (nothing was
    /// proposed) if a grant of `id` was in flight or made since.
    pub async fn propose_expiry(&self, id: i64, term: u64, mark: &Mark) -> Result<CommandResult, ProposeError> {
        let _decided = self.lease_order.decided(id, mark);
        self.propose(Command::LeaseExpire { id, term }).await
    }

    /// Commands waiting for a batch.
    pub fn queued(&self) -> usize {
        self.batcher.queued()
    }

    /// Propose `cmd` on this member and wait for its apply result.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        answer(self.batcher.call(cmd).await)
    }

    /// Propose `cmds` together, so that they share an entry (with whatever
    /// else is queued), and wait for their results, in order.
    pub async fn propose_all(&self, cmds: Vec<Command>) -> Vec<Result<CommandResult, ProposeError>> {
        self.batcher.call_all(cmds).await.into_iter().map(answer).collect()
    }
}

fn answer(called: Result<Result<CommandResult, ProposeError>, CallError>) -> Result<CommandResult, ProposeError> {
    match called {
        Ok(result) => result,
        Err(CallError::Overloaded) => Err(ProposeError::Overloaded),
        Err(CallError::Stopped) => Err(ProposeError::Stopped),
    }
}

async fn propose_batch(raft: &Raft, cmds: Vec<Command>) -> Vec<Result<CommandResult, ProposeError>> {
    let n = cmds.len();
    let cmd = if n == 1 { cmds.into_iter().next().expect("one command") } else { Command::Batch(Arc::new(cmds)) };
    let outcome = match raft.client_write(cmd).await {
        Ok(resp) => Ok(resp.data),
        // Refused to append, or truncated after it was appended: which one
        // is not told (see the module doc).
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(ProposeError::LeaderChanged),
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            unreachable!("a command is not a membership change: {e}")
        }
        Err(RaftError::Fatal(_)) => Err(ProposeError::Stopped),
    };
    if outcome.is_ok() {
        crate::base::metrics::metrics().proposal_batch.observe(n as f64);
    }
    match outcome {
        Ok(CommandResult::Batch(results)) if n > 1 => {
            assert_eq!(results.len(), n, "one result per batched command");
            results.into_iter().map(Ok).collect()
        }
        Ok(result) => {
            assert_eq!(n, 1, "a batch must answer with a batch result");
            vec![Ok(result)]
        }
        Err(e) => {
            crate::base::metrics::metrics().proposals_failed.inc();
            vec![Err(e); n]
        }
    }
}
