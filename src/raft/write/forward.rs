//! Follower-side forwarding of writes to the leader.
//!
//! The writes that arrive while earlier ones are on their way to the leader
//! travel together as one batch (see `crate::base::batcher`), and each waiter gets
//! its own command's apply result, or why it has none. Batches go to the
//! leader on one long-lived `Peer.Forward` stream per leader URL (a
//! [`Link`]): a batch is one message tagged with an ID, and each command
//! carries a tag from this member's [`ForwardedAnswers`]. Against one unary
//! call per batch, a batch opens no HTTP/2 stream of its own: no request and
//! response headers, no task per call on either side, no identity metadata
//! to stamp and check (the leader checks the sender's membership per batch,
//! from its configuration).
//!
//! The leader proposes each command as a `Command::Forwarded` naming this
//! member and the tag, and answers a batch (with its ID) only if some of its
//! commands failed. The others are answered by this member's own apply
//! (`raft::write::forwarded`): a successful batch costs the leader no message, and
//! a client that got its answer here reads its write here.
//!
//! What a failure means (what `node::write` may retry):
//! - the stream could not be opened because no connection could be made
//!   (`client::never_sent`): the batches queued on it never left, and are
//!   `Unreachable`;
//! - the leader stops: it finishes the batches it read (answering what
//!   failed), then says which was the last (`ForwardReply::Closing`); those
//!   after it never ran, and are `Unreachable`;
//! - the stream failed or ended otherwise: the batches the transport had
//!   taken from the link's queue may have been applied, and those still
//!   queued never left, and are `Unreachable`. The link is ended (its stream
//!   reset); the next batch to that URL opens a new one;
//! - a batch that may have reached the leader (those the transport took, or
//!   the leader read before it closed) waits on for this member's apply, but
//!   only until this member applies an entry of a later term than it had
//!   applied when the batch left (an entry the old leader committed, or one
//!   a later leader kept, comes before that one in the log), and for two
//!   election timeouts at most (a stream that broke while its leader lives
//!   brings no new term). What is still unanswered then is `Unknown`;
//! - a batch that gets no results within the forwarding timeout is
//!   `Unknown`. Its link stays: with no answer due for what succeeded, a
//!   slow apply here looks the same as a silent leader, and a leader whose
//!   connection died is found by HTTP/2 keepalive.
//!
//! The third rule, a yield and a question to the kernel make a write that
//! arrives just after the leader died retryable. HTTP/2 learns that a
//! connection died only when the connection's task reads the EOF; the
//! request that carries the write may be run first (its task woken by the
//! same poll of the reactor), and had it queued a batch that the stream's
//! body task then took, that batch would be `Unknown`: seen in CI, and in 3
//! of 25 local runs of
//! `go_election_campaign_observe_resign_with_the_leader_killed`. So a batch
//! is handed to a link only after a `yield_now`, which lets the tasks
//! already woken run (the connection's task then closes the stream, and the
//! link's end finds the batch still queued: 0 of 40 runs), and only if the
//! kernel does not already hold the leader's FIN or reset on the channel's
//! connection (`PeerClients::closed_by_peer`; with the yield alone, a later
//! CI run still lost the test's write to "leader changed"). What is left is
//! a leader that dies while the batch is on its way: that one waits for the
//! next term, as above, and is then answered from this member's apply if a
//! later leader kept it, else `Unknown`.
//!
//! Invariants: every batch handed to a link gets at most one answer, from
//! the leader or from the link's end, and is forgotten when its waiter goes;
//! each command gets exactly one result: from this member's apply, from the
//! leader's answer, from the link's end, or from the timeout; a
//! link that ended takes no more batches, and its transport takes no more
//! from its queue (both are decided under the link's lock, so a batch the
//! end calls never sent cannot leave afterwards).
//!
//! Caveat: an idle follower forwards a lone write in its client's task
//! (`crate::base::batcher`), so the write's own deadline may end the wait before
//! the forwarding timeout does, and the link is not replaced then. A link
//! whose connection died is ended all the same, by HTTP/2 keepalive
//! (`client::PEER_KEEPALIVE`).
//!
//! Caveat: a link stays open while its URL is a peer's, whether or not that
//! peer still leads (a deposed leader answers `NotLeader`); there are at most
//! as many links as peers.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use futures::StreamExt;

use crate::base::batcher::{Batcher, CallError, Limits};
use crate::base::codec::{decode, encode};
use crate::base::limits::FORWARD_IN_FLIGHT;
use crate::model::command::{Command, CommandResult};
use crate::proto::raftlock::peer::RaftPayload;
use crate::raft::peer::client::{never_sent, ForwardFailure, PeerClients};
use crate::raft::peer::messages::{ForwardBatch, ForwardError, ForwardReply};
use crate::raft::write::forwarded::ForwardedAnswers;

/// Writes on their way from this follower to the leader (see the module doc).
#[derive(Clone)]
pub struct Forwarder {
    batcher: Batcher<(String, Command), Result<CommandResult, ForwardFailure>>,
}

/// The most commands in one forwarded batch, its most bytes, and what may
/// wait behind the batches in flight: the proposer's bounds
/// (`raft::write::proposer`), so that what one forwarded batch carries fits one entry.
const LIMITS: Limits = Limits {
    max_batch: crate::base::limits::MAX_BATCH_COMMANDS,
    max_batch_weight: crate::base::limits::MAX_BATCH_BYTES,
    max_in_flight: FORWARD_IN_FLIGHT,
    max_queued: crate::base::limits::MAX_QUEUED_COMMANDS,
    max_queued_weight: crate::base::limits::MAX_QUEUED_BYTES,
};

fn weigh((_, cmd): &(String, Command)) -> u64 {
    cmd.encoded_len()
}

impl Forwarder {
    /// Forward through `clients`' channels, the results handed to
    /// `answers` by this member's apply; a command unanswered for `timeout`,
    /// or for `grace` after its way to the leader broke, is reported
    /// `Unknown`.
    pub fn start(
        clients: PeerClients,
        answers: Arc<ForwardedAnswers>,
        timeout: Duration,
        grace: Duration,
    ) -> Forwarder {
        let links = Arc::new(Links { clients, answers, grace, open: Mutex::default() });
        let batcher = Batcher::start(LIMITS, weigh, move |items: Vec<(String, Command)>| {
            let links = links.clone();
            async move {
                // Usually one leader URL; group by URL, keeping queue order.
                let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
                let mut cmds: Vec<Option<Command>> = Vec::with_capacity(items.len());
                for (i, (url, cmd)) in items.into_iter().enumerate() {
                    match groups.iter_mut().find(|(u, _)| *u == url) {
                        Some((_, idx)) => idx.push(i),
                        None => groups.push((url, vec![i])),
                    }
                    cmds.push(Some(cmd));
                }
                let mut results: Vec<Option<Result<CommandResult, ForwardFailure>>> = vec![None; cmds.len()];
                for (url, idx) in groups {
                    let group: Vec<Command> = idx.iter().map(|&i| cmds[i].take().expect("each command once")).collect();
                    for (i, r) in idx.into_iter().zip(links.forward(&url, group, timeout).await) {
                        results[i] = Some(r);
                    }
                }
                results.into_iter().map(|r| r.expect("every item forwarded")).collect()
            }
        });
        Forwarder { batcher }
    }

    /// Forward `cmd` to the leader at `url` and wait for its apply result.
    pub async fn forward(&self, url: String, cmd: Command) -> Result<CommandResult, ForwardFailure> {
        match self.batcher.call((url, cmd)).await {
            Ok(result) => result,
            Err(CallError::Overloaded) => Err(ForwardFailure::Overloaded),
            Err(CallError::Stopped) => Err(ForwardFailure::Unknown("forwarder stopped".into())),
        }
    }
}

/// The open links, by leader URL.
struct Links {
    clients: PeerClients,
    /// Where this member's apply hands its forwarded writes their results.
    answers: Arc<ForwardedAnswers>,
    /// How long a batch whose way to the leader broke waits for its
    /// results at most (see the module doc).
    grace: Duration,
    /// std Mutex: held only to look up, insert or remove a link.
    open: Mutex<HashMap<String, Arc<Link>>>,
}

/// What a batch gets back from its link: what the leader said, or why it
/// will not say anything.
type Answer = Result<LeaderAnswer, ForwardFailure>;

/// What the leader says about a batch.
enum LeaderAnswer {
    /// Which commands failed (the others were applied).
    Failed(Vec<(u32, ForwardError)>),
    /// Every command's result (a leader of an earlier raftlock).
    Results(Vec<Result<CommandResult, ForwardError>>),
}

fn failure(error: ForwardError) -> ForwardFailure {
    match error {
        ForwardError::NotLeader { leader } => ForwardFailure::NotLeader { leader },
        ForwardError::Failed(msg) => ForwardFailure::Unknown(msg),
        ForwardError::Overloaded => ForwardFailure::Overloaded,
    }
}

impl Links {
    /// Hand `cmds` to the leader at `url`; one answer per command, in order.
    async fn forward(
        &self,
        url: &str,
        cmds: Vec<Command>,
        timeout: Duration,
    ) -> Vec<Result<CommandResult, ForwardFailure>> {
        let n = cmds.len();
        let failed = |f: ForwardFailure| vec![Err(f); n];
        let (deadline, grace) = (tokio::time::Instant::now() + timeout, self.grace);
        // Let the tasks already woken run first: among them, a connection's
        // task that has a dead leader's EOF to read (see the module doc).
        tokio::task::yield_now().await;
        let link = match self.link(url) {
            Ok(link) => link,
            Err(e) => return failed(ForwardFailure::Unreachable(e.to_string())),
        };
        // The kernel has seen the leader close the connection, which HTTP/2
        // may not have read yet: this batch is not sent into it.
        if self.clients.closed_by_peer(url) {
            let why = "the leader closed its connection";
            link.end(ForwardFailure::Unknown(why.into()), None);
            return failed(ForwardFailure::Unreachable(why.into()));
        }
        // Waiters for this member's apply to hand out the results, from
        // before the batch leaves; forgotten when this call ends.
        let mut expected = self.answers.expect(n);
        // A link that ended since it was looked up never sent the batch.
        let Some((id, answer)) = link.submit(cmds, expected.first_tag) else {
            return failed(ForwardFailure::Unreachable("the forwarding stream ended".into()));
        };
        crate::base::metrics::metrics().forwarded_batch.observe(n as f64);
        // If this wait is cancelled (its caller's deadline), nobody waits for
        // the answer any more.
        let _waiting = Waiting { link: &link, id };
        let (first_tag, applied_term) = (expected.first_tag, expected.applied_term);
        let mut results: Vec<Option<Result<CommandResult, ForwardFailure>>> = vec![None; n];
        let mut applied: futures::stream::FuturesUnordered<_> = std::mem::take(&mut expected.receivers)
            .into_iter()
            .enumerate()
            .map(|(i, rx)| async move { (i, rx.await) })
            .collect();
        let mut answer = Some(answer);
        // Why the way to the leader broke, if it did: from then on the
        // batch waits for its results only until this member applies an
        // entry of a later term than it had applied when the batch left.
        let mut broken: Option<ForwardFailure> = None;
        let mut broke_at: Option<tokio::time::Instant> = None;
        let mut unanswered = n;
        while unanswered > 0 {
            tokio::select! {
                // Results first: one handed out in the same apply call as a
                // later term's entry must not be taken for lost.
                biased;
                Some((i, result)) = applied.next() => {
                    if results[i].is_none() {
                        unanswered -= 1;
                        results[i] = Some(result.map_err(|_| {
                            ForwardFailure::Unknown("applied here through a snapshot: its result is not known".into())
                        }));
                    }
                }
                said = async { answer.as_mut().expect("guarded").await }, if answer.is_some() => {
                    answer = None;
                    match said {
                        Ok(Ok(LeaderAnswer::Failed(failures))) => {
                            for (i, error) in failures {
                                let i = i as usize;
                                if i < n && results[i].is_none() {
                                    self.answers.forget(first_tag.wrapping_add(i as u64));
                                    unanswered -= 1;
                                    results[i] = Some(Err(failure(error)));
                                }
                            }
                        }
                        Ok(Ok(LeaderAnswer::Results(all))) => {
                            if all.len() != n {
                                return failed(ForwardFailure::Unknown("forward: wrong number of results".into()));
                            }
                            for (i, r) in all.into_iter().enumerate() {
                                results[i].get_or_insert(r.map_err(failure));
                            }
                            unanswered = 0;
                        }
                        // Nothing of it reached the leader: nothing of it will be applied.
                        Ok(Err(unreachable @ ForwardFailure::Unreachable(_))) => return failed(unreachable),
                        Ok(Err(why)) => broken = Some(why),
                        Err(_) => broken = Some(ForwardFailure::Unknown("the forwarding stream ended".into())),
                    }
                    if broken.is_some() {
                        broke_at = Some(tokio::time::Instant::now());
                    }
                }
                _ = self.answers.applied_past(applied_term), if broken.is_some() => {
                    let why = broken.take().expect("guarded");
                    return unanswered_as(results, why);
                }
                _ = tokio::time::sleep_until(broke_at.map_or(deadline, |at| deadline.min(at + grace))) => {
                    // The link is left open: with no answer due from a
                    // leader for what succeeded, a slow apply here looks
                    // the same, and a leader that went away is found by
                    // HTTP/2 keepalive.
                    let why = match broken {
                        Some(why) => why,
                        None => ForwardFailure::Unknown(format!("not applied here within {timeout:?}")),
                    };
                    return unanswered_as(results, why);
                }
            }
        }
        results.into_iter().map(|r| r.expect("every command answered")).collect()
    }

    /// The open link to `url`, or a new one (an ended link is replaced).
    fn link(&self, url: &str) -> Result<Arc<Link>, tonic::transport::Error> {
        let mut open = self.open.lock().expect("forward links lock poisoned");
        if let Some(link) = open.get(url).filter(|link| !link.ended()) {
            return Ok(link.clone());
        }
        let link = Link::open(&self.clients, url)?;
        open.insert(url.to_string(), link.clone());
        Ok(link)
    }
}

/// `results` with each command still unanswered failed as `why`.
fn unanswered_as(
    results: Vec<Option<Result<CommandResult, ForwardFailure>>>,
    why: ForwardFailure,
) -> Vec<Result<CommandResult, ForwardFailure>> {
    results.into_iter().map(|r| r.unwrap_or_else(|| Err(why.clone()))).collect()
}

/// A batch waiting for its answer on `link`: dropped, it is forgotten there
/// (already answered or not).
struct Waiting<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.link.state.lock().expect("forward link lock poisoned").waiting.remove(&self.id);
    }
}

/// One `Peer.Forward` stream to a leader: batches go out on it, and a task
/// hands each answer to the batch that waits for it.
struct Link {
    /// std Mutex: held to number a batch and queue it, to hand out an
    /// answer, or to end the link; never across I/O.
    state: Mutex<LinkState>,
}

struct LinkState {
    /// Encoded batches on their way into the stream, with their IDs; None
    /// once ended.
    outgoing: Option<mpsc::UnboundedSender<(u64, RaftPayload)>>,
    next_id: u64,
    /// The batches below this ID were taken by the transport (they may have
    /// reached the leader); the others are still queued here.
    taken_below: u64,
    /// The batches sent and not yet answered, by ID.
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    /// The task reading the answers (aborted when the link is ended).
    reader: Option<tokio::task::AbortHandle>,
}

impl Link {
    /// Open a stream to the member at `url` (the connection is made by the
    /// stream's task, so this does not wait for it).
    fn open(clients: &PeerClients, url: &str) -> Result<Arc<Link>, tonic::transport::Error> {
        let mut client = clients.client(url)?;
        let (link, body) = Link::new();
        let reading = link.clone();
        let reader = tokio::spawn(async move {
            let request = tonic::Request::new(body);
            // Why the stream ended, and (if the leader said so) the first
            // batch it did not read.
            let (why, unread_from) = match client.forward(request).await {
                // Nothing queued so far left this member.
                Err(status) if never_sent(&status) => (ForwardFailure::Unreachable(status.to_string()), None),
                Err(status) => (ForwardFailure::Unknown(status.to_string()), None),
                Ok(response) => {
                    let mut answers = response.into_inner();
                    loop {
                        let why = match answers.message().await {
                            Ok(Some(payload)) => match decode::<ForwardReply>(&payload.data) {
                                Ok(ForwardReply::Failed { id, failed }) => {
                                    reading.answer(id, LeaderAnswer::Failed(failed));
                                    continue;
                                }
                                Ok(ForwardReply::Answer { id, results }) => {
                                    reading.answer(id, LeaderAnswer::Results(results));
                                    continue;
                                }
                                Ok(ForwardReply::Closing { last_read }) => {
                                    // It ran every batch it read first (and
                                    // answered what failed): what succeeded
                                    // is applied here in time.
                                    let why = "the leader closed the forwarding stream without answering";
                                    break (
                                        ForwardFailure::Unknown(why.into()),
                                        Some(last_read.map_or(0, |id| id + 1)),
                                    );
                                }
                                Err(e) => format!("forward answer: {e}"),
                            },
                            Ok(None) => "the leader ended the forwarding stream".into(),
                            Err(status) => status.to_string(),
                        };
                        break (ForwardFailure::Unknown(why), None);
                    }
                }
            };
            reading.end(why, unread_from);
        });
        let mut state = link.state.lock().expect("forward link lock poisoned");
        // The task may have ended already (it never does before it has
        // tried to connect, but the order is not the point): then it stays ended.
        if state.outgoing.is_some() {
            state.reader = Some(reader.abort_handle());
        }
        drop(state);
        Ok(link)
    }

    /// A link not yet ended, and the request body that carries its batches.
    fn new() -> (Arc<Link>, Outgoing) {
        let (outgoing, queued) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            state: Mutex::new(LinkState {
                outgoing: Some(outgoing),
                next_id: 0,
                taken_below: 0,
                waiting: HashMap::new(),
                reader: None,
            }),
        });
        let body = Outgoing { link: link.clone(), queued };
        (link, body)
    }

    fn ended(&self) -> bool {
        self.state.lock().expect("forward link lock poisoned").outgoing.is_none()
    }

    /// Send `commands` as one batch; its ID, and the receiver that gets its
    /// answer. None if the link has ended (the batch was not sent).
    fn submit(&self, commands: Vec<Command>, first_tag: u64) -> Option<(u64, oneshot::Receiver<Answer>)> {
        let mut state = self.state.lock().expect("forward link lock poisoned");
        let id = state.next_id;
        let payload = RaftPayload { data: encode(&ForwardBatch { id, commands, first_tag }) };
        state.outgoing.as_ref()?.send((id, payload)).ok()?;
        state.next_id += 1;
        let (tx, rx) = oneshot::channel();
        state.waiting.insert(id, tx);
        Some((id, rx))
    }

    /// Hand what the leader said to the batch `id` if it still waits (one
    /// that was answered or timed out has gone).
    fn answer(&self, id: u64, said: LeaderAnswer) {
        let waiter = self.state.lock().expect("forward link lock poisoned").waiting.remove(&id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok(said));
        }
    }

    /// End the link: no batch is sent on it any more, and the stream is
    /// reset. Each batch still waiting is answered `Unreachable` if it never
    /// reached the leader: the transport never took it, or it comes at or
    /// after `unread_from`, the first batch the leader says it did not read;
    /// the others are answered `why`.
    fn end(&self, why: ForwardFailure, unread_from: Option<u64>) {
        let (waiting, taken_below, reader) = {
            let mut state = self.state.lock().expect("forward link lock poisoned");
            state.outgoing = None;
            (std::mem::take(&mut state.waiting), state.taken_below, state.reader.take())
        };
        let unsent_from = unread_from.map_or(taken_below, |from| from.min(taken_below));
        for (id, waiter) in waiting {
            let failure = if id < unsent_from {
                why.clone()
            } else {
                ForwardFailure::Unreachable(format!("never reached the leader ({why:?})"))
            };
            let _ = waiter.send(Err(failure));
        }
        if let Some(reader) = reader {
            reader.abort();
        }
    }
}

/// The stream's request body: hands the link's queued batches to the
/// transport, noting each one it takes; it ends, taking nothing more, once
/// the link has ended.
struct Outgoing {
    link: Arc<Link>,
    queued: mpsc::UnboundedReceiver<(u64, RaftPayload)>,
}

impl futures::Stream for Outgoing {
    type Item = RaftPayload;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RaftPayload>> {
        let this = self.get_mut();
        let mut state = this.link.state.lock().expect("forward link lock poisoned");
        if state.outgoing.is_none() {
            return Poll::Ready(None);
        }
        match this.queued.poll_recv(cx) {
            Poll::Ready(Some((id, payload))) => {
                state.taken_below = id + 1;
                Poll::Ready(Some(payload))
            }
            other => other.map(|_| None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact(revision: i64) -> Command {
        Command::Compact { revision }
    }

    #[tokio::test]
    async fn a_batch_the_transport_never_took_is_unreachable_when_the_link_ends() {
        let (link, mut body) = Link::new();
        let (first, taken) = link.submit(vec![compact(1)], 0).expect("link open");
        let (_, queued) = link.submit(vec![compact(2)], 1).expect("link open");
        // The transport takes the first batch only; then the stream dies.
        let sent = body.next().await.expect("a batch to send");
        assert_eq!(decode::<ForwardBatch>(&sent.data).expect("a batch").id, first);
        link.end(ForwardFailure::Unknown("connection reset".into()), None);

        assert!(matches!(taken.await, Ok(Err(ForwardFailure::Unknown(_)))), "the taken batch may have been applied");
        assert!(matches!(queued.await, Ok(Err(ForwardFailure::Unreachable(_)))), "the queued batch never left");
        // Nothing more leaves, and nothing more is taken.
        assert!(body.next().await.is_none());
        assert!(link.submit(vec![compact(3)], 2).is_none());
    }

    #[tokio::test]
    async fn the_batches_a_closing_leader_did_not_read_are_unreachable() {
        let (link, mut body) = Link::new();
        let (_, read) = link.submit(vec![compact(1)], 0).expect("link open");
        let (_, unread) = link.submit(vec![compact(2)], 1).expect("link open");
        // The transport takes both; the leader says it read the first only.
        for _ in 0..2 {
            body.next().await.expect("a batch to send");
        }
        link.end(ForwardFailure::Unknown("closed without answering".into()), Some(1));

        assert!(matches!(read.await, Ok(Err(ForwardFailure::Unknown(_)))), "a batch the leader read may have run");
        assert!(matches!(unread.await, Ok(Err(ForwardFailure::Unreachable(_)))), "the leader never read it");
    }
}
