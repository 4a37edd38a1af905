//! Lock-delay time: when a lock's delay marker is deleted.
//!
//! Apply starts a lock-delay by putting the lock's marker
//! (`crate::model::lock_delay`); nobody is granted the lock while it exists.
//! Every member runs this keeper: it notes, by its own monotonic clock, when
//! it applied each marker's latest put, and while it leads, deletes a
//! marker once its delay has passed since then, with a txn guarded by the
//! marker's mod_revision (a marker put again since is not ended early by an
//! old decision).
//!
//! Never shortened: a member applies an entry only after it is committed,
//! and the involuntary end a marker records is committed in the same
//! revision, so every member's start is no earlier than the end itself,
//! and a marker is deleted no earlier than its delay after it, whichever
//! member proposes the deletion and whenever (a deposed leader's late
//! proposal included). Lengthened by: a tick ([`TICK`]) and one commit;
//! while no member leads, by the wait for a leader (an election timeout or
//! more); on a leader that restarted during the delay, by up to the whole
//! delay again (it starts the delay when it finds the marker, on loading
//! its state or a snapshot).
//!
//! Caveats: the end is the leader's decision; at most [`ENDS_PER_TICK`]
//! delays end per tick, so a mass of them that came due together ends a
//! little later; a member's answer to
//! Describe shows how long it believes is left, by its own clock. A marker
//! put by hand with a value that is no delay is deleted at the next tick.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::base::shutdown::Stopping;
use crate::model::lock_delay::{is_marker, parse_ms};
use crate::model::mvcc::{CompareResult, CompareTarget, DeleteRangeRequest, RequestOp, TxnRequest};
use crate::node::Node;

/// How often the keeper looks for delays that have passed.
pub const TICK: Duration = Duration::from_millis(50);

/// How long a proposed end may stay unanswered before it is proposed again.
const RETRY: Duration = Duration::from_secs(1);

/// The most lock-delays ended in one tick (10,000 a second): markers that
/// came due together (a fleet of holders lost at once, or markers put by
/// hand in bulk) are ended over several ticks, not as one burst of writes.
const ENDS_PER_TICK: usize = 500;

/// A marker this member knows of.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Delay {
    /// The marker's mod_revision: the put this delay runs from.
    revision: i64,
    ms: u32,
    /// When this member applied (or first saw) that put.
    since: Instant,
    /// When its end was last proposed.
    proposed: Option<Instant>,
}

/// The markers a member knows of, and when each one's delay ends.
#[derive(Default)]
struct Delays {
    by_marker: BTreeMap<Vec<u8>, Delay>,
}

impl Delays {
    /// A marker was put at `revision` (seen at `now`), or deleted.
    fn saw(&mut self, key: Vec<u8>, put: Option<(i64, u32)>, now: Instant) {
        match put {
            Some((revision, ms)) => match self.by_marker.get(&key) {
                Some(known) if known.revision == revision => {}
                _ => {
                    self.by_marker.insert(key, Delay { revision, ms, since: now, proposed: None });
                }
            },
            None => {
                self.by_marker.remove(&key);
            }
        }
    }

    /// The store was replaced: keep what is still there as it was, start
    /// what is new from `now`, forget what is gone.
    fn rescan(&mut self, live: Vec<(Vec<u8>, i64, u32)>, now: Instant) {
        let mut known = std::mem::take(&mut self.by_marker);
        for (key, revision, ms) in live {
            let delay = match known.remove(&key) {
                Some(d) if d.revision == revision => d,
                _ => Delay { revision, ms, since: now, proposed: None },
            };
            self.by_marker.insert(key, delay);
        }
    }

    /// The markers whose delay has passed at `now` and whose end is not in
    /// flight; marks them proposed.
    fn due(&mut self, now: Instant) -> Vec<(Vec<u8>, i64)> {
        let mut due = Vec::new();
        for (key, d) in &mut self.by_marker {
            if due.len() == ENDS_PER_TICK {
                break;
            }
            let passed = now >= d.since + Duration::from_millis(d.ms as u64);
            let in_flight = d.proposed.is_some_and(|at| now < at + RETRY);
            if passed && !in_flight {
                d.proposed = Some(now);
                due.push((key.clone(), d.revision));
            }
        }
        due
    }

    /// What this member believes is left of lock-delay `marker`.
    fn remaining(&self, marker: &[u8], now: Instant) -> Option<Duration> {
        let d = self.by_marker.get(marker)?;
        Some((d.since + Duration::from_millis(d.ms as u64)).saturating_duration_since(now))
    }
}

/// The keeper's shared view, for Describe.
#[derive(Default)]
pub struct DelayClock {
    delays: std::sync::Mutex<Delays>,
}

impl DelayClock {
    /// What this member believes is left of lock-delay `marker` (None: it
    /// does not know the marker yet).
    pub fn remaining(&self, marker: &[u8]) -> Option<Duration> {
        self.delays.lock().expect("delay clock poisoned").remaining(marker, Instant::now())
    }
}

/// The markers in the store now.
fn live_markers(node: &Node) -> Vec<(Vec<u8>, i64, u32)> {
    let found = node.state().mvcc().live_where(is_marker);
    found.into_iter().map(|kv| (kv.key.clone(), kv.mod_revision, parse_ms(&kv.value).unwrap_or(0))).collect()
}

/// End lock-delay `marker` (put at `revision`), unless it was put again since.
async fn end(node: Arc<Node>, marker: Vec<u8>, revision: i64) {
    let guard = super::compare(&marker, CompareTarget::Mod, CompareResult::Equal, revision);
    let delete = DeleteRangeRequest { key: marker, range_end: vec![], prev_kv: false };
    let txn = TxnRequest { compare: vec![guard], success: vec![RequestOp::DeleteRange(delete)], failure: vec![] };
    if let Err(e) = node.txn(txn, None).await {
        tracing::debug!(error = %e, "ending a lock-delay (it is proposed again)");
    }
}

/// Run the keeper of `node` until it stops, keeping `clock`.
pub async fn run(node: Arc<Node>, clock: Arc<DelayClock>, mut stopping: Stopping) {
    // Held from the start: a marker seen from now on is in the feed.
    let _ = node.state().markers().take();
    clock.delays.lock().expect("delay clock poisoned").rescan(live_markers(&node), Instant::now());
    loop {
        tokio::select! {
            _ = node.state().markers().changed() => {}
            _ = tokio::time::sleep(TICK) => {}
            _ = stopping.stopped() => return,
        }
        let (changes, resync) = node.state().markers().take();
        let now = Instant::now();
        let due = {
            let mut delays = clock.delays.lock().expect("delay clock poisoned");
            for (key, put) in changes {
                delays.saw(key, put, now);
            }
            if resync {
                delays.rescan(live_markers(&node), now);
            }
            if node.is_leader() {
                delays.due(now)
            } else {
                Vec::new()
            }
        };
        for (marker, revision) in due {
            tokio::spawn(end(node.clone(), marker, revision));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_ends_its_length_after_this_member_saw_its_latest_put() {
        let t0 = Instant::now();
        let mut d = Delays::default();
        d.saw(b"a/.lock-delay".to_vec(), Some((10, 1000)), t0);
        assert!(d.due(t0 + Duration::from_millis(999)).is_empty());
        // Put again (a second involuntary end): the delay runs from the new put.
        d.saw(b"a/.lock-delay".to_vec(), Some((12, 1000)), t0 + Duration::from_millis(500));
        assert!(d.due(t0 + Duration::from_millis(1001)).is_empty());
        let at = t0 + Duration::from_millis(1500);
        assert_eq!(d.due(at), vec![(b"a/.lock-delay".to_vec(), 12)]);
        assert!(d.due(at).is_empty(), "in flight: not proposed again at once");
        assert_eq!(d.due(at + RETRY).len(), 1, "proposed again when unanswered");
        d.saw(b"a/.lock-delay".to_vec(), None, at + RETRY);
        assert!(d.by_marker.is_empty());
    }

    #[test]
    fn a_replaced_store_keeps_known_delays_and_starts_new_ones_now() {
        let t0 = Instant::now();
        let mut d = Delays::default();
        d.saw(b"a/.lock-delay".to_vec(), Some((10, 1000)), t0);
        d.saw(b"b/.lock-delay".to_vec(), Some((11, 1000)), t0);
        let later = t0 + Duration::from_millis(800);
        d.rescan(vec![(b"a/.lock-delay".to_vec(), 10, 1000), (b"c/.lock-delay".to_vec(), 30, 1000)], later);
        assert_eq!(d.remaining(b"a/.lock-delay", later), Some(Duration::from_millis(200)));
        assert_eq!(d.remaining(b"b/.lock-delay", later), None, "gone from the store");
        assert_eq!(d.remaining(b"c/.lock-delay", later), Some(Duration::from_millis(1000)));
    }
}
