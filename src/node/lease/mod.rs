//! Lease time: keepalives and TimeToLive, which only the leader answers
//! (lease deadlines are the leader's, [`keeper`]), and expiry, which
//! only the leader of the term that set a deadline proposes.
//!
//! A follower asks the leader over the peer protocol; a question waiting on a
//! leader that has since been replaced (paused, cut off) is asked of the new
//! one at once, so that keepalives reach the leader whose deadlines count.

pub mod keeper;

use tokio::time::Instant;

use crate::base::version::Version;
use crate::model::command::CommandResult;
use crate::model::lease::{LeaseStatus, LeaseTimes};
use crate::node::route::{Attempt, Route};
use crate::node::versions::ClusterVersion;
use crate::node::{Node, ServerError};
use crate::raft::read_index;
use crate::raft::LeaseAuthority;
use crate::raft::ProposeError;
use crate::raft::{LeaseAnswer, LeaseQuery};

/// The first release whose leaders answer [`LeaseQuery::TimesLeft`].
const TIMES_LEFT_SINCE: Version = Version::new(0, 2, 0);
/// The most leases one [`LeaseQuery::TimesLeft`] asks about (Describe's
/// largest page of waiters).
const TIMES_LEFT_AT_ONCE: usize = 10_000;

impl Node {
    /// Leases past their deadline and not yet revoked, if this member leads
    /// (0 otherwise): the expiry backlog a lease-expiry storm builds.
    pub fn overdue_lease_expiries(&self) -> usize {
        if !self.is_leader() {
            return 0;
        }
        self.lease_keeper.overdue(&self.state.leases())
    }

    /// Renew lease `id`; returns its TTL in seconds, 0 if it is unknown or
    /// has expired.
    pub async fn keep_alive(&self, id: i64) -> Result<i64, ServerError> {
        match self.lease_query(LeaseQuery::KeepAlive(id)).await? {
            LeaseAnswer::KeptAlive { ttl } => Ok(ttl),
            other => unreachable!("a keepalive is answered with a TTL, not {other:?}"),
        }
    }

    /// Lease `id` as the leader sees it (None if there is no such lease).
    pub async fn time_to_live(&self, id: i64) -> Result<Option<LeaseStatus>, ServerError> {
        match self.lease_query(LeaseQuery::TimeToLive(id)).await? {
            LeaseAnswer::TimeToLive(status) => Ok(status),
            other => unreachable!("a TimeToLive is answered with a status, not {other:?}"),
        }
    }

    /// The time left and the TTL granted of each lease of `ids`, in order
    /// (`None` for a lease that does not exist), as the leader sees them: one
    /// question to the leader for them all, and one read barrier there. A
    /// member of 0.1.0 does not know that question, so while the cluster
    /// version is not decided, or below 0.2.0, each lease is asked about on
    /// its own, as 0.1.0 did.
    pub async fn times_left(&self, ids: &[i64]) -> Result<Vec<Option<LeaseTimes>>, ServerError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        if !matches!(self.cluster_version(), ClusterVersion::Decided(v) if v >= TIMES_LEFT_SINCE) {
            let answers = futures::future::join_all(ids.iter().map(|&id| self.time_to_live(id))).await;
            let times =
                |status: Option<LeaseStatus>| status.map(|s| LeaseTimes { remaining: s.remaining, granted: s.granted });
            return answers.into_iter().map(|answer| answer.map(times)).collect();
        }
        // A question of at most TIMES_LEFT_AT_ONCE leases, so that neither it
        // nor its answer nears the peer message limit (a shared lock's
        // readers are all holders, however many).
        let mut all = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(TIMES_LEFT_AT_ONCE) {
            match self.lease_query(LeaseQuery::TimesLeft(chunk.to_vec())).await? {
                LeaseAnswer::TimesLeft(times) if times.len() == chunk.len() => all.extend(times),
                other => unreachable!("{} leases' times are answered with as many, not {other:?}", chunk.len()),
            }
        }
        Ok(all)
    }

    /// Ask the leader a lease question (answered here if we lead).
    async fn lease_query(&self, query: LeaseQuery) -> Result<LeaseAnswer, ServerError> {
        self.routed(|route, deadline| self.lease_attempt(route, deadline, query.clone())).await
    }

    /// One attempt of [`Node::lease_query`].
    async fn lease_attempt(
        &self,
        route: Route,
        deadline: Instant,
        query: LeaseQuery,
    ) -> Attempt<LeaseAnswer, ServerError> {
        match route {
            Route::Here => match self.answer(query).await {
                LeaseAnswer::NotLeader => Attempt::Retry,
                answer => Attempt::Done(Ok(answer)),
            },
            Route::Leader { id, url } => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    answer = self.replica.peers.lease(&url, &query, remaining) => match answer {
                        Ok(LeaseAnswer::NotLeader) | Err(_) => Attempt::Retry,
                        Ok(answer) => Attempt::Done(Ok(answer)),
                    },
                    _ = self.leader_replaced(id) => Attempt::Again,
                }
            }
        }
    }

    /// Expire leases whose deadlines passed while this member led `term`
    /// (see `lease::keeper`): only if a quorum confirms that it still leads
    /// `term`, proposed here and nowhere else, and never retried — the next
    /// tick decides again. Apply ignores the expiry if its entry is not of
    /// `term`.
    pub(crate) async fn expire_leases(
        &self,
        term: u64,
        ids: &[i64],
        mark: &crate::raft::Mark,
    ) -> Result<(), ServerError> {
        let confirmed = tokio::time::timeout(
            self.request_timeout,
            read_index(&self.replica.raft, &self.replica.read_floor, &self.replica.elections),
        )
        .await;
        if !matches!(confirmed, Ok(Ok(_))) || self.leading_term() != Some(term) {
            return Err(ServerError::LeaderChanged);
        }
        let proposals = ids.iter().map(|&id| self.replica.proposer.propose_expiry(id, term, mark));
        let outcomes = tokio::time::timeout(self.request_timeout, futures::future::join_all(proposals))
            .await
            .map_err(|_| ServerError::Timeout)?;
        for (id, outcome) in ids.iter().zip(outcomes) {
            match outcome {
                Ok(CommandResult::LeaseRevoked { .. }) => tracing::debug!(lease = id, term, "lease expired"),
                Ok(other) => tracing::info!(lease = id, term, result = ?other, "lease expiry not applied"),
                // Granted again under its ID since the deadline was read, or a
                // grant of it in flight: the next tick decides again.
                Err(ProposeError::Superseded) => {
                    tracing::debug!(lease = id, term, "lease granted again since its expiry was decided; not expired")
                }
                Err(ProposeError::NotLeader { .. } | ProposeError::LeaderChanged) => {
                    return Err(ServerError::LeaderChanged)
                }
                Err(ProposeError::Stopped) => return Err(ServerError::Stopped),
                // The keeper tries again on its next round.
                Err(ProposeError::Overloaded) => return Err(ServerError::TooManyRequests),
            }
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl LeaseAuthority for Node {
    async fn answer(&self, query: LeaseQuery) -> LeaseAnswer {
        if !self.is_leader() {
            return LeaseAnswer::NotLeader;
        }
        // The leader must have applied every grant it acknowledged.
        if self.read_barrier().await.is_err() || !self.is_leader() {
            return LeaseAnswer::NotLeader;
        }
        let table = self.state.leases();
        match query {
            LeaseQuery::KeepAlive(id) => {
                let Some(term) = self.leading_term() else { return LeaseAnswer::NotLeader };
                LeaseAnswer::KeptAlive { ttl: self.lease_keeper.renew(term, &table, id).unwrap_or(0) }
            }
            LeaseQuery::TimeToLive(id) => LeaseAnswer::TimeToLive(table.get(id).map(|l| LeaseStatus {
                remaining: self.lease_keeper.remaining(&table, id).unwrap_or(l.ttl),
                granted: l.ttl,
                keys: l.keys.iter().cloned().collect(),
            })),
            LeaseQuery::TimesLeft(ids) => LeaseAnswer::TimesLeft(self.lease_keeper.times_left(&table, &ids)),
        }
    }
}
