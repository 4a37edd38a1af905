//! The applied state a node serves from: the MVCC store, the lease table,
//! the members' published attributes and the auth store; how apply tells
//! its readers what it changed (the revision waits, the watch routes, the
//! deletion waits); and the auth tokens this member accepts (handed out by
//! apply, but not part of the replicated state: see `auth::tokens`). Written
//! only by the Raft state machine, in log order; read by every API handler.
//!
//! Apply wakes only the readers an apply call concerns, never all of them:
//! a read that waits for this member to reach a revision (written through
//! another member) is woken once, by the call that reaches it
//! ([`AppliedState::revision_reached`]); a watch session is handed only the
//! batches that change a key its watchers watch (`crate::model::watch_routes`), and
//! so are a semaphore waiter and an election's observer, for the keys under
//! their name ([`AppliedState::follow`]); a lock waiter waits for the
//! deletion of the key ahead of it ([`DeletionWait`]), woken only when apply
//! deletes that key. Apply never waits for any of them.
//!
//! Lock order: `mvcc` before `leases` before `members` before `auth` before `alarms`. All are std `RwLock`s, not tokio's:
//! they are never held across an `.await`, and a read holds one only while it
//! copies its answer out, so apply is never kept waiting for a client. The
//! deletion waits' own lock, and the watch routes' (its table, then an
//! inbox), are taken with none of those held (apply publishes after it let
//! them go). The revision waits' lock is taken before `mvcc` (a waiter reads
//! the revision under it), and apply takes it with none held.
//!
//! Invariant: once the node serves, the store's revision moves only in an
//! apply call (or a snapshot's install) that then publishes
//! ([`AppliedState::publish`]) the revision it reached. (Loading a
//! checkpoint or restoring a backup moves it before the node serves, when
//! nobody can be waiting.)

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::{oneshot, Notify};

use serde::{Deserialize, Serialize};

use crate::model::alarm::Alarms;
use crate::model::auth::{AuthStore, Tokens};
use crate::model::lease::LeaseTable;
use crate::model::mvcc::{KeyRange, MvccStore, Revision};
use crate::model::watch_routes::{AppliedChanges, Inbox, WatchRoutes};

/// What a lease counts as in the state's size (etcd's lease overhead).
pub const LEASE_BYTES: u64 = 64;

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
    revision_waits: Arc<RevisionWaits>,
    /// Woken when a compaction left versions to sweep (see `mvcc::history`).
    sweep: tokio::sync::Notify,
    deletion_waits: Arc<DeletionWaits>,
    watch_routes: Arc<WatchRoutes>,
    /// Lock-delay markers' changes, for this member's keeper.
    markers: crate::model::lock_delay::MarkerFeed,
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
            revision_waits: Arc::default(),
            sweep: tokio::sync::Notify::new(),
            deletion_waits: Arc::default(),
            watch_routes: Arc::default(),
            markers: Default::default(),
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

    /// Resolves once this member's store has reached `revision`: at once if
    /// it has, else when the apply call that reaches it publishes. The wait
    /// is registered when this is called, not when it is first polled;
    /// dropping the future takes it out.
    pub fn revision_reached(&self, revision: Revision) -> impl std::future::Future<Output = ()> + Send + 'static {
        let wait = self.revision_waits.register(revision, || self.mvcc().revision());
        async move {
            if let Some((reached, _registered)) = wait {
                // An error only if the state was dropped: nothing to wait for.
                let _ = reached.await;
            }
        }
    }

    /// Publish what an apply call changed, once the stores hold it (and
    /// the revision it reached, `changes.revision`): wake the reads waiting
    /// for a revision up to it, the waits for the deletion of a key it
    /// deleted (every wait, if it says the store was replaced: `resync`),
    /// and queue it for the watch sessions that watch a key it changed.
    /// Never blocks on a reader.
    pub fn publish(&self, changes: AppliedChanges) {
        self.revision_waits.reached(changes.revision);
        self.deletion_waits.wake(&changes);
        let markers = changes.changes.iter().filter(|c| crate::model::lock_delay::is_marker(&c.key)).map(|c| {
            let put = c.kv.as_ref().map(|kv| {
                let ms = crate::model::lock_delay::parse_ms(&kv.value).unwrap_or(0);
                (kv.mod_revision, ms)
            });
            (c.key.clone(), put)
        });
        self.markers.push(markers, changes.resync);
        self.watch_routes.route(&Arc::new(changes));
    }

    /// The lock-delay markers apply put and deleted (`locks::delay`).
    pub fn markers(&self) -> &crate::model::lock_delay::MarkerFeed {
        &self.markers
    }

    /// Open a watch session's inbox (see `crate::model::watch_routes`).
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
        // The ranges followed are prefixes or single keys, which are
        // always routed; another range over the cap is simply not woken
        // for, and its waiter still looks at the store when it is.
        let _routed = inbox.watch(range);
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

/// The reads waiting for the store to reach a revision, by that revision:
/// an apply call wakes the waits up to the revision it reached, each once,
/// and no other. A wait dropped first takes itself out ([`RevisionWait`]),
/// as a deletion wait does.
#[derive(Default)]
struct RevisionWaits {
    next_id: AtomicU64,
    by_revision: Mutex<BTreeMap<Revision, HashMap<u64, oneshot::Sender<()>>>>,
}

impl RevisionWaits {
    /// A wait for `revision`, or `None` if `current()` (the store's
    /// revision, read under this lock) has reached it. Reading it under the
    /// lock is what keeps a wake from being missed: an apply call that
    /// moves the revision past `revision` takes this lock after, and finds
    /// the wait.
    fn register(
        self: &Arc<Self>,
        revision: Revision,
        current: impl FnOnce() -> Revision,
    ) -> Option<(oneshot::Receiver<()>, RevisionWait)> {
        let mut by_revision = self.by_revision.lock().expect("revision waits lock poisoned");
        if current() >= revision {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reached, wait) = oneshot::channel();
        by_revision.entry(revision).or_default().insert(id, reached);
        Some((wait, RevisionWait { waits: self.clone(), revision, id }))
    }

    /// The store reached `revision`: wake the waits up to it.
    fn reached(&self, revision: Revision) {
        let mut by_revision = self.by_revision.lock().expect("revision waits lock poisoned");
        if by_revision.first_key_value().is_none_or(|(&first, _)| first > revision) {
            return;
        }
        let later = by_revision.split_off(&(revision + 1));
        let reached = std::mem::replace(&mut *by_revision, later);
        drop(by_revision);
        reached.into_values().flat_map(HashMap::into_values).for_each(|w| {
            let _ = w.send(());
        });
    }
}

/// A registered wait for a revision; dropping it (woken or not) takes it
/// out of the waits.
struct RevisionWait {
    waits: Arc<RevisionWaits>,
    revision: Revision,
    id: u64,
}

impl Drop for RevisionWait {
    fn drop(&mut self) {
        let mut by_revision = self.waits.by_revision.lock().expect("revision waits lock poisoned");
        if let Some(waits) = by_revision.get_mut(&self.revision) {
            waits.remove(&self.id);
            if waits.is_empty() {
                by_revision.remove(&self.revision);
            }
        }
    }
}

/// The waits registered for deletions, by key. Apply looks up each key it
/// deleted, so it wakes the waits on that key and no other; a key nobody
/// waits for costs one hash lookup when it is deleted.
#[derive(Default)]
struct DeletionWaits {
    next_id: AtomicU64,
    by_key: Mutex<HashMap<Vec<u8>, WaitsOnKey>>,
}

/// The waits on one key's deletion, by wait ID.
type WaitsOnKey = HashMap<u64, Arc<Notify>>;

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
        let wake = |waits: &WaitsOnKey| waits.values().for_each(|n| n.notify_one());
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
    use crate::model::mvcc::{Change, KeyValue};
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
        AppliedChanges { resync, ..AppliedChanges::new(2, changes) }
    }

    async fn soon(wait: impl std::future::Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), wait).await.is_ok()
    }

    /// A read waiting for a revision is woken by the apply call that reaches
    /// it (or passes it), not by those before; one for a revision already
    /// reached resolves at once; a wait dropped, woken or not, leaves
    /// nothing registered.
    #[tokio::test]
    async fn a_revision_wait_is_woken_by_the_apply_that_reaches_its_revision() {
        let state = AppliedState::default();
        let published = |revision| AppliedChanges::new(revision, Vec::new());
        let registered = |state: &AppliedState| {
            let by_revision = state.revision_waits.by_revision.lock().unwrap();
            by_revision.iter().map(|(&r, waits)| (r, waits.len())).collect::<Vec<_>>()
        };
        assert!(soon(state.revision_reached(0)).await, "revision 0 is reached by an empty store");
        let (mut at_3, mut at_5) = (Box::pin(state.revision_reached(3)), Box::pin(state.revision_reached(5)));
        let abandoned = state.revision_reached(4);
        assert_eq!(registered(&state), vec![(3, 1), (4, 1), (5, 1)]);
        drop(abandoned);
        assert_eq!(registered(&state), vec![(3, 1), (5, 1)], "a dropped wait stayed registered");
        state.publish(published(2));
        assert!(!soon(&mut at_3).await, "woken before its revision");
        // Revision 4 reached (a batch of several revisions): 3 resolves, 5 waits.
        state.publish(published(4));
        assert!(soon(&mut at_3).await);
        assert!(!soon(&mut at_5).await, "woken before its revision");
        assert_eq!(registered(&state), vec![(5, 1)]);
        state.publish(published(7));
        assert!(soon(&mut at_5).await);
        // On a member that applies nothing, abandoned waits leave nothing
        // behind; those listened to stay, and are woken.
        let listened = state.revision_reached(100);
        for _ in 0..1024 {
            drop(state.revision_reached(50));
        }
        assert_eq!(registered(&state), vec![(100, 1)], "abandoned waits stayed registered");
        state.publish(published(100));
        assert!(soon(listened).await);
        assert!(registered(&state).is_empty());
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
