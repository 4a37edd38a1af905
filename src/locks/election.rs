//! etcd's `v3election`: Campaign, Proclaim, Leader, Observe, Resign, run on the
//! server (see the module above). The leader of election `name` is the key
//! under `name/` with the lowest create_revision; its value is the leader's
//! proclamation.

use std::sync::Arc;

use super::turn::{enqueue_guarded, wait_for_turn};
use super::{queue_prefix, Mode, Place, RecipeError};
use crate::model::mvcc::{CompareResult, CompareTarget, KeyRange, KeyValue, PutRequest, RequestOp, TxnRequest};
use crate::node::Node;

/// Who leads: the election's name, the leader's key, its create_revision and lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderKey {
    pub name: Vec<u8>,
    pub key: Vec<u8>,
    pub rev: i64,
    pub lease: i64,
}

/// Wait to become leader of `name` with `value`; a campaign again by the same
/// lease keeps its place and updates the value. Returns the leader key and, for
/// the response header, the revision of the campaign's txn (as etcd does).
pub async fn campaign(node: Arc<Node>, name: &[u8], lease: i64, value: &[u8]) -> Result<(LeaderKey, i64), RecipeError> {
    let (queued, cleanup) = enqueue_guarded(&node, &Place::etcd(name, lease, value, 1)).await?;
    let mine = &queued.mine;
    let leader = LeaderKey { name: name.to_vec(), key: mine.key.clone(), rev: mine.create_revision, lease };
    if mine.value != value {
        proclaim(&node, &leader, value).await?;
    }
    if !queued.holds() {
        wait_for_turn(&node, &queue_prefix(name), mine, Mode::Write, 1, None).await?;
    }
    cleanup.disarm();
    Ok((leader, queued.revision))
}

/// A txn that runs `op` only while `leader` still holds its key; answers the
/// txn's revision and whether it ran.
async fn while_leader(node: &Node, leader: &LeaderKey, op: RequestOp) -> Result<(i64, bool), RecipeError> {
    let txn = TxnRequest {
        compare: vec![super::create_revision_is(&leader.key, leader.rev)],
        success: vec![op],
        failure: vec![],
    };
    let r = node.txn(txn, None).await?;
    Ok((r.revision, r.succeeded))
}

/// Change the leader's value, if `leader` still leads.
///
/// The leader key comes from the client, so everything in it is checked
/// against the store rather than trusted: the key must lie under the
/// election's prefix and exist with create_revision `rev` (so `rev > 0`),
/// and its lease must be the one it already has. Without the lease guard
/// the put would attach the key to any lease the caller names — a victim's,
/// whose keepalives and revokes auth would then refuse the victim (it lacks
/// rights on the attached key). A key that fails any of these is
/// `election: not leader`, as etcd answers a stale leader key.
pub async fn proclaim(node: &Node, leader: &LeaderKey, value: &[u8]) -> Result<i64, RecipeError> {
    if !is_candidate_key(leader) {
        return Err(RecipeError::NotLeader);
    }
    let put = PutRequest { key: leader.key.clone(), value: value.to_vec(), lease: leader.lease, ..Default::default() };
    let guards = vec![
        super::create_revision_is(&leader.key, leader.rev),
        super::compare(&leader.key, CompareTarget::Lease, CompareResult::Equal, leader.lease),
    ];
    super::put_if(node, guards, put).await?.ok_or(RecipeError::NotLeader)
}

/// Whether a client's leader key can name a campaign of its election at
/// all: a key strictly under the election's prefix, created at a real
/// revision. (That it still exists, with that revision and lease, is the
/// txn's guard.)
fn is_candidate_key(leader: &LeaderKey) -> bool {
    let prefix = queue_prefix(&leader.name);
    leader.rev > 0 && leader.key.len() > prefix.len() && leader.key.starts_with(&prefix)
}

/// Give up leadership (delete the leader's key), if `leader` still leads. A
/// stale leader key resigns nothing and is not an error, as in etcd.
pub async fn resign(node: &Node, leader: &LeaderKey) -> Result<i64, RecipeError> {
    if !is_candidate_key(leader) {
        // Nothing a campaign made: resigns nothing (etcd answers the header).
        node.read_barrier().await?;
        return Ok(node.revision());
    }
    let del = crate::model::mvcc::DeleteRangeRequest { key: leader.key.clone(), range_end: vec![], prev_kv: false };
    Ok(while_leader(node, leader, RequestOp::DeleteRange(del)).await?.0)
}

/// The current leader's key-value, read linearizably.
pub async fn leader(node: &Node, name: &[u8]) -> Result<KeyValue, RecipeError> {
    node.read_barrier().await?;
    first_created(node, name)?.ok_or(RecipeError::NoLeader)
}

fn first_created(node: &Node, name: &[u8]) -> Result<Option<KeyValue>, RecipeError> {
    let req = super::front_range(&queue_prefix(name), 1);
    Ok(node.state().mvcc().range(&req).map_err(RecipeError::Mvcc)?.kvs.into_iter().next())
}

/// Follow the leadership of `name`: each time it changes (a new leader, or a
/// new value) the leader, mapped by `make`, goes to `out`; ends when `out` closes.
/// Woken only by changes under the election's prefix (`AppliedState::follow`).
pub async fn observe<T: Send>(
    node: &Node,
    name: &[u8],
    out: &tokio::sync::mpsc::Sender<T>,
    mut make: impl FnMut(KeyValue) -> T + Send,
) -> Result<(), RecipeError> {
    let p = queue_prefix(name);
    // Follow the election's keys before reading them (see `AppliedState::follow`).
    let inbox = node.state().follow(&KeyRange::with_prefix(&p));
    node.read_barrier().await?;
    let mut last: Option<KeyValue> = None;
    let mut stopping = node.stopping();
    loop {
        // What is queued now shows in the look that follows.
        inbox.take();
        let current = first_created(node, name)?;
        if let Some(kv) = &current {
            if last.as_ref() != Some(kv) {
                if out.send(make(kv.clone())).await.is_err() {
                    return Ok(());
                }
                last = current;
            }
        }
        // Wait for a change under the election's prefix, or for word that
        // changes were lost (the store was replaced, or the inbox overflowed):
        // either way, look at the store again. A wake kept from before the
        // last look, with nothing queued, is not a change.
        loop {
            tokio::select! {
                _ = inbox.ready() => {
                    let taken = inbox.take();
                    if !taken.batches.is_empty() || taken.lost_after.is_some() {
                        break;
                    }
                }
                // The observer went away: stop following (a quiet election
                // would otherwise keep its inbox until the next change).
                _ = out.closed() => return Ok(()),
                _ = stopping.stopped() => return Ok(()),
            }
        }
    }
}
