//! raftlock's native locks (`raftlock.v1.Locks`): acquire with a wait timeout
//! or try-once, semaphores of N permits, fenced release, and introspection.
//!
//! These are the queues of the module above with three additions: a waiter
//! that reaches its deadline removes its key and answers who holds the lock
//! instead; the owner's metadata is the key's value; and Describe and List show
//! queues as they are, linearizably read (Describe with every owner's lease
//! TTL).
//!
//! Invariant: an acquire that does not answer "acquired" leaves no key behind
//! (its removal is fenced by the key's token, so it can never remove a later
//! grant). A place in the queue belongs to the lease, as in etcd: acquires by
//! one lease of one lock share it, and one that gives up gives it up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{enqueue_guarded, prefix_end, queue_prefix, wait_for_turn, RecipeError};
use crate::mvcc::{KeyValue, RangeRequest, SortOrder, SortTarget};
use crate::server::Node;

/// How long an acquire may wait for its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Answer at once.
    Never,
    For(Duration),
    /// Until granted, the lease ends or the caller goes away.
    Forever,
}

/// An owner in a lock's queue (a holder or a waiter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kv: KeyValue,
    /// Seconds left on the owner's lease (-1: unknown or ended); Describe only.
    pub ttl: i64,
    /// The lease's granted TTL in seconds; Describe only.
    pub granted_ttl: i64,
}

impl Owner {
    fn of(kv: KeyValue) -> Self {
        Owner { kv, ttl: -1, granted_ttl: 0 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Held: the owner key (its create_revision is the fencing token).
    Granted { kv: KeyValue, revision: i64 },
    /// Not held within the wait; who holds the lock.
    Refused { holders: Vec<Owner>, revision: i64 },
}

/// Acquire one of `permits` places of lock `name` for `lease`, waiting at most
/// `wait`. `metadata` becomes the owner key's value.
pub async fn acquire(
    node: Arc<Node>,
    name: &[u8],
    lease: i64,
    metadata: &[u8],
    permits: usize,
    wait: Wait,
) -> Result<Acquired, RecipeError> {
    let (queued, cleanup) = enqueue_guarded(&node, name, lease, metadata, permits).await?;
    if queued.holds() {
        cleanup.disarm();
        return Ok(Acquired::Granted { kv: queued.mine, revision: queued.revision });
    }
    let prefix = queue_prefix(name);
    let waited = match wait {
        // An overflowing deadline is as good as none.
        Wait::For(d) => match Instant::now().checked_add(d) {
            Some(deadline) => wait_for_turn(&node, &prefix, &queued.mine, permits, Some(deadline)).await,
            None => wait_for_turn(&node, &prefix, &queued.mine, permits, None).await,
        },
        Wait::Forever => wait_for_turn(&node, &prefix, &queued.mine, permits, None).await,
        Wait::Never => Err(RecipeError::TimedOut),
    };
    match waited {
        Ok(kv) => {
            cleanup.disarm();
            Ok(Acquired::Granted { kv, revision: node.revision() })
        }
        Err(RecipeError::TimedOut) => {
            // The place belongs to the lease, as in etcd: an acquire that gives
            // up removes it even if an earlier acquire by the lease made it.
            let revision = cleanup.remove().await?.revision;
            let holders = if wait == Wait::Never {
                queued.front.into_iter().map(Owner::of).collect()
            } else {
                queue(&node, name).await?.into_iter().take(permits).map(Owner::of).collect()
            };
            Ok(Acquired::Refused { holders, revision })
        }
        Err(e) => Err(e),
    }
}

/// Every key of lock `name`, first in line first, read linearizably.
async fn queue(node: &Node, name: &[u8]) -> Result<Vec<KeyValue>, RecipeError> {
    node.read_barrier().await?;
    let req = super::front_range(&queue_prefix(name), 0);
    Ok(node.state().mvcc().range(&req).map_err(RecipeError::Mvcc)?.kvs)
}

/// A lock's holders and waiters, each with its lease's TTL (asked of the leader).
pub struct Description {
    pub holders: Vec<Owner>,
    pub waiters: Vec<Owner>,
    pub revision: i64,
}

pub async fn describe(node: &Node, name: &[u8], permits: usize) -> Result<Description, RecipeError> {
    let keys = queue(node, name).await?;
    let revision = node.revision();
    let asks = keys.iter().map(|kv| node.time_to_live(kv.lease));
    let answers = futures::future::join_all(asks).await;
    let mut owners = Vec::with_capacity(keys.len());
    for (kv, answer) in keys.into_iter().zip(answers) {
        let (ttl, granted_ttl) = match answer? {
            Some(status) => (status.remaining, status.granted),
            None => (-1, 0),
        };
        owners.push(Owner { kv, ttl, granted_ttl });
    }
    let waiters = owners.split_off(permits.min(owners.len()));
    Ok(Description { holders: owners, waiters, revision })
}

/// A lock found by [`list`].
pub struct Summary {
    pub name: Vec<u8>,
    pub holders: Vec<Owner>,
    pub waiters: usize,
}

/// Every lock whose name starts with `prefix` (all when empty), by name. A lock
/// is recognised by its keys: `<name>/<lease hex>` attached to that lease.
pub async fn list(node: &Node, prefix: &[u8], permits: usize) -> Result<(Vec<Summary>, i64), RecipeError> {
    node.read_barrier().await?;
    let req = RangeRequest {
        key: if prefix.is_empty() { vec![0] } else { prefix.to_vec() },
        range_end: if prefix.is_empty() { vec![0] } else { prefix_end(prefix) },
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        ..Default::default()
    };
    let (kvs, revision) = {
        let result = node.state().mvcc().range(&req).map_err(RecipeError::Mvcc)?;
        (result.kvs, result.revision)
    };
    let mut locks: BTreeMap<Vec<u8>, Vec<KeyValue>> = BTreeMap::new();
    for kv in kvs {
        if let Some(name) = lock_name(&kv) {
            locks.entry(name.to_vec()).or_default().push(kv);
        }
    }
    let summaries = locks
        .into_iter()
        .map(|(name, mut kvs)| {
            let waiting = kvs.split_off(permits.min(kvs.len()));
            Summary { name, holders: kvs.into_iter().map(Owner::of).collect(), waiters: waiting.len() }
        })
        .collect();
    Ok((summaries, revision))
}

/// The lock a key belongs to, if it is an owner key: `<name>/<lease hex>`
/// attached to that very lease.
fn lock_name(kv: &KeyValue) -> Option<&[u8]> {
    let slash = kv.key.iter().rposition(|&b| b == b'/')?;
    (kv.lease != 0 && kv.key[slash + 1..] == *format!("{:x}", kv.lease).as_bytes()).then(|| &kv.key[..slash])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, lease: i64) -> KeyValue {
        KeyValue { key: key.as_bytes().to_vec(), lease, ..Default::default() }
    }

    #[test]
    fn owner_keys_name_their_lock() {
        assert_eq!(lock_name(&kv("jobs/nightly/694d7", 0x694d7)), Some(&b"jobs/nightly"[..]));
        assert_eq!(lock_name(&kv("/1f", 0x1f)), Some(&b""[..]));
        // Not an owner key: no lease, another lease, or no slash.
        assert_eq!(lock_name(&kv("jobs/694d7", 0)), None);
        assert_eq!(lock_name(&kv("jobs/694d7", 0x694d8)), None);
        assert_eq!(lock_name(&kv("694d7", 0x694d7)), None);
    }
}
