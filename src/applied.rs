//! The applied state a node serves from: the MVCC store, the lease table,
//! the members' published attributes and the auth store, plus the feed of
//! applied changes that watchers follow, and the auth tokens this member
//! accepts (handed out by apply, but not part of the replicated state: see
//! `auth::tokens`). Written only by the Raft state machine, in log order; read
//! by every API handler.
//!
//! The change feed is a bounded broadcast: apply never waits for a watcher. A
//! watcher that falls more than [`CHANGE_FEED_CAPACITY`] apply calls behind
//! misses messages, notices (the receiver reports the lag), and catches up
//! from MVCC history instead.
//!
//! Lock order: `mvcc` before `leases` before `members` before `auth` before `alarms`. All are std `RwLock`s, not tokio's:
//! they are never held across an `.await`, and a read holds one only while it
//! copies its answer out, so apply is never kept waiting for a client.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use crate::alarm::Alarms;
use crate::auth::{AuthStore, Tokens};
use crate::lease::LeaseTable;
use crate::mvcc::{Change, MvccStore, Revision};

/// What a lease counts as in the state's size (etcd's lease overhead).
pub const LEASE_BYTES: u64 = 64;

/// Apply calls the change feed buffers for slow watchers.
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

    /// Publish what an apply call changed. Never blocks.
    pub fn publish(&self, changes: AppliedChanges) {
        let _ = self.feed.send(std::sync::Arc::new(changes));
    }

    pub fn members(&self) -> RwLockReadGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.read().expect("members lock poisoned")
    }

    pub fn members_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.write().expect("members lock poisoned")
    }
}
