//! Locks and elections: etcd's recipes, run on the server over the node facade.
//!
//! A lock (or an election) named `N` is a set of ordinary keys `N/<lease id in
//! hex>`, each attached to its holder's lease. They are ordered by
//! create_revision: the lowest is the owner, the others wait in FIFO order.
//! Because the keys are exactly etcd's, client-side recipes (etcdctl lock and
//! elect, clientv3's `concurrency`, python etcd3 locks) and these server-side
//! services see and respect each other.
//!
//! Waiting is server-side: a waiter follows the node's feed of applied changes
//! and wakes only when the key just ahead of it is deleted — no polling, and a
//! release wakes exactly one waiter (no thundering herd). Before it answers, a
//! waiter checks that its own key still exists: if its lease expired while it
//! waited, the key is gone and it gets an error, not the lock (etcd issue
//! 11456). A waiter that is cancelled (the client went away) deletes its key.
//!
//! Caveat: the fencing token of a holder is its key's create_revision; it only
//! grows across holders of one name.

pub mod election;
pub mod mutex;

use std::sync::Arc;

use crate::command::{Command, CommandResult};
use crate::mvcc::{
    Compare, CompareResult, CompareTarget, KeyValue, MvccError, PutRequest, RangeRequest, RequestOp, ResponseOp,
    SortOrder, SortTarget, TxnRequest,
};
use crate::server::{Node, ServerError};

/// Why a lock or election request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{0}")]
    Mvcc(MvccError),
    /// The waiter's own key vanished (its lease expired or was revoked); the
    /// message is etcd's.
    #[error("session: session is expired")]
    SessionExpired,
    #[error("election: not leader")]
    NotLeader,
    #[error("election: no leader")]
    NoLeader,
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

/// Create `key` with `value` under `lease` unless it exists; either way return
/// the key as it now is and the txn's revision. One txn, as etcd's recipes do.
pub async fn create_or_get(node: &Node, key: &[u8], value: &[u8], lease: i64) -> Result<(KeyValue, i64), RecipeError> {
    let get = RequestOp::Range(RangeRequest { key: key.to_vec(), ..Default::default() });
    let txn = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Create,
            key: key.to_vec(),
            range_end: vec![],
            number: 0,
            value: vec![],
        }],
        success: vec![
            RequestOp::Put(PutRequest { key: key.to_vec(), value: value.to_vec(), lease, ..Default::default() }),
            get.clone(),
        ],
        failure: vec![get],
    };
    let result = match node.write(Command::Txn(txn)).await? {
        CommandResult::Txn(r) => r,
        CommandResult::Rejected { error, .. } => return Err(RecipeError::Mvcc(error)),
        other => unreachable!("a txn answers with a txn result, not {other:?}"),
    };
    match result.responses.last() {
        Some(ResponseOp::Range(r)) if !r.kvs.is_empty() => Ok((r.kvs[0].clone(), result.revision)),
        _ => Err(RecipeError::SessionExpired),
    }
}

/// The key under `prefix` created last before `before` (the one to wait for),
/// read linearizably.
async fn predecessor(node: &Node, prefix: &[u8], before: i64) -> Result<Option<KeyValue>, RecipeError> {
    node.read_barrier().await?;
    let req = RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        max_create_revision: before - 1,
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Create,
        limit: 1,
        ..Default::default()
    };
    Ok(node.state().mvcc().range(&req).map_err(RecipeError::Mvcc)?.kvs.into_iter().next())
}

/// Wait until no key under `prefix` was created before `mine`: every earlier
/// holder or waiter is gone. Wakes on the deletion of the key just ahead, then
/// looks again; fails at once if `mine` itself is deleted (its lease ended).
/// Returns whether it had to wait at all.
pub async fn wait_for_turn(node: &Node, prefix: &[u8], mine: &KeyValue) -> Result<bool, RecipeError> {
    let mut waited = false;
    loop {
        // Follow the feed before reading, so that a deletion cannot slip between.
        let mut feed = node.state().subscribe();
        let Some(ahead) = predecessor(node, prefix, mine.create_revision).await? else { return Ok(waited) };
        waited = true;
        if wait_deleted(node, &mut feed, &ahead.key, &mine.key).await? == Deleted::Mine {
            return Err(RecipeError::SessionExpired);
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Deleted {
    Ahead,
    Mine,
    /// The feed lagged: nothing is known, look again.
    Unknown,
}

/// Resolve once `ahead` or `mine` is deleted.
async fn wait_deleted(
    node: &Node,
    feed: &mut tokio::sync::broadcast::Receiver<Arc<crate::state::AppliedChanges>>,
    ahead: &[u8],
    mine: &[u8],
) -> Result<Deleted, RecipeError> {
    let shutdown = node.shutdown_signal();
    loop {
        tokio::select! {
            batch = feed.recv() => match batch {
                Ok(batch) => {
                    for c in batch.changes.iter().filter(|c| c.kv.is_none()) {
                        if c.key == mine {
                            return Ok(Deleted::Mine);
                        }
                        if c.key == ahead {
                            return Ok(Deleted::Ahead);
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Ok(Deleted::Unknown),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Err(ServerError::Stopped.into()),
            },
            _ = crate::server::shutdown_started(shutdown.clone()) => return Err(ServerError::Stopped.into()),
        }
    }
}

/// The live version of `key`, read linearizably.
pub async fn get(node: &Node, key: &[u8]) -> Result<Option<KeyValue>, RecipeError> {
    node.read_barrier().await?;
    let req = RangeRequest { key: key.to_vec(), ..Default::default() };
    Ok(node.state().mvcc().range(&req).map_err(RecipeError::Mvcc)?.kvs.into_iter().next())
}

/// Delete `key` (one revision if it existed); returns the store revision.
pub async fn delete(node: &Node, key: &[u8]) -> Result<i64, RecipeError> {
    let req = crate::mvcc::DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
    match node.write(Command::DeleteRange(req)).await? {
        CommandResult::DeleteRange(r) => Ok(r.revision),
        other => unreachable!("a delete answers with a delete result, not {other:?}"),
    }
}

/// Deletes a waiter's key if the waiter is dropped before it is disarmed (the
/// client went away mid-wait).
pub struct CleanupOnDrop {
    node: Option<Arc<Node>>,
    key: Vec<u8>,
}

impl CleanupOnDrop {
    pub fn new(node: Arc<Node>, key: Vec<u8>) -> Self {
        CleanupOnDrop { node: Some(node), key }
    }

    /// The wait ended normally; keep the key.
    pub fn disarm(mut self) {
        self.node = None;
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let key = std::mem::take(&mut self.key);
            tokio::spawn(async move {
                if let Err(e) = delete(&node, &key).await {
                    tracing::warn!(error = %e, "removing an abandoned waiter's key");
                }
            });
        }
    }
}
