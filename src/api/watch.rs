//! etcd's Watch service: one bidirectional stream carrying many watchers.
//!
//! Each stream is a session task that owns its watchers, served from this
//! member's own applied state. The session has an inbox in the member's
//! watch routes (`crate::model::watch_routes`): apply queues there the batches that
//! change a key one of its watchers watches, and wakes the session only
//! then. A watcher's range is registered *before* its history is read, so
//! between history and inbox no change is missed, and a watcher's position
//! makes sure none is delivered twice.
//!
//! Positions: a watcher's position is the first revision it has not seen:
//! its own `next_revision`, moved past each batch that held one of its
//! events, or the session's `synced + 1`, whichever is later. `synced` is
//! how far the routes had routed when the session last took its inbox:
//! nothing up to it concerns a watcher that got no batch for it. So a
//! batch moves only the watchers it concerns, and a session's cost per
//! batch is its changes times (one hash lookup, plus a test per watcher
//! of a range), not its number of watchers.
//!
//! Slow consumers: the session writes to a bounded outbox; when the client
//! does not read, the session waits on the outbox and falls behind. The
//! routes never wait for it (an inbox is bounded); once the session has
//! lost batches it catches every watcher up from MVCC history, a bounded
//! number of bytes at a time, then follows its inbox again. So a
//! stalled watcher holds at most the outbox, its inbox and one catch-up
//! chunk in memory, and never slows apply or other watchers.
//!
//! Progress notifications (periodic, or asked for) promise that every event
//! up to their revision has been sent: the session first takes its inbox,
//! then each notification reports how far its watcher's position has come,
//! never the store's revision, which can be ahead of what has been routed.
//!
//! A stream opened with etcd's `hasleader` metadata (clientv3's
//! `WithRequireLeader`) is refused on a member without a leader, and ends
//! with "etcdserver: no leader" once its member has been without one for
//! three election timeouts, so that the client moves to another member.
//!
//! Watch IDs are per stream, as etcd assigns them: the client's, or the lowest
//! free one counting from 0. A watcher whose start revision is compacted is
//! created, then cancelled with `compact_revision` set.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::{auth, error, header};
use crate::base::limits::MAX_CLIENT_REQUEST_BYTES;
use crate::base::limits::{MAX_WATCHERS_PER_STREAM, WATCH_CATCH_UP_BYTES, WATCH_CATCH_UP_KEYS, WATCH_OUTBOX};
use crate::model::auth::PermKind;
use crate::model::mvcc::{Change, HistoryScan, KeyRange, KeyValue, MvccError, Revision};
use crate::model::watch::{by_revision, fragments, Event, Watcher};
use crate::node::Node;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::watch_server::{Watch, WatchServer};
use crate::proto::mvccpb;

pub struct WatchService {
    node: Arc<Node>,
    progress_interval: Duration,
}

impl WatchService {
    pub fn server(node: Arc<Node>, progress_interval: Duration) -> super::served::Served<WatchServer<WatchService>> {
        super::served::Served(
            WatchServer::new(WatchService { node, progress_interval })
                .max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

type WatchStream = Pin<Box<dyn futures::Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<Streaming<pb::WatchRequest>>) -> Result<Response<WatchStream>, Status> {
        let require_leader = super::requires_leader(&req);
        if require_leader && !self.node.has_leader() {
            return Err(error::no_leader());
        }
        let (tx, rx) = mpsc::channel(WATCH_OUTBOX);
        let session = Session {
            credentials: auth::Credentials::of(&req),
            inbox: self.node.state().open_watch_inbox(),
            synced: 0,
            node: self.node.clone(),
            outbox: tx,
            watchers: BTreeMap::new(),
            by_key: HashMap::new(),
            ranged: BTreeSet::new(),
            next_id: 0,
        };
        tokio::spawn(session.run(req.into_inner(), self.progress_interval, require_leader));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

/// The client went away: the session ends.
struct Gone;

struct Session {
    node: Arc<Node>,
    /// Who opened the stream: each create is checked (READ on its range).
    credentials: auth::Credentials,
    /// Where apply queues the batches this session's watchers watch.
    inbox: crate::model::watch_routes::Inbox,
    /// Every batch through this revision that concerns a watcher has been
    /// taken from the inbox (see the module doc: positions).
    synced: Revision,
    outbox: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    /// The watchers of one key, by key.
    by_key: HashMap<Vec<u8>, BTreeSet<i64>>,
    /// The watchers of a range of keys.
    ranged: BTreeSet<i64>,
    next_id: i64,
}

impl Session {
    async fn run(
        mut self,
        mut inbound: Streaming<pb::WatchRequest>,
        progress_interval: Duration,
        require_leader: bool,
    ) {
        let mut stopping = self.node.stopping();
        let node = self.node.clone();
        let leaderless = async {
            if require_leader {
                node.leaderless().await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(leaderless);
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + progress_interval, progress_interval);
        // A client that closed its side of the stream still gets its events,
        // as from etcd, until it goes away (the outbox closes).
        let mut reading = true;
        let outbox = self.outbox.clone();
        loop {
            let step = tokio::select! {
                msg = inbound.next(), if reading => match msg {
                    Some(Ok(req)) => self.handle(req).await,
                    None => {
                        reading = false;
                        Ok(())
                    }
                    Some(Err(_)) => return,
                },
                _ = outbox.closed() => return,
                _ = self.inbox.ready() => self.take_inbox().await,
                _ = progress.tick() => self.progress().await,
                _ = &mut leaderless => {
                    // As etcd: a stream that requires a leader ends with
                    // "no leader" rather than waiting in silence.
                    let _ = self.outbox.send(Err(error::no_leader())).await;
                    return;
                }
                _ = stopping.stopped() => return,
            };
            if step.is_err() {
                return;
            }
        }
    }

    async fn send(&self, resp: pb::WatchResponse) -> Result<(), Gone> {
        self.outbox.send(Ok(resp)).await.map_err(|_| Gone)
    }

    fn response(&self, watch_id: i64, revision: Revision) -> pb::WatchResponse {
        pb::WatchResponse { header: header(&self.node, revision), watch_id, ..Default::default() }
    }

    fn current_revision(&self) -> Revision {
        self.node.revision()
    }

    async fn handle(&mut self, req: pb::WatchRequest) -> Result<(), Gone> {
        use pb::watch_request::RequestUnion;
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if self.remove(c.watch_id).is_some() {
                    let mut resp = self.response(c.watch_id, self.current_revision());
                    resp.canceled = true;
                    self.send(resp).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                self.take_inbox().await?;
                let revision = self.watchers.values().map(|w| self.delivered_through(w)).min();
                self.send(self.response(-1, revision.unwrap_or_else(|| self.current_revision()))).await
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: pb::WatchCreateRequest) -> Result<(), Gone> {
        let current = self.current_revision();
        let key = if c.key.is_empty() { vec![0] } else { c.key };
        let range = KeyRange::new(&key, &c.range_end);
        let mut refused = None;
        if let KeyRange::Interval(start, end) = &range {
            if end <= start {
                refused = Some("mvcc: watcher range is empty");
            }
        }
        if c.watch_id != 0 && self.watchers.contains_key(&c.watch_id) {
            refused = Some("mvcc: duplicate watch ID provided on the WatchStream");
        }
        if refused.is_none() && self.watchers.len() >= MAX_WATCHERS_PER_STREAM {
            refused = Some("etcdserver: too many watchers on this stream (at most 10000)");
        }
        if let Some(reason) = refused {
            // As etcd: a refused watcher gets no ID (-1).
            let mut resp = self.response(-1, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = reason.to_string();
            return self.send(resp).await;
        }
        if !self.permitted(&key, &c.range_end).await {
            // As etcd: a watch auth refuses is created and canceled at once,
            // with the ID asked for and gRPC's rendering of the error.
            let mut resp = self.response(c.watch_id, current);
            resp.created = true;
            resp.canceled = true;
            let denied = error::auth(crate::model::auth::AuthError::PermissionDenied);
            resp.cancel_reason = format!("rpc error: code = PermissionDenied desc = {}", denied.message());
            return self.send(resp).await;
        }
        // Routed before history is read: nothing falls between the two.
        if !self.inbox.watch(&range) {
            let mut resp = self.response(-1, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = format!(
                "etcdserver: too many key ranges watched on this member (at most {}); watch a prefix or single \
                 keys instead",
                crate::base::limits::MAX_WATCHED_RANGES
            );
            return self.send(resp).await;
        }
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        let mut created = self.response(id, current);
        created.created = true;
        self.send(created).await?;
        let filters = |f: pb::watch_create_request::FilterType| c.filters.contains(&(f as i32));
        let watcher = Watcher {
            id,
            range,
            next_revision: if c.start_revision <= 0 { current + 1 } else { c.start_revision },
            no_put: filters(pb::watch_create_request::FilterType::Noput),
            no_delete: filters(pb::watch_create_request::FilterType::Nodelete),
            prev_kv: c.prev_kv,
            progress_notify: c.progress_notify,
            fragment: c.fragment,
        };
        match &watcher.range {
            KeyRange::Single(key) => {
                self.by_key.entry(key.clone()).or_default().insert(id);
            }
            _ => {
                self.ranged.insert(id);
            }
        }
        self.watchers.insert(id, watcher);
        self.catch_up(id).await
    }

    /// Remove watcher `id`, and its route.
    fn remove(&mut self, id: i64) -> Option<Watcher> {
        let w = self.watchers.remove(&id)?;
        self.inbox.unwatch(&w.range);
        match &w.range {
            KeyRange::Single(key) => {
                if let Some(ids) = self.by_key.get_mut(key) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            _ => {
                self.ranged.remove(&id);
            }
        }
        Some(w)
    }

    /// The first revision `w` has not seen (see the module doc: positions).
    fn position(&self, w: &Watcher) -> Revision {
        w.next_revision.max(self.synced + 1)
    }

    /// Deliver what the inbox holds; after a lag, catch every watcher up
    /// from history instead.
    async fn take_inbox(&mut self) -> Result<(), Gone> {
        let taken = self.inbox.take();
        if let Some(lost_after) = taken.lost_after {
            // Nothing up to `lost_after` concerned a watcher that got no
            // batch for it: history is read from there on, not from the
            // last take (which may be long ago for a quiet session).
            let from = self.synced.max(lost_after) + 1;
            self.watchers.values_mut().for_each(|w| w.next_revision = w.next_revision.max(from));
            self.catch_up_all().await?;
        }
        for batch in &taken.batches {
            self.deliver(&batch.changes, batch.revision).await?;
        }
        self.synced = self.synced.max(taken.through);
        Ok(())
    }

    /// Whether the stream's caller may read `[key, range_end)`.
    async fn permitted(&self, key: &[u8], range_end: &[u8]) -> bool {
        match self.credentials.caller(&self.node).await {
            Ok(caller) => auth::check(&self.node, &caller, key, range_end, PermKind::Read).is_ok(),
            Err(_) => false,
        }
    }

    /// Bring one watcher up from history to what the routes have routed
    /// (the changes after it come through the inbox, the watcher's range
    /// being routed already): scans of bounded size, each a few thousand
    /// keys per hold of the store's lock. The target is read once, so that
    /// a range written faster than its client reads cannot keep the session
    /// here; and it is not the store's revision, which can be ahead of what
    /// has been routed, and so of what a progress notification may promise
    /// for the session's other watchers.
    async fn catch_up(&mut self, id: i64) -> Result<(), Gone> {
        let current = self.inbox.routed_through().min(self.node.state().mvcc().revision());
        loop {
            let Some(w) = self.watchers.get(&id) else { return Ok(()) };
            if w.next_revision > current {
                return Ok(());
            }
            let mut scan = HistoryScan::new(w.range.clone(), w.next_revision, current, WATCH_CATCH_UP_BYTES);
            let read = loop {
                let step = self.node.state().mvcc().scan_history(&mut scan, WATCH_CATCH_UP_KEYS);
                match step {
                    Err(e) => break Err(e),
                    Ok(()) if scan.finished() => break Ok(scan.into_changes()),
                    Ok(()) => tokio::task::yield_now().await,
                }
            };
            let Some(w) = self.watchers.get_mut(&id) else { return Ok(()) };
            match read {
                Ok((changes, to)) => {
                    let events = w.take(&changes, to);
                    let fragment = w.fragment;
                    // Whole revisions, in responses of bounded size.
                    let mut pending: Vec<Event> = Vec::new();
                    let mut size = 0;
                    for (_, group) in by_revision(events) {
                        let group_size: usize = group.iter().map(Event::size).sum();
                        if !pending.is_empty() && size + group_size > MAX_CLIENT_REQUEST_BYTES {
                            self.send_events(id, current, std::mem::take(&mut pending), fragment).await?;
                            size = 0;
                        }
                        size += group_size;
                        pending.extend(group);
                    }
                    if !pending.is_empty() {
                        self.send_events(id, current, pending, fragment).await?;
                    }
                }
                Err(MvccError::Compacted) => {
                    let compacted = self.node.state().mvcc().compact_revision();
                    self.remove(id);
                    let mut resp = self.response(id, 0);
                    resp.compact_revision = compacted;
                    resp.canceled = true;
                    return self.send(resp).await;
                }
                Err(e) => unreachable!("reading history: {e}"),
            }
        }
    }

    async fn catch_up_all(&mut self) -> Result<(), Gone> {
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        for id in ids {
            self.catch_up(id).await?;
        }
        Ok(())
    }

    /// Events of an applied batch that went through `revision`: one response
    /// per watcher and revision, as etcd sends them. Only the watchers of a
    /// changed key are looked at, and only they move.
    async fn deliver(&mut self, changes: &[Change], revision: Revision) -> Result<(), Gone> {
        let mut out: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
        for c in changes {
            let of_key = self.by_key.get(&c.key).into_iter().flatten();
            for id in of_key.chain(&self.ranged) {
                let w = &self.watchers[id];
                if let Some(event) = w.event(c, self.position(w)) {
                    out.entry(*id).or_default().push(event);
                }
            }
        }
        for (id, events) in out {
            let Some(w) = self.watchers.get_mut(&id) else { continue };
            w.next_revision = w.next_revision.max(revision + 1);
            let fragment = w.fragment;
            for (rev, group) in by_revision(events) {
                self.send_events(id, rev, group, fragment).await?;
            }
        }
        Ok(())
    }

    async fn send_events(&self, id: i64, revision: Revision, events: Vec<Event>, fragment: bool) -> Result<(), Gone> {
        let parts = if fragment { fragments(events, MAX_CLIENT_REQUEST_BYTES) } else { vec![events] };
        let n = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            let mut resp = self.response(id, revision);
            resp.fragment = i + 1 < n;
            resp.events = part.into_iter().map(event).collect();
            self.send(resp).await?;
        }
        Ok(())
    }

    /// The revision through which `w` has been sent every event: what a
    /// progress notification may promise, once the inbox was taken. Not the
    /// store's revision, which can be ahead of what has been routed: a batch
    /// applied but not yet queued would let a notification overtake its
    /// events.
    fn delivered_through(&self, w: &Watcher) -> Revision {
        (self.position(w) - 1).min(self.current_revision())
    }

    async fn progress(&mut self) -> Result<(), Gone> {
        self.take_inbox().await?;
        let due: Vec<(i64, Revision)> =
            self.watchers.values().filter(|w| w.progress_notify).map(|w| (w.id, self.delivered_through(w))).collect();
        for (id, revision) in due {
            self.send(self.response(id, revision)).await?;
        }
        Ok(())
    }
}

fn event(e: Event) -> mvccpb::Event {
    use mvccpb::event::EventType;
    let (kind, kv) = match e.kv {
        Some(kv) => (EventType::Put, super::kv::key_value(Arc::unwrap_or_clone(kv))),
        None => (
            EventType::Delete,
            super::kv::key_value(KeyValue { key: e.key, mod_revision: e.revision, ..Default::default() }),
        ),
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv),
        prev_kv: e.prev_kv.map(|kv| super::kv::key_value(Arc::unwrap_or_clone(kv))),
    }
}
