//! What the lock metrics count (`crate::base::metrics`): the waiters of this
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

use crate::base::metrics::metrics;
use crate::model::applied::AppliedState;
use crate::model::mvcc::RangeRequest;

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

/// Grants checked under one hold of the store's read lock: apply, which
/// takes the write lock, waits for at most this many lookups, not for a
/// check of every grant (tens of milliseconds with 100k held).
const PRUNE_CHUNK: usize = 1024;

/// Drop the grants whose owner key is gone or was created again.
fn prune(grants: &mut HashMap<Vec<u8>, i64>, state: &AppliedState) {
    let mut mvcc = None;
    let mut checked = 0usize;
    grants.retain(|key, token| {
        if checked.is_multiple_of(PRUNE_CHUNK) {
            // Let go of the last chunk's hold before taking the next, so a
            // waiting writer gets in between (and a second read hold is
            // never asked for while one is held: with a writer waiting, it
            // would wait for that writer, which waits for the first).
            drop(mvcc.take());
            mvcc = Some(state.mvcc());
        }
        checked += 1;
        let store = mvcc.as_ref().expect("held since the chunk began");
        let current = store.range(&RangeRequest { key: key.clone(), keys_only: true, ..Default::default() });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lease::LeaseTable;
    use crate::model::mvcc::{DeleteRangeRequest, PutRequest};

    /// More grants than one chunk of the pruning holds: each is counted
    /// while its key lives with the create revision it was granted with.
    #[test]
    fn a_grant_is_held_while_its_key_lives_with_its_create_revision() {
        let state = AppliedState::default();
        let grants = Grants::default();
        let no_leases = LeaseTable::default();
        let put = |key: &[u8]| {
            let req = PutRequest { key: key.to_vec(), ..Default::default() };
            state.mvcc_mut().put(req, &no_leases).expect("put").0.revision
        };
        let delete = |key: &[u8]| {
            state.mvcc_mut().delete_range(&DeleteRangeRequest { key: key.to_vec(), ..Default::default() });
        };
        let n = 3 * PRUNE_CHUNK + 7;
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("lock/{i}").into_bytes()).collect();
        for key in &keys {
            grants.granted(key, put(key), &state);
        }
        assert_eq!(grants.held(&state), n);
        // Every third released; every fifth of the others released and
        // taken again (a new create revision: not the grant counted).
        for (i, key) in keys.iter().enumerate() {
            if i % 3 == 0 {
                delete(key);
            } else if i % 5 == 0 {
                delete(key);
                put(key);
            }
        }
        let held = (0..n).filter(|i| i % 3 != 0 && i % 5 != 0).count();
        assert_eq!(grants.held(&state), held);
    }
}
