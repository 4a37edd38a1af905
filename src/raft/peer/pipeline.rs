//! Pipelined replication: a leader streams its log to a follower without
//! waiting for each AppendEntries to be answered.
//!
//! ## Why
//! openraft 0.9 keeps one AppendEntries in flight per follower: an entry
//! appended while a call is out waits for that call's answer before it is
//! sent, and when the commit index moves meanwhile, a call that carries only
//! the commit index goes first. Under load a round trip costs far more than
//! the follower's work (measured with 64 clients on 2 cores: a follower spent
//! 0.45-0.75 ms on an append, sync included, while the leader waited 1.2-1.9 ms
//! for the answer, and a third of the calls carried no entries), so entries
//! spent most of their time waiting for their turn.
//!
//! ## How
//! A [`Pipe`] is one `Peer.Replicate` stream to one follower, opened by that
//! follower's connection (`raft::peer::network`) when openraft asks it to send
//! entries after the follower has confirmed where its log matches (not while
//! openraft is still searching for that point), starting there. Its task
//! sends every entry as soon as the leader's log holds it (written, see
//! `raft::store::log_store`), in AppendEntries requests that each continue where the
//! previous one ended, up to [`APPENDS_IN_FLIGHT`] unanswered. The follower
//! handles them in order (`raft::peer`), one sync for all that have arrived,
//! and answers each in order. openraft's own calls on that connection then
//! wait on the pipe:
//! - a call with entries returns `Success` once the follower has acknowledged
//!   holding its last entry — often at once, the pipe having sent it before
//!   openraft asked;
//! - a call without entries (a heartbeat, or a commit index to pass on) makes
//!   the pipe send a request carrying that commit index, and returns once the
//!   follower has answered a request sent within one heartbeat timeout of the
//!   call: at once under load, when answers stream back all along; else when
//!   its own request is answered.
//!
//! If the pipe stops (a refusal, a broken stream, entries purged, this member
//! no longer leading), the connection sends openraft's request itself, so
//! openraft sees the follower's real answer (a conflict, a newer vote, an
//! error) and acts on it as always; once a request succeeds again, the next
//! call with entries opens a new pipe. A follower that does not serve
//! `Peer.Replicate` (an older version) is sent single requests for a while
//! before the next try.
//!
//! ## Why it is sound
//! - A pipe sends only this leader's own log: every read of entries checks,
//!   under the log's lock, that the stored vote is still the pipe's (openraft
//!   stores a newer vote before it truncates or appends for another leader),
//!   and that the log still holds the entry the pipe last sent
//!   ([`LogStore::entries_after`]). Otherwise the pipe stops. openraft 0.9
//!   keeps a deposed leader's replication tasks (and so its pipes) alive until
//!   it leads again; this check is what makes such a pipe stop instead of
//!   sending another leader's entries under its old vote.
//! - A follower acknowledges an AppendEntries only once its entries are
//!   durable, and within one vote (one leader's term) the leader's log only
//!   grows: "the follower holds the leader's log up to entry e" stays true for
//!   this leader. openraft learning it from the answer to an earlier request is
//!   the same as an answer delayed in the network, which Raft tolerates; a
//!   follower that has since moved to a newer term says so to the next request
//!   that reaches it.
//! - Requests on the stream are answered in the order sent, so the n-th answer
//!   is for the n-th request; any answer but `Success` stops the pipe.
//! - A commit index travels only once the leader's own copy of the entry is
//!   durable (see `raft::store::log_store`), as on every other path.
//! - Caveat: openraft's leader clock (when a follower last confirmed this
//!   leader) is taken as the time of the call that openraft made, while the
//!   follower confirmed the leader for a request sent earlier: up to a round
//!   earlier for a call with entries, up to one heartbeat timeout for a call
//!   without. openraft 0.9 uses that clock for metrics only, and the
//!   leadership checks behind linearizable reads send heartbeats of their own
//!   on connections made for them, which never open a pipe. A follower that
//!   has stopped answering is noticed as before: calls wait for answers that
//!   do not come, and openraft's timeout ends them. A heartbeat answered from
//!   a recent answer can succeed just after the pipe stopped on a newer vote;
//!   openraft then learns of that vote from its next call.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures::FutureExt;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::Vote;
use tokio::sync::{mpsc, watch};

use crate::base::codec::{decode, encode};
use crate::base::limits::{APPENDS_IN_FLIGHT, MAX_APPEND_BYTES, MAX_APPEND_ENTRIES};
use crate::proto::raftlock::peer::RaftPayload;
use crate::raft::peer::client::PeerStub;
use crate::raft::store::log_store::{LogMoved, LogStore};
use crate::raft::types::{LogId, TypeConfig};
use crate::storage::wal::Durable;

/// What the connection asks of the pipe.
#[derive(Clone, Copy, Debug, Default)]
struct Wants {
    /// The newest commit index openraft passed on to this follower.
    commit: Option<LogId>,
    /// Heartbeats asked for, counted.
    heartbeats: u64,
}

/// What the pipe has learned from the follower.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// The last entry the follower has acknowledged holding.
    acked: Option<LogId>,
    /// Heartbeats (counted as in [`Wants`]) answered by a request sent after
    /// they were asked for.
    heartbeats: u64,
    /// When the last request answered was sent: the follower confirmed this
    /// leader as of then.
    confirmed: Option<Instant>,
    /// Why the pipe stopped; it answers nothing more.
    stopped: Option<Stopped>,
}

/// One pipelined replication stream to one follower, for one vote. Dropping
/// it stops its task and closes the stream.
pub struct Pipe {
    vote: Vote<u64>,
    wants: watch::Sender<Wants>,
    progress: watch::Receiver<Progress>,
    task: tokio::task::AbortHandle,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a pipe could not answer a call (the caller then sends the call itself).
#[derive(Clone, Debug)]
pub struct Stopped {
    pub reason: String,
    /// The follower does not serve `Peer.Replicate` (an older version).
    pub unsupported: bool,
}

impl Stopped {
    fn because(reason: impl Into<String>) -> Stopped {
        Stopped { reason: reason.into(), unsupported: false }
    }
}

impl Pipe {
    /// Open a pipe that sends this leader's log after `matched`, the last entry
    /// the follower is known to hold, under `vote`.
    pub fn open(
        client: PeerStub,
        log: LogStore,
        durable: Durable,
        vote: Vote<u64>,
        matched: Option<LogId>,
        commit: Option<LogId>,
        to: u64,
    ) -> Pipe {
        let (wants, wants_rx) = watch::channel(Wants { commit, heartbeats: 0 });
        let (progress_tx, progress) = watch::channel(Progress::default());
        let sender = Sender { log, durable, vote, sent: matched, sent_commit: None, heartbeats_sent: 0, to };
        let task = tokio::spawn(async move {
            let stopped = sender.run(client, wants_rx, &progress_tx).await;
            tracing::debug!(reason = %stopped.reason, "replication pipe stopped");
            progress_tx.send_modify(|p| p.stopped = Some(stopped));
        });
        Pipe { vote, wants, progress, task: task.abort_handle() }
    }

    /// Whether this pipe can answer calls made under `vote`.
    pub fn serves(&self, vote: &Vote<u64>) -> bool {
        self.vote == *vote && self.progress.borrow().stopped.is_none()
    }

    /// Pass a commit index on (with the next request).
    fn offer_commit(&self, commit: Option<LogId>) {
        self.wants.send_if_modified(|w| {
            let newer = commit > w.commit;
            if newer {
                w.commit = commit;
            }
            newer
        });
    }

    /// Wait until the follower has acknowledged holding the log up to `last`.
    pub async fn replicated(&self, last: Option<LogId>, commit: Option<LogId>) -> Result<(), Stopped> {
        self.offer_commit(commit);
        let want = last.map(|l| l.index);
        self.wait(|p| p.acked.map(|a| a.index) >= want).await
    }

    /// A heartbeat through the pipe: have it send a request now, carrying
    /// `commit`. Answered at once if the follower confirmed this leader for a
    /// request sent within `fresh` (as it does all along under load), else
    /// once this request is answered.
    pub async fn heartbeat(&self, commit: Option<LogId>, fresh: Duration) -> Result<(), Stopped> {
        let mut asked = 0;
        self.wants.send_modify(|w| {
            w.commit = w.commit.max(commit);
            w.heartbeats += 1;
            asked = w.heartbeats;
        });
        let now = Instant::now();
        self.wait(|p| p.heartbeats >= asked || p.confirmed.is_some_and(|c| now.saturating_duration_since(c) <= fresh))
            .await
    }

    async fn wait(&self, done: impl Fn(&Progress) -> bool) -> Result<(), Stopped> {
        let mut progress = self.progress.clone();
        let seen = progress.wait_for(|p| p.stopped.is_some() || done(p)).await;
        let p = seen.map_err(|_| Stopped::because("the pipe's task ended"))?;
        match &p.stopped {
            // Done before it stopped counts: the answer was real.
            Some(_) if done(&p) => Ok(()),
            Some(stopped) => Err(stopped.clone()),
            None => Ok(()),
        }
    }
}

/// One request in flight: what answering it tells.
struct InFlight {
    /// The last entry the follower holds once it succeeds.
    last: Option<LogId>,
    /// Heartbeats it answers.
    heartbeats: u64,
    sent_at: Instant,
}

/// The pipe's task.
struct Sender {
    log: LogStore,
    durable: Durable,
    vote: Vote<u64>,
    /// The last entry sent (or known held before the first send).
    sent: Option<LogId>,
    /// The commit index of the last request sent.
    sent_commit: Option<LogId>,
    heartbeats_sent: u64,
    /// The follower's member ID (the metrics' label).
    to: u64,
}

type AppendResult = Result<AppendEntriesResponse<u64>, RaftError<u64>>;

impl Sender {
    /// Run until the stream fails, the follower refuses, or the log is no
    /// longer this leader's to send; returns why it stopped.
    async fn run(
        mut self,
        mut client: PeerStub,
        mut wants: watch::Receiver<Wants>,
        progress: &watch::Sender<Progress>,
    ) -> Stopped {
        let (requests, outgoing) = mpsc::channel::<RaftPayload>(APPENDS_IN_FLIGHT);
        let mut answers = match client.replicate(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                return Stopped {
                    unsupported: status.code() == tonic::Code::Unimplemented,
                    reason: format!("opening the stream: {status}"),
                }
            }
        };
        let mut last_index = self.log.last_index();
        let to = format!("{:x}", self.to);
        let round_trip = crate::base::metrics::metrics().peer_round_trip.with_label_values(&[&to]);
        let sent_bytes = crate::base::metrics::metrics().peer_sent_bytes.with_label_values(&[&to]);
        let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(APPENDS_IN_FLIGHT);
        loop {
            while in_flight.len() < APPENDS_IN_FLIGHT {
                let wanted = *wants.borrow_and_update();
                let request = match self.next_request(&wanted, in_flight.is_empty()) {
                    Ok(Some(request)) => request,
                    Ok(None) => break,
                    Err(moved) => return Stopped::because(moved.to_string()),
                };
                let entry = InFlight {
                    last: request.entries.last().map(|e| e.log_id).or(request.prev_log_id),
                    heartbeats: wanted.heartbeats,
                    sent_at: Instant::now(),
                };
                self.sent = entry.last;
                self.sent_commit = request.leader_commit;
                self.heartbeats_sent = wanted.heartbeats;
                // Never blocks: the channel holds APPENDS_IN_FLIGHT requests.
                let data = encode(&request);
                sent_bytes.inc_by(data.len() as u64);
                if requests.send(RaftPayload { data }).await.is_err() {
                    return Stopped::because("the stream closed");
                }
                in_flight.push_back(entry);
            }
            // With nothing in flight, a commit index waiting for the leader's
            // sync is worth waking for (else the next answer wakes us).
            let commit_waits = in_flight.is_empty() && wants.borrow().commit > self.sent_commit;
            tokio::select! {
                answer = answers.message() => {
                    let payload = match answer {
                        Ok(Some(payload)) => payload,
                        Ok(None) => return Stopped::because("the follower ended the stream"),
                        Err(status) => return Stopped::because(format!("stream: {status}")),
                    };
                    let Some(answered) = in_flight.pop_front() else {
                        return Stopped::because("an answer to no request");
                    };
                    round_trip.observe(answered.sent_at.elapsed().as_secs_f64());
                    match decode::<AppendResult>(&payload.data) {
                        Ok(Ok(AppendEntriesResponse::Success)) => progress.send_modify(|p| {
                            p.acked = p.acked.max(answered.last);
                            p.heartbeats = p.heartbeats.max(answered.heartbeats);
                            p.confirmed = p.confirmed.max(Some(answered.sent_at));
                        }),
                        Ok(Ok(other)) => return Stopped::because(format!("the follower answered {other}")),
                        Ok(Err(e)) => return Stopped::because(format!("the follower failed: {e}")),
                        Err(e) => return Stopped::because(format!("undecodable answer: {e}")),
                    }
                }
                _ = last_index.changed() => {}
                _ = wants.changed() => {}
                _ = self.durable.changed(), if commit_waits => {}
            }
        }
    }

    /// The next request to send, if there is reason to send one: entries the
    /// follower has not been sent, a heartbeat asked for, or (when nothing is
    /// in flight to carry it) a commit index it has not been told.
    fn next_request(&self, wanted: &Wants, idle: bool) -> Result<Option<AppendEntriesRequest<TypeConfig>>, LogMoved> {
        let entries = self.log.entries_after(&self.vote, self.sent, MAX_APPEND_ENTRIES, MAX_APPEND_BYTES)?;
        if let Some(first) = entries.first() {
            debug_assert_eq!(first.log_id.index, self.sent.map_or(0, |s| s.index + 1), "entries continue the pipe");
        }
        let commit = self.sendable_commit(wanted.commit);
        let heartbeat_due = wanted.heartbeats > self.heartbeats_sent;
        let commit_due = idle && commit > self.sent_commit;
        if entries.is_empty() && !heartbeat_due && !commit_due {
            return Ok(None);
        }
        Ok(Some(AppendEntriesRequest { vote: self.vote, prev_log_id: self.sent, entries, leader_commit: commit }))
    }

    /// The newest commit index that may travel: `wanted` once the leader's
    /// copy of that entry is durable, else the last one sent.
    fn sendable_commit(&self, wanted: Option<LogId>) -> Option<LogId> {
        match wanted {
            Some(c) if self.durable.index().is_some_and(|d| d >= c.index) => Some(c).max(self.sent_commit),
            _ => self.sent_commit,
        }
    }
}

/// The follower's side: take requests that arrived together as one (they
/// continue each other), so that they cost one append and one sync. Returns
/// the requests merged into one, and how many they were.
pub fn merge(mut requests: Vec<AppendEntriesRequest<TypeConfig>>) -> Vec<(AppendEntriesRequest<TypeConfig>, usize)> {
    let mut merged: Vec<(AppendEntriesRequest<TypeConfig>, usize)> = Vec::new();
    for request in requests.drain(..) {
        if let Some((into, count)) = merged.last_mut() {
            let into_last = into.entries.last().map(|e| e.log_id).or(into.prev_log_id);
            if into.vote == request.vote && request.prev_log_id == into_last {
                into.entries.extend(request.entries);
                into.leader_commit = into.leader_commit.max(request.leader_commit);
                *count += 1;
                continue;
            }
        }
        merged.push((request, 1));
    }
    merged
}

/// Take, without waiting, every item a stream has ready.
pub fn ready_now<S: futures::Stream + Unpin>(stream: &mut S, into: &mut Vec<S::Item>, max: usize) {
    use futures::StreamExt;
    while into.len() < max {
        match stream.next().now_or_never() {
            Some(Some(item)) => into.push(item),
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::raft::types::Entry;

    fn id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    /// A request continuing from `prev` with entries `from..=to` (none if `to < from`).
    fn request(prev: Option<u64>, from: u64, to: u64, commit: Option<u64>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: prev.map(id),
            entries: (from..=to).map(|i| Entry { log_id: id(i), payload: EntryPayload::Blank }).collect(),
            leader_commit: commit.map(id),
        }
    }

    /// A merged request as (prev index, entry indexes, commit index, requests merged).
    type Shape = (Option<u64>, Vec<u64>, Option<u64>, usize);

    fn shape(merged: &[(AppendEntriesRequest<TypeConfig>, usize)]) -> Vec<Shape> {
        merged
            .iter()
            .map(|(r, n)| {
                let entries = r.entries.iter().map(|e| e.log_id.index).collect();
                (r.prev_log_id.map(|p| p.index), entries, r.leader_commit.map(|c| c.index), *n)
            })
            .collect()
    }

    #[test]
    fn requests_that_continue_each_other_merge_into_one() {
        // 5..=7, then a heartbeat after 7 with a newer commit, then 8..=9.
        let merged = merge(vec![
            request(Some(4), 5, 7, Some(3)),
            request(Some(7), 1, 0, Some(6)),
            request(Some(7), 8, 9, Some(5)),
        ]);
        assert_eq!(shape(&merged), vec![(Some(4), vec![5, 6, 7, 8, 9], Some(6), 3)]);
    }

    #[test]
    fn a_request_that_does_not_continue_stays_apart() {
        // A gap (prev 8 after 7), and another vote: each is handed to Raft as it came.
        let mut other_vote = request(Some(9), 10, 10, None);
        other_vote.vote = Vote::new_committed(3, 2);
        let merged = merge(vec![request(None, 0, 7, None), request(Some(8), 9, 9, None), other_vote]);
        assert_eq!(
            shape(&merged),
            vec![(None, (0..=7).collect(), None, 1), (Some(8), vec![9], None, 1), (Some(9), vec![10], None, 1)]
        );
    }
}
