//! The applied state a node serves from: the MVCC store, the lease table,
//! the members' published attributes and the auth store; how apply tells
//! its readers what it changed (the feed, the watch routes, the deletion
//! waits); and the auth tokens this member accepts (handed out by apply, but
//! not part of the replicated state: see `auth::tokens`). Written only by
//! the Raft state machine, in log order; read by every API handler.
//!
//! The change feed is a bounded broadcast: apply never waits for a follower
//! of it. A follower that falls more than [`CHANGE_FEED_CAPACITY`] apply
//! calls behind misses messages, notices (the receiver reports the lag), and
//! looks at the store instead. Every follower of the feed (a read waiting
//! for a revision, for as long as that takes) is woken by every apply call,
//! so the many waiters that wait for particular keys do not follow it: a
//! watch session is handed only the batches that change a key its watchers
//! watch (`crate::watch_routes`), and so are a semaphore waiter and an
//! election's observer, for the keys under their name ([`AppliedState::follow`]);
//! a lock waiter waits for the deletion of the key ahead of it
//! ([`DeletionWait`]), woken only when apply deletes that key.
//!
//! Lock order: `mvcc` before `leases` before `members` before `auth` before `alarms`. All are std `RwLock`s, not tokio's:
//! they are never held across an `.await`, and a read holds one only while it
//! copies its answer out, so apply is never kept waiting for a client. The
//! deletion waits' own lock, and the watch routes' (its table, then an
//! inbox), are taken with none of those held (apply publishes after it let
//! them go).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::Notify;

use serde::{Deserialize, Serialize};

use crate::alarm::Alarms;
use crate::auth::{AuthStore, Tokens};
use crate::lease::LeaseTable;
use crate::mvcc::{Change, KeyRange, MvccStore, Revision};
use crate::watch_routes::{Inbox, WatchRoutes};

/// What a lease counts as in the state's size (etcd's lease overhead).
pub const LEASE_BYTES: u64 = 64;

/// Apply calls the change feed buffers for its slow followers.
pub const CHANGE_FEED_CAPACITY: usize = 1024;

/// What one apply call changed, in revision order; `revision` is the store's
/// revision after it.
#[derive(Debug)]
pub struct AppliedChanges {
    pub revision: Revision,
    pub changes: Vec<Change>,
    /// The store was replaced (a snapshot was installed) and `changes` may not
    /// hold everything that changed: followers of the feed must look at the
    /// store again, as after a lag.
    pub resync: bool,
}

/// A follower of the applied changes. A batch that says the store was
/// replaced (`resync`) is reported as a lag, so that every follower looks at
/// the store again the one way it already does after missing batches.
pub struct Feed(tokio::sync::broadcast::Receiver<std::sync::Arc<AppliedChanges>>);

impl Feed {
    pub async fn recv(&mut self) -> Result<std::sync::Arc<AppliedChanges>, tokio::sync::broadcast::error::RecvError> {
        match self.0.recv().await? {
            batch if batch.resync => Err(tokio::sync::broadcast::error::RecvError::Lagged(0)),
            batch => Ok(batch),
        }
    }
}

/// What a member publishes about itself through the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub name: String,
    pub client_urls: Vec<String>,
}

pub struct AppliedState {
    mvcc: RwLock<MvccStore>,
    leases: RwLock<LeaseTable>,
    members: RwLock<BTreeMap<u64, MemberAttrs>>,
    auth: RwLock<AuthStore>,
    alarms: RwLock<Alarms>,
    tokens: Tokens,
    feed: tokio::sync::broadcast::Sender<std::sync::Arc<AppliedChanges>>,
    /// Woken when a compaction left versions to sweep (see `mvcc::history`).
    sweep: tokio::sync::Notify,
    deletion_waits: Arc<DeletionWaits>,
    watch_routes: Arc<WatchRoutes>,
}

impl Default for AppliedState {
    fn default() -> Self {
        AppliedState::with_tokens(Tokens::default())
    }
}

impl AppliedState {
    /// An empty state whose member accepts `tokens`.
    pub fn with_tokens(tokens: Tokens) -> AppliedState {
        AppliedState {
            mvcc: RwLock::default(),
            leases: RwLock::default(),
            members: RwLock::default(),
            auth: RwLock::default(),
            alarms: RwLock::default(),
            tokens,
            feed: tokio::sync::broadcast::channel(CHANGE_FEED_CAPACITY).0,
            sweep: tokio::sync::Notify::new(),
            deletion_waits: Arc::default(),
            watch_routes: Arc::default(),
        }
    }

    pub fn auth(&self) -> RwLockReadGuard<'_, AuthStore> {
        self.auth.read().expect("auth lock poisoned")
    }

    pub fn auth_mut(&self) -> RwLockWriteGuard<'_, AuthStore> {
        self.auth.write().expect("auth lock poisoned")
    }

    pub fn alarms(&self) -> RwLockReadGuard<'_, Alarms> {
        self.alarms.read().expect("alarms lock poisoned")
    }

    pub fn alarms_mut(&self) -> RwLockWriteGuard<'_, Alarms> {
        self.alarms.write().expect("alarms lock poisoned")
    }

    /// What the space quota counts: the MVCC history's weight
    /// (`MvccStore::size_bytes`) and [`LEASE_BYTES`] per lease.
    pub fn size_bytes(&self) -> u64 {
        let history = self.mvcc().size_bytes();
        history + self.leases().len() as u64 * LEASE_BYTES
    }

    /// A compaction was applied: wake the sweeper.
    pub fn compacted(&self) {
        self.sweep.notify_one();
    }

    /// Wait until a compaction may have left versions to sweep.
    pub async fn sweep_requested(&self) {
        self.sweep.notified().await
    }

    pub fn tokens(&self) -> &Tokens {
        &self.tokens
    }

    pub fn mvcc(&self) -> RwLockReadGuard<'_, MvccStore> {
        self.mvcc.read().expect("mvcc lock poisoned")
    }

    pub fn mvcc_mut(&self) -> RwLockWriteGuard<'_, MvccStore> {
        self.mvcc.write().expect("mvcc lock poisoned")
    }

    pub fn leases(&self) -> RwLockReadGuard<'_, LeaseTable> {
        self.leases.read().expect("lease lock poisoned")
    }

    pub fn leases_mut(&self) -> RwLockWriteGuard<'_, LeaseTable> {
        self.leases.write().expect("lease lock poisoned")
    }

    /// Follow applied changes from now on (see the module doc).
    pub fn subscribe(&self) -> Feed {
        Feed(self.feed.subscribe())
    }

    /// Publish what an apply call changed, once the stores hold it: wake the
    /// waits for the deletion of a key it deleted (every wait, if it says the
    /// store was replaced: `resync`), queue it for the watch sessions that
    /// watch a key it changed, and hand it to the feed. Never blocks on a
    /// reader.
    pub fn publish(&self, changes: AppliedChanges) {
        self.deletion_waits.wake(&changes);
        let changes = Arc::new(changes);
        self.watch_routes.route(&changes);
        let _ = self.feed.send(changes);
    }

    /// Open a watch session's inbox (see `crate::watch_routes`).
    pub fn open_watch_inbox(&self) -> Inbox {
        self.watch_routes.open()
    }

    /// An inbox handed the batches that change a key in `range`, from now
    /// on: what a waiter for particular keys follows (a semaphore waiter,
    /// an election's observer). Open it before looking at the keys in the
    /// store: a change applied after the look is then sure to be queued,
    /// and one applied before it shows in the look.
    pub fn follow(&self, range: &KeyRange) -> Inbox {
        let mut inbox = self.watch_routes.open();
        inbox.watch(range);
        inbox
    }

    /// Wait for the deletion of any of `keys` by an apply call after this
    /// one returns. Register before looking at the keys in the store: a
    /// deletion applied after the look is then sure to wake the wait, and
    /// one applied before it shows in the look.
    pub fn wait_for_deletion(&self, keys: Vec<Vec<u8>>) -> DeletionWait {
        self.deletion_waits.register(keys)
    }

    pub fn members(&self) -> RwLockReadGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.read().expect("members lock poisoned")
    }

    pub fn members_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.write().expect("members lock poisoned")
    }
}

/// The waits registered for deletions, by key. Apply looks up each key it
/// deleted, so it wakes the waits on that key and no other; a key nobody
/// waits for costs one hash lookup when it is deleted.
#[derive(Default)]
struct DeletionWaits {
    next_id: AtomicU64,
    by_key: Mutex<HashMap<Vec<u8>, HashMap<u64, Arc<Notify>>>>,
}

impl DeletionWaits {
    fn register(self: &Arc<Self>, keys: Vec<Vec<u8>>) -> DeletionWait {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let mut by_key = self.by_key.lock().expect("deletion waits lock poisoned");
        for key in &keys {
            by_key.entry(key.clone()).or_default().insert(id, notify.clone());
        }
        drop(by_key);
        DeletionWait { waits: self.clone(), id, keys, notify }
    }

    fn wake(&self, changes: &AppliedChanges) {
        if !changes.resync && changes.changes.iter().all(|c| c.kv.is_some()) {
            return;
        }
        let by_key = self.by_key.lock().expect("deletion waits lock poisoned");
        if by_key.is_empty() {
            return;
        }
        let wake = |waits: &HashMap<u64, Arc<Notify>>| waits.values().for_each(|n| n.notify_one());
        if changes.resync {
            by_key.values().for_each(wake);
            return;
        }
        for change in changes.changes.iter().filter(|c| c.kv.is_none()) {
            if let Some(waits) = by_key.get(&change.key) {
                wake(waits);
            }
        }
    }
}

/// A wait for the deletion of some keys ([`AppliedState::wait_for_deletion`]);
/// dropping it ends the wait.
pub struct DeletionWait {
    waits: Arc<DeletionWaits>,
    id: u64,
    keys: Vec<Vec<u8>>,
    notify: Arc<Notify>,
}

impl DeletionWait {
    /// Resolves once apply deleted one of the keys, or said it replaced the
    /// store (`resync`), after the registration or after the last time this
    /// resolved. It may resolve once more than that (a wake that came while
    /// nobody awaited is kept for the next call): look at the store again
    /// after it.
    pub async fn deleted(&self) {
        self.notify.notified().await
    }
}

impl Drop for DeletionWait {
    fn drop(&mut self) {
        let mut by_key = self.waits.by_key.lock().expect("deletion waits lock poisoned");
        for key in &self.keys {
            if let Some(waits) = by_key.get_mut(key) {
                waits.remove(&self.id);
                if waits.is_empty() {
                    by_key.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Change, KeyValue};
    use std::time::Duration;

    fn change(key: &str, deleted: bool) -> Change {
        let kv = KeyValue { key: key.into(), create_revision: 1, mod_revision: 2, version: 1, ..Default::default() };
        Change {
            revision: 2,
            sub: 0,
            key: key.into(),
            kv: (!deleted).then(|| Arc::new(kv.clone())),
            prev: Some(Arc::new(kv)),
        }
    }

    fn applied(changes: Vec<Change>, resync: bool) -> AppliedChanges {
        AppliedChanges { revision: 2, changes, resync }
    }

    async fn woken(wait: &DeletionWait) -> bool {
        tokio::time::timeout(Duration::from_millis(20), wait.deleted()).await.is_ok()
    }

    /// A wait is woken by the deletion of one of its keys, by a replaced
    /// store, and by nothing else; a wake that came before the wait was
    /// awaited is kept; a dropped wait leaves nothing registered.
    #[tokio::test]
    async fn a_deletion_wait_is_woken_by_its_keys_deletion_only() {
        let state = AppliedState::default();
        let wait = state.wait_for_deletion(vec![b"lock/a".to_vec(), b"lock/b".to_vec()]);
        let other = state.wait_for_deletion(vec![b"lock/c".to_vec()]);
        // Other keys deleted, or its own keys written: no wake.
        state.publish(applied(vec![change("lock/c", true), change("lock/a", false), change("x", true)], false));
        assert!(!woken(&wait).await, "woken by a change that deleted none of its keys");
        assert!(woken(&other).await);
        // One of its keys deleted before anyone awaits: the wake is kept.
        state.publish(applied(vec![change("x", false), change("lock/b", true)], false));
        assert!(woken(&wait).await);
        assert!(!woken(&wait).await, "one deletion wakes once");
        // A replaced store wakes every wait.
        state.publish(applied(Vec::new(), true));
        assert!(woken(&wait).await && woken(&other).await);
        drop((wait, other));
        assert!(state.deletion_waits.by_key.lock().unwrap().is_empty());
    }
}
