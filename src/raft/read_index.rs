//! The read index a leader hands out for linearizable reads.
//!
//! openraft's `get_read_log_id` answers max(noop, committed): the first entry
//! this leader proposed in its term, or the commit index. That is not enough
//! after a restart: a member that restarts holding a committed vote for itself
//! comes back as leader *without* an election, reuses its old noop, and — as
//! the commit index is not persisted — starts from its state store's applied
//! index, which may be behind entries that were committed and acknowledged
//! before the crash. A read served then would miss acknowledged writes.
//!
//! So the read index is also at least the leader's last log index at the
//! moment it began to lead in its current term ([`ReadFloor`]). That is safe
//! (every committed entry is in the leader's log) and always reached (a leader
//! commits its own log). After an ordinary election openraft's new noop is
//! already above the floor, so reads pay nothing extra.

use std::sync::Mutex;

use openraft::error::{CheckIsLeaderError, RaftError};

use crate::raft::cluster::prevote::Elections;
use crate::raft::types::Raft;

/// Why no read index was handed out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadIndexError {
    /// This member does not lead (any more).
    #[error("not the leader")]
    NotLeader,
    /// A quorum did not confirm that this member still leads.
    #[error("a quorum did not confirm the leadership")]
    NoQuorum,
    /// Raft has stopped on this member.
    #[error("raft stopped: {0}")]
    Stopped(String),
}

/// The last log index of this member when it began to lead, per term.
#[derive(Default)]
pub struct ReadFloor {
    /// std Mutex: held only to read or set two numbers.
    by_term: Mutex<(u64, u64)>,
}

impl ReadFloor {
    fn for_term(&self, term: u64, last_log_index: u64) -> u64 {
        let mut floor = self.by_term.lock().expect("read floor lock poisoned");
        if floor.0 != term {
            *floor = (term, last_log_index);
        }
        floor.1
    }
}

/// Confirm leadership with a quorum and return the index a linearizable read
/// must wait for (see the module doc). None while this member hands its
/// leadership over (`raft::election::Elections::transferring`).
pub async fn read_index(raft: &Raft, floor: &ReadFloor, elections: &Elections) -> Result<u64, ReadIndexError> {
    if elections.transferring() {
        return Err(ReadIndexError::NotLeader);
    }
    let (read_log_id, _applied) = raft.get_read_log_id().await.map_err(|e| match e {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)) => ReadIndexError::NotLeader,
        RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)) => ReadIndexError::NoQuorum,
        RaftError::Fatal(fatal) => ReadIndexError::Stopped(fatal.to_string()),
    })?;
    let (term, last_log_index) = {
        let m = raft.metrics();
        let m = m.borrow();
        (m.current_term, m.last_log_index.unwrap_or(0))
    };
    Ok(read_log_id.map_or(0, |l| l.index).max(floor.for_term(term, last_log_index)))
}

/// Why a wait for this member to apply an index ended without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    Timeout,
    Stopped,
}

/// Wait until this member has applied log index `index`, at most `within`.
/// Watches openraft's data metrics, which change only when one of their
/// fields does, rather than its full metrics (see [`ServerMetrics`]).
pub async fn wait_applied(raft: &Raft, index: u64, within: std::time::Duration) -> Result<(), WaitError> {
    let mut data = raft.data_metrics();
    let applied = data.wait_for(|m| m.last_applied.map(|l| l.index) >= Some(index));
    let outcome = tokio::time::timeout(within, async { applied.await.map(drop) }).await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(WaitError::Stopped),
        Err(_) => Err(WaitError::Timeout),
    }
}
