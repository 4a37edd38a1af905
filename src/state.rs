//! The applied state a node serves from: the MVCC store and the members'
//! published attributes. Written only by the Raft state machine, in log order;
//! read by every API handler.
//!
//! Lock order: `mvcc` before `members`. Both are std `RwLock`s, not tokio's:
//! they are never held across an `.await`, and a read holds one only while it
//! copies its answer out, so apply is never kept waiting for a client.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use crate::mvcc::MvccStore;

/// What a member publishes about itself through the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub name: String,
    pub client_urls: Vec<String>,
}

#[derive(Default)]
pub struct AppliedState {
    mvcc: RwLock<MvccStore>,
    members: RwLock<BTreeMap<u64, MemberAttrs>>,
}

impl AppliedState {
    pub fn mvcc(&self) -> RwLockReadGuard<'_, MvccStore> {
        self.mvcc.read().expect("mvcc lock poisoned")
    }

    pub fn mvcc_mut(&self) -> RwLockWriteGuard<'_, MvccStore> {
        self.mvcc.write().expect("mvcc lock poisoned")
    }

    pub fn members(&self) -> RwLockReadGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.read().expect("members lock poisoned")
    }

    pub fn members_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, MemberAttrs>> {
        self.members.write().expect("members lock poisoned")
    }
}
