//! Leader routing: the one loop every request that only the leader can
//! answer goes through — writes, read indexes, lease questions, membership
//! changes.
//!
//! Each attempt goes to the leader this member knows of: handled here if this
//! member leads ([`Route::Here`]), else sent to it over the peer protocol
//! ([`Route::Leader`]). The attempt says what it came to ([`Attempt`]): an
//! answer (or a failure to report), or a retry because it certainly had no
//! effect (the target was not the leader, or could not be reached). Between
//! retries the loop waits a moment for news of a leader; the whole request
//! has `request_timeout`, after which it fails as "request timed out" — or
//! "no leader" if no leader was known at the last attempt.
//!
//! Whether an attempt may be retried is the caller's to decide: a write whose
//! fate is unknown must not be sent again (it could apply twice); a question
//! (read index, lease time) may be asked again, of a new leader at once.

use std::time::Duration;

use tokio::time::Instant;

use super::{Node, ServerError};

/// Where an attempt goes.
pub(super) enum Route {
    /// This member leads.
    Here,
    /// Member `id` leads, reached at peer URL `url`.
    Leader { id: u64, url: String },
}

/// What an attempt came to.
pub(super) enum Attempt<T, E> {
    /// The request's outcome.
    Done(Result<T, E>),
    /// It certainly had no effect: try again once there is news of a leader.
    Retry,
    /// The leader it went to has been replaced: try the new one now.
    Again,
}

impl Node {
    /// Run `attempt` against the leader until it is done, or until the request
    /// timeout (see the module doc). `attempt` gets the route and the deadline.
    pub(super) async fn routed<T, E, F, Fut>(&self, mut attempt: F) -> Result<T, E>
    where
        E: From<ServerError>,
        F: FnMut(Route, Instant) -> Fut,
        Fut: std::future::Future<Output = Attempt<T, E>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let leader = self.leader();
            let route = match &leader {
                Some((id, _)) if *id == self.id => Some(Route::Here),
                Some((id, url)) => Some(Route::Leader { id: *id, url: url.clone() }),
                None => None,
            };
            if let Some(route) = route {
                match attempt(route, deadline).await {
                    Attempt::Done(outcome) => return outcome,
                    Attempt::Again => continue,
                    Attempt::Retry => {}
                }
            }
            self.before_retry(leader.is_some(), deadline).await?;
        }
    }

    /// The leader's ID and peer URL, if there is a leader (this member only
    /// while a quorum acknowledges it: check-quorum).
    fn leader(&self) -> Option<(u64, String)> {
        let leader = self.replica.elections.acting_leader()?;
        let m = self.replica.raft.metrics();
        let m = m.borrow();
        let url = m.membership_config.membership().get_node(&leader).map(|n| n.peer_url.clone())?;
        Some((leader, url))
    }

    /// Resolves once this member knows of a leader other than `leader` (or
    /// of an election under way); never, once Raft has stopped.
    pub(super) async fn leader_replaced(&self, leader: u64) {
        let mut server = self.replica.raft.server_metrics();
        if server.wait_for(|m| m.current_leader != Some(leader)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Between two attempts of a request: give up if the node is stopping or the
    /// deadline has passed (with "no leader" if none was known), else wait a
    /// moment for news of a leader.
    async fn before_retry(&self, had_leader: bool, deadline: Instant) -> Result<(), ServerError> {
        if self.shutdown.is_stopping() {
            return Err(ServerError::Stopped);
        }
        if Instant::now() >= deadline {
            return Err(if had_leader { ServerError::Timeout } else { ServerError::NoLeader });
        }
        let mut server = self.replica.raft.server_metrics();
        let until = deadline.min(Instant::now() + Duration::from_millis(100));
        let _ = tokio::time::timeout_at(until, server.changed()).await;
        // Do not spin when the metrics change for other reasons.
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(())
    }
}
