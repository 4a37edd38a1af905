//! The order of one lease ID's grants and expiries on the leader.
//!
//! The leader's keeper (`node::lease::keeper`) decides from its deadlines
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
//! expiries), and each batch is admitted here before it is proposed:
//! - an expiry is dropped (not proposed: the keeper decides again at its
//!   next tick, from deadlines that then include any grant made) if a grant
//!   of its ID is in flight, or succeeded after the keeper's [`Mark`], taken
//!   just before the keeper read the lease table; an expiry with no mark is
//!   dropped too;
//! - a grant waits while an expiry of its ID is in flight in another batch,
//!   so that it reaches the log after the expiry.
//!
//! A grant answered before the mark was applied before the keeper read the
//! table (the leader answers a write once it has applied it), so the
//! keeper's deadlines had it. A grant refused (the ID is taken: its old lease
//! is still there; auth; the space quota) changes nothing, so a client
//! retrying a grant of a lease still waiting to expire does not keep it
//! alive, unless a grant of that ID is in flight at every tick. Only grants
//! wait, and only for an expiry's batch already admitted, which waits for
//! nothing more: the wait ends when that entry is answered (applied, or
//! refused), which a batch is, with its grants and expiries in flight, even
//! if the caller that ran it stopped waiting (`raft::write::proposer` then
//! proposes it in a task of its own). While a grant waits, its whole batch
//! does. Within a batch, commands apply in order: an expiry after a grant of
//! its ID is dropped, a grant after an expiry of its ID needs no wait.
//!
//! Invariant: an expiry proposed here is never applied after a successful
//! grant of its ID that the keeper's decision did not see.
//!
//! Caveats: only this member's proposals are ordered. A grant appended by an
//! earlier leader and applied here during this term is not; but the keeper
//! gives every lease a full TTL when its term begins, so no expiry is decided
//! before a TTL into the term, by when the earlier terms' entries have long
//! been applied.
//!
//! Cost: a batch with no lease grant or expiry is not looked at beyond a
//! scan of its commands; the tables hold the IDs in flight and the grants
//! that succeeded while a mark was in use.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::model::command::{Command, CommandResult, UserCommand};

#[derive(Default)]
pub struct LeaseOrder {
    /// std Mutex: never held across an `.await`.
    inner: Mutex<Inner>,
    /// Woken whenever a batch holding a grant or an expiry is answered.
    answered: Notify,
}

#[derive(Default)]
struct Inner {
    /// Counts the grants that succeeded; a mark is a value of it.
    seq: u64,
    /// Lease IDs with a grant in flight, or one that succeeded while a mark
    /// was in use.
    grants: HashMap<i64, Grants>,
    /// Lease IDs with an expiry in flight, and how many.
    expiring: HashMap<i64, usize>,
    /// Marks in use, and how many of each.
    marks: BTreeMap<u64, usize>,
    /// Expiries on their way to a batch, with the mark of the decision.
    decided: HashMap<i64, u64>,
}

#[derive(Default)]
struct Grants {
    in_flight: usize,
    /// `seq` when a grant of this ID last succeeded (0: none tracked).
    granted: u64,
}

/// What a command is to this module.
enum LeaseCommand {
    Grant(i64),
    Expire(i64),
}

fn lease_command(cmd: &Command) -> Option<LeaseCommand> {
    match cmd {
        Command::Forwarded { command, .. } => lease_command(command),
        Command::LeaseGrant { id, .. } | Command::AsUser { command: UserCommand::LeaseGrant { id, .. }, .. } => {
            Some(LeaseCommand::Grant(*id))
        }
        Command::LeaseExpire { id, .. } => Some(LeaseCommand::Expire(*id)),
        _ => None,
    }
}

/// The moment before the keeper reads the lease table: a grant that
/// succeeds after it may be missing from what the keeper read. In use until
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
        inner.grants.retain(|_, g| g.in_flight > 0 || g.granted > oldest);
    }
}

/// An expiry decided under a mark, on its way to a batch; forgotten when
/// dropped (its batch may never form if its caller gives up first; if it
/// forms later, the expiry has no mark and is dropped).
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
/// were, and the grants and expiries it holds in flight until answered.
pub struct Admitted {
    pub commands: Vec<Command>,
    /// Positions, in the batch as it came, of the expiries dropped.
    pub dropped: Vec<usize>,
    pub in_flight: InFlight,
    /// Whether the batch waited for an expiry before it was admitted.
    pub waited: bool,
}

/// A batch's grants and expiries in flight, until [`InFlight::answered`]
/// with the results of its proposal (or dropped without: then its grants
/// count as having succeeded, which may only delay an expiry).
pub struct InFlight {
    order: Option<Arc<LeaseOrder>>,
    /// Each grant: its ID and its position among the commands proposed.
    grants: Vec<(i64, usize)>,
    expiries: Vec<i64>,
    /// Per grant: whether it succeeded, once answered.
    succeeded: Option<Vec<bool>>,
}

impl InFlight {
    fn none() -> InFlight {
        InFlight { order: None, grants: Vec::new(), expiries: Vec::new(), succeeded: None }
    }

    /// Whether the batch holds no grant or expiry in flight.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty() && self.expiries.is_empty()
    }

    /// The batch's proposal answered with `results` (one per command
    /// proposed, in order; none if it was not proposed).
    pub fn answered<E>(mut self, results: &[Result<CommandResult, E>]) {
        self.succeeded = Some(
            self.grants
                .iter()
                .map(|(_, at)| matches!(results.get(*at), Some(Ok(CommandResult::LeaseGranted { .. }))))
                .collect(),
        );
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(order) = self.order.take() else { return };
        let mut inner = order.lock();
        let succeeded = self.succeeded.take();
        for (i, (id, _)) in self.grants.iter().enumerate() {
            let ok = succeeded.as_ref().is_none_or(|s| s[i]);
            if ok {
                inner.seq += 1;
            }
            let seq = inner.seq;
            let g = inner.grants.get_mut(id).expect("a grant in flight is tracked");
            g.in_flight -= 1;
            if ok {
                g.granted = seq;
            }
        }
        let oldest = inner.oldest_mark();
        for (id, _) in &self.grants {
            if inner.grants.get(id).is_some_and(|g| g.in_flight == 0 && g.granted <= oldest) {
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
        order.answered.notify_waiters();
    }
}

impl Inner {
    /// The oldest mark in use; with none, any later mark is at least `seq`.
    fn oldest_mark(&self) -> u64 {
        self.marks.keys().next().copied().unwrap_or(self.seq)
    }

    /// Whether one of `leased` is a grant that must wait for an expiry of
    /// its ID in a batch already admitted.
    fn held_up(&self, leased: &[(usize, LeaseCommand)]) -> bool {
        leased.iter().any(|(_, c)| matches!(c, LeaseCommand::Grant(id) if self.expiring.contains_key(id)))
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

    /// Admit a batch (see the module doc): wait while one of its grants is
    /// held up by an expiry already admitted, then drop the expiries that
    /// must not be proposed and put the rest, and its grants, in flight.
    pub async fn admit(self: &Arc<Self>, commands: Vec<Command>) -> Admitted {
        let leased: Vec<(usize, LeaseCommand)> =
            commands.iter().enumerate().filter_map(|(i, c)| Some((i, lease_command(c)?))).collect();
        if leased.is_empty() {
            return Admitted { commands, dropped: Vec::new(), in_flight: InFlight::none(), waited: false };
        }
        let mut waited = false;
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Registered before the check, so an answer between the check and
            // the wait is not missed.
            answered.as_mut().enable();
            {
                let mut inner = self.lock();
                if !inner.held_up(&leased) {
                    return Admitted { waited, ..self.admit_now(&mut inner, commands, leased) };
                }
            }
            answered.await;
            waited = true;
        }
    }

    fn admit_now(
        self: &Arc<Self>,
        inner: &mut Inner,
        commands: Vec<Command>,
        leased: Vec<(usize, LeaseCommand)>,
    ) -> Admitted {
        let mut in_flight = InFlight::none();
        in_flight.order = Some(self.clone());
        let mut dropped = Vec::new();
        for (i, c) in leased {
            match c {
                LeaseCommand::Grant(id) => {
                    inner.grants.entry(id).or_default().in_flight += 1;
                    // Its position among the commands proposed.
                    in_flight.grants.push((id, i - dropped.len()));
                }
                LeaseCommand::Expire(id) => {
                    let granted_since = match inner.decided.remove(&id) {
                        Some(mark) => inner.grants.get(&id).is_some_and(|g| g.in_flight > 0 || g.granted > mark),
                        None => true,
                    };
                    if granted_since {
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
        Admitted { commands, dropped, in_flight, waited: false }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::mvcc::MvccError;

    fn grant(id: i64) -> Command {
        Command::LeaseGrant { id, ttl: 10 }
    }

    fn expire(id: i64) -> Command {
        Command::LeaseExpire { id, term: 1 }
    }

    fn put() -> Command {
        Command::Put(crate::model::mvcc::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })
    }

    /// Admit a batch that must not wait.
    async fn admit(order: &Arc<LeaseOrder>, commands: Vec<Command>) -> Admitted {
        tokio::time::timeout(Duration::from_secs(1), order.admit(commands)).await.expect("admitted without waiting")
    }

    /// Answer a batch of one grant.
    fn answer(a: Admitted, granted: bool) {
        let result = if granted {
            CommandResult::LeaseGranted { id: 1, ttl: 10, revision: 1 }
        } else {
            CommandResult::Rejected { error: MvccError::LeaseExists, revision: 1 }
        };
        a.in_flight.answered::<()>(&[Ok(result)]);
    }

    #[tokio::test]
    async fn a_batch_without_leases_is_admitted_whole_and_holds_nothing() {
        let order = Arc::new(LeaseOrder::default());
        let a = admit(&order, vec![put(), put()]).await;
        assert_eq!(a.commands.len(), 2);
        assert!(a.dropped.is_empty() && a.in_flight.is_empty());
    }

    /// The race this module closes: the keeper marks and decides; a grant
    /// of the same ID succeeds before the expiry's batch forms. The expiry
    /// is dropped; another one in the batch is not.
    #[tokio::test]
    async fn an_expiry_is_dropped_if_its_id_was_granted_after_the_mark() {
        let order = Arc::new(LeaseOrder::default());
        let mark = order.mark();
        answer(admit(&order, vec![grant(7)]).await, true);
        let _d7 = order.decided(7, &mark);
        let _d9 = order.decided(9, &mark);
        let a = admit(&order, vec![put(), expire(7), expire(9)]).await;
        assert_eq!(a.dropped, vec![1]);
        assert_eq!(a.commands, vec![put(), expire(9)]);
    }

    /// A grant answered before the keeper's mark was in the table it read,
    /// and a refused grant changed nothing: the expiry stands.
    #[tokio::test]
    async fn an_expiry_stands_after_a_grant_before_the_mark_or_a_refused_one() {
        let order = Arc::new(LeaseOrder::default());
        answer(admit(&order, vec![grant(7)]).await, true);
        let mark = order.mark();
        answer(admit(&order, vec![grant(7)]).await, false);
        let _d = order.decided(7, &mark);
        let a = admit(&order, vec![expire(7)]).await;
        assert!(a.dropped.is_empty());
        assert_eq!(a.commands, vec![expire(7)]);
    }

    /// An expiry whose ID has a grant in flight is dropped at once (the
    /// keeper tries again at its next tick); once the grant was refused, the
    /// next one stands.
    #[tokio::test]
    async fn an_expiry_is_dropped_while_a_grant_of_its_id_is_in_flight() {
        let order = Arc::new(LeaseOrder::default());
        let granting = admit(&order, vec![grant(7)]).await;
        let mark = order.mark();
        let d = order.decided(7, &mark);
        assert_eq!(admit(&order, vec![put(), expire(7)]).await.dropped, vec![1]);
        drop(d);
        answer(granting, false);
        let _d = order.decided(7, &mark);
        assert!(admit(&order, vec![expire(7)]).await.dropped.is_empty());
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
        answer(admit(&order, vec![grant(8)]).await, true);
        let waiting = tokio::spawn({
            let order = order.clone();
            async move { order.admit(vec![put(), grant(7)]).await.commands.len() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the grant went ahead of the expiry in flight");
        expiring.in_flight.answered::<()>(&[Ok(CommandResult::LeaseRevoked { revision: 2 })]);
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

    /// An expiry with no mark (its decision was forgotten: its caller gave
    /// up) is not proposed; a grant whose answer was lost counts as made.
    #[tokio::test]
    async fn what_is_not_known_holds_the_expiry_back() {
        let order = Arc::new(LeaseOrder::default());
        assert_eq!(admit(&order, vec![expire(5)]).await.dropped, vec![0]);
        let mark = order.mark();
        drop(admit(&order, vec![grant(6)]).await);
        let _d = order.decided(6, &mark);
        assert_eq!(admit(&order, vec![expire(6)]).await.dropped, vec![0]);
    }

    /// The tables hold only what is in flight or may matter to a mark in
    /// use.
    #[tokio::test]
    async fn the_tables_are_emptied_once_nothing_is_in_flight_and_no_mark_is_in_use() {
        let order = Arc::new(LeaseOrder::default());
        for id in 0..100 {
            answer(admit(&order, vec![grant(id)]).await, true);
        }
        assert!(order.lock().grants.is_empty());
        let mark = order.mark();
        for id in 0..100 {
            answer(admit(&order, vec![grant(id)]).await, id % 2 == 0);
        }
        assert_eq!(order.lock().grants.len(), 50, "the grants made, kept for the mark in use");
        {
            let _d = order.decided(5, &mark);
            answer(admit(&order, vec![expire(5)]).await, false);
        }
        drop(mark);
        let inner = order.lock();
        assert!(inner.grants.is_empty() && inner.expiring.is_empty() && inner.marks.is_empty());
        assert!(inner.decided.is_empty());
    }
}
