//! Lease time: the leader's clock decides when a lease expires.
//!
//! Only the leader keeps deadlines, and only for the term it leads in. When a
//! member begins to lead a term it gives every lease its full TTL again from
//! that moment (as etcd does), so a lease never expires because of a
//! leadership change; keepalives move a deadline to now + TTL. Once a
//! deadline passes the keeper asks the node to expire the lease
//! ([`Node::expire_leases`]), which confirms with a quorum that this member
//! still leads the same term and proposes `Command::LeaseExpire` carrying
//! that term, so expiry reaches every replica in log order and apply never
//! reads a clock.
//!
//! Safety (a lease whose holder keeps it alive is never revoked): the
//! keepalives of a term go to that term's leader, so only its deadlines know
//! of them. A leader that was paused or cut off may wake believing it still
//! leads, with deadlines that missed every keepalive its successor took. So
//! its expiry is proposed only after a quorum confirmed, after the deadline
//! passed, that it still leads — then no later term had begun, and every
//! keepalive of this term went through its own deadlines — and only on this
//! member: never forwarded, never retried under another leader. The command
//! carries the term its deadlines belong to, and apply ignores it in an
//! entry of another term, which covers a re-election between the
//! confirmation and the proposal. (An expiry appended in its term and
//! committed by the next leader is sound: it was decided before that
//! leader's term began, and that leader applies it before it renews
//! anything.)
//!
//! Fairness: time the keeper could not see — its tick delayed by much more
//! than a tick ([`STALL`]), as when the process was stopped — is added to
//! every deadline, since keepalives may have been waiting for it all along
//! (a pause shorter than an election leaves it leading). Shorter delays are
//! ordinary scheduling and count as time passed.
//!
//! Rate (as etcd's `leaseRevokeRate`, 1,000, but 20 times higher by
//! default, and set by `--lease-expiry-rate`): about
//! [`EXPIRIES_PER_SECOND`] leases are proposed for expiry a second — a
//! tick's share of them a tick,
//! soonest deadline first (a tick up to 5 ms late keeps the schedule, so two
//! may come 95 ms apart; an expiry that failed is proposed again within a
//! later tick's share).
//! When many leases lapse at once — a new term gives every lease the same
//! deadline, and a fleet of clients that died together leaves theirs to
//! lapse together — their revocations are spread out instead of arriving
//! as one burst that every client's write queues behind (20,000 at once
//! held writes up to about 100 ms; docs/performance-notes.md) and that
//! every watcher of those keys must take at once. The price is that a lease
//! may be revoked later than its deadline, by its place in the backlog.
//! Meanwhile a keepalive is answered with TTL 0 at once (the lease is lost:
//! its deadline passed), while its keys, and any lock they hold, stay until
//! the revocation is applied: its holder learns it lost the lease before
//! anyone else can take what it held. etcd's keepalive waits for the
//! revocation instead.
//!
//! Caveats: deadlines live in the leader's memory only, so after a leader
//! change a lease lives up to one extra TTL (never less than its TTL). Expiry
//! is checked every tick ([`TICK`]); a lease is revoked within a tick, a
//! quorum round and one commit after its deadline, unless more leases than
//! a tick's share lapsed before it (see Rate). A tick visits the grants
//! made since the one before and the deadlines that have passed, so its
//! cost does not grow with the number of leases; the first tick of a term
//! walks them all once. A lease revoked and granted again under the same ID
//! is a new lease with a full TTL. The expiry command names only the ID and
//! the term (as etcd's names the ID), so an expiry decided for the old lease
//! and applied after the new grant would revoke the new one; the proposer
//! orders the two (`raft::write::lease_order`): the keeper takes a mark before it
//! reads the table, and an expiry whose ID was granted since, or has a
//! grant in flight, is not proposed (the next tick decides again).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::base::limits::EXPIRIES_PER_SECOND;
use crate::base::shutdown::Stopping;
use crate::model::lease::{GrantMark, LeaseTable, LeaseTimes};
use crate::node::Node;

/// How often the leader looks for expired leases.
pub const TICK: Duration = Duration::from_millis(100);
/// A tick this much later than due means the keeper was held up (stopped,
/// starved): the time it missed moves every deadline.
pub const STALL: Duration = Duration::from_millis(500);
/// The most leases proposed for expiry in one tick by default (a tick's
/// share of [`EXPIRIES_PER_SECOND`]).
#[cfg(test)]
const EXPIRIES_PER_TICK: usize = EXPIRIES_PER_SECOND * TICK.as_millis() as usize / 1000;

pub struct LeaseKeeper {
    /// std Mutex: held only to read or update deadlines, never across I/O.
    inner: Mutex<Deadlines>,
    /// The most leases proposed for expiry in a tick.
    per_tick: usize,
}

impl Default for LeaseKeeper {
    fn default() -> LeaseKeeper {
        LeaseKeeper::with_rate(EXPIRIES_PER_SECOND)
    }
}

/// The leader's deadlines. A tick costs the leases granted since the last
/// one and the deadlines that have passed, not a walk over every lease:
/// with 200,000 leases the walk took 75 ms of every 100 ms tick, under the
/// lease table's read lock, which every applied write waits for.
#[derive(Default)]
struct Deadlines {
    /// The term whose leader this member was at the last tick, if it led.
    term: Option<u64>,
    /// When the last tick ran (to notice time the keeper did not see).
    last_tick: Option<Instant>,
    /// Each lease's deadline. May still hold leases revoked since (they
    /// are dropped when their deadline comes, or by `reconcile`); readers
    /// look a lease up in the table first.
    at: HashMap<i64, Instant>,
    /// The same deadlines, soonest first.
    due: BTreeSet<(Instant, i64)>,
    /// Leases whose expiry has been proposed and not yet answered.
    expiring: HashSet<i64>,
    /// The table's grants this keeper has given deadlines to; `None` while
    /// not leading, and in a term until its first tick (a keepalive may
    /// have begun the term before it).
    seen: Option<GrantMark>,
}

impl Deadlines {
    /// Forget the deadlines of any other term (or of not leading): a new
    /// term of ours gives every lease a full TTL from now (see `sync`).
    fn begin_term(&mut self, term: Option<u64>, now: Instant) {
        if self.term != term {
            *self = Deadlines { term, last_tick: Some(now), ..Deadlines::default() };
        }
    }

    fn set(&mut self, id: i64, deadline: Instant) {
        if let Some(old) = self.at.insert(id, deadline) {
            self.due.remove(&(old, id));
        }
        self.due.insert((deadline, id));
    }

    fn forget(&mut self, id: i64) {
        if let Some(old) = self.at.remove(&id) {
            self.due.remove(&(old, id));
        }
    }

    /// Give the leases granted since the last sync a full TTL from now —
    /// a lease revoked and granted again under its ID is a new lease, and
    /// gets one too. Only what is new is visited; a table this keeper has
    /// not followed (a new term's first sync, a restored table) is walked
    /// whole, keeping the deadlines of the leases it already knew.
    fn sync(&mut self, table: &LeaseTable, now: Instant) {
        if !self.catch_up(table, now) {
            if self.seen.is_some() {
                // The table was replaced (restored) within this term: an ID
                // known here may name a different lease there, so every
                // lease gets a full TTL, as in a new term.
                self.at.clear();
                self.due.clear();
            }
            self.reconcile(table);
            for (id, ttl) in table.grants() {
                if !self.at.contains_key(&id) {
                    self.set(id, now + secs(ttl));
                }
            }
            self.seen = Some(table.grant_mark());
        }
        // Deadlines of revoked leases go when they come due; a keeper whose
        // leases are granted and revoked faster than they expire drops
        // them here once they outnumber the live ones (amortized: a walk
        // per so many revocations).
        if self.at.len() > 2 * table.len() + 1024 {
            self.reconcile(table);
        }
    }

    /// The incremental part of `sync`; false if the table is not the one
    /// this keeper followed.
    fn catch_up(&mut self, table: &LeaseTable, now: Instant) -> bool {
        let Some(new) = self.seen.and_then(|mark| table.grants_since(mark)) else { return false };
        for (id, ttl) in new {
            self.set(id, now + secs(ttl));
        }
        self.seen = Some(table.grant_mark());
        true
    }

    /// Drop the deadlines of leases the table no longer has.
    fn reconcile(&mut self, table: &LeaseTable) {
        self.at.retain(|id, _| table.get(*id).is_some());
        self.due.retain(|(_, id)| table.get(*id).is_some());
        self.expiring.retain(|id| table.get(*id).is_some());
    }

    /// Move every deadline later by `by`.
    fn postpone(&mut self, by: Duration) {
        for deadline in self.at.values_mut() {
            *deadline += by;
        }
        self.due = self.at.iter().map(|(id, t)| (*t, *id)).collect();
    }

    /// Up to `limit` live leases whose deadline is `now` or before and
    /// whose expiry is not already proposed, soonest deadline first;
    /// deadlines of revoked leases met on the way are dropped. Leases whose
    /// expiry is in flight are passed over again each tick until it is
    /// answered (and their lease revoked); those beyond `limit` wait for a
    /// later tick.
    fn passed(&mut self, table: &LeaseTable, now: Instant, limit: usize) -> Vec<i64> {
        let mut expired = Vec::new();
        let mut gone = Vec::new();
        for &(deadline, id) in &self.due {
            if deadline > now || expired.len() == limit {
                break;
            }
            if table.get(id).is_none() {
                gone.push(id);
            } else if !self.expiring.contains(&id) {
                expired.push(id);
            }
        }
        for id in gone {
            self.forget(id);
        }
        expired
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

impl LeaseKeeper {
    /// A keeper that proposes about `per_second` expiries a second at most
    /// (`--lease-expiry-rate`), a tick's share at a time (at least one).
    pub fn with_rate(per_second: usize) -> LeaseKeeper {
        let per_tick = (per_second.saturating_mul(TICK.as_millis() as usize) / 1000).max(1);
        LeaseKeeper { inner: Mutex::default(), per_tick }
    }

    /// A keepalive on the leader of `term`: the lease's TTL, or `None` if it
    /// is unknown or already expired (etcd answers TTL 0 then).
    pub fn renew(&self, term: u64, table: &LeaseTable, id: i64) -> Option<i64> {
        let lease = table.get(id)?;
        let mut d = self.inner.lock().expect("lease keeper lock poisoned");
        let now = Instant::now();
        d.begin_term(Some(term), now);
        // A lease granted since the last tick (perhaps under the ID of a
        // revoked one, whose deadline may have passed) is not expired.
        d.catch_up(table, now);
        match d.at.get(&id) {
            Some(deadline) if *deadline <= now => None,
            _ => {
                d.set(id, now + secs(lease.ttl));
                crate::base::metrics::metrics().leases_renewed.inc();
                Some(lease.ttl)
            }
        }
    }

    /// On the leader: leases whose deadline has passed and which are not
    /// revoked yet (their expiry waits for its share of a tick, or is in
    /// flight). Not leading: 0. Counts every passed deadline (for a scrape,
    /// not for each tick).
    pub fn overdue(&self, table: &LeaseTable) -> usize {
        self.overdue_at(table, Instant::now())
    }

    fn overdue_at(&self, table: &LeaseTable, now: Instant) -> usize {
        let d = self.inner.lock().expect("lease keeper lock poisoned");
        if d.term.is_none() {
            return 0;
        }
        d.due.iter().take_while(|(deadline, _)| *deadline <= now).filter(|(_, id)| table.get(*id).is_some()).count()
    }

    /// Whole seconds left before a lease expires (on the leader).
    pub fn remaining(&self, table: &LeaseTable, id: i64) -> Option<i64> {
        self.times_left(table, &[id])[0].map(|t| t.remaining)
    }

    /// [`LeaseKeeper::remaining`] and the TTL granted of each of `ids`, in
    /// order (`None` for a lease the table does not hold), read at one
    /// instant under one lock.
    pub fn times_left(&self, table: &LeaseTable, ids: &[i64]) -> Vec<Option<LeaseTimes>> {
        let mut d = self.inner.lock().expect("lease keeper lock poisoned");
        let now = Instant::now();
        d.catch_up(table, now);
        let times = |id: &i64| {
            let lease = table.get(*id)?;
            let remaining = match d.at.get(id) {
                Some(deadline) => deadline.saturating_duration_since(now).as_secs() as i64,
                None => lease.ttl,
            };
            Some(LeaseTimes { remaining, granted: lease.ttl })
        };
        ids.iter().map(times).collect()
    }

    /// One tick at `now`, as leader of `leading` (or not leading). Returns the
    /// leases to expire now.
    fn tick(&self, leading: Option<u64>, table: &LeaseTable, now: Instant) -> Vec<i64> {
        let mut d = self.inner.lock().expect("lease keeper lock poisoned");
        let unseen =
            d.last_tick.map_or(Duration::ZERO, |last| now.saturating_duration_since(last).saturating_sub(TICK));
        d.last_tick = Some(now);
        if d.term != leading {
            d.begin_term(leading, now);
        } else if unseen >= STALL {
            tracing::warn!(
                unseen_ms = unseen.as_millis() as u64,
                "the lease keeper was held up; every lease deadline moves by the time it could not see"
            );
            d.postpone(unseen);
        }
        if leading.is_none() {
            return Vec::new();
        }
        d.sync(table, now);
        let expired = d.passed(table, now, self.per_tick);
        d.expiring.extend(&expired);
        expired
    }

    fn expiry_answered(&self, id: i64) {
        self.inner.lock().expect("lease keeper lock poisoned").expiring.remove(&id);
    }
}

/// The keeper's loop; ends when the node stops.
pub async fn run(node: Arc<Node>, mut stopping: Stopping) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopping.stopped() => return,
        }
        let term = node.leading_term();
        // Before the table is read: grants after this are ordered against
        // the expiries decided from it (`raft::write::lease_order`).
        let mark = node.replica.proposer.lease_mark();
        let expired = node.lease_keeper.tick(term, &node.state().leases(), Instant::now());
        if let (Some(term), false) = (term, expired.is_empty()) {
            let n = node.clone();
            tokio::spawn(async move {
                if let Err(e) = n.expire_leases(term, &expired, &mark).await {
                    tracing::debug!(leases = ?expired, error = %e, "expiring leases failed; will retry while leading");
                }
                for id in expired {
                    n.lease_keeper.expiry_answered(id);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(id: i64, ttl: i64) -> LeaseTable {
        let mut table = LeaseTable::default();
        assert!(table.grant(id, ttl));
        table
    }

    /// Tick every [`TICK`] from `from` (exclusive) until a lease expires or
    /// `until` passes; returns when, as an offset from `from`.
    fn ticks_until_expiry(
        keeper: &LeaseKeeper,
        table: &LeaseTable,
        term: u64,
        from: Instant,
        until: Duration,
    ) -> Option<Duration> {
        let mut now = from;
        while now < from + until {
            now += TICK;
            if !keeper.tick(Some(term), table, now).is_empty() {
                return Some(now - from);
            }
        }
        None
    }

    /// A keeper leading term 3 from `t0`, ticked until 100 ms before the
    /// 2 s lease in `table` expires.
    fn leading_until_just_before_expiry(table: &LeaseTable) -> (LeaseKeeper, Instant) {
        let keeper = LeaseKeeper::default();
        let t0 = Instant::now();
        keeper.tick(Some(3), table, t0);
        assert_eq!(ticks_until_expiry(&keeper, table, 3, t0, Duration::from_millis(1900)), None);
        (keeper, t0)
    }

    #[test]
    fn overdue_counts_the_live_leases_past_their_deadline_while_leading() {
        let mut table = LeaseTable::default();
        let lapsing = EXPIRIES_PER_TICK as i64 * 2 + 50;
        for id in 1..=lapsing {
            assert!(table.grant(id, 1));
        }
        let keeper = LeaseKeeper::default();
        let t0 = Instant::now();
        assert_eq!(keeper.overdue_at(&table, t0), 0, "not leading yet");
        keeper.tick(Some(3), &table, t0);
        assert_eq!(keeper.overdue_at(&table, t0 + Duration::from_millis(500)), 0);
        let due = t0 + Duration::from_secs(1);
        let mut now = t0 + TICK;
        while now < due {
            assert!(keeper.tick(Some(3), &table, now).is_empty());
            now += TICK;
        }
        let first = keeper.tick(Some(3), &table, due);
        assert_eq!(first.len(), EXPIRIES_PER_TICK);
        assert_eq!(keeper.overdue_at(&table, due), lapsing as usize, "in flight is not yet expired");
        for id in first {
            table.revoke(id);
        }
        assert_eq!(keeper.overdue_at(&table, due), lapsing as usize - EXPIRIES_PER_TICK);
        keeper.tick(None, &table, due + TICK);
        assert_eq!(keeper.overdue_at(&table, due + TICK), 0, "no longer leading");
    }

    #[test]
    fn a_lease_expires_after_its_ttl_in_one_term() {
        let keeper = LeaseKeeper::default();
        let table = table_with(1, 2);
        let t0 = Instant::now();
        assert!(keeper.tick(Some(3), &table, t0).is_empty());
        let expired = ticks_until_expiry(&keeper, &table, 3, t0, Duration::from_secs(5)).expect("expires");
        assert_eq!(expired, Duration::from_secs(2));
        assert!(keeper.tick(Some(3), &table, t0 + expired + TICK).is_empty(), "one expiry in flight at a time");
    }

    #[test]
    fn a_new_term_gives_every_lease_a_full_ttl() {
        let table = table_with(1, 2);
        let (keeper, t0) = leading_until_just_before_expiry(&table);
        // Led term 3, then (between two ticks) term 5: the deadline of term 3
        // knows nothing of the keepalives term 4's leader took.
        let t1 = t0 + Duration::from_millis(2000);
        assert!(keeper.tick(Some(5), &table, t1).is_empty());
        assert_eq!(ticks_until_expiry(&keeper, &table, 5, t1, Duration::from_secs(5)), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_keepalive_in_a_new_term_before_its_first_tick_gets_a_full_ttl() {
        let keeper = LeaseKeeper::default();
        let table = table_with(1, 2);
        let t0 = Instant::now();
        keeper.tick(Some(3), &table, t0);
        // Term 3's deadline passed long ago; term 5 has not ticked yet.
        std::thread::sleep(Duration::from_millis(10));
        keeper.inner.lock().unwrap().set(1, t0);
        assert_eq!(keeper.renew(5, &table, 1), Some(2), "a live lease was answered as gone");
    }

    #[test]
    fn time_the_keeper_did_not_see_moves_every_deadline() {
        let keeper = LeaseKeeper::default();
        let table = table_with(1, 2);
        let t0 = Instant::now();
        keeper.tick(Some(3), &table, t0);
        assert_eq!(ticks_until_expiry(&keeper, &table, 3, t0, Duration::from_millis(1000)), None);
        // Stopped for 10 s with a second of the TTL left: that second is
        // still there when it wakes.
        let woke = t0 + Duration::from_millis(1000) + Duration::from_secs(10);
        assert!(keeper.tick(Some(3), &table, woke).is_empty(), "a lease expired across a pause");
        let expired = ticks_until_expiry(&keeper, &table, 3, woke, Duration::from_secs(5)).expect("expires");
        assert!(expired >= Duration::from_millis(900) && expired <= Duration::from_millis(1100), "{expired:?}");
    }

    #[test]
    fn leases_expire_in_the_order_of_their_deadlines_and_revoked_ones_do_not() {
        let keeper = LeaseKeeper::default();
        let mut table = LeaseTable::default();
        for (id, ttl) in [(1, 3), (2, 1), (3, 2), (4, 1)] {
            assert!(table.grant(id, ttl));
        }
        let t0 = Instant::now();
        assert!(keeper.tick(Some(3), &table, t0).is_empty());
        table.revoke(4);
        let mut order = Vec::new();
        let mut now = t0;
        while now < t0 + Duration::from_secs(4) {
            now += TICK;
            for id in keeper.tick(Some(3), &table, now) {
                order.push((id, now - t0));
            }
        }
        let s = Duration::from_secs;
        assert_eq!(order, vec![(2, s(1)), (3, s(2)), (1, s(3))]);
    }

    #[test]
    fn a_lease_granted_again_under_its_id_gets_a_full_ttl() {
        let mut table = table_with(1, 2);
        let (keeper, t0) = leading_until_just_before_expiry(&table);
        // Between two ticks the old lease 1 is revoked and a new one granted
        // under its ID: the old deadline (at 2 s) is not the new lease's.
        table.revoke(1);
        assert!(table.grant(1, 10));
        let t1 = t0 + Duration::from_millis(1900);
        // The next tick, at t1 + TICK, sees the grant and gives it 10 s.
        let expired = ticks_until_expiry(&keeper, &table, 3, t1, Duration::from_secs(11));
        assert_eq!(expired, Some(TICK + Duration::from_secs(10)));
    }

    #[test]
    fn a_keepalive_finds_a_lease_granted_again_since_the_last_tick_alive() {
        let keeper = LeaseKeeper::default();
        let mut table = table_with(1, 2);
        let t0 = Instant::now();
        keeper.tick(Some(3), &table, t0);
        // The old lease 1's deadline has passed; it is revoked and granted
        // again before the keeper's next tick.
        keeper.inner.lock().unwrap().set(1, t0);
        table.revoke(1);
        assert!(table.grant(1, 2));
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(keeper.renew(3, &table, 1), Some(2), "a new lease was answered as expired");
    }

    #[test]
    fn the_rate_is_shared_out_over_the_ticks_of_a_second() {
        assert_eq!(LeaseKeeper::default().per_tick, EXPIRIES_PER_TICK);
        assert_eq!(LeaseKeeper::with_rate(20_000).per_tick, 2_000);
        assert_eq!(LeaseKeeper::with_rate(1_000).per_tick, 100);
        // Never none at all.
        assert_eq!(LeaseKeeper::with_rate(3).per_tick, 1);
    }

    #[test]
    fn leases_that_lapse_together_are_expired_a_ticks_share_at_a_time() {
        let keeper = LeaseKeeper::default();
        let mut table = LeaseTable::default();
        // Two ticks' share and 50 more, and one lease due a second later.
        let lapsing = EXPIRIES_PER_TICK as i64 * 2 + 50;
        for id in 1..=lapsing {
            assert!(table.grant(id, 2));
        }
        assert!(table.grant(lapsing + 1, 3));
        let t0 = Instant::now();
        // A new term: every lease gets its full TTL from t0, so all but the
        // last fall due at the same instant, t0 + 2 s.
        assert!(keeper.tick(Some(3), &table, t0).is_empty());
        assert_eq!(ticks_until_expiry(&keeper, &table, 3, t0, Duration::from_millis(1900)), None);
        let mut rounds: Vec<Vec<i64>> = Vec::new();
        let mut now = t0 + Duration::from_secs(2);
        // No expiry is answered meanwhile: those in flight are not proposed again.
        while rounds.iter().map(Vec::len).sum::<usize>() < lapsing as usize {
            rounds.push(keeper.tick(Some(3), &table, now));
            now += TICK;
            assert!(rounds.len() < 10, "expiry stalled: {:?}", rounds.iter().map(Vec::len).collect::<Vec<_>>());
        }
        let per_tick = EXPIRIES_PER_TICK as i64;
        let expected: Vec<Vec<i64>> = vec![
            (1..=per_tick).collect(),
            (per_tick + 1..=2 * per_tick).collect(),
            (2 * per_tick + 1..=lapsing).collect(),
        ];
        assert_eq!(rounds, expected, "a tick's share at a time, in the order of their deadlines");
        // Answered and revoked: nothing is left to expire until the last
        // lease's deadline, which is not held back by the backlog before it.
        for id in 1..=lapsing {
            table.revoke(id);
            keeper.expiry_answered(id);
        }
        let mut last = Vec::new();
        while last.is_empty() {
            assert!(now <= t0 + Duration::from_secs(3), "the last lease was not expired at its deadline");
            last = keeper.tick(Some(3), &table, now);
            assert!(last.is_empty() || now == t0 + Duration::from_secs(3), "expired at {:?}", now - t0);
            now += TICK;
        }
        assert_eq!(last, vec![lapsing + 1]);
    }

    #[test]
    fn deadlines_of_revoked_leases_do_not_pile_up() {
        let keeper = LeaseKeeper::default();
        let mut table = LeaseTable::default();
        let t0 = Instant::now();
        keeper.tick(Some(3), &table, t0);
        for id in 1..=5000 {
            assert!(table.grant(id, 3600));
        }
        keeper.tick(Some(3), &table, t0 + TICK);
        assert_eq!(keeper.inner.lock().unwrap().at.len(), 5000);
        for id in 1..=5000 {
            table.revoke(id);
        }
        assert!(table.grant(5001, 3600));
        assert!(keeper.tick(Some(3), &table, t0 + TICK * 2).is_empty());
        let d = keeper.inner.lock().unwrap();
        assert_eq!((d.at.len(), d.due.len()), (1, 1), "the revoked leases' deadlines were kept");
    }

    #[test]
    fn a_table_restored_within_a_term_gives_every_lease_a_full_ttl() {
        let table = table_with(1, 2);
        let (keeper, t0) = leading_until_just_before_expiry(&table);
        // The table is rebuilt from a snapshot in which ID 1 is another
        // lease: the old lease's deadline (at 2 s) is not its deadline.
        let restored = LeaseTable::restore([(1, 10)], Vec::new());
        let t1 = t0 + Duration::from_millis(1900);
        let expired = ticks_until_expiry(&keeper, &restored, 3, t1, Duration::from_secs(11));
        assert_eq!(expired, Some(TICK + Duration::from_secs(10)));
    }
}
