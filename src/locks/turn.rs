//! A queued caller's turn, and giving it up: [`enqueue_guarded`] places the
//! caller's key with a guard that removes it if the caller goes away,
//! [`wait_for_turn`] waits until the keys ahead of it leave (watching only
//! the last key ahead with one permit, so a release wakes one waiter, not
//! all), and [`give_up`] / [`CleanupOnDrop`] remove a key that will not be
//! used — by its token, so that a newer place of the same lease survives.
//!
//! Invariant: a waiter decides from the applied state it read at a
//! revision, and waits for changes after that revision, so no release
//! between the read and the watch is missed.

use std::sync::Arc;
use std::time::Instant;

use super::*;

/// [`enqueue`], guarded: the place comes with the [`CleanupOnDrop`] that
/// removes it unless disarmed. The txn runs in a task of its own, so that
/// a caller that goes away while it is in flight (a cancelled request) cannot
/// leave a place behind: the task finishes, and the guard it produced, which
/// nobody takes, removes the key. A place the lease already held comes with
/// an unarmed guard: an acquire that finds the lock held by its lease never
/// removes it.
pub async fn enqueue_guarded(node: &Arc<Node>, place: &Place<'_>) -> Result<(Queued, CleanupOnDrop), RecipeError> {
    let (node, name, value) = (node.clone(), place.name.to_vec(), place.value.to_vec());
    let place = Place { name: &[], value: &[], ..place.clone() };
    let task = tokio::spawn(async move {
        let place = Place { name: &name, value: &value, ..place };
        let queued = match enqueue(&node, &place).await {
            // Its txn may or may not have been applied: queue again (a place
            // the first try made is then joined). Not for the native API,
            // where a reentrant acquire would count a join as a second hold.
            Err(RecipeError::Server(ServerError::LeaderChanged)) if !place.native => enqueue(&node, &place).await?,
            queued => queued?,
        };
        let waits = Waits { prefix: queue_prefix(place.name), mode: place.mode, permits: place.permits };
        let guard = match !queued.created && queued.holds() {
            // The lease held the lock already: nothing of this acquire's to remove.
            true => CleanupOnDrop::unarmed(waits),
            false => CleanupOnDrop::new(node, &queued.mine, waits),
        };
        Ok((queued, guard))
    });
    task.await.unwrap_or(Err(RecipeError::Server(ServerError::Stopped)))
}

/// Where a place stands, as one applied state has it.
struct Standing {
    /// The place's key (or whatever now has that key).
    own: Option<KeyValue>,
    /// The keys queued ahead of it that a waiter of its mode waits for.
    ahead: Vec<KeyValue>,
    /// The lock's delay marker, if the lock is in a lock-delay: no turn
    /// comes until it is gone, wherever it stands in the queue.
    delay: Option<KeyValue>,
    /// The revision of that state.
    revision: i64,
}

impl Standing {
    /// Whether the turn has come, with `permits`.
    fn turn_came(&self, permits: usize) -> bool {
        self.ahead.len() < permits && self.delay.is_none()
    }
}

/// The place `key` (made with `token`) as this member's applied state has
/// it, the keys queued ahead of it under `prefix` that a `mode` waiter
/// waits for ([`classify`]) and the lock's delay marker.
fn standing(node: &Node, key: &[u8], token: i64, prefix: &[u8], mode: Mode) -> Result<Standing, RecipeError> {
    Ok(read_standing(node, key, token, prefix, mode, None)?.0)
}

/// [`standing`], reading either every key ahead (in key order), or with
/// `newest` only that many of them, newest first; and whether keys ahead
/// were left unread.
fn read_standing(
    node: &Node,
    key: &[u8],
    token: i64,
    prefix: &[u8],
    mode: Mode,
    newest: Option<i64>,
) -> Result<(Standing, bool), RecipeError> {
    let mvcc = node.state().mvcc();
    let point = |key: Vec<u8>| super::point(&mvcc, key).map_err(RecipeError::Mvcc);
    let own = point(key.to_vec())?;
    let delay = point(crate::model::lock_delay::marker_key(&prefix[..prefix.len() - 1]))?;
    let mut earlier = RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        max_create_revision: token - 1,
        keys_only: true,
        ..Default::default()
    };
    if let Some(limit) = newest {
        (earlier.sort_target, earlier.sort_order, earlier.limit) = (SortTarget::Create, SortOrder::Descend, limit);
    }
    let read = mvcc.range(&earlier).map_err(RecipeError::Mvcc)?;
    let mut ahead = read.kvs;
    ahead.retain(|kv| waits_for(mode, classify(prefix, &kv.key)));
    Ok((Standing { own, ahead, delay, revision: mvcc.revision() }, read.more))
}

/// How many keys ahead a one-permit waiter reads at first, newest first:
/// enough to pass the few that no waiter waits for (hold counts, delay
/// settings) and find the one it does.
const NEWEST_AHEAD: i64 = 8;

/// [`standing`] for a waiter with one permit, which needs only the newest
/// key ahead of it that it waits for: our key, that key, and the delay
/// marker. It reads the keys ahead newest first, a few of them (answered
/// from the store's queue index without looking at the rest); only when
/// those are all keys it does not wait for and there are more does it read
/// them all. So a waiter joining the back of a long queue does not load
/// and sort the whole queue.
fn last_ahead(
    node: &Node,
    key: &[u8],
    token: i64,
    prefix: &[u8],
    mode: Mode,
) -> Result<(Option<KeyValue>, Option<KeyValue>, Option<KeyValue>), RecipeError> {
    let (newest, more) = read_standing(node, key, token, prefix, mode, Some(NEWEST_AHEAD))?;
    if newest.ahead.is_empty() && more {
        let Standing { own, ahead, delay, .. } = standing(node, key, token, prefix, mode)?;
        return Ok((own, ahead.into_iter().max_by_key(|kv| kv.create_revision), delay));
    }
    // Newest first: the first is the one.
    let Standing { own, ahead, delay, .. } = newest;
    Ok((own, ahead.into_iter().next(), delay))
}

/// Wait until fewer than `permits` keys under `prefix` that a `mode` waiter
/// waits for ([`classify`]) were created before `mine` (it holds the lock), or
/// until `deadline` ([`RecipeError::TimedOut`]). A reader's `permits` is 1.
/// Fails if `mine` itself is deleted (its lease ended) before its turn comes.
/// Returns our key as it is when the turn came.
///
/// It reads the keys ahead in the local applied state (committed, so the
/// reading is true at that revision; later keys are created behind `mine`),
/// and waits for deletions: with one permit, of the last key ahead
/// ([`wait_for_the_last_key_ahead`]); with more, of any key ahead, counted
/// down from the changes under the prefix ([`count_down_the_keys_ahead`]). Either way it looks at
/// the store again only when the turn may have come, and that look is the
/// re-check: our key (hence our lease) is alive in the committed state in
/// which nobody is ahead of us any more.
pub async fn wait_for_turn(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let _waiting = stats::Waiting::start();
    // The key may have been queued through another member; see it here first.
    node.wait_revision(mine.mod_revision).await?;
    if permits == 1 {
        wait_for_the_last_key_ahead(node, prefix, mine, mode, deadline).await
    } else {
        count_down_the_keys_ahead(node, prefix, mine, mode, permits, deadline).await
    }
}

/// [`wait_for_turn`] with one permit: the turn cannot come before the key
/// ahead that was created last (of those a `mode` waiter waits for) is
/// deleted, so wait for that deletion (and for our own key's), then look
/// again. A release therefore wakes only the waiters that waited for that
/// key, and a write anywhere else wakes none (as etcd's client-side mutex
/// watches only the key before its own).
async fn wait_for_the_last_key_ahead(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let mut stopping = node.stopping();
    // The key ahead waited for, and the wait on it (and on our own key).
    let mut wait: Option<(Vec<u8>, crate::model::applied::DeletionWait)> = None;
    loop {
        let (own, last, delay) = last_ahead(node, &mine.key, mine.create_revision, prefix, mode)?;
        let current = match own {
            Some(kv) if kv.create_revision == mine.create_revision => kv,
            _ => return Err(RecipeError::SessionExpired),
        };
        // The last key ahead goes first; then the delay marker, if any.
        let Some(last) = last.or(delay) else {
            return Ok(current);
        };
        match &wait {
            Some((ahead, w)) if *ahead == last.key => tokio::select! {
                _ = w.deleted() => {}
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            },
            // Wait first, then look again: a deletion between the look
            // above and the registration would go unseen otherwise.
            _ => {
                let w = node.state().wait_for_deletion(vec![mine.key.clone(), last.key.clone()]);
                wait = Some((last.key, w));
            }
        }
    }
}

/// [`wait_for_turn`] with more than one permit: follow the applied changes
/// under `prefix` ([`crate::model::applied::AppliedState::follow`]) and count down
/// the deletions of keys ahead (any of them may be the one that lets us in),
/// looking at the store again only when the count says the turn has come, or
/// when changes were lost. Only a change under the prefix wakes such a waiter.
async fn count_down_the_keys_ahead(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let waits_for = |key: &[u8]| waits_for(mode, classify(prefix, key));
    let mut stopping = node.stopping();
    // Follow the keys before reading them, so that no deletion slips between.
    let inbox = node.state().follow(&KeyRange::with_prefix(prefix));
    'count: loop {
        // What is queued now shows in the look that follows.
        inbox.take();
        let standing = standing(node, &mine.key, mine.create_revision, prefix, mode)?;
        let read_at = standing.revision;
        let current = match &standing.own {
            Some(kv) if kv.create_revision == mine.create_revision => kv.clone(),
            _ => return Err(RecipeError::SessionExpired),
        };
        if standing.turn_came(permits) {
            return Ok(current);
        }
        let (mut ahead, mut delayed) = (standing.ahead.len(), standing.delay.is_some());
        while ahead >= permits || delayed {
            tokio::select! {
                _ = inbox.ready() => {}
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            }
            let taken = inbox.take();
            if taken.lost_after.is_some() {
                // Missed changes (or a snapshot replaced the store): count again.
                continue 'count;
            }
            // Changes up to `read_at` are already in the count.
            for batch in &taken.batches {
                for c in batch.changes.iter().filter(|c| c.revision > read_at) {
                    if c.key.starts_with(prefix) && classify(prefix, &c.key) == QueueKey::Delay {
                        // A lock-delay began (or began again), or ended.
                        delayed = c.kv.is_some();
                        continue;
                    }
                    if c.kv.is_some() {
                        continue;
                    }
                    if c.key == mine.key {
                        return Err(RecipeError::SessionExpired);
                    }
                    let was_ahead = c.prev.as_ref().is_some_and(|p| p.create_revision < mine.create_revision);
                    if was_ahead && c.key.starts_with(prefix) && waits_for(&c.key) {
                        ahead = ahead.saturating_sub(1);
                    }
                }
            }
        }
        // The count says the turn has come: the look that follows confirms it.
    }
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Delete `key` (one revision if it existed); returns the store revision.
pub async fn delete(node: &Node, key: &[u8]) -> Result<i64, RecipeError> {
    let req = DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
    Ok(node.delete_range(req, None).await?.revision)
}

/// What a fenced release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// The revision of the release's txn.
    pub revision: i64,
    pub released: bool,
    /// When not released: the key's create_revision now, 0 if it does not exist.
    pub current_token: i64,
}

/// How many times the removal of an abandoned place is tried while its
/// writes end with their fate unknown or find no leader (an election).
const CLEANUP_TRIES: u32 = 5;

/// Remove an abandoned place while it still waits (see [`CleanupOnDrop`]).
/// The removal is a guarded txn, so one whose fate is unknown is tried
/// again, after a pause that grows with each try.
async fn remove_abandoned(node: &Node, key: &[u8], token: i64, waits: &Waits) -> Result<(), RecipeError> {
    let mut tries = 1;
    loop {
        match give_up(node, key, token, waits).await {
            Err(RecipeError::Server(ServerError::LeaderChanged | ServerError::Timeout | ServerError::NoLeader))
                if tries < CLEANUP_TRIES =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200) * tries).await;
                tries += 1;
            }
            removed => return removed.map(|_| ()),
        }
    }
}

/// How a place in a queue waits: what [`give_up`] must find still ahead of it.
#[derive(Clone, Debug)]
pub struct Waits {
    /// The queue's prefix, `name/`.
    pub prefix: Vec<u8>,
    pub mode: Mode,
    pub permits: usize,
}

/// What [`give_up`] came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GaveUp {
    /// The place was removed (or was gone already: `released` false).
    Removed(Release),
    /// The place holds the lock: its turn came first. It is kept.
    Holds(KeyValue),
}

/// How many times [`give_up`] looks again when the queue changed under it.
const GIVE_UP_TRIES: usize = 64;

/// Remove the place `key` (made with `token`) while it still waits, never
/// once it holds: the removal is a txn guarded by `permits` keys that were
/// ahead of it (while they all exist, it waits), read linearizably just
/// before. A place whose turn has come is answered as [`GaveUp::Holds`].
pub async fn give_up(node: &Node, key: &[u8], token: i64, waits: &Waits) -> Result<GaveUp, RecipeError> {
    for _ in 0..GIVE_UP_TRIES {
        node.read_barrier().await?;
        let standing = standing(node, key, token, &waits.prefix, waits.mode)?;
        let turn_came = standing.turn_came(waits.permits);
        let Standing { own: mine, ahead, delay, revision } = standing;
        let mine = match mine {
            Some(kv) if kv.create_revision == token => kv,
            other => {
                let current_token = other.map_or(0, |kv| kv.create_revision);
                return Ok(GaveUp::Removed(Release { revision, released: false, current_token }));
            }
        };
        if turn_came {
            return Ok(GaveUp::Holds(mine));
        }
        // While these keys ahead (or the delay marker) all exist, it waits.
        let mut compare = vec![create_revision_is(key, token)];
        compare.extend(ahead.iter().take(waits.permits).map(|kv| create_revision_is(&kv.key, kv.create_revision)));
        if ahead.len() < waits.permits {
            let delay = delay.expect("no turn: keys ahead or a delay");
            compare.push(create_revision_is(&delay.key, delay.create_revision));
        }
        let delete = DeleteRangeRequest { key: key.to_vec(), range_end: vec![], prev_kv: false };
        let txn = TxnRequest { compare, success: vec![RequestOp::DeleteRange(delete)], failure: vec![] };
        let result = node.txn(txn, None).await?;
        if result.succeeded {
            return Ok(GaveUp::Removed(Release { revision: result.revision, released: true, current_token: 0 }));
        }
        // A key ahead went (or ours did): look again.
    }
    Err(RecipeError::Contended)
}

/// Removes a waiting place, unless disarmed: explicitly
/// ([`CleanupOnDrop::give_up`]) when the waiter gives up, or in the
/// background when it is dropped mid-wait (the client went away).
///
/// Either way a place is removed only while it still waits ([`give_up`]),
/// never once its turn has come: the place belongs to the lease, and another
/// acquire of the lease (a retry, say) may have joined it and been told it
/// holds, which nothing in the store records (a join writes nothing, as in
/// etcd). A place whose turn came as its caller went away stays until its
/// lease releases it or ends; a retry by the same lease is granted it.
pub struct CleanupOnDrop {
    node: Option<Arc<Node>>,
    key: Vec<u8>,
    token: i64,
    waits: Waits,
}

impl CleanupOnDrop {
    /// Armed for the place `mine`.
    pub fn new(node: Arc<Node>, mine: &KeyValue, waits: Waits) -> Self {
        CleanupOnDrop { node: Some(node), key: mine.key.clone(), token: mine.create_revision, waits }
    }

    /// A guard that removes nothing.
    fn unarmed(waits: Waits) -> Self {
        CleanupOnDrop { node: None, key: Vec::new(), token: 0, waits }
    }

    /// The wait ended with the lock; keep the key.
    pub fn disarm(mut self) {
        self.node = None;
    }

    /// The waiter gave up: remove the place now, unless its turn has come
    /// ([`give_up`]). Stays armed until that is settled, so that a failure,
    /// or this call being dropped midway, still leaves it to the background.
    pub async fn give_up(mut self) -> Result<GaveUp, RecipeError> {
        let node = self.node.clone().expect("armed until used");
        let outcome = give_up(&node, &self.key, self.token, &self.waits).await?;
        self.node = None;
        Ok(outcome)
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let (key, token, waits) = (std::mem::take(&mut self.key), self.token, self.waits.clone());
            tokio::spawn(async move {
                if let Err(e) = remove_abandoned(&node, &key, token, &waits).await {
                    tracing::warn!(error = %e, "removing an abandoned waiter's key");
                }
            });
        }
    }
}
