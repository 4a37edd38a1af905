//! A queued caller's turn, and giving it up: [`enqueue_guarded`] places the
//! caller's key with a guard that removes it if the caller goes away,
//! [`wait_for_turn`] waits until the keys ahead of it leave (watching only
//! the newest `permits` keys ahead, so a release wakes the waiters right
//! behind the released key, not all), and [`give_up`] / [`CleanupOnDrop`]
//! remove a key that will not be used — by its token, so that a newer place
//! of the same lease survives.
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

/// How many keys ahead, beyond its permits, a waiter reads at first,
/// newest first: enough to pass the few that no waiter waits for (hold
/// counts, delay settings) and find those it does.
const NEWEST_AHEAD: i64 = 8;

/// [`standing`] for a waiter with `permits`, which needs only the newest
/// `permits` keys ahead of it that it waits for: while those all exist, at
/// least `permits` are ahead, and its turn cannot come. It reads the keys
/// ahead newest first, a few of them (answered from the store's queue index
/// without looking at the rest); only when those hold fewer than `permits`
/// that it waits for and there are more does it read them all. So `ahead`
/// holds at most `permits` keys, newest first; fewer only when fewer are
/// ahead (the turn has come, unless a lock-delay holds it), and a waiter
/// joining the back of a long queue does not load and sort the whole queue.
fn newest_standing(
    node: &Node,
    key: &[u8],
    token: i64,
    prefix: &[u8],
    mode: Mode,
    permits: usize,
) -> Result<Standing, RecipeError> {
    let window = Some(permits as i64 + NEWEST_AHEAD);
    let (mut newest, more) = read_standing(node, key, token, prefix, mode, window)?;
    if newest.ahead.len() < permits && more {
        newest = standing(node, key, token, prefix, mode)?;
        newest.ahead.sort_by_key(|kv| std::cmp::Reverse(kv.create_revision));
    }
    newest.ahead.truncate(permits);
    Ok(newest)
}

/// Wait until fewer than `permits` keys under `prefix` that a `mode` waiter
/// waits for ([`classify`]) were created before `mine` (it holds the lock), or
/// until `deadline` ([`RecipeError::TimedOut`]). A reader's `permits` is 1.
/// Fails if `mine` itself is deleted (its lease ended) before its turn comes.
/// Returns our key as it is when the turn came.
///
/// It reads the keys ahead in the local applied state (committed, so the
/// reading is true at that revision; later keys are created behind `mine`),
/// and waits for the deletion of the newest `permits` of them
/// ([`wait_for_the_newest_keys_ahead`]). It looks at the store again only
/// when one of those went, and that look is the re-check: our key (hence
/// our lease) is alive in the committed state in which fewer than `permits`
/// are ahead of us.
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
    wait_for_the_newest_keys_ahead(node, prefix, mine, mode, permits.max(1), deadline).await
}

/// [`wait_for_turn`]: the turn cannot come while the newest `permits` keys
/// ahead (of those a `mode` waiter waits for) all exist, since each of them
/// is ahead and keys created later are behind. So wait for the deletion of
/// one of them (or of our own key), then look again. A release therefore
/// wakes only the waiters that have the released key among their newest
/// `permits` ahead (with one permit, the one waiter right behind it, as
/// etcd's client-side mutex watches only the key before its own), and a
/// write anywhere else wakes none. Once fewer than `permits` are ahead, a
/// lock-delay marker is waited out the same way.
async fn wait_for_the_newest_keys_ahead(
    node: &Node,
    prefix: &[u8],
    mine: &KeyValue,
    mode: Mode,
    permits: usize,
    deadline: Option<Instant>,
) -> Result<KeyValue, RecipeError> {
    let mut stopping = node.stopping();
    // The keys waited for, and the wait on them (and on our own key).
    let mut wait: Option<(Vec<Vec<u8>>, crate::model::applied::DeletionWait)> = None;
    loop {
        let Standing { own, ahead, delay, .. } =
            newest_standing(node, &mine.key, mine.create_revision, prefix, mode, permits)?;
        let current = match own {
            Some(kv) if kv.create_revision == mine.create_revision => kv,
            _ => return Err(RecipeError::SessionExpired),
        };
        // The keys ahead go first; then the delay marker, if any.
        let waited: Vec<Vec<u8>> = match (ahead.len() >= permits, delay) {
            (true, _) => ahead.into_iter().map(|kv| kv.key).collect(),
            (false, Some(delay)) => vec![delay.key],
            (false, None) => return Ok(current),
        };
        match &wait {
            Some((keys, w)) if *keys == waited => tokio::select! {
                _ = w.deleted() => {}
                _ = stopping.stopped() => return Err(ServerError::Stopped.into()),
                _ = until(deadline) => return Err(RecipeError::TimedOut),
            },
            // Wait first, then look again: a deletion between the look
            // above and the registration would go unseen otherwise.
            _ => {
                let keys = std::iter::once(mine.key.clone()).chain(waited.iter().cloned()).collect();
                wait = Some((waited, node.state().wait_for_deletion(keys)));
            }
        }
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
        let standing = newest_standing(node, key, token, &waits.prefix, waits.mode, waits.permits)?;
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
