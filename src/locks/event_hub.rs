//! One lock's events, worked out once per member and shared by every stream
//! that observes the lock (`Observe`): a lock's hub follows the changes
//! under its prefix, keeps the lock's queue ([`super::observe::Queue`]),
//! turns each revision that changed it into events and a message once, and
//! hands that message to all its streams through one broadcast channel. A
//! thousand streams on one lock thus cost each change one queue update and
//! one message, not a thousand; what is left per stream is a copy of the
//! message and its HTTP/2 frame.
//!
//! Settling: the hub's task, woken by apply, tells a change once the lock
//! has had no other for [`SETTLE`], or [`SETTLE_LIMIT`] after it under a
//! stream of changes. So the request that waited for the change (the next
//! holder's acquire, a release's answer) is answered before observers are
//! told; and a grant and the release right after it reach observers
//! together, after the release was answered: one waking of every stream
//! instead of two, neither on the path of the holder's next request.
//!
//! Waking, paced: a stream that has sent all it was given lists itself
//! with its hub ([`WakeList`]) rather than with the broadcast channel; after
//! a broadcast the hub's task wakes the listed streams a chunk at a time
//! (`super::wake_list`), yielding between chunks. Tokio runs a yielded task
//! again only once its worker has nothing else queued, or at its periodic
//! look at the network: so a thousand streams' work (a copy and an HTTP/2
//! frame each) no longer sits in the run queue ahead of the next handoff's
//! tasks; those wait for one chunk at most. A round of waking wakes all it
//! has left once it has gone on for 50 ms (a saturated member); changes
//! that come during a round are told after it. A stream woken late finds
//! several messages: it sends them joined as one ([`Message::join`], up to
//! about [`JOINED_BYTES`]): one frame per waking, not one per change.
//!
//! Joining: a stream takes the hub's queue as it is after a read barrier
//! (so its first message is linearizable, as a lone stream's was): it
//! brings the hub up to what the member has routed (`pump`, under the hub's
//! lock), subscribes, and reads the queue (or, from a `start_revision`, the
//! history up to the hub's revision) in the same critical section, so no
//! message falls between its first one and the broadcast.
//!
//! Invariants: messages are broadcast under the hub's lock, in revision
//! order; a hub's `through` only grows, and every change to the lock up to
//! it has been told. A stream lists itself before its second look at the
//! channel, and the hub takes the list after it broadcast: so a message
//! sent is either seen by that look or followed by a wake. A hub lives
//! while a stream holds it (its task ends with the last one); a hub that
//! ended (no leader, the node stopping, a failed read) is never joined
//! again, a new one takes its place.
//!
//! Caveats: observers are told a change [`SETTLE`] after it at the least;
//! under a stream of changes, up to [`SETTLE_LIMIT`] plus a round of waking
//! (50 ms at most) plus the time the runtime takes to run the hub's task.
//! The task looks whether the node stops, the leader is lost or its last
//! stream went only between rounds. A stream that falls more than
//! [`BROADCAST_MESSAGES`] messages behind (its client reads too slowly)
//! joins again from the revision it had told, from history, where a deletion's cause is a guess (`Released`
//! if the lease still lives, else `Ended`; never `LeaseEnded`); if that
//! history was compacted meanwhile, it ends with the compaction error, as a
//! watch is cancelled, and the client starts over from the lock as it is.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::broadcast::{self, error::TryRecvError};
use tokio::sync::Notify;

use super::observe::{by_revision, EventKind, LockEvent, Queue};
use super::wake_list::{Listener, WakeList, WakingRound};
use super::{front_range, queue_prefix, RecipeError};
use crate::model::mvcc::{KeyRange, KeyValue, RangeRequest};
use crate::model::watch_routes::Inbox;
use crate::node::{Node, ServerError};

/// How many messages a hub keeps for a stream that has not sent them yet.
pub const BROADCAST_MESSAGES: usize = 256;

/// How long a lock must see no change before its changes are told.
pub const SETTLE: Duration = Duration::from_millis(2);

/// How long after a change it is told however busy the lock.
pub const SETTLE_LIMIT: Duration = Duration::from_millis(10);

/// Builds a stream's message from a revision's events (the API's response).
pub type MakeMessage<T> = dyn Fn(&Node, i64, Vec<LockEvent>) -> T + Send + Sync;

/// A hub's message as its streams send it: made once (encoded, for the
/// gRPC API), shared by every stream, and joined with the ones after it
/// when a stream finds several waiting (one frame, not several).
pub trait Message: Clone + Send + Sync + Unpin + 'static {
    /// Its size, to bound what is joined.
    fn size(&self) -> usize;
    /// One message saying what `parts` say, in their order.
    fn join(parts: Vec<Self>) -> Self;
}

/// A stream that finds messages waiting joins them up to about this size.
pub const JOINED_BYTES: usize = 64 * 1024;

/// This member's hubs, one per observed lock (name and permits).
pub struct LockHubs<T> {
    node: Arc<Node>,
    make: Arc<MakeMessage<T>>,
    hubs: Mutex<HashMap<(Vec<u8>, usize), Weak<Hub<T>>>>,
}

/// What streams hold of a hub: dropping the last one ends its task and
/// takes it out of the registry.
struct Hub<T> {
    shared: Arc<Shared<T>>,
    _last_stream: tokio::sync::oneshot::Sender<()>,
    registry: Weak<LockHubs<T>>,
    key: (Vec<u8>, usize),
}

impl<T> Drop for Hub<T> {
    fn drop(&mut self) {
        let Some(registry) = self.registry.upgrade() else { return };
        let mut hubs = registry.hubs.lock().expect("lock hubs poisoned");
        // A hub that ended may have been replaced under its key already.
        if hubs.get(&self.key).is_some_and(|hub| hub.strong_count() == 0) {
            hubs.remove(&self.key);
        }
    }
}

struct Shared<T> {
    prefix: Vec<u8>,
    permits: usize,
    inbox: Inbox,
    state: Mutex<State<T>>,
    /// Streams that have sent every message they were given, to be woken
    /// by the hub's task when it broadcasts the next.
    listening: WakeList,
    /// A message was broadcast by a stream's join, not by the hub's task:
    /// the task is to wake the listening streams.
    joined_told: Notify,
}

struct State<T> {
    queue: Queue,
    /// Every change to the lock up to this revision has been told.
    through: i64,
    /// None once the hub ended.
    sender: Option<broadcast::Sender<Told<T>>>,
    /// Why it ended, if not because the node stopped.
    ended: Option<RecipeError>,
}

/// One revision's message, as the hub broadcasts it.
#[derive(Clone)]
struct Told<T> {
    revision: i64,
    message: T,
}

impl<T: Message> LockHubs<T> {
    pub fn new(node: Arc<Node>, make: Arc<MakeMessage<T>>) -> Arc<LockHubs<T>> {
        Arc::new(LockHubs { node, make, hubs: Mutex::default() })
    }

    /// Observe lock `name` (of `permits`): the stream's first message holds
    /// the queue as it is (or, with `start_revision` > 0, every change since
    /// then), each later one the changes of one or more revisions as this
    /// member applies them. It ends when the node stops, or with an error (no leader for
    /// three election timeouts; history compacted under a slow reader).
    pub async fn observe(
        self: &Arc<Self>,
        name: &[u8],
        permits: usize,
        start_revision: i64,
    ) -> Result<Observation<T>, RecipeError> {
        let mut hub = self.hub(name, permits)?;
        self.node.read_barrier().await?;
        let (through, events, receiver) = match self.join(&hub.shared, start_revision) {
            // The hub ended during the barrier (it saw no leader a moment
            // ago, or failed a read): once more, with the hub that replaced it.
            Err(Joined::Ended) => {
                hub = self.hub(name, permits)?;
                self.join(&hub.shared, start_revision).map_err(Joined::into_error)?
            }
            joined => joined.map_err(Joined::into_error)?,
        };
        Ok(Observation {
            hubs: self.clone(),
            hub,
            first: Some((self.make)(&self.node, through, events)),
            told: through,
            receiver,
            listener: Arc::default(),
            lagged: false,
            done: false,
        })
    }

    /// The lock's live hub, made (and its task started) if it has none.
    fn hub(self: &Arc<Self>, name: &[u8], permits: usize) -> Result<Arc<Hub<T>>, RecipeError> {
        let key = (name.to_vec(), permits);
        // Declared first, so dropped after the registry's lock is let go: the
        // last hold on a hub takes that lock when it goes.
        let found: Option<Arc<Hub<T>>>;
        let mut hubs = self.hubs.lock().expect("lock hubs poisoned");
        found = hubs.get(&key).and_then(Weak::upgrade);
        if let Some(hub) = &found {
            if hub.shared.state().sender.is_some() {
                return Ok(hub.clone());
            }
        }
        let prefix = queue_prefix(name);
        // Follow the lock's keys before reading them (`AppliedState::follow`).
        let inbox = self.node.state().follow(&KeyRange::with_prefix(&prefix));
        let (kvs, through) = {
            let mvcc = self.node.state().mvcc();
            (mvcc.range(&front_range(&prefix, 0)).map_err(RecipeError::Mvcc)?.kvs, mvcc.revision())
        };
        let queue = Queue::new(prefix.clone(), permits, kvs);
        let (sender, _) = broadcast::channel(BROADCAST_MESSAGES);
        let state = State { queue, through, sender: Some(sender), ended: None };
        let shared = Arc::new(Shared {
            prefix,
            permits,
            inbox,
            state: Mutex::new(state),
            listening: WakeList::default(),
            joined_told: Notify::new(),
        });
        let (last_stream, gone) = tokio::sync::oneshot::channel();
        tokio::spawn(run(self.node.clone(), self.make.clone(), shared.clone(), gone));
        let hub = Arc::new(Hub { shared, _last_stream: last_stream, registry: Arc::downgrade(self), key: key.clone() });
        hubs.insert(key, Arc::downgrade(&hub));
        Ok(hub)
    }

    /// A stream's first events and its subscription, taken together: the
    /// queue as it is (or the changes since `start_revision`) at the
    /// revision returned, after every change routed so far.
    fn join(&self, shared: &Shared<T>, start_revision: i64) -> Result<JoinedAt<T>, Joined> {
        let (through, receiver, snapshot) = {
            let mut state = shared.state();
            match shared.pump(&self.node, &*self.make, &mut state) {
                Ok(told) => {
                    if told {
                        shared.joined_told.notify_one();
                    }
                }
                Err(e) => {
                    // What the inbox held is gone with the failed pump: no
                    // stream of this hub can be told the truth after it.
                    state.sender = None;
                    state.ended = Some(e.clone());
                    drop(state);
                    shared.listening.wake_all();
                    return Err(Joined::Failed(e));
                }
            }
            let Some(sender) = &state.sender else { return Err(Joined::Ended) };
            let through = state.through;
            let snapshot = (start_revision <= 0).then(|| state.queue.snapshot(through));
            (through, sender.subscribe(), snapshot)
        };
        // History up to `through` is settled: read it without holding the hub.
        let events = match snapshot {
            Some(events) => events,
            None => shared.replay(&self.node, start_revision, through).map_err(Joined::Failed)?,
        };
        Ok((through, events, receiver))
    }
}

impl<T: Message> Shared<T> {
    /// Tell what the inbox holds: apply it to the queue and broadcast each
    /// taking's events as one message. Under the hub's lock. True if a
    /// message was broadcast.
    fn pump(&self, node: &Node, make: &MakeMessage<T>, state: &mut State<T>) -> Result<bool, RecipeError> {
        if state.sender.is_none() {
            return Ok(false);
        }
        let taken = self.inbox.take();
        let mut events = Vec::new();
        if taken.lost_after.is_some() {
            let (kvs, now) = {
                let mvcc = node.state().mvcc();
                (mvcc.range(&front_range(&self.prefix, 0)).map_err(RecipeError::Mvcc)?.kvs, mvcc.revision())
            };
            state.queue.resync(kvs, now, &mut events);
            state.through = state.through.max(now);
        }
        for batch in &taken.batches {
            // A batch's changes are in revision order: the unseen ones are a tail.
            let through = state.through;
            let unseen = batch.changes.iter().position(|c| c.revision > through).unwrap_or(batch.changes.len());
            for (revision, changes) in by_revision(&batch.changes[unseen..]) {
                let ended = |_: &KeyValue| match batch.lease_ended.binary_search(&revision) {
                    Ok(_) => EventKind::LeaseEnded,
                    Err(_) => EventKind::Released,
                };
                state.queue.apply_revision(revision, changes.iter(), &ended, &mut events);
            }
            state.through = state.through.max(batch.revision);
        }
        state.through = state.through.max(taken.through);
        if let (Some(last), Some(sender)) = (events.last(), &state.sender) {
            let revision = last.revision;
            // No stream listening is no error: the events are in the queue.
            let _ = sender.send(Told { revision, message: make(node, revision, events) });
            return Ok(true);
        }
        Ok(false)
    }

    /// The lock's events from `start_revision` through `through`, from
    /// history: its queue as it was before, and each change since.
    fn replay(&self, node: &Node, start_revision: i64, through: i64) -> Result<Vec<LockEvent>, RecipeError> {
        let base = (start_revision - 1).min(through);
        let (kvs, replayed) = {
            let mvcc = node.state().mvcc();
            let kvs = if base == 0 {
                Vec::new()
            } else {
                let req = RangeRequest { revision: base, ..front_range(&self.prefix, 0) };
                mvcc.range(&req).map_err(RecipeError::Mvcc)?.kvs
            };
            let range = KeyRange::with_prefix(&self.prefix);
            let replayed = if base < through {
                mvcc.changes_between(&range, base + 1, through).map_err(RecipeError::Mvcc)?
            } else {
                Vec::new()
            };
            (kvs, replayed)
        };
        // History keeps no cause: a lease that still lives did not end its key.
        let ended = |kv: &KeyValue| match node.state().leases().get(kv.lease) {
            Some(_) => EventKind::Released,
            None => EventKind::Ended,
        };
        let mut queue = Queue::new(self.prefix.clone(), self.permits, kvs);
        let mut events = Vec::new();
        for (revision, changes) in by_revision(&replayed) {
            queue.apply_revision(revision, changes.iter(), &ended, &mut events);
        }
        Ok(events)
    }

    /// End the hub: its streams end once they have sent what was broadcast,
    /// with `why` if it is an error.
    fn end(&self, why: Option<RecipeError>) {
        {
            let mut state = self.state();
            state.sender = None;
            if state.ended.is_none() {
                state.ended = why;
            }
        }
        self.listening.wake_all();
    }

    /// The hub's state, locked. A panic while it was held (a bug) leaves it
    /// usable: the hub is ended by its task's guard, and its streams end.
    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A joining stream's first events: the revision they bring it to, the
/// events, and its subscription to what follows.
type JoinedAt<T> = (i64, Vec<LockEvent>, broadcast::Receiver<Told<T>>);

/// Why a stream could not join a hub.
enum Joined {
    /// The hub had ended (its streams end; a new stream takes a new hub).
    Ended,
    Failed(RecipeError),
}

impl Joined {
    fn into_error(self) -> RecipeError {
        match self {
            Joined::Ended => RecipeError::Server(ServerError::Stopped),
            Joined::Failed(e) => e,
        }
    }
}

/// Ends the hub when its task ends, however it ends (a panic included), so
/// that no stream waits for a task that is gone.
struct EndOnExit<T: Message>(Arc<Shared<T>>);

impl<T: Message> Drop for EndOnExit<T> {
    fn drop(&mut self) {
        self.0.end(None);
    }
}

/// A hub's task: tell each change as apply routes it, and wake the streams
/// waiting for it a chunk at a time, until the last stream goes, the node
/// stops, or the member is cut off from the leader.
async fn run<T: Message>(
    node: Arc<Node>,
    make: Arc<MakeMessage<T>>,
    shared: Arc<Shared<T>>,
    mut last_stream_gone: tokio::sync::oneshot::Receiver<()>,
) {
    let _end = EndOnExit(shared.clone());
    let mut stopping = node.stopping();
    let leaderless = node.leaderless();
    tokio::pin!(leaderless);
    loop {
        let mut told = tokio::select! {
            _ = shared.inbox.ready() => false,
            _ = shared.joined_told.notified() => true,
            _ = &mut last_stream_gone => return,
            _ = stopping.stopped() => return shared.end(None),
            // A member cut off from the cluster learns of no end: the streams
            // end, and their clients pick them up from their revisions elsewhere.
            _ = &mut leaderless => return shared.end(Some(RecipeError::Server(ServerError::NoLeader))),
        };
        // Let the lock settle: a change is told once no other came for
        // [`SETTLE`] (a grant and the release right after it go as one), or
        // [`SETTLE_LIMIT`] after it, under a stream of changes.
        if !told {
            let limit = tokio::time::Instant::now() + SETTLE_LIMIT;
            loop {
                let left = limit.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(SETTLE.min(left)) => break,
                    _ = shared.inbox.ready() => {}
                }
            }
        }
        let pumped = {
            let mut state = shared.state();
            shared.pump(&node, &*make, &mut state)
        };
        match pumped {
            Ok(sent) => told |= sent,
            Err(e) => return shared.end(Some(e)),
        }
        if !told {
            continue;
        }
        // Wake the streams waiting for it a chunk at a time, each chunk once
        // the runtime has nothing else to run (or at its next look at the
        // network). Changes that come meanwhile wait in the inbox for the
        // next round: a round ends within `WAKE_ROUND_LIMIT`.
        let mut round = WakingRound::new(shared.listening.take());
        while !round.is_done() {
            round.wake_next();
            tokio::task::yield_now().await;
        }
    }
}

/// One stream's view of a hub: its first message, then the hub's.
pub struct Observation<T> {
    hubs: Arc<LockHubs<T>>,
    hub: Arc<Hub<T>>,
    first: Option<T>,
    /// The revision of the last message this stream has been given.
    told: i64,
    receiver: broadcast::Receiver<Told<T>>,
    listener: Arc<Listener>,
    /// The channel said this stream fell behind: join again when what was
    /// read before it has been given.
    lagged: bool,
    done: bool,
}

impl<T> Drop for Observation<T> {
    fn drop(&mut self) {
        self.listener.forget();
    }
}

impl<T: Message> Stream for Observation<T> {
    type Item = Result<T, RecipeError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        let mut listed = false;
        // Messages read in this poll: given as one, once nothing more waits,
        // or they are big enough, or the stream fell behind after them.
        let (mut read, mut read_bytes) = (Vec::new(), 0);
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if !read.is_empty() && (read_bytes >= JOINED_BYTES || this.lagged) {
                return Poll::Ready(Some(Ok(T::join(read))));
            }
            if this.lagged {
                // Fell behind: join again from where this stream was.
                this.lagged = false;
                crate::base::metrics::metrics().lock_event_rejoins.inc();
                match this.hubs.join(&this.hub.shared, this.told + 1) {
                    Ok((through, events, receiver)) => {
                        this.receiver = receiver;
                        this.told = this.told.max(through);
                        if !events.is_empty() {
                            let revision = events.last().map_or(through, |e| e.revision);
                            return Poll::Ready(Some(Ok((this.hubs.make)(&this.hubs.node, revision, events))));
                        }
                    }
                    // The hub ended meanwhile: end as its other streams do.
                    Err(Joined::Ended) => {
                        this.done = true;
                        return Poll::Ready(this.hub.shared.state().ended.clone().map(Err));
                    }
                    Err(Joined::Failed(e)) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                continue;
            }
            match this.receiver.try_recv() {
                // Every message after the subscription is new to this stream
                // (it subscribed under the hub's lock, with its first events).
                Ok(told) => {
                    this.told = this.told.max(told.revision);
                    read_bytes += told.message.size();
                    read.push(told.message);
                }
                Err(TryRecvError::Empty) if !read.is_empty() => return Poll::Ready(Some(Ok(T::join(read)))),
                // Nothing yet: list with the hub, then look once more (a
                // message sent before the listing is seen by that look).
                Err(TryRecvError::Empty) => {
                    if listed {
                        return Poll::Pending;
                    }
                    this.hub.shared.listening.listen(&this.listener, cx.waker());
                    listed = true;
                }
                Err(TryRecvError::Lagged(_)) => this.lagged = true,
                // The channel says closed again when next asked.
                Err(TryRecvError::Closed) if !read.is_empty() => return Poll::Ready(Some(Ok(T::join(read)))),
                Err(TryRecvError::Closed) => {
                    this.done = true;
                    return Poll::Ready(this.hub.shared.state().ended.clone().map(Err));
                }
            }
        }
    }
}
