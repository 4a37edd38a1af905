//! Lease safety and liveness.
//!
//! Safety: a keepalive invoked at `i` and answered with TTL `t > 0` was applied
//! by the leader at some time `>= i`, and gave the lease `t` more seconds from
//! then; a new leader gives every lease a fresh full TTL, never less. So the
//! lease must live until at least `i + t` seconds. If its key is seen deleted
//! before that, the server revoked a lease its holder was keeping alive — the
//! worst bug a lock server can have, since the holder still believes it holds
//! its locks. A lease that was never abandoned, whose every keepalive was
//! answered with TTL > 0 and whose key nobody saw deleted, must still exist at
//! the end.
//!
//! Liveness: once its holder abandons it, a lease must be seen revoked by
//! `max(abandoned_at + TTL, healed_at) + revoke_bound` — it expires a TTL after
//! its last renewal, but no earlier than the cluster healed, plus the slack of
//! an election and the expiry sweep — and must not exist at the end.
//!
//! Caveats: only keepalives answered `Ok` count; an unknown keepalive may have
//! renewed the lease or not, so it neither guarantees life nor excuses death.
//! The harness must keep watching past every abandoned lease's deadline and
//! must check existence at the end before the last keepalive's TTL could
//! lapse, or these checks report what it failed to observe.

use serde::{Deserialize, Serialize};

use super::{format_time, secs_to_time};
use crate::history::{Anomaly, Op, Outcome, Time};

const CHECKER: &str = "leases";

/// Everything the run saw of one lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease: i64,
    pub client: usize,
    pub ttl_secs: i64,
    /// `Ok(ttl)` as answered; `ttl <= 0` means the server says the lease is gone.
    pub keepalives: Vec<Op<(), i64>>,
    /// When the holder stopped keeping it alive.
    pub abandoned_at: Option<Time>,
    /// When a watcher (or a read) first saw the lease's key deleted.
    pub revoked_seen_at: Option<Time>,
    pub exists_at_end: bool,
}

/// Checks every lease; `healed_at` is when the last fault was healed and
/// `revoke_bound` the slack allowed for revocation (e.g. TTL slack plus an
/// election timeout), in nanoseconds.
pub fn check_leases(leases: &[LeaseRecord], healed_at: Time, revoke_bound: Time) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for lease in leases {
        check_kept_alive(lease, &mut anomalies);
        check_answered_gone(lease, &mut anomalies);
        if let Some(abandoned_at) = lease.abandoned_at {
            check_revoked(lease, abandoned_at, healed_at, revoke_bound, &mut anomalies);
        }
    }
    anomalies
}

/// Leases are named as etcd tools print them, in hexadecimal.
fn subject(lease: &LeaseRecord) -> String {
    format!("lease {:x}", lease.lease)
}

/// A keepalive answered "gone" (TTL <= 0) although a keepalive answered
/// with a TTL before it was invoked promised life past its answer: the
/// server said the lease was gone while it had to be alive — no watcher
/// needed to see it. (Only keepalives ordered in real time count: a "gone"
/// from a leader whose own deadline passed may race with a keepalive that
/// the next leader, which restarts every TTL, answers.)
fn check_answered_gone(lease: &LeaseRecord, anomalies: &mut Vec<Anomaly>) {
    let gone = lease.keepalives.iter().filter(|k| matches!(k.outcome, Outcome::Ok(ttl) if ttl <= 0));
    for dead in gone {
        let promise = lease
            .keepalives
            .iter()
            .filter_map(|k| match k.outcome {
                Outcome::Ok(ttl) if ttl > 0 && k.complete < dead.invoke => {
                    Some((k.invoke.saturating_add(secs_to_time(ttl)), k))
                }
                _ => None,
            })
            .max_by_key(|(until, _)| *until);
        if let Some((alive_until, alive)) = promise.filter(|(until, _)| *until > dead.complete) {
            let what = format!(
                "answered gone while kept alive: client {}'s keepalive invoked at {} was answered TTL <= 0 at {}, \
                 but its keepalive invoked at {} (answered at {}) keeps the lease alive until at least {}",
                lease.client,
                format_time(dead.invoke),
                format_time(dead.complete),
                format_time(alive.invoke),
                format_time(alive.complete),
                format_time(alive_until)
            );
            anomalies.push(Anomaly::new(CHECKER, subject(lease), what));
            return;
        }
    }
}

fn check_kept_alive(lease: &LeaseRecord, anomalies: &mut Vec<Anomaly>) {
    // The keepalive that promises the longest life: (alive until, keepalive, TTL).
    let strongest = lease
        .keepalives
        .iter()
        .filter_map(|keepalive| match keepalive.outcome {
            Outcome::Ok(ttl) if ttl > 0 => Some((keepalive.invoke.saturating_add(secs_to_time(ttl)), keepalive, ttl)),
            _ => None,
        })
        .max_by_key(|&(alive_until, _, _)| alive_until);

    match (lease.revoked_seen_at, strongest) {
        (Some(seen), Some((alive_until, keepalive, ttl))) if seen < alive_until => {
            let what = format!(
                "revoked while kept alive: client {}'s lease (TTL {}s) was seen revoked at {}, but its keepalive \
                 invoked at {} (completed {}) was answered TTL {ttl}s, which keeps it alive until at least {}",
                lease.client,
                lease.ttl_secs,
                format_time(seen),
                format_time(keepalive.invoke),
                format_time(keepalive.complete),
                format_time(alive_until)
            );
            anomalies.push(Anomaly::new(CHECKER, subject(lease), what));
        }
        (None, Some(_)) if lease.abandoned_at.is_none() && !lease.exists_at_end => {
            let all_answered_alive =
                lease.keepalives.iter().all(|keepalive| matches!(keepalive.outcome, Outcome::Ok(ttl) if ttl > 0));
            if all_answered_alive {
                let last_invoked = lease.keepalives.iter().map(|keepalive| keepalive.invoke).max().unwrap_or(0);
                let what = format!(
                    "vanished: client {}'s lease (TTL {}s) was never abandoned and all {} keepalives (the last \
                     invoked at {}) were answered with a TTL > 0, yet it does not exist at the end and nobody saw \
                     it revoked",
                    lease.client,
                    lease.ttl_secs,
                    lease.keepalives.len(),
                    format_time(last_invoked)
                );
                anomalies.push(Anomaly::new(CHECKER, subject(lease), what));
            }
        }
        _ => {}
    }
}

fn check_revoked(
    lease: &LeaseRecord,
    abandoned_at: Time,
    healed_at: Time,
    revoke_bound: Time,
    anomalies: &mut Vec<Anomaly>,
) {
    let expires = abandoned_at.saturating_add(secs_to_time(lease.ttl_secs));
    let deadline = expires.max(healed_at).saturating_add(revoke_bound);
    let abandoned = format!(
        "client {}'s lease (TTL {}s) was abandoned at {} and should have been seen revoked by {} \
         (faults healed at {})",
        lease.client,
        lease.ttl_secs,
        format_time(abandoned_at),
        format_time(deadline),
        format_time(healed_at)
    );
    let mut report = |what: String| anomalies.push(Anomaly::new(CHECKER, subject(lease), what));
    match lease.revoked_seen_at {
        None if lease.exists_at_end => report(format!("never revoked: {abandoned}, yet it still exists at the end")),
        None => report(format!(
            "revocation unseen: {abandoned}; it is gone at the end, but no watcher or read saw its key deleted"
        )),
        Some(seen) => {
            if seen > deadline {
                report(format!("revoked late: {abandoned}, but was first seen revoked at {}", format_time(seen)));
            }
            if lease.exists_at_end {
                report(format!(
                    "still exists at the end: {abandoned}; its key was seen deleted at {}",
                    format_time(seen)
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Time = 1_000_000_000;

    fn keepalive(invoke: Time, outcome: Outcome<i64>) -> Op<(), i64> {
        let complete =
            if matches!(outcome, Outcome::Unknown(_)) { crate::history::NEVER } else { invoke + SECOND / 10 };
        Op { client: 1, invoke, complete, input: (), outcome }
    }

    /// A lease kept alive every second from 1s to 5s with TTL 5, then abandoned
    /// at 6s, seen revoked at 12s and gone at the end.
    fn clean_lease() -> LeaseRecord {
        LeaseRecord {
            lease: 0x694d,
            client: 1,
            ttl_secs: 5,
            keepalives: (1..=5).map(|second| keepalive(second * SECOND, Outcome::Ok(5))).collect(),
            abandoned_at: Some(6 * SECOND),
            revoked_seen_at: Some(12 * SECOND),
            exists_at_end: false,
        }
    }

    fn check(lease: LeaseRecord) -> Vec<Anomaly> {
        check_leases(&[lease], 3 * SECOND, 2 * SECOND)
    }

    #[test]
    fn a_clean_lease_passes() {
        assert_eq!(check(clean_lease()), vec![]);
        // Kept to the end and still there.
        let kept = LeaseRecord { abandoned_at: None, revoked_seen_at: None, exists_at_end: true, ..clean_lease() };
        assert_eq!(check(kept), vec![]);
    }

    #[test]
    fn answered_gone_while_kept_alive() {
        // A keepalive invoked at 5s promised life until 10s; one invoked at
        // 6s is answered "gone".
        let mut lease = clean_lease();
        lease.keepalives.push(keepalive(6 * SECOND, Outcome::Ok(0)));
        let anomalies = check(lease.clone());
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        assert!(anomalies[0].what.starts_with("answered gone while kept alive"), "{}", anomalies[0].what);
        // Gone after the promise ran out is fine.
        lease.keepalives.pop();
        lease.keepalives.push(keepalive(10 * SECOND, Outcome::Ok(0)));
        assert_eq!(check(lease.clone()), vec![]);
        // A "gone" racing with a keepalive answered by another leader is not
        // ordered in real time: no verdict.
        let racing = |invoke: Time, complete: Time, ttl: i64| Op {
            client: 1,
            invoke,
            complete,
            input: (),
            outcome: Outcome::Ok(ttl),
        };
        lease.keepalives = vec![racing(SECOND, 3 * SECOND / 2, 5), racing(6 * SECOND / 5, 13 * SECOND / 10, 0)];
        assert_eq!(check(lease), vec![]);
    }

    #[test]
    fn revoked_while_kept_alive() {
        // The keepalive invoked at 5s promised life until 10s.
        let anomalies = check(LeaseRecord { revoked_seen_at: Some(9 * SECOND), ..clean_lease() });
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        assert_eq!(anomalies[0].subject, "lease 694d");
        let what = &anomalies[0].what;
        assert!(what.starts_with("revoked while kept alive: client 1's lease (TTL 5s) was seen revoked at 9.0"));
        assert!(what.contains("invoked at 5.000000000s") && what.contains("until at least 10.000000000s"), "{what}");
        // Exactly at the promised instant is allowed.
        assert_eq!(check(LeaseRecord { revoked_seen_at: Some(10 * SECOND), ..clean_lease() }), vec![]);
    }

    #[test]
    fn only_answered_keepalives_promise_life() {
        let mut lease = LeaseRecord { revoked_seen_at: Some(9 * SECOND), ..clean_lease() };
        lease.keepalives[4] = keepalive(5 * SECOND, Outcome::Unknown("timeout".into()));
        lease.keepalives[3] = keepalive(4 * SECOND, Outcome::Unknown("connection reset".into()));
        lease.keepalives[2] = keepalive(3 * SECOND, Outcome::Failed("no leader".into()));
        // The keepalive at 2s promised life until 7s only.
        assert_eq!(check(lease), vec![]);
    }

    #[test]
    fn a_kept_lease_that_vanished() {
        let vanished = LeaseRecord { abandoned_at: None, revoked_seen_at: None, exists_at_end: false, ..clean_lease() };
        let anomalies = check(vanished.clone());
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        assert!(anomalies[0].what.starts_with("vanished: client 1's lease"), "{}", anomalies[0]);
        assert!(anomalies[0].what.contains("all 5 keepalives"), "{}", anomalies[0]);
        // A keepalive after the last promise ran out said the lease was gone:
        // it may legitimately have expired.
        let mut told = vanished;
        told.keepalives.push(keepalive(11 * SECOND, Outcome::Ok(-1)));
        assert_eq!(check(told), vec![]);
    }

    #[test]
    fn an_abandoned_lease_revoked_late() {
        // Expires at 11s; the deadline is 13s.
        let anomalies = check(LeaseRecord { revoked_seen_at: Some(14 * SECOND), ..clean_lease() });
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        assert!(anomalies[0].what.starts_with("revoked late:"), "{}", anomalies[0]);
        assert!(anomalies[0].what.contains("should have been seen revoked by 13.000000000s"), "{}", anomalies[0]);
        // A late heal moves the deadline.
        let late_heal =
            check_leases(&[LeaseRecord { revoked_seen_at: Some(14 * SECOND), ..clean_lease() }], 20 * SECOND, 0);
        assert_eq!(late_heal, vec![]);
    }

    #[test]
    fn an_abandoned_lease_never_revoked() {
        let anomalies = check(LeaseRecord { revoked_seen_at: None, exists_at_end: true, ..clean_lease() });
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        assert!(anomalies[0].what.starts_with("never revoked:"), "{}", anomalies[0]);
        let anomalies = check(LeaseRecord { revoked_seen_at: None, ..clean_lease() });
        assert!(anomalies[0].what.starts_with("revocation unseen:"), "{}", anomalies[0]);
        let anomalies = check(LeaseRecord { exists_at_end: true, ..clean_lease() });
        assert!(anomalies[0].what.starts_with("still exists at the end:"), "{}", anomalies[0]);
    }
}
