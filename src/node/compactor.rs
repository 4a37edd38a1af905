//! Auto compaction (`--auto-compaction-mode`, `--auto-compaction-retention`),
//! with etcd's semantics, run by the leader only:
//!
//! - periodic, retention `P`: every `min(P, 1h) / 10` every member notes the
//!   store's revision; once it has noted for `P`, and then every `min(P, 1h)`,
//!   the leader compacts to the newest revision noted at least `P` ago — so
//!   about `P` of history is kept. Every member samples, so that leadership
//!   moving (a rolling restart) does not start the period over.
//! - revision, retention `N`: every check interval (etcd's: 5 minutes) it
//!   compacts to `current revision - N`, if that moved since the last time.
//!
//! This module also runs the sweeper ([`sweep`]): a compaction, once
//! applied, only moves the compaction revision, and the sweeper then removes
//! the unreadable versions a few thousand keys at a time, releasing the
//! store's lock between steps so that no apply or read waits long behind it.
//!
//! A compaction is an ordinary write (`Node::compact`) replicated to every
//! member. Invariants: only a leader proposes one; a revision already
//! compacted is never proposed again (a refusal — another compaction got
//! there first — is logged and forgotten). Caveat: a restarted member has
//! noted nothing, so as leader it waits out a whole `P` before its first
//! periodic compaction.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Node;
use crate::base::shutdown::Stopping;
use crate::config::AutoCompaction;
use crate::model::mvcc::Revision;

/// The longest a periodic compactor waits between compactions (etcd's).
const MAX_PERIODIC_INTERVAL: Duration = Duration::from_secs(3600);

/// Keys the sweeper looks at per hold of the store's write lock: a few
/// milliseconds of work.
const SWEEP_KEYS: usize = 8192;

/// Remove compacted versions whenever a compaction asks for it, until the
/// node stops.
pub async fn sweep(node: Arc<Node>, mut stopping: Stopping) {
    loop {
        // A compaction restored from the journal or a snapshot may have
        // left work too: look before waiting.
        while node.state().mvcc_mut().sweep(SWEEP_KEYS) {
            tokio::task::yield_now().await;
        }
        tokio::select! {
            _ = stopping.stopped() => return,
            _ = node.state().sweep_requested() => {}
        }
    }
}

/// Wait until this member has applied a compaction at `revision` or later
/// (if one is named) and every version a compaction made unreadable is
/// gone: etcd's `physical` compaction waits with its revision, Defragment
/// with none.
pub async fn swept(node: &Node, revision: Option<Revision>) {
    while {
        let mvcc = node.state().mvcc();
        revision.is_some_and(|r| mvcc.compact_revision() < r) || mvcc.sweep_pending()
    } {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Run auto compaction under `policy` until the node stops.
pub async fn run(node: Arc<Node>, policy: AutoCompaction, mut stopping: Stopping) {
    tracing::info!(?policy, "auto compaction on");
    let tick = match policy {
        AutoCompaction::Periodic(period) => period.min(MAX_PERIODIC_INTERVAL) / 10,
        AutoCompaction::Revision { every, .. } => every,
    }
    .max(Duration::from_millis(10));
    let mut schedule = Schedule::default();
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopping.stopped() => return,
            _ = ticks.tick() => {}
        }
        let (current, compacted) = {
            let mvcc = node.state().mvcc();
            (mvcc.revision(), mvcc.compact_revision())
        };
        let now = Instant::now();
        schedule.sample(policy, now, current);
        if !node.is_leader() {
            continue;
        }
        let Some(target) = schedule.next(policy, now, current) else { continue };
        if target <= compacted {
            continue;
        }
        match node.compact(target, None).await {
            Ok(_) => tracing::info!(revision = target, "auto compaction done"),
            Err(e) => tracing::info!(revision = target, error = %e, "auto compaction not done"),
        }
    }
}

/// What the compactor remembers between ticks.
#[derive(Default)]
struct Schedule {
    /// Since when this member has been taking samples.
    since: Option<Instant>,
    /// Revisions noted (periodic), oldest first.
    samples: VecDeque<(Instant, Revision)>,
    /// When the last compaction was proposed (periodic), and to what revision.
    last: Option<(Instant, Revision)>,
}

impl Schedule {
    /// Note the store's revision (periodic mode), on every member.
    fn sample(&mut self, policy: AutoCompaction, now: Instant, current: Revision) {
        self.since.get_or_insert(now);
        if let AutoCompaction::Periodic(period) = policy {
            self.samples.push_back((now, current));
            // Keep what the next compaction may need: the newest sample at
            // least `period` old, and everything after it.
            let old = self.samples.iter().rposition(|(at, _)| now.duration_since(*at) >= period).unwrap_or(0);
            self.samples.drain(..old);
        }
    }

    /// The revision the leader compacts to now, if one is due.
    fn next(&mut self, policy: AutoCompaction, now: Instant, current: Revision) -> Option<Revision> {
        let since = *self.since.get_or_insert(now);
        match policy {
            AutoCompaction::Revision { keep, .. } => {
                let target = current - keep;
                let moved = self.last.is_none_or(|(_, last)| target > last);
                (target > 0 && moved).then(|| {
                    self.last = Some((now, target));
                    target
                })
            }
            AutoCompaction::Periodic(period) => {
                let due = match self.last {
                    None => now.duration_since(since) >= period,
                    Some((at, _)) => now.duration_since(at) >= period.min(MAX_PERIODIC_INTERVAL),
                };
                if !due {
                    return None;
                }
                // The newest revision noted at least `period` ago; older
                // samples are no longer needed.
                let old_enough = self.samples.iter().rposition(|(at, _)| now.duration_since(*at) >= period)?;
                self.samples.drain(..old_enough);
                let target = self.samples.front().map(|(_, rev)| *rev)?;
                self.last = Some((now, target));
                Some(target)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_compaction_keeps_the_retention_period() {
        let period = Duration::from_secs(10);
        let policy = AutoCompaction::Periodic(period);
        let start = Instant::now();
        let mut s = Schedule::default();
        let at = |secs: u64| start + Duration::from_secs(secs);
        // A sample a second, the revision growing by 100 a second.
        let tick = |s: &mut Schedule, t: u64, leads: bool| {
            let rev = 100 * t as i64 + 1;
            s.sample(policy, at(t), rev);
            if leads {
                s.next(policy, at(t), rev)
            } else {
                None
            }
        };
        // Sampled as a follower for 7 s, then leader: the period counts from
        // the first sample, not from the leadership.
        for t in 0..7 {
            tick(&mut s, t, false);
        }
        for t in 7..10 {
            assert_eq!(tick(&mut s, t, true), None, "not sampled for a period yet ({t}s)");
        }
        assert_eq!(tick(&mut s, 10, true), Some(1), "the revision of 10 s ago");
        for t in 11..20 {
            assert_eq!(tick(&mut s, t, true), None, "one compaction a period");
        }
        assert_eq!(tick(&mut s, 20, true), Some(1001));
    }

    #[test]
    fn revision_compaction_keeps_the_last_revisions() {
        let policy = AutoCompaction::Revision { keep: 100, every: Duration::from_secs(300) };
        let now = Instant::now();
        let mut s = Schedule::default();
        assert_eq!(s.next(policy, now, 50), None, "fewer revisions than kept");
        assert_eq!(s.next(policy, now, 350), Some(250));
        assert_eq!(s.next(policy, now, 350), None, "nothing new since");
        assert_eq!(s.next(policy, now, 351), Some(251));
    }
}
