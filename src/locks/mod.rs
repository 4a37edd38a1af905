//! Locks, semaphores and elections, run on the server over the node facade.
//!
//! A lock (or an election) named `N` is a queue of ordinary keys `N/<lease id
//! in hex>`, each attached to its owner's lease and ordered by create_revision.
//! With `permits` = P the first P keys hold the lock (P = 1: a mutex; etcd's
//! Lock and Election always use 1); the others wait in FIFO order. Because the
//! keys are exactly etcd's, client-side recipes (etcdctl lock and elect,
//! clientv3's `concurrency`, python etcd3 locks), etcd's Lock service and the
//! native API all see and respect each other.
//!
//! Taking a place is one txn that also reads the front of the queue, so an
//! uncontended lock costs one write. Waiting is server-side: a waiter follows
//! the node's feed of applied changes and counts down the deletions of keys
//! ahead of it — no polling, and a release makes exactly one waiter look again
//! (no thundering herd). Before it answers, a waiter checks that its own key
//! still exists in the committed state in which its turn came: if its lease
//! ended while it waited, it gets an error, not the lock (etcd issue 11456).
//! A waiter that gives up, times out or is cancelled (the client went away)
//! deletes its key.
//!
//! Fencing: a grant's token is its key's create_revision, strictly greater for
//! every later holder of the same name. Releases can be fenced by it, so a
//! stale holder cannot delete a later grant of the same lease (etcd issue 22082).
//!
//! Caveats: names nest — the keys of lock `a/b` lie under `a/` and so queue in
//! lock `a` too, as in etcd; and every user of a name must agree on `permits`.

pub mod election;
pub mod fenced;
pub mod mutex;
pub mod stats;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::broadcast;

use crate::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, KeyValue, MvccError, PutRequest, RangeRequest,
    RequestOp, ResponseOp, SortOrder, SortTarget, TxnRequest,
};
use crate::server::{Node, ServerError, WriteError};

/// Why a lock or election request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{0}")]
    Mvcc(MvccError),
    /// The waiter's own key vanished (its lease expired or was revoked).
    #[error("the session's lease ended")]
    SessionExpired,
    #[error("not the election's leader")]
    NotLeader,
    #[error("the election has no leader")]
    NoLeader,
    /// The wait for a lock reached its deadline.
    #[error("the wait for the lock timed out")]
    TimedOut,
    /// Auth refused the caller.
    #[error(transparent)]
    Denied(crate::auth::AuthError),
}

impl From<WriteError> for RecipeError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Server(e) => RecipeError::Server(e),
            WriteError::Rejected(e) => RecipeError::Mvcc(e),
            WriteError::Denied(e) => RecipeError::Denied(e),
        }
    }
}

/// `name/<lease hex>`, etcd's key for a lease in a lock or election.
pub fn member_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut key = name.to_vec();
    key.push(b'/');
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The end of the prefix range `prefix..`: etcd's `GetPrefixRangeEnd`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A place in a lock's queue, as the txn that took it left things.
#[derive(Clone, Debug)]
pub struct Queued {
    /// Our key; its create_revision is our place (and fencing token).
    pub mine: KeyValue,
    /// The revision of the txn that queued (or found) the key.
    pub revision: i64,
    /// The first `permits` keys of the queue at that revision, lowest
    /// create_revision first: the holders.
    pub front: Vec<KeyValue>,
}

impl Queued {
    /// Whether our key is among the holders.
    pub fn holds(&self) -> bool {
        self.front.iter().any(|kv| kv.key == self.mine.key && kv.create_revision == self.mine.create_revision)
    }
}

/// `name/`, the prefix of every key of a lock or election.
pub fn queue_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The first `permits` keys under `prefix`, by create_revision (0: all).
pub(super) fn front_range(prefix: &[u8], permits: usize) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        limit: permits as i64,
        ..Default::default()
    }
}

/// Take a place in the queue of lock `name` for `lease`, in one txn (as etcd's
/// recipes do): create `name/<lease hex>` with `value` unless it exists, and
/// read back the key and the queue's first `permits` keys. A lease that is
/// already queued keeps its place (and its value).
pub async fn enqueue(
    node: &Node,
    name: &[u8],
    lease: i64,
    value: &[u8],
    permits: usize,
) -> Result<Queued, RecipeError> {
    let key = member_key(name, lease);
    let reads = vec![
        RequestOp::Range(RangeRequest { key: key.clone(), ..Default::default() }),
        RequestOp::Range(front_range(&queue_prefix(name), permits)),
    ];
    let put = RequestOp::Put(PutRequest { key: key.clone(), value: value.to_vec(), lease, ..Default::default() });
    let txn = TxnRequest {
        compare: vec![create_revision_is(&key, 0)],
        success: std::iter::once(put).chain(reads.iter().cloned()).collect(),
        failure: reads,
    };
    let result = node.txn(txn, None).await?;
    let mut ranges = result.responses.into_iter().filter_map(|r| match r {
        ResponseOp::Range(r) => Some(r.kvs),
        _ => None,
    });
    let (Some(mine), Some(front)) = (ranges.next(), ranges.next()) else {
        unreachable!("the queue txn reads the key and the front of the queue")
    };
    // A failure branch on a key that exists always finds it: the txn is atomic.
    let mine = mine.into_iter().next().ok_or(RecipeError::SessionExpired)?;
    Ok(Queued { mine, revision: result.revision, front })
}

/// [`enqueue`], guarded: the place comes with the [`CleanupOnDrop`] that
/// removes it unless disarmed. The txn runs in a task of its own, so that a
/// caller that goes away while it is in flight (a cancelled request) cannot
/// leave a place behind: the task finishes, and the guard it produced, which
/// nobody takes, removes the key.
pub async fn enqueue_guarded(
    node: &Arc<Node>,
    name: &[u8],
    lease: i64,
    value: &[u8],
    permits: usize,
) -> Result<(Queued, CleanupOnDrop), RecipeError> {
    let (node, name, value) = (node.clone(), name.to_vec(), value.to_vec());
    let task = tokio::spawn(async move {
        let queued = enqueue(&node, &name, lease, &value, permits).await?;
        let guard = CleanupOnDrop::new(node, &queued.mine);
        Ok((queued, guard))
    });
    task.await.unwrap_or(Err(RecipeError::Server(ServerError::Stopped)))
}

/// A txn guard: `key`'s create_revision is `revision` (0: it does not exist).
pub(super) fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::Create,
        key: key.to_vec(),
        range_end: vec![],
        number: revision,
        value: vec![],
    }
}

/// Wait until fewer than `permits` keys under `prefix` were created before
/// `mine` (it holds the lock), or until `deadline` ([`RecipeError::TimedOut`]).
/// Fails if `mine` itself is deleted (its lease ended) before its turn comes.
/// Returns our key as it is when the turn came.
///
/// It counts the keys ahead in the local applied state (committed, so the
/// count is true at that revision; later keys are created behind `mine`), then
/// follows the feed of applied changes and counts down the deletions of keys
/// ahead. It looks at the store again only when the count says its turn has
/// come — so a release wakes only the waiter it makes a holder — and that look
/// is the re-check: our key (hence our lease) is alive in the committed state
/// in which nobody is ahead of us any more.
pub async fn wait_for_turn(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let _waiting = stats::Waiting::start();
    // The key may have been queued through another member; see it here first.
    node.wait_revision(mine.mod_revision).await?;
    let mut stopping = node.stopping();
    loop {
        // Follow the feed before reading, so that no deletion slips between.
        let mut feed = node.state().subscribe();
        let (current, mut ahead, read_at) = {
            let mvcc = node.state().mvcc();
            let own = mvcc.range(&RangeRequest { key: mine.key.clone(), ..Default::default() });
            let current = match own.map_err(RecipeError::Mvcc)?.kvs.into_iter().next() {
                Some(kv) if kv.create_revision == mine.create_revision => kv,
                _ => return Err(RecipeError::SessionExpired),
            };
            let earlier = RangeRequest {
                key: prefix.to_vec(),
                range_end: prefix_end(prefix),
                max_create_revision: mine.create_revision - 1,
                keys_only: true,
                ..Default::default()
            };
            (current, mvcc.range(&earlier).map_err(RecipeError::Mvcc)?.kvs.len(), mvcc.revision())
        };
        if ahead < permits {
            return Ok(current);
        }
        while ahead >= permits {
            let batch = tokio::select! {
                batch = feed.recv() => batch,
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            };
            let batch = match batch {
                Ok(batch) => batch,
                // Missed changes (or a snapshot replaced the store): count again.
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return Err(ServerError::Stopped.into()),
            };
            // Changes up to `read_at` are already in the count.
            for c in batch.changes.iter().filter(|c| c.kv.is_none() && c.revision > read_at) {
                if c.key == mine.key {
                    return Err(RecipeError::SessionExpired);
                }
                let was_ahead = c.prev.as_ref().is_some_and(|p| p.create_revision < mine.create_revision);
                if was_ahead && c.key.starts_with(prefix) {
                    ahead -= 1;
                }
            }
        }
    }
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Delete `key` (one revision if it existed); returns the store revision.
pub async fn delete(node: &Node, key: &[u8]) -> Result<i64, RecipeError> {
    let req = DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
    Ok(node.delete_range(req, None).await?.revision)
}

/// What a fenced release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// The revision of the release's txn.
    pub revision: i64,
    pub released: bool,
    /// When not released: the key's create_revision now, 0 if it does not exist.
    pub current_token: i64,
}

/// Delete `key` only if its create_revision is still `token`: a release that
/// cannot touch a later grant of the same key.
pub async fn release(node: &Node, key: &[u8], token: i64) -> Result<Release, RecipeError> {
    let txn = TxnRequest {
        compare: vec![create_revision_is(key, token)],
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
            key: key.to_vec(),
            range_end: vec![],
            prev_kv: false,
        })],
        failure: vec![RequestOp::Range(RangeRequest { key: key.to_vec(), keys_only: true, ..Default::default() })],
    };
    let result = node.txn(txn, None).await?;
    let current_token = match result.responses.first() {
        Some(ResponseOp::Range(r)) => r.kvs.first().map_or(0, |kv| kv.create_revision),
        _ => 0,
    };
    Ok(Release { revision: result.revision, released: result.succeeded, current_token })
}

/// Removes a waiter's key, fenced by its token, unless disarmed: explicitly
/// ([`CleanupOnDrop::remove`]) when the waiter gives up, or in the background
/// when it is dropped mid-wait (the client went away).
pub struct CleanupOnDrop {
    node: Option<Arc<Node>>,
    key: Vec<u8>,
    token: i64,
}

impl CleanupOnDrop {
    pub fn new(node: Arc<Node>, mine: &KeyValue) -> Self {
        CleanupOnDrop { node: Some(node), key: mine.key.clone(), token: mine.create_revision }
    }

    /// The wait ended with the lock; keep the key.
    pub fn disarm(mut self) {
        self.node = None;
    }

    /// The waiter gave up: remove the key now. Stays armed until the removal
    /// has succeeded, so that a failure, or this call being dropped midway,
    /// still leaves the removal to the background.
    pub async fn remove(mut self) -> Result<Release, RecipeError> {
        let node = self.node.clone().expect("armed until used");
        let released = release(&node, &self.key, self.token).await?;
        self.node = None;
        Ok(released)
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let key = std::mem::take(&mut self.key);
            let token = self.token;
            tokio::spawn(async move {
                if let Err(e) = release(&node, &key, token).await {
                    tracing::warn!(error = %e, "removing an abandoned waiter's key");
                }
            });
        }
    }
}
