//! etcd's `v3lock` Lock/Unlock, run on the server (see the module above).
//!
//! Lock with lease 0 behaves as etcd's: the server grants a 60-second lease
//! that nobody keeps alive, so the lock silently ends a minute later. The
//! README warns about this trap and steers users to pass their own lease.

use std::sync::Arc;

use super::turn::{enqueue_guarded, wait_for_turn};
use super::{queue_prefix, Mode, Place, RecipeError};
use crate::model::mvcc::KeyValue;
use crate::node::Node;

/// The TTL of the lease etcd's Lock grants when the request names none.
pub const DEFAULT_SESSION_TTL: i64 = 60;

/// Take the lock `name` for `lease`, waiting in FIFO order. Returns the
/// holder's key as it is once held (its create_revision is the fencing token)
/// and the revision for the response header: as etcd's, the revision of the
/// txn that queued it if it did not wait, else the revision it saw its turn at.
pub async fn lock(node: Arc<Node>, name: &[u8], lease: i64) -> Result<(KeyValue, i64), RecipeError> {
    let lease = if lease == 0 { grant_unattended_lease(&node).await? } else { lease };
    // From here on, giving up (or being dropped) must remove our key.
    let (queued, cleanup) = enqueue_guarded(&node, &Place::etcd(name, lease, b"", 1)).await?;
    if queued.holds() {
        cleanup.disarm();
        return Ok((queued.mine, queued.revision));
    }
    let held = wait_for_turn(&node, &queue_prefix(name), &queued.mine, Mode::Write, 1, None).await?;
    cleanup.disarm();
    Ok((held, node.revision()))
}

async fn grant_unattended_lease(node: &Node) -> Result<i64, RecipeError> {
    Ok(node.grant_lease(0, DEFAULT_SESSION_TTL, None).await?.id)
}
