//! What the lock metrics count (`crate::metrics`): the waiters of this
//! member ([`Waiting`], a guard held while a request waits for its turn) and
//! the grants it made that are still held ([`Grants`]).
//!
//! A grant is held while its owner key exists with the create_revision it was
//! granted with; releases happen anywhere (another member, a lease expiry),
//! so the set is checked against the applied state when it is read, and
//! pruned of released grants whenever it has doubled since it was last
//! pruned — its size stays within twice the grants held (plus a floor).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::applied::AppliedState;
use crate::metrics::metrics;
use crate::mvcc::RangeRequest;

/// Grants are pruned no more often than every this many.
const PRUNE_FLOOR: usize = 1024;

/// Grants made through this member: owner key -> token.
#[derive(Default)]
pub struct Grants {
    inner: Mutex<GrantSet>,
}

#[derive(Default)]
struct GrantSet {
    grants: HashMap<Vec<u8>, i64>,
    /// The size after the last pruning.
    pruned_to: usize,
}

impl Grants {
    /// Note a grant of `key` with fencing token `token`.
    pub fn granted(&self, key: &[u8], token: i64, state: &AppliedState) {
        let mut set = self.inner.lock().expect("grants lock poisoned");
        set.grants.insert(key.to_vec(), token);
        if set.grants.len() >= (set.pruned_to * 2).max(PRUNE_FLOOR) {
            prune(&mut set.grants, state);
            set.pruned_to = set.grants.len();
        }
    }

    /// How many are still held (pruning the others).
    pub fn held(&self, state: &AppliedState) -> usize {
        let mut set = self.inner.lock().expect("grants lock poisoned");
        prune(&mut set.grants, state);
        set.pruned_to = set.grants.len();
        set.grants.len()
    }
}

/// Drop the grants whose owner key is gone or was created again.
fn prune(grants: &mut HashMap<Vec<u8>, i64>, state: &AppliedState) {
    let mvcc = state.mvcc();
    grants.retain(|key, token| {
        let current = mvcc.range(&RangeRequest { key: key.clone(), keys_only: true, ..Default::default() });
        current.is_ok_and(|r| r.kvs.first().is_some_and(|kv| kv.create_revision == *token))
    });
}

/// Counts a request as waiting for its turn while it lives.
pub struct Waiting(());

impl Waiting {
    pub fn start() -> Waiting {
        metrics().lock_waiters.inc();
        Waiting(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics().lock_waiters.dec();
    }
}
