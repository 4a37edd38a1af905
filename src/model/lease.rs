//! The replicated lease table: which leases exist, their granted TTL, and the
//! keys attached to each.
//!
//! This is deterministic state, changed only by applied commands: a grant, a
//! revoke, and the puts and deletes that attach keys to and detach them from
//! leases. *Time* is not here: when a lease expires is decided by the leader
//! alone (`crate::node::lease::keeper`), which proposes a revoke through Raft
//! like any client would. So every replica agrees on which leases exist, and
//! none of them ever reads a clock in apply.
//!
//! Invariants: a key is attached to at most one lease; `attached[key] == id`
//! exactly when `leases[id].keys` contains `key`. Every live lease is in
//! `by_grant` under the order of its grant, and nothing else is: a reader
//! that remembers a [`GrantMark`] learns of the grants made since without
//! walking the table (the lease keeper does, every tick).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::model::mvcc::{Change, LeaseView};

/// etcd's limit on a granted TTL, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: i64,
    /// The TTL granted, in seconds (after raising it to the floor).
    pub ttl: i64,
    pub keys: BTreeSet<Vec<u8>>,
    /// Where its grant falls among the grants made into this table
    /// (this member's memory only: a restored table numbers them anew, so
    /// the same lease in two tables may compare unequal).
    #[serde(skip)]
    pub grant_order: u64,
}

/// A lease as TimeToLive reports it: what only the leader, which keeps
/// lease time, can say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Whole seconds left.
    pub remaining: i64,
    /// The TTL granted, in seconds.
    pub granted: i64,
    /// The keys attached to it.
    pub keys: Vec<Vec<u8>>,
}

/// A lease's time left and the TTL it was granted, whole seconds: a
/// [`LeaseStatus`] without its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTimes {
    pub remaining: i64,
    pub granted: i64,
}

/// A point in one table's sequence of grants: what a reader of
/// [`LeaseTable::grants_since`] has seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantMark {
    table: u64,
    grants: u64,
}

/// Tells tables apart: a table rebuilt by [`LeaseTable::restore`] (or made
/// anew) starts its own sequence of grants.
static TABLES_MADE: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub struct LeaseTable {
    leases: BTreeMap<i64, Lease>,
    attached: HashMap<Vec<u8>, i64>,
    /// This table's identity, from [`TABLES_MADE`].
    table: u64,
    /// Grants made into this table: the `grant_order` of the latest.
    grants: u64,
    /// Live leases by `grant_order`.
    by_grant: BTreeMap<u64, i64>,
}

impl Default for LeaseTable {
    fn default() -> Self {
        LeaseTable {
            leases: BTreeMap::new(),
            attached: HashMap::new(),
            table: TABLES_MADE.fetch_add(1, Ordering::Relaxed),
            grants: 0,
            by_grant: BTreeMap::new(),
        }
    }
}

impl LeaseView for LeaseTable {
    fn lease_exists(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }
}

impl LeaseTable {
    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// How many leases are granted.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.leases.keys().copied()
    }

    /// The leases in ID order, from the first after `after` (from the first
    /// of all when `None`).
    pub fn after(&self, after: Option<i64>) -> impl Iterator<Item = &Lease> + '_ {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = after.map_or(Unbounded, Excluded);
        self.leases.range((from, Unbounded)).map(|(_, lease)| lease)
    }

    /// Grant a lease. False if the ID is taken (nothing changes).
    pub fn grant(&mut self, id: i64, ttl: i64) -> bool {
        if self.leases.contains_key(&id) {
            return false;
        }
        self.grants += 1;
        self.by_grant.insert(self.grants, id);
        self.leases.insert(id, Lease { id, ttl, keys: BTreeSet::new(), grant_order: self.grants });
        true
    }

    /// Remove a lease; returns its keys (to delete), or `None` if unknown.
    pub fn revoke(&mut self, id: i64) -> Option<BTreeSet<Vec<u8>>> {
        let lease = self.leases.remove(&id)?;
        self.by_grant.remove(&lease.grant_order);
        for k in &lease.keys {
            self.attached.remove(k);
        }
        Some(lease.keys)
    }

    /// Follow the MVCC changes of a write: a put attaches its key to the put's
    /// lease (and detaches it from any other); a delete detaches it.
    pub fn track(&mut self, changes: &[Change]) {
        for c in changes {
            if let Some(old) = self.attached.remove(&c.key) {
                if let Some(l) = self.leases.get_mut(&old) {
                    l.keys.remove(&c.key);
                }
            }
            if let Some(kv) = &c.kv {
                if kv.lease != 0 {
                    if let Some(l) = self.leases.get_mut(&kv.lease) {
                        l.keys.insert(c.key.clone());
                        self.attached.insert(c.key.clone(), kv.lease);
                    }
                }
            }
        }
    }

    /// Rebuild from persisted leases (id, ttl) and the live keys that name a
    /// lease (key, lease id).
    pub fn restore(
        leases: impl IntoIterator<Item = (i64, i64)>,
        keys: impl IntoIterator<Item = (Vec<u8>, i64)>,
    ) -> Self {
        let mut table = LeaseTable::default();
        for (id, ttl) in leases {
            table.grant(id, ttl);
        }
        for (key, id) in keys {
            if let Some(l) = table.leases.get_mut(&id) {
                l.keys.insert(key.clone());
                table.attached.insert(key, id);
            }
        }
        table
    }

    /// Where this table's grants stand now.
    pub fn grant_mark(&self) -> GrantMark {
        GrantMark { table: self.table, grants: self.grants }
    }

    /// The leases granted after `mark` and still live, (id, ttl) in the
    /// order of their grants; `None` if `mark` is from another table (one
    /// this table replaced), whose grants cannot be told from these.
    pub fn grants_since(&self, mark: GrantMark) -> Option<impl Iterator<Item = (i64, i64)> + '_> {
        if mark.table != self.table {
            return None;
        }
        Some(self.by_grant.range(mark.grants + 1..).map(|(_, id)| (*id, self.leases[id].ttl)))
    }

    /// (id, ttl) of every lease: what a checkpoint stores.
    pub fn grants(&self) -> Vec<(i64, i64)> {
        self.leases.values().map(|l| (l.id, l.ttl)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::KeyValue;

    fn put(key: &str, lease: i64) -> Change {
        Change {
            revision: 2,
            sub: 0,
            key: key.into(),
            kv: Some(std::sync::Arc::new(KeyValue { key: key.into(), lease, ..Default::default() })),
            prev: None,
        }
    }

    #[test]
    fn attach_move_detach_and_revoke() {
        let mut t = LeaseTable::default();
        assert!(t.grant(1, 10));
        assert!(t.grant(2, 10));
        assert!(!t.grant(1, 5), "an ID is granted once");
        t.track(&[put("a", 1), put("b", 1)]);
        t.track(&[put("b", 2)]);
        assert_eq!(t.get(1).unwrap().keys, BTreeSet::from([b"a".to_vec()]));
        assert_eq!(t.get(2).unwrap().keys, BTreeSet::from([b"b".to_vec()]));
        t.track(&[Change { revision: 3, sub: 0, key: "a".into(), kv: None, prev: None }]);
        assert!(t.get(1).unwrap().keys.is_empty());
        t.track(&[put("c", 0)]);
        assert_eq!(t.revoke(2), Some(BTreeSet::from([b"b".to_vec()])));
        assert_eq!(t.revoke(2), None);
        assert!(t.lease_exists(1) && !t.lease_exists(2));
    }

    #[test]
    fn grants_since_a_mark_are_the_live_leases_granted_after_it() {
        let mut t = LeaseTable::default();
        assert!(t.grant(1, 10));
        let mark = t.grant_mark();
        assert_eq!(t.grants_since(mark).unwrap().count(), 0);
        assert!(t.grant(2, 20));
        assert!(t.grant(3, 30));
        assert!(!t.grant(2, 5), "a refused grant is no grant");
        t.revoke(3);
        // Revoked, then granted again under the same ID: a new grant.
        assert!(t.grant(3, 40));
        t.revoke(1);
        assert_eq!(t.grants_since(mark).unwrap().collect::<Vec<_>>(), vec![(2, 20), (3, 40)]);
        assert_eq!(t.grants_since(t.grant_mark()).unwrap().count(), 0);
        let restored = LeaseTable::restore(t.grants(), Vec::new());
        assert!(restored.grants_since(mark).is_none(), "a mark of another table");
        assert_eq!(restored.grants_since(restored.grant_mark()).unwrap().count(), 0);
    }
}
