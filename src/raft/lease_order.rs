//! The order of one lease ID's grants and expiries on the leader.
//!
//! The leader's keeper (`server::lease_keeper`) decides from its deadlines
//! that lease `id` has expired, confirms with a quorum that it still leads,
//! and proposes `Command::LeaseExpire { id, term }`, which revokes whatever
//! lease has that ID when it is applied. A client may revoke a lease and
//! grant a new one under the same ID. Were that grant applied after the
//! keeper read the lease table its decision came from, and before the expiry
//! is applied, the expiry would revoke the new lease, whose TTL has only
//! begun.
//!
//! Every command this leader proposes goes through its proposer's batches
//! (its clients' writes, the followers' forwarded writes, the keeper's
//! expiries), and each batch is admitted here before it is proposed, by two
//! rules:
//! - an expiry is dropped (not proposed: the keeper decides again at a later
//!   tick, from deadlines that then include the grant) if a grant of its ID
//!   is in flight, or was begun or answered after the keeper's [`Mark`],
//!   taken just before the keeper read the lease table;
//! - a grant whose ID has an expiry in flight in another batch waits until
//!   that batch is answered, so that it reaches the log after the expiry.
//!
//! A batch's grants and expiries stay in flight until its entry is answered
//! (applied, or refused), even if the caller that ran the batch stopped
//! waiting (`raft::proposer` then proposes it in a task of its own).
//!
//! Whichever of a grant and an expiry is admitted second yields, so the
//! order in which concurrent batches are admitted does not matter. Within a
//! batch, commands apply in order: an expiry after a grant of its ID is
//! dropped, a grant after an expiry of its ID needs no wait. A grant answered
//! before the mark was applied before the keeper read the table (the leader
//! answers a write once it has applied it), so the keeper's deadlines had it.
//!
//! Invariant: an expiry proposed here is never applied after a grant of its
//! ID that the keeper's decision did not see.
//!
//! Caveats: only this member's proposals are ordered. A grant appended by an
//! earlier leader and applied here during this term is not; but the keeper
//! gives every lease a full TTL when its term begins, so no expiry is decided
//! before a TTL into the term, by when the earlier terms' entries have long
//! been applied. An expiry proposed without a mark (none of raftlock's) is
//! ordered against grants in flight only.
//!
//! Cost: a batch with no lease grant or expiry is not looked at beyond a
//! scan of its commands; the tables hold the IDs in flight and the grants
//! answered while a mark was in use.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::command::{Command, UserCommand};

#[derive(Default)]
pub struct LeaseOrder {
    /// std Mutex: never held across an `.await`.
    inner: Mutex<Inner>,
    /// Woken whenever a batch holding an expiry is answered.
    expiry_answered: Notify,
}

#[derive(Default)]
struct Inner {
    /// Counts grants admitted and answered; a mark is a value of it.
    seq: u64,
    /// Lease IDs with a grant in flight, or one answered while a mark was in
    /// use.
    grants: HashMap<i64, Grants>,
    /// Lease IDs with an expiry in flight, and how many.
    expiring: HashMap<i64, usize>,
    /// Marks in use, and how many of each.
    marks: BTreeMap<u64, usize>,
    /// Expiries on their way to a batch, with the mark of the decision.
    decided: HashMap<i64, u64>,
}

struct Grants {
    in_flight: usize,
    /// `seq` when a grant of this ID was last admitted or answered.
    last: u64,
}

/// What a command is to this module.
enum LeaseCommand {
    Grant(i64),
    Expire(i64),
}

fn lease_command(cmd: &Command) -> Option<LeaseCommand> {
    match cmd {
        Command::LeaseGrant { id, .. } | Command::AsUser { command: UserCommand::LeaseGrant { id, .. }, .. } => {
            Some(LeaseCommand::Grant(*id))
        }
        Command::LeaseExpire { id, .. } => Some(LeaseCommand::Expire(*id)),
        _ => None,
    }
}

/// The moment before the keeper reads the lease table: a grant begun or
/// answered after it may be missing from what the keeper read. In use until
/// dropped.
pub struct Mark {
    order: Arc<LeaseOrder>,
    seq: u64,
}

impl Drop for Mark {
    fn drop(&mut self) {
        let mut inner = self.order.lock();
        if let Some(count) = inner.marks.get_mut(&self.seq) {
            *count -= 1;
            if *count == 0 {
                inner.marks.remove(&self.seq);
            }
        }
        let oldest = inner.oldest_mark();
        inner.grants.retain(|_, g| g.in_flight > 0 || g.last > oldest);
    }
}

/// An expiry decided under a mark, on its way to a batch; forgotten when
/// dropped (its batch may never form if its caller gives up first).
pub struct Decided<'a> {
    order: &'a LeaseOrder,
    id: i64,
}

impl Drop for Decided<'_> {
    fn drop(&mut self) {
        self.order.lock().decided.remove(&self.id);
    }
}

/// A batch admitted: the commands to propose, where the dropped expiries
/// were, and the grants and expiries it holds in flight until dropped.
pub struct Admitted {
    pub commands: Vec<Command>,
    /// Positions, in the batch as it came, of the expiries dropped.
    pub dropped: Vec<usize>,
    pub in_flight: InFlight,
}

/// A batch's grants and expiries in flight; answered when dropped (after
/// the batch's proposal returned, so after it was applied or refused).
pub struct InFlight {
    order: Option<Arc<LeaseOrder>>,
    grants: Vec<i64>,
    expiries: Vec<i64>,
}

impl InFlight {
    /// Whether the batch holds no grant or expiry in flight.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty() && self.expiries.is_empty()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(order) = self.order.take() else { return };
        let mut inner = order.lock();
        for id in &self.grants {
            inner.seq += 1;
            let seq = inner.seq;
            let g = inner.grants.get_mut(id).expect("a grant in flight is tracked");
            g.in_flight -= 1;
            g.last = seq;
        }
        let oldest = inner.oldest_mark();
        for id in &self.grants {
            if inner.grants.get(id).is_some_and(|g| g.in_flight == 0 && g.last <= oldest) {
                inner.grants.remove(id);
            }
        }
        for id in &self.expiries {
            let count = inner.expiring.get_mut(id).expect("an expiry in flight is tracked");
            *count -= 1;
            if *count == 0 {
                inner.expiring.remove(id);
            }
        }
        drop(inner);
        if !self.expiries.is_empty() {
            order.expiry_answered.notify_waiters();
        }
    }
}

impl Inner {
    /// The oldest mark in use; with none, any later mark is at least `seq`.
    fn oldest_mark(&self) -> u64 {
        self.marks.keys().next().copied().unwrap_or(self.seq)
    }
}

impl LeaseOrder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("lease order lock poisoned")
    }

    /// Take a mark: call it before reading the lease table to decide
    /// expiries, and keep it until they are answered.
    pub fn mark(self: &Arc<Self>) -> Mark {
        let mut inner = self.lock();
        let seq = inner.seq;
        *inner.marks.entry(seq).or_default() += 1;
        Mark { order: self.clone(), seq }
    }

    /// Record that the expiry of `id` about to be proposed was decided under
    /// `mark`, until the returned guard is dropped.
    pub fn decided<'a>(&'a self, id: i64, mark: &Mark) -> Decided<'a> {
        self.lock().decided.insert(id, mark.seq);
        Decided { order: self, id }
    }

    /// Admit a batch (see the module doc): wait while another batch's expiry
    /// holds up one of its grants, then drop the expiries that must not be
    /// proposed and put the rest, and its grants, in flight.
    pub async fn admit(self: &Arc<Self>, commands: Vec<Command>) -> Admitted {
        let leased: Vec<(usize, LeaseCommand)> =
            commands.iter().enumerate().filter_map(|(i, c)| Some((i, lease_command(c)?))).collect();
        if leased.is_empty() {
            return Admitted {
                commands,
                dropped: Vec::new(),
                in_flight: InFlight { order: None, grants: Vec::new(), expiries: Vec::new() },
            };
        }
        loop {
            let answered = self.expiry_answered.notified();
            tokio::pin!(answered);
            // Registered before the check, so an answer between the check and
            // the wait is not missed.
            answered.as_mut().enable();
            {
                let mut inner = self.lock();
                let held_up =
                    leased.iter().any(|(_, c)| matches!(c, LeaseCommand::Grant(id) if inner.expiring.contains_key(id)));
                if !held_up {
                    return self.admit_now(&mut inner, commands, leased);
                }
            }
            answered.await;
        }
    }

    fn admit_now(
        self: &Arc<Self>,
        inner: &mut Inner,
        commands: Vec<Command>,
        leased: Vec<(usize, LeaseCommand)>,
    ) -> Admitted {
        let mut in_flight = InFlight { order: Some(self.clone()), grants: Vec::new(), expiries: Vec::new() };
        let mut dropped = Vec::new();
        for (i, c) in leased {
            match c {
                LeaseCommand::Grant(id) => {
                    inner.seq += 1;
                    let seq = inner.seq;
                    let g = inner.grants.entry(id).or_insert(Grants { in_flight: 0, last: seq });
                    g.in_flight += 1;
                    g.last = seq;
                    in_flight.grants.push(id);
                }
                LeaseCommand::Expire(id) => {
                    let mark = inner.decided.remove(&id);
                    let granted = inner
                        .grants
                        .get(&id)
                        .is_some_and(|g| g.in_flight > 0 || mark.is_some_and(|mark| g.last > mark));
                    if granted {
                        dropped.push(i);
                    } else {
                        *inner.expiring.entry(id).or_default() += 1;
                        in_flight.expiries.push(id);
                    }
                }
            }
        }
        let commands = if dropped.is_empty() {
            commands
        } else {
            commands.into_iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, c)| c).collect()
        };
        Admitted { commands, dropped, in_flight }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn grant(id: i64) -> Command {
        Command::LeaseGrant { id, ttl: 10 }
    }

    fn expire(id: i64) -> Command {
        Command::LeaseExpire { id, term: 1 }
    }

    fn put() -> Command {
        Command::Put(crate::mvcc::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })
    }

    /// Admit a batch that must not wait.
    async fn admit(order: &Arc<LeaseOrder>, commands: Vec<Command>) -> Admitted {
        tokio::time::timeout(Duration::from_secs(1), order.admit(commands)).await.expect("admitted without waiting")
    }

    #[tokio::test]
    async fn a_batch_without_leases_is_admitted_whole_and_holds_nothing() {
        let order = Arc::new(LeaseOrder::default());
        let a = admit(&order, vec![put(), put()]).await;
        assert_eq!(a.commands.len(), 2);
        assert!(a.dropped.is_empty());
        assert_eq!(order.lock().seq, 0);
    }

    /// The race this module closes: the keeper marks and decides; a grant
    /// of the same ID is begun (and even answered) before the expiry's batch
    /// forms. The expiry is dropped.
    #[tokio::test]
    async fn an_expiry_is_dropped_if_its_id_was_granted_after_the_mark() {
        let order = Arc::new(LeaseOrder::default());
        let mark = order.mark();
        // Answered before the expiry forms.
        drop(admit(&order, vec![grant(7)]).await);
        // In flight when the expiry forms.
        let in_flight = admit(&order, vec![grant(8)]).await;
        let _d7 = order.decided(7, &mark);
        let _d8 = order.decided(8, &mark);
        let _d9 = order.decided(9, &mark);
        let a = admit(&order, vec![put(), expire(7), expire(8), expire(9)]).await;
        assert_eq!(a.dropped, vec![1, 2]);
        assert_eq!(a.commands, vec![put(), expire(9)]);
        drop(in_flight);
    }

    /// A grant answered before the keeper's mark was in the table it read:
    /// the expiry decided after it stands.
    #[tokio::test]
    async fn an_expiry_stands_if_the_grant_was_answered_before_the_mark() {
        let order = Arc::new(LeaseOrder::default());
        drop(admit(&order, vec![grant(7)]).await);
        let mark = order.mark();
        let _d = order.decided(7, &mark);
        let a = admit(&order, vec![expire(7)]).await;
        assert!(a.dropped.is_empty());
        assert_eq!(a.commands, vec![expire(7)]);
    }

    /// A grant begun before the mark and answered after it may have been
    /// applied after the keeper read the table: the expiry is dropped.
    #[tokio::test]
    async fn an_expiry_is_dropped_if_a_grant_begun_before_the_mark_was_answered_after_it() {
        let order = Arc::new(LeaseOrder::default());
        let granting = admit(&order, vec![grant(7)]).await;
        let mark = order.mark();
        drop(granting);
        let _d = order.decided(7, &mark);
        let a = admit(&order, vec![expire(7)]).await;
        assert_eq!(a.dropped, vec![0]);
    }

    /// A grant whose ID has an expiry in flight waits for its answer; a
    /// grant of another ID does not.
    #[tokio::test]
    async fn a_grant_waits_for_an_expiry_of_its_id_in_flight() {
        let order = Arc::new(LeaseOrder::default());
        let mark = order.mark();
        let d = order.decided(7, &mark);
        let expiring = admit(&order, vec![expire(7)]).await;
        drop(d);
        assert!(expiring.dropped.is_empty());
        drop(admit(&order, vec![grant(8)]).await);
        let waiting = tokio::spawn({
            let order = order.clone();
            async move { order.admit(vec![put(), grant(7)]).await.commands.len() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the grant went ahead of the expiry in flight");
        drop(expiring);
        let admitted = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("admitted once answered");
        assert_eq!(admitted.unwrap(), 2);
    }

    /// Within a batch commands apply in order: an expiry after a grant of
    /// its ID is dropped; a grant after an expiry of its ID goes with it.
    #[tokio::test]
    async fn within_a_batch_the_order_of_the_commands_decides() {
        let order = Arc::new(LeaseOrder::default());
        let mark = order.mark();
        let _d = order.decided(7, &mark);
        let a = admit(&order, vec![grant(7), expire(7)]).await;
        assert_eq!(a.dropped, vec![1]);
        drop(a);
        let _d = order.decided(8, &mark);
        let b = admit(&order, vec![expire(8), grant(8)]).await;
        assert!(b.dropped.is_empty());
        assert_eq!(b.commands, vec![expire(8), grant(8)]);
    }

    /// The tables hold only what is in flight or may matter to a mark in
    /// use.
    #[tokio::test]
    async fn the_tables_are_emptied_once_nothing_is_in_flight_and_no_mark_is_in_use() {
        let order = Arc::new(LeaseOrder::default());
        for id in 0..100 {
            drop(admit(&order, vec![grant(id)]).await);
        }
        assert!(order.lock().grants.is_empty());
        let mark = order.mark();
        for id in 0..100 {
            drop(admit(&order, vec![grant(id)]).await);
        }
        assert_eq!(order.lock().grants.len(), 100, "kept for the mark in use");
        {
            let _d = order.decided(5, &mark);
            drop(admit(&order, vec![expire(5)]).await);
        }
        drop(mark);
        let inner = order.lock();
        assert!(inner.grants.is_empty() && inner.expiring.is_empty() && inner.marks.is_empty());
        assert!(inner.decided.is_empty());
    }
}
