//! Lease time: the leader's clock decides when a lease expires.
//!
//! Only the leader keeps deadlines. When a member becomes leader it gives every
//! lease its full TTL again from that moment (as etcd does), so a lease never
//! expires because of a leadership change; keepalives move a deadline to now +
//! TTL. Once a deadline passes the keeper proposes a revoke through Raft — the
//! same command a client's LeaseRevoke proposes — so expiry reaches every
//! replica in log order and apply never reads a clock.
//!
//! Caveats: deadlines live in the leader's memory only, so after a leader
//! change a lease lives up to one extra TTL (never less than its TTL). Expiry
//! is checked every tick ([`TICK`]); a lease is revoked within a tick plus one
//! commit after its deadline.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Node;
use crate::command::Command;
use crate::lease::LeaseTable;

/// How often the leader looks for expired leases.
pub const TICK: Duration = Duration::from_millis(100);

#[derive(Default)]
pub struct LeaseKeeper {
    /// std Mutex: held only to read or update deadlines, never across I/O.
    inner: Mutex<Deadlines>,
}

#[derive(Default)]
struct Deadlines {
    /// Whether the deadlines below belong to a term in which we lead.
    leading: bool,
    at: HashMap<i64, Instant>,
    /// Leases whose revoke has been proposed and not yet answered.
    revoking: HashSet<i64>,
}

impl Deadlines {
    /// Bring the deadlines in line with the table: new leases get a full TTL.
    fn sync(&mut self, table: &LeaseTable, now: Instant) {
        self.at.retain(|id, _| table.get(*id).is_some());
        self.revoking.retain(|id| table.get(*id).is_some());
        for (id, ttl) in table.grants() {
            self.at.entry(id).or_insert_with(|| now + secs(ttl));
        }
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

impl LeaseKeeper {
    /// A keepalive on the leader: the lease's TTL, or `None` if it is unknown
    /// or already expired (etcd answers TTL 0 then).
    pub fn renew(&self, table: &LeaseTable, id: i64) -> Option<i64> {
        let lease = table.get(id)?;
        let now = Instant::now();
        let mut d = self.inner.lock().expect("lease keeper lock poisoned");
        match d.at.get(&id) {
            Some(deadline) if *deadline <= now => None,
            _ => {
                d.at.insert(id, now + secs(lease.ttl));
                Some(lease.ttl)
            }
        }
    }

    /// Whole seconds left before a lease expires (on the leader).
    pub fn remaining(&self, table: &LeaseTable, id: i64) -> Option<i64> {
        let lease = table.get(id)?;
        let d = self.inner.lock().expect("lease keeper lock poisoned");
        Some(match d.at.get(&id) {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()).as_secs() as i64,
            None => lease.ttl,
        })
    }

    /// One tick (see the module doc). Returns the leases to revoke now.
    fn tick(&self, leading: bool, table: &LeaseTable) -> Vec<i64> {
        let now = Instant::now();
        let mut d = self.inner.lock().expect("lease keeper lock poisoned");
        if !leading {
            *d = Deadlines::default();
            return Vec::new();
        }
        if !d.leading {
            // Just became leader: every lease starts a full TTL from now.
            d.at.clear();
            d.revoking.clear();
            d.leading = true;
        }
        d.sync(table, now);
        let expired: Vec<i64> =
            d.at.iter().filter(|(id, t)| **t <= now && !d.revoking.contains(id)).map(|(id, _)| *id).collect();
        d.revoking.extend(&expired);
        expired
    }

    fn revoke_answered(&self, id: i64) {
        self.inner.lock().expect("lease keeper lock poisoned").revoking.remove(&id);
    }
}

/// The keeper's loop; ends when the node shuts down or is dropped.
pub async fn run(node: Weak<Node>) {
    let Some(mut shutdown) = node.upgrade().map(|n| n.shutdown_signal()) else { return };
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(n) = node.upgrade() else { return };
        let expired = { n.lease_keeper.tick(n.is_leader(), &n.state().leases()) };
        for id in expired {
            let n = n.clone();
            tokio::spawn(async move {
                if let Err(e) = n.write(Command::LeaseRevoke { id }).await {
                    tracing::debug!(lease = id, error = %e, "revoking an expired lease failed; will retry");
                }
                n.lease_keeper.revoke_answered(id);
            });
        }
    }
}
