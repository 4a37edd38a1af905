//! The read path's facade: linearizable reads by ReadIndex.
//!
//! A linearizable read waits for [`Node::read_barrier`], then reads this
//! member's applied state (`crate::model::applied`). The barrier gets a read index
//! from the leader — itself (`raft::read_index`: a heartbeat round confirms
//! it still leads) or over the peer protocol — and waits until this member
//! has applied that far. Reads that arrive together share one round.
//! Serializable reads skip the barrier and may be stale.

use tokio::time::Instant;

use super::route::{Attempt, Route};
use super::{Node, ServerError};
use crate::raft::WaitError;
use crate::raft::{read_index, ReadIndexError};

impl Node {
    /// Make the local state fresh enough for a linearizable read: at least as
    /// new as everything committed when this call began. Concurrent callers
    /// share rounds: a round that starts after a caller arrived serves it.
    pub async fn read_barrier(&self) -> Result<(), ServerError> {
        match self.read_barriers.call(()).await {
            Ok(outcome) => outcome,
            Err(crate::base::batcher::CallError::Overloaded) => Err(ServerError::TooManyRequests),
            Err(crate::base::batcher::CallError::Stopped) => Err(ServerError::Stopped),
        }
    }

    /// One ReadIndex round (see [`Node::read_barrier`]): get a read index from
    /// the leader (ourselves or over the peer channel), then wait until this
    /// member has applied that far.
    pub(super) async fn read_index_round(&self) -> Result<(), ServerError> {
        let (index, deadline) = self.routed(|route, deadline| self.read_index_attempt(route, deadline)).await?;
        self.wait_applied(index, deadline).await
    }

    /// One attempt of [`Node::read_index_round`]: the read index, and the
    /// request's deadline (for the wait that follows).
    async fn read_index_attempt(&self, route: Route, deadline: Instant) -> Attempt<(u64, Instant), ServerError> {
        match route {
            Route::Here => {
                match tokio::time::timeout_at(
                    deadline,
                    read_index(&self.replica.raft, &self.replica.read_floor, &self.replica.elections),
                )
                .await
                {
                    Err(_) => Attempt::Done(Err(ServerError::Timeout)),
                    Ok(Ok(index)) => Attempt::Done(Ok((index, deadline))),
                    Ok(Err(ReadIndexError::NotLeader | ReadIndexError::NoQuorum)) => Attempt::Retry,
                    Ok(Err(ReadIndexError::Stopped(_))) => Attempt::Done(Err(ServerError::Stopped)),
                }
            }
            // Safe to ask again, as lease questions are.
            Route::Leader { id, url } => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    index = self.replica.peers.read_index(&url, remaining) => match index {
                        Ok(index) => Attempt::Done(Ok((index, deadline))),
                        Err(_) => Attempt::Retry,
                    },
                    _ = self.leader_replaced(id) => Attempt::Again,
                }
            }
        }
    }

    /// Wait until this member has applied log index `index`, until `deadline`.
    pub(super) async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), ServerError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match crate::raft::wait_applied(&self.replica.raft, index, remaining).await {
            Ok(()) => Ok(()),
            Err(WaitError::Timeout) => Err(ServerError::Timeout),
            Err(WaitError::Stopped) => Err(ServerError::Stopped),
        }
    }

    /// Wait until this member's store has reached `revision` (for state that
    /// was written through another member), at most the request timeout.
    pub async fn wait_revision(&self, revision: i64) -> Result<(), ServerError> {
        let reached = self.state.revision_reached(revision);
        let mut stopping = self.stopping();
        tokio::select! {
            () = reached => Ok(()),
            _ = tokio::time::sleep(self.request_timeout) => Err(ServerError::Timeout),
            _ = stopping.stopped() => Err(ServerError::Stopped),
        }
    }
}
