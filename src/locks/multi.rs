//! Multi-locks: several locks taken together for one lease, all or none
//! (what Curator's `InterProcessMultiLock` and Redisson's `MultiLock` give),
//! with one token per lock and no deadlock however the sets overlap.
//!
//! The places are queued in **one txn**: every owner key of the set is
//! created at the same revision R, which is each grant's token. A waiter
//! waits only for keys created at a revision below its own
//! ([`wait_for_turn`]), so a wait always points from a later revision to an
//! earlier one, and the waits between any number of multi-locks (and single
//! locks) can form no cycle: the place queued first in every queue it joined
//! is never waiting for a later one. Taking the locks one by one in a global
//! order would be deadlock-free too, but would hold early locks while
//! waiting for later ones, and cost a write per lock when nobody contends;
//! one txn costs one write for the whole set.
//!
//! Invariants: the call answers "granted" only when every place holds its
//! lock. One that does not (try-once, or a wait that timed out) removes every
//! place of the set, the ones whose turn had come included, each fenced by
//! its token, so a failed multi-lock leaves nothing behind and holds nothing.
//! A retry of a multi-lock whose answer was lost finds all its places (one
//! create revision) and waits on with them; a lease that is queued for only
//! some of the locks is refused ([`RecipeError::PartlyQueued`]), since taking
//! the rest later could wait on places queued after its own.
//!
//! Caveats: while it waits, a multi-lock holds the locks whose turn came
//! (a single lock's holder sees the name held by it): "all or none" is the
//! answer, not the store. A multi-lock whose caller goes away mid-wait removes
//! its waiting places in the background and keeps the ones that hold until its
//! lease releases or ends them, as a single acquire does (`CleanupOnDrop`);
//! so does one whose giving back fails (the cluster unavailable): it answers
//! with the error, and its lease's end is what releases what it kept.

use std::sync::Arc;
use std::time::Instant;

use super::fenced::{self, Owner, Wait};
use super::turn::{wait_for_turn, CleanupOnDrop, GaveUp, Waits};
use super::{create_revision_is, front_range, holders_from, owner_key, queue_prefix, shown, Mode, Queued, RecipeError};
use crate::model::mvcc::{KeyValue, PutRequest, RangeRequest, RequestOp, ResponseOp, TxnRequest};
use crate::node::{Node, ServerError};

/// One lock of a set: its name, mode and permits (1 for a mutex; a reader's is 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub name: Vec<u8>,
    pub mode: Mode,
    pub permits: usize,
}

/// What a multi-lock came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultiAcquired {
    /// Every lock held: the owner keys in the set's order (their
    /// create_revision, one for all, is each grant's token).
    Granted { grants: Vec<KeyValue>, revision: i64 },
    /// Not all held within the wait, and nothing kept: the first lock that
    /// was not held, and its holders.
    Refused { blocked_on: Vec<u8>, holders: Vec<Owner>, revision: i64 },
}

/// What is wrong with a set of locks, if anything: an empty name, a name
/// given twice, or a lock nested under another of the set ("a" and "a/b":
/// the inner one's key would queue in the outer lock too).
pub fn set_problem(specs: &[Spec]) -> Option<String> {
    let mut names: Vec<&[u8]> = specs.iter().map(|s| s.name.as_slice()).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Some("lock name is not provided".into());
    }
    names.sort();
    for pair in names.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a == b {
            return Some(format!("lock {} is named twice", shown(a)));
        }
    }
    for a in &names {
        let prefix = queue_prefix(a);
        if let Some(b) = names.iter().find(|b| b.starts_with(&prefix)) {
            return Some(format!("lock {} is nested under lock {} of the same set", shown(b), shown(a)));
        }
    }
    None
}

/// Acquire every lock of `specs` (checked by [`set_problem`]) for `lease`,
/// all or none, waiting at most `wait`; `metadata` becomes every owner key's
/// value.
pub async fn acquire_all(
    node: Arc<Node>,
    specs: Vec<Spec>,
    lease: i64,
    metadata: &[u8],
    wait: Wait,
) -> Result<MultiAcquired, RecipeError> {
    let specs = Arc::new(specs);
    let (queued, guards) = enqueue_all_guarded(&node, specs.clone(), lease, metadata.to_vec()).await?;
    let deadline = match wait {
        Wait::Never => Some(Instant::now()),
        // An overflowing deadline is as good as none.
        Wait::For(d) => Instant::now().checked_add(d),
        Wait::Forever => None,
    };
    let mut held = Vec::with_capacity(specs.len());
    let mut waited = Ok(());
    for (place, spec) in queued.iter().zip(specs.iter()) {
        if place.holds() {
            held.push(place.mine.clone());
            continue;
        }
        if wait == Wait::Never {
            waited = Err(RecipeError::TimedOut);
            break;
        }
        match wait_for_turn(&node, &queue_prefix(&spec.name), &place.mine, spec.mode, spec.permits, deadline).await {
            Ok(kv) => held.push(kv),
            Err(e) => {
                waited = Err(e);
                break;
            }
        }
    }
    match waited {
        Ok(()) => {
            guards.into_iter().for_each(CleanupOnDrop::disarm);
            Ok(MultiAcquired::Granted { grants: held, revision: node.revision() })
        }
        Err(RecipeError::TimedOut) => give_up_all(&node, &specs, guards).await,
        // The lease ended (every place went with it) or the node stops: the
        // guards, dropped, remove what still waits.
        Err(e) => Err(e),
    }
}

/// The wait ended before every place held: remove the waiting places, and
/// release the ones whose turn came, unless by now every place holds.
async fn give_up_all(node: &Node, specs: &[Spec], guards: Vec<CleanupOnDrop>) -> Result<MultiAcquired, RecipeError> {
    let mut blocked_on = None;
    let mut kept = Vec::new();
    for (guard, spec) in guards.into_iter().zip(specs) {
        match guard.give_up().await? {
            GaveUp::Holds(kv) => kept.push(kv),
            GaveUp::Removed(_) => {
                blocked_on.get_or_insert_with(|| spec.clone());
            }
        }
    }
    let Some(blocked) = blocked_on else {
        // Every turn came as the wait ended: the set holds, and is kept.
        return Ok(MultiAcquired::Granted { grants: kept, revision: node.revision() });
    };
    // Every one is tried, whatever the others came to.
    let mut failed = None;
    for kv in &kept {
        if let Err(e) = fenced::release(node, &kv.key, kv.create_revision).await {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let description =
        fenced::describe(node, &blocked.name, blocked.permits, fenced::Page::of(1, 0, Vec::new())).await?;
    Ok(MultiAcquired::Refused {
        blocked_on: blocked.name,
        holders: description.holders,
        revision: description.revision,
    })
}

/// [`enqueue_all`] in a task of its own, each place with the guard that
/// removes it unless disarmed (as `enqueue_guarded` does for one place): a
/// caller that goes away while the txn is in flight leaves nothing waiting.
async fn enqueue_all_guarded(
    node: &Arc<Node>,
    specs: Arc<Vec<Spec>>,
    lease: i64,
    value: Vec<u8>,
) -> Result<(Vec<Queued>, Vec<CleanupOnDrop>), RecipeError> {
    let node = node.clone();
    let task = tokio::spawn(async move {
        let queued = match enqueue_all(&node, &specs, lease, &value).await {
            // Its txn may or may not have been applied: a second try finds
            // the places of the first (one create revision) and joins them.
            Err(RecipeError::Server(ServerError::LeaderChanged)) => enqueue_all(&node, &specs, lease, &value).await?,
            queued => queued?,
        };
        let guards = queued
            .iter()
            .zip(specs.iter())
            .map(|(place, spec)| {
                let waits = Waits { prefix: queue_prefix(&spec.name), mode: spec.mode, permits: spec.permits };
                CleanupOnDrop::new(node.clone(), &place.mine, waits)
            })
            .collect();
        Ok((queued, guards))
    });
    task.await.unwrap_or(Err(RecipeError::Server(ServerError::Stopped)))
}

/// Queue `lease` in every lock of `specs` in one txn: create the owner keys
/// unless any of them (or a place of the lease in the other mode) exists,
/// and read back each key and the front of its queue (read further, once
/// the txn is applied here, where it leaves the holders undecided:
/// `holders_from`).
async fn enqueue_all(node: &Node, specs: &[Spec], lease: i64, value: &[u8]) -> Result<Vec<Queued>, RecipeError> {
    let keys: Vec<Vec<u8>> = specs.iter().map(|s| owner_key(&s.name, lease, s.mode)).collect();
    let others: Vec<Vec<u8>> = specs.iter().map(|s| owner_key(&s.name, lease, s.mode.other())).collect();
    let range = |key: &[u8]| RequestOp::Range(RangeRequest { key: key.to_vec(), ..Default::default() });
    let mut reads = Vec::with_capacity(3 * specs.len());
    for ((spec, key), other) in specs.iter().zip(&keys).zip(&others) {
        reads.push(range(key));
        reads.push(RequestOp::Range(front_range(&queue_prefix(&spec.name), spec.permits)));
        reads.push(range(other));
    }
    let compare = keys.iter().chain(&others).map(|key| create_revision_is(key, 0)).collect();
    let puts = keys
        .iter()
        .map(|key| RequestOp::Put(PutRequest { key: key.clone(), value: value.to_vec(), lease, ..Default::default() }));
    let txn = TxnRequest { compare, success: puts.chain(reads.iter().cloned()).collect(), failure: reads };
    let result = node.txn(txn, None).await?;
    let mut ranges = result.responses.into_iter().filter_map(|r| match r {
        ResponseOp::Range(r) => Some(r),
        _ => None,
    });
    // The holders are read in this member's state once it has the txn.
    node.wait_revision(result.revision).await?;
    let mut places = Vec::with_capacity(specs.len());
    for spec in specs {
        let (mine, front, other) =
            (ranges.next().unwrap_or_default(), ranges.next().unwrap_or_default(), ranges.next().unwrap_or_default());
        if !other.kvs.is_empty() {
            return Err(RecipeError::OtherMode(spec.mode.other()));
        }
        let mvcc = node.state().mvcc();
        let front = holders_from(&mvcc, &spec.name, spec.permits, front.kvs, front.more).map_err(RecipeError::Mvcc)?;
        places.push((spec, mine.kvs.into_iter().next(), front));
    }
    if !result.succeeded {
        // A retry of this very multi-lock finds every place, made at one
        // revision; anything else is a lease queued on its own for some.
        let revision_of = |mine: &Option<KeyValue>| mine.as_ref().map(|kv| kv.create_revision);
        let first = revision_of(&places[0].1);
        if first.is_none() || places.iter().any(|(_, mine, _)| revision_of(mine) != first) {
            // The compare failed, so some place exists (the other mode's
            // were ruled out above).
            let queued = places.iter().find(|(_, mine, _)| mine.is_some()).map_or(&specs[0], |(s, _, _)| *s);
            return Err(RecipeError::PartlyQueued(queued.name.clone()));
        }
    }
    places
        .into_iter()
        .map(|(_, mine, front)| {
            // Created by the txn, or found by its failure branch: the txn is atomic.
            let mine = mine.ok_or(RecipeError::SessionExpired)?;
            Ok(Queued { mine, revision: result.revision, front, created: result.succeeded, hold_count: None })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> Spec {
        Spec { name: name.as_bytes().to_vec(), mode: Mode::Write, permits: 1 }
    }

    #[test]
    fn a_set_names_each_lock_once_and_nests_none() {
        assert_eq!(set_problem(&[spec("a"), spec("b"), spec("ab")]), None);
        assert_eq!(set_problem(&[spec("a/x"), spec("a/y")]), None, "siblings are not nested");
        assert!(set_problem(&[spec("a"), spec("b"), spec("a")]).unwrap().contains("named twice"));
        assert!(set_problem(&[spec("b"), spec("a/b/c"), spec("a")]).unwrap().contains("nested"));
        assert!(set_problem(&[spec("x"), spec("")]).unwrap().contains("not provided"));
    }
}
