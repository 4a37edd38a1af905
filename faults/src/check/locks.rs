//! Lock and semaphore safety, judged from what the clients saw.
//!
//! A grant is recorded from its holder's side: `granted_at` when the acquire
//! returned, `released_at` when the release was invoked (or the run ended). On
//! the server the hold began no later and ended no earlier, so the client-side
//! interval lies inside the server-side one, and two client-side intervals
//! that overlap prove that the server's did. That holds only while the lease
//! was kept: a holder whose lease lapsed may believe it holds a lock the
//! server has already given away, which is what fencing tokens are for — so
//! mutual exclusion is judged on kept grants only, and fencing on all writes.
//!
//! Checks, per name:
//! 1. the fencing tokens of grants are unique;
//! 2. mutual exclusion: at no instant do more than `permits` kept grants
//!    overlap, or a kept shared (read) grant overlap a kept exclusive one
//!    (intervals that merely touch do not overlap: the shared clock cannot
//!    order a release and a grant read at the same nanosecond);
//! 3. token order: a grant whose acquire was invoked after another grant was
//!    released has the greater token (the token is its key's create revision,
//!    and that key was created after the other was);
//! 4. fencing: successful guarded writes, in revision order, carry
//!    non-decreasing tokens on a mutex (a stale holder's write never lands
//!    after a newer holder's), and no two share a revision;
//! 5. no lost update: a counter's final value is at least its acknowledged
//!    increments and at most those plus the unknown ones;
//! 6. stable reads: a reader that read the counter twice, each read in a txn
//!    guarded by its grant, read the same value both times. Its lease needs no
//!    proof here: the guards show its key, with its token, existed at both
//!    reads, so it held the lock in between, and no writer may have written;
//! 7. reentrancy: a kept holder that acquired its lock again (reentrantly)
//!    got the same token with two holds, and giving one back left one;
//! 8. validation: `Validate` never answered "current" for an exclusive grant
//!    of a mutex whose successor (a grant of the same name with a greater
//!    token) had already been granted when the Validate was invoked. The
//!    successor's `granted_at` is when its acquire returned, so the server
//!    granted it earlier still, and a linearizable Validate invoked after
//!    that must see the earlier grant gone;
//! 9. lock-delay: after a grant that asked for a lock-delay of D ended
//!    involuntarily (its holder revoked its lease without releasing, or
//!    found its key gone when it released), the next grant of the name (the
//!    least greater token) was not granted within D of that end. The end is
//!    known only from below — no earlier than the last instant the holder
//!    knew its grant alive (`ended_after`) — and a grant no later than when
//!    its acquire returned, so `granted_at < ended_after + D` proves a grant
//!    inside the delay;
//! 10. liveness of multi-locks: once the faults had healed and every other
//!    lock client had stopped, each multi-lock client's last multi-lock was
//!    granted within its wait (a deadlock between sets, or a place or a
//!    lock-delay that never goes, would leave it waiting).
//!
//! Caveat: fencing order is judged only for names whose grants say they are
//! mutexes (`permits == 1`) or that have no recorded grant; a semaphore lets
//! several holders write in any order. Grants of one name must agree on
//! `permits`; when they do not, that is reported and the largest is used.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::format_time;
use crate::history::{Anomaly, Outcome, Time};

const CHECKER: &str = "locks";

/// One successful acquire of a lock or semaphore, and how long it was held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub name: String,
    pub client: usize,
    /// 1 for a mutex, N for a semaphore of N.
    pub permits: usize,
    /// Fencing token: the create revision of the holder's key.
    pub token: i64,
    pub acquire_invoked: Time,
    /// When the acquire completed.
    pub granted_at: Time,
    /// When the release was invoked, or the end of the run.
    pub released_at: Time,
    /// True iff the holder's lease was never lost during the hold: every
    /// keepalive answered TTL > 0 and its guarded writes did not find it deposed.
    pub kept: bool,
    /// A read lock's grant: shared with other readers, not with writers.
    #[serde(default)]
    pub shared: bool,
    /// One lock of a multi-lock's grant (the set's other grants have the
    /// same token and interval).
    #[serde(default)]
    pub multi: bool,
    /// The lock-delay the grant asked for, in ms (0: none).
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// Set when the grant ended involuntarily: an instant before its end
    /// (the last its holder knew it alive), for check 9.
    #[serde(default)]
    pub ended_after: Option<Time>,
}

/// A reader's two reads of the counter, each guarded by its fencing token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedRead {
    pub name: String,
    pub client: usize,
    pub token: i64,
    pub first: u64,
    pub second: u64,
}

/// A holder acquiring its lock again, reentrantly, then giving one hold back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reentry {
    pub name: String,
    pub client: usize,
    pub token: i64,
    /// What the reentrant acquire answered.
    pub token_again: i64,
    pub holds_after_acquire: u32,
    /// What the release of that hold answered: holds left.
    pub holds_after_release: u32,
    /// As [`Grant::kept`].
    pub kept: bool,
}

/// A write to the protected resource, guarded by the writer's fencing token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardedWrite {
    pub name: String,
    pub client: usize,
    pub token: i64,
    /// Header revision of a successful write; 0 otherwise.
    pub revision: i64,
    /// `Ok(true)`: written; `Ok(false)`: the guard refused (stale holder).
    pub outcome: Outcome<bool>,
}

/// A counter incremented under a lock; a lost increment is a lost update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub name: String,
    pub final_value: u64,
    pub increments_ok: u64,
    pub increments_unknown: u64,
}

/// A holder asking `Validate` about its own exclusive grant of a mutex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Validation {
    pub name: String,
    pub client: usize,
    pub token: i64,
    pub invoked: Time,
    pub completed: Time,
    /// What it answered.
    pub current: bool,
}

/// A multi-lock client's last multi-lock, asked for after the faults healed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    pub client: usize,
    pub names: Vec<String>,
    pub invoked: Time,
    pub completed: Time,
    pub granted: bool,
    /// Why it was not granted.
    pub why: String,
}

/// What the lock clients recorded, for [`check_locks`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Recorded<'a> {
    pub grants: &'a [Grant],
    pub writes: &'a [GuardedWrite],
    pub counters: &'a [Counter],
    pub reads: &'a [SharedRead],
    pub reentries: &'a [Reentry],
    pub validations: &'a [Validation],
    pub liveness: &'a [Liveness],
}

/// Runs every lock check; see the module documentation.
pub fn check_locks(recorded: Recorded<'_>) -> Vec<Anomaly> {
    let Recorded { grants, writes, counters, reads, reentries, validations, liveness } = recorded;
    let mut anomalies = Vec::new();

    let mut grants_by_name: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        grants_by_name.entry(&grant.name).or_default().push(grant);
    }
    let mut permits_by_name = BTreeMap::new();
    for (&name, grants) in &grants_by_name {
        let permits = agreed_permits(name, grants, &mut anomalies);
        permits_by_name.insert(name, permits);
        check_unique_tokens(name, grants, &mut anomalies);
        let well_formed: Vec<&Grant> =
            grants.iter().copied().filter(|grant| is_well_formed(grant, &mut anomalies)).collect();
        check_exclusion(name, permits, &well_formed, &mut anomalies);
        check_token_order(name, &well_formed, &mut anomalies);
    }

    let mut writes_by_name: BTreeMap<&str, Vec<&GuardedWrite>> = BTreeMap::new();
    for write in writes {
        writes_by_name.entry(&write.name).or_default().push(write);
    }
    for (&name, writes) in &writes_by_name {
        let is_mutex = permits_by_name.get(name).is_none_or(|&permits| permits == 1);
        check_fencing(name, is_mutex, writes, &mut anomalies);
    }

    for counter in counters {
        check_counter(counter, &mut anomalies);
    }
    for read in reads.iter().filter(|read| read.first != read.second) {
        let what = format!(
            "a write landed while client {} held a read lock (token {}): it read the counter as {}, then as {}",
            read.client, read.token, read.first, read.second
        );
        anomalies.push(Anomaly::new(CHECKER, &read.name, what));
    }
    for r in reentries.iter().filter(|r| r.kept) {
        if r.token_again != r.token || r.holds_after_acquire != 2 || r.holds_after_release != 1 {
            let what = format!(
                "client {}'s reentrant acquire of its grant (token {}) answered token {} with {} holds, and \
                 giving that hold back left {} (expected the same token, 2, then 1)",
                r.client, r.token, r.token_again, r.holds_after_acquire, r.holds_after_release
            );
            anomalies.push(Anomaly::new(CHECKER, &r.name, what));
        }
    }
    for (&name, grants) in &grants_by_name {
        check_lock_delay(name, grants, &mut anomalies);
    }
    for probe in liveness.iter().filter(|p| !p.granted) {
        let what = format!(
            "client {}'s multi-lock of {:?}, invoked {} after the faults healed and the other clients stopped, was \
             not granted within {} ms: {}",
            probe.client,
            probe.names,
            format_time(probe.invoked),
            probe.completed.saturating_sub(probe.invoked) / 1_000_000,
            probe.why
        );
        anomalies.push(Anomaly::new(CHECKER, &probe.names.join("+"), what));
    }
    for v in validations.iter().filter(|v| v.current) {
        if permits_by_name.get(v.name.as_str()).is_some_and(|&permits| permits != 1) {
            continue;
        }
        let successors = grants_by_name.get(v.name.as_str()).into_iter().flatten();
        if let Some(next) = successors.filter(|g| g.token > v.token && g.granted_at < v.invoked).min_by_key(|g| g.token)
        {
            let what = format!(
                "Validate of client {}'s grant (token {}), invoked {}, answered current, but {} had been granted \
                 before it",
                v.client,
                v.token,
                format_time(v.invoked),
                describe(next)
            );
            anomalies.push(Anomaly::new(CHECKER, &v.name, what));
        }
    }
    anomalies
}

/// Check 9 (see the module doc).
fn check_lock_delay(name: &str, grants: &[&Grant], anomalies: &mut Vec<Anomaly>) {
    for ended in grants.iter().filter(|g| g.lock_delay_ms > 0 && !g.shared) {
        let Some(end) = ended.ended_after else { continue };
        let Some(next) = grants.iter().filter(|g| g.token > ended.token).min_by_key(|g| g.token) else { continue };
        let delay_ends = end + ended.lock_delay_ms * 1_000_000;
        if next.granted_at < delay_ends {
            let what = format!(
                "{} was granted {} ms after {} ended involuntarily (it was alive at {}), inside its lock-delay of {} ms",
                describe(next),
                next.granted_at.saturating_sub(end) / 1_000_000,
                describe(ended),
                format_time(end),
                ended.lock_delay_ms
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
        }
    }
}

fn describe(grant: &Grant) -> String {
    format!(
        "client {}'s {}grant (token {}, acquire invoked {}, granted {}, released {}{})",
        grant.client,
        if grant.shared { "read " } else { "" },
        grant.token,
        format_time(grant.acquire_invoked),
        format_time(grant.granted_at),
        format_time(grant.released_at),
        if grant.kept { "" } else { ", lease lost during the hold" }
    )
}

/// The permits of a name: what its grants say, or the largest if they disagree.
fn agreed_permits(name: &str, grants: &[&Grant], anomalies: &mut Vec<Anomaly>) -> usize {
    let permits: BTreeSet<usize> = grants.iter().map(|grant| grant.permits).collect();
    if permits.len() > 1 {
        let what = format!(
            "grants disagree on the number of permits ({permits:?}); every user of a name must use the same, \
             so judging with the largest"
        );
        anomalies.push(Anomaly::new(CHECKER, name, what));
    }
    permits.last().copied().unwrap_or(1)
}

fn is_well_formed(grant: &Grant, anomalies: &mut Vec<Anomaly>) -> bool {
    let ordered = grant.acquire_invoked <= grant.granted_at && grant.granted_at <= grant.released_at;
    if !ordered {
        let what = format!("malformed grant record (harness bug): {}: times out of order", describe(grant));
        anomalies.push(Anomaly::new(CHECKER, &grant.name, what));
    }
    ordered
}

fn check_unique_tokens(name: &str, grants: &[&Grant], anomalies: &mut Vec<Anomaly>) {
    let mut first_with_token: BTreeMap<i64, &Grant> = BTreeMap::new();
    for &grant in grants {
        if let Some(first) = first_with_token.insert(grant.token, grant) {
            let what = format!(
                "fencing token {} was handed out twice: {} and {}",
                grant.token,
                describe(first),
                describe(grant)
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
            first_with_token.insert(grant.token, first);
        }
    }
}

fn check_exclusion(name: &str, permits: usize, grants: &[&Grant], anomalies: &mut Vec<Anomaly>) {
    // (time, is a grant, which): at equal times releases (false) come first,
    // so intervals that touch do not overlap.
    let mut events: Vec<(Time, bool, usize)> = Vec::with_capacity(2 * grants.len());
    for (index, grant) in grants.iter().enumerate().filter(|(_, grant)| grant.kept) {
        events.push((grant.granted_at, true, index));
        events.push((grant.released_at, false, index));
    }
    events.sort_unstable();
    let mut holders: BTreeSet<usize> = BTreeSet::new();
    for (_, is_grant, index) in events {
        if !is_grant {
            holders.remove(&index);
            continue;
        }
        let excluded = if grants[index].shared {
            holders.iter().any(|&holder| !grants[holder].shared)
        } else {
            holders.len() >= permits
        };
        if excluded {
            let others: Vec<String> = holders.iter().map(|&holder| describe(grants[holder])).collect();
            let what = format!(
                "mutual exclusion violated (permits {permits}): {} began while {} other kept grant(s) still held \
                 it: {}",
                describe(grants[index]),
                others.len(),
                others.join("; ")
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
        }
        holders.insert(index);
    }
}

fn check_token_order(name: &str, grants: &[&Grant], anomalies: &mut Vec<Anomaly>) {
    let mut by_release: Vec<&Grant> = grants.to_vec();
    by_release.sort_by_key(|grant| grant.released_at);
    // highest[i]: the grant with the highest token among the first i + 1 released.
    let mut highest: Vec<&Grant> = Vec::with_capacity(by_release.len());
    for &grant in &by_release {
        let best = match highest.last() {
            Some(&best) if best.token >= grant.token => best,
            _ => grant,
        };
        highest.push(best);
    }
    for &later in grants {
        let released_before = by_release.partition_point(|earlier| earlier.released_at < later.acquire_invoked);
        let Some(&earlier) = released_before.checked_sub(1).and_then(|last| highest.get(last)) else { continue };
        if earlier.token >= later.token {
            let what = format!(
                "fencing tokens went backwards: {} was acquired after {} was released, yet its token is not greater",
                describe(later),
                describe(earlier)
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
        }
    }
}

fn check_fencing(name: &str, is_mutex: bool, writes: &[&GuardedWrite], anomalies: &mut Vec<Anomaly>) {
    let describe_write = |write: &GuardedWrite| format!("client {}'s write with token {}", write.client, write.token);
    let mut landed: Vec<&GuardedWrite> = Vec::new();
    for &write in writes.iter().filter(|write| write.outcome == Outcome::Ok(true)) {
        if write.revision > 0 {
            landed.push(write);
        } else {
            let what = format!(
                "malformed write record (harness bug): {} succeeded but has no revision ({})",
                describe_write(write),
                write.revision
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
        }
    }
    landed.sort_by_key(|write| write.revision);
    for pair in landed.windows(2) {
        if pair[0].revision == pair[1].revision {
            let what = format!(
                "two successful writes share revision {}: {} and {}",
                pair[0].revision,
                describe_write(pair[0]),
                describe_write(pair[1])
            );
            anomalies.push(Anomaly::new(CHECKER, name, what));
        }
    }
    if !is_mutex {
        return;
    }
    let mut newest: Option<&GuardedWrite> = None;
    for &write in &landed {
        match newest {
            Some(newer) if write.token < newer.token => {
                let what = format!(
                    "fencing failed: {} landed at revision {}, after {} had landed at revision {}: a stale \
                     holder wrote after a newer one",
                    describe_write(write),
                    write.revision,
                    describe_write(newer),
                    newer.revision
                );
                anomalies.push(Anomaly::new(CHECKER, name, what));
            }
            _ => newest = Some(write),
        }
    }
}

fn check_counter(counter: &Counter, anomalies: &mut Vec<Anomaly>) {
    let most = counter.increments_ok.saturating_add(counter.increments_unknown);
    let what = if counter.final_value < counter.increments_ok {
        format!(
            "lost update: the counter ended at {} but {} increments were acknowledged",
            counter.final_value, counter.increments_ok
        )
    } else if counter.final_value > most {
        format!(
            "phantom update: the counter ended at {} but only {} increments were acknowledged and {} unknown",
            counter.final_value, counter.increments_ok, counter.increments_unknown
        )
    } else {
        return;
    };
    anomalies.push(Anomaly::new(CHECKER, &counter.name, what));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(
        name: &str,
        client: usize,
        token: i64,
        acquire_invoked: Time,
        granted_at: Time,
        released_at: Time,
    ) -> Grant {
        Grant {
            name: name.into(),
            client,
            permits: 1,
            token,
            acquire_invoked,
            granted_at,
            released_at,
            kept: true,
            shared: false,
            multi: false,
            lock_delay_ms: 0,
            ended_after: None,
        }
    }

    /// A grant with a lock-delay of 1 s that ended involuntarily after `end`.
    fn delayed_and_lost(token: i64, granted_at: Time, end: Time) -> Grant {
        Grant { lock_delay_ms: 1000, ended_after: Some(end), kept: false, ..grant("d", 0, token, 0, granted_at, end) }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_multi_lock_not_granted_after_the_faults_healed_is_found() {
        let probe = |granted| Liveness {
            client: 12,
            names: vec!["lock/0".into(), "lock/1".into()],
            invoked: 0,
            completed: 20_000 * MS,
            granted,
            why: if granted { String::new() } else { "not acquired within the wait".into() },
        };
        let found = check_locks(Recorded { liveness: &[probe(true), probe(false)], ..Default::default() });
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("not granted within 20000 ms"), "{found:?}");
    }

    #[test]
    fn a_grant_inside_a_lock_delay_is_found() {
        let lost = delayed_and_lost(5, 10 * MS, 100 * MS);
        let inside = grant("d", 1, 9, 20 * MS, 600 * MS, 700 * MS);
        let found = check_locks(Recorded { grants: &[lost.clone(), inside], ..Default::default() });
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("inside its lock-delay of 1000 ms"), "{found:?}");
        // Granted after the delay: fine. So is one inside it after a release (no end recorded).
        let after = grant("d", 1, 9, 20 * MS, 1101 * MS, 1200 * MS);
        assert!(check_locks(Recorded { grants: &[lost.clone(), after], ..Default::default() }).is_empty());
        let released = Grant { ended_after: None, ..lost.clone() };
        let inside = grant("d", 1, 9, 20 * MS, 600 * MS, 700 * MS);
        assert!(check_locks(Recorded { grants: &[released, inside.clone()], ..Default::default() }).is_empty());
        // Only the next grant is judged against the end: a later one came after it anyway.
        let next = grant("d", 1, 9, 20 * MS, 1150 * MS, 1160 * MS);
        let later = grant("d", 2, 12, 20 * MS, 1170 * MS, 1180 * MS);
        assert!(check_locks(Recorded { grants: &[lost, next, later], ..Default::default() }).is_empty());
    }

    fn validation(token: i64, invoked: Time, current: bool) -> Validation {
        Validation { name: "a".into(), client: 0, token, invoked, completed: invoked + 1, current }
    }

    #[test]
    fn validate_answering_current_after_a_successor_was_granted_is_found() {
        let grants = [grant("a", 0, 10, 0, 5, 20), grant("a", 1, 12, 3, 25, 40)];
        let check =
            |validations: &[Validation]| check_locks(Recorded { grants: &grants, validations, ..Default::default() });
        // Current while it held, not current after: fine.
        assert!(check(&[validation(10, 10, true), validation(10, 30, false)]).is_empty());
        // Current, but invoked when the grant had ended and the next been
        // granted: the later grant is named.
        let anomaly = only(check(&[validation(10, 30, true)]));
        assert!(anomaly.what.contains("token 10") && anomaly.what.contains("token 12"), "{}", anomaly.what);
        // Invoked before the successor's acquire returned: it may still have
        // been current, so nothing is claimed.
        assert!(check(&[validation(10, 24, true)]).is_empty());
        // A semaphore's validations are not judged.
        let mut sem = grants.clone();
        sem.iter_mut().for_each(|g| g.permits = 2);
        assert!(check_locks(Recorded { grants: &sem, validations: &[validation(10, 30, true)], ..Default::default() })
            .is_empty());
    }

    fn check(grants: &[Grant], writes: &[GuardedWrite], counters: &[Counter]) -> Vec<Anomaly> {
        check_locks(Recorded { grants, writes, counters, ..Default::default() })
    }

    fn reader(name: &str, client: usize, token: i64, granted_at: Time, released_at: Time) -> Grant {
        Grant { shared: true, ..grant(name, client, token, 0, granted_at, released_at) }
    }

    fn landed(name: &str, client: usize, token: i64, revision: i64) -> GuardedWrite {
        GuardedWrite { name: name.into(), client, token, revision, outcome: Outcome::Ok(true) }
    }

    fn counter(final_value: u64, increments_ok: u64, increments_unknown: u64) -> Counter {
        Counter { name: "hits".into(), final_value, increments_ok, increments_unknown }
    }

    fn only(anomalies: Vec<Anomaly>) -> Anomaly {
        assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
        let anomaly = anomalies.into_iter().next().expect("one anomaly");
        assert_eq!(anomaly.checker, "locks");
        anomaly
    }

    #[test]
    fn a_clean_run_passes() {
        let mut semaphore: Vec<Grant> =
            (0..3).map(|client| grant("sem", client, 100 + client as i64, 0, 10, 50)).collect();
        for grant in &mut semaphore {
            grant.permits = 3;
        }
        let grants = [
            vec![
                grant("a", 0, 10, 0, 5, 20),
                // Touches the previous hold: released and granted at one instant.
                grant("a", 1, 12, 3, 20, 40),
                grant("a", 2, 15, 41, 45, 60),
                grant("b", 0, 11, 0, 5, 30),
            ],
            semaphore,
        ]
        .concat();
        let writes = [
            landed("a", 0, 10, 13),
            landed("a", 1, 12, 14),
            landed("a", 1, 12, 16),
            GuardedWrite { outcome: Outcome::Ok(false), ..landed("a", 0, 10, 0) },
            GuardedWrite { outcome: Outcome::Unknown("timeout".into()), ..landed("a", 0, 10, 0) },
            landed("a", 2, 15, 17),
            // A semaphore's holders write in any order.
            landed("sem", 2, 102, 20),
            landed("sem", 0, 100, 21),
        ];
        let counters = [counter(10, 10, 0), counter(12, 10, 3)];
        assert_eq!(check(&grants, &writes, &counters), vec![]);
    }

    #[test]
    fn duplicate_tokens() {
        // Acquires that overlap, so that token order says nothing.
        let anomaly = only(check(&[grant("a", 0, 10, 0, 5, 20), grant("a", 1, 10, 3, 35, 40)], &[], &[]));
        assert!(anomaly.what.contains("token 10 was handed out twice"), "{anomaly}");
        assert!(anomaly.what.contains("client 0's grant") && anomaly.what.contains("client 1's grant"), "{anomaly}");
        // The same token under another name is fine.
        assert_eq!(check(&[grant("a", 0, 10, 0, 5, 20), grant("b", 1, 10, 0, 5, 20)], &[], &[]), vec![]);
    }

    #[test]
    fn overlapping_mutex_holders() {
        let grants = [grant("a", 0, 10, 0, 5, 20), grant("a", 1, 12, 3, 19, 40)];
        let anomaly = only(check(&grants, &[], &[]));
        assert_eq!(anomaly.subject, "a");
        assert!(anomaly.what.contains("mutual exclusion violated (permits 1)"), "{anomaly}");
        assert!(anomaly
            .what
            .contains("client 1's grant (token 12, acquire invoked 0.000000003s, granted 0.000000019s"));
        assert!(anomaly.what.contains("client 0's grant (token 10"), "{anomaly}");
    }

    #[test]
    fn overlap_with_a_lost_lease_is_not_a_violation() {
        let grants = [Grant { kept: false, ..grant("a", 0, 10, 0, 5, 20) }, grant("a", 1, 12, 3, 10, 40)];
        assert_eq!(check(&grants, &[], &[]), vec![]);
    }

    #[test]
    fn semaphore_over_its_permits() {
        let grants: Vec<Grant> =
            (0..3).map(|client| Grant { permits: 2, ..grant("sem", client, 10 + client as i64, 0, 5, 50) }).collect();
        let anomaly = only(check(&grants, &[], &[]));
        assert!(anomaly.what.contains("(permits 2)") && anomaly.what.contains("2 other kept grant(s)"), "{anomaly}");
    }

    #[test]
    fn tokens_going_backwards() {
        let grants = [grant("a", 0, 20, 0, 5, 20), grant("a", 1, 15, 30, 35, 40)];
        let anomaly = only(check(&grants, &[], &[]));
        assert!(anomaly.what.contains("fencing tokens went backwards: client 1's grant (token 15"), "{anomaly}");
        // Overlapping acquires may be granted in either order.
        let concurrent = [grant("a", 0, 20, 10, 15, 20), grant("a", 1, 15, 0, 5, 8)];
        assert_eq!(check(&concurrent, &[], &[]), vec![]);
    }

    #[test]
    fn stale_holder_write_lands_after_newer_one() {
        let writes = [landed("a", 1, 12, 14), landed("a", 0, 10, 15)];
        let anomaly = only(check(&[], &writes, &[]));
        assert!(anomaly.what.contains("client 0's write with token 10 landed at revision 15"), "{anomaly}");
        assert!(anomaly.what.contains("client 1's write with token 12 had landed at revision 14"), "{anomaly}");
    }

    #[test]
    fn two_writes_at_one_revision() {
        let anomaly = only(check(&[], &[landed("a", 0, 10, 14), landed("a", 1, 12, 14)], &[]));
        assert!(anomaly.what.contains("share revision 14"), "{anomaly}");
    }

    #[test]
    fn successful_write_without_revision_is_a_harness_bug() {
        let anomaly = only(check(&[], &[landed("a", 0, 10, 0)], &[]));
        assert!(anomaly.what.contains("harness bug"), "{anomaly}");
    }

    #[test]
    fn lost_and_phantom_increments() {
        let anomaly = only(check(&[], &[], &[counter(9, 10, 5)]));
        assert!(anomaly.what.contains("lost update: the counter ended at 9 but 10"), "{anomaly}");
        assert_eq!(anomaly.subject, "hits");
        let anomaly = only(check(&[], &[], &[counter(16, 10, 5)]));
        assert!(anomaly.what.contains("phantom update"), "{anomaly}");
    }

    #[test]
    fn disagreeing_permits_and_malformed_grants() {
        let grants = [grant("a", 0, 10, 0, 5, 20), Grant { permits: 2, ..grant("a", 1, 12, 30, 35, 40) }];
        let anomaly = only(check(&grants, &[], &[]));
        assert!(anomaly.what.contains("disagree on the number of permits"), "{anomaly}");
        let anomaly = only(check(&[grant("a", 0, 10, 0, 30, 20)], &[], &[]));
        assert!(anomaly.what.contains("malformed grant record"), "{anomaly}");
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        // Three readers overlap; a writer before and after them.
        let grants = [
            grant("rw", 0, 10, 0, 5, 10),
            reader("rw", 1, 11, 10, 30),
            reader("rw", 2, 12, 12, 25),
            reader("rw", 3, 13, 20, 40),
            grant("rw", 4, 14, 0, 40, 50),
        ];
        assert_eq!(check(&grants, &[], &[]), vec![]);
        // A writer granted while a reader holds.
        let anomaly = only(check(&[reader("rw", 1, 11, 10, 30), grant("rw", 4, 14, 0, 20, 50)], &[], &[]));
        assert!(
            anomaly.what.contains("client 4's grant") && anomaly.what.contains("client 1's read grant"),
            "{anomaly}"
        );
        // A reader granted while a writer holds.
        let anomaly = only(check(&[grant("rw", 4, 14, 0, 20, 50), reader("rw", 1, 15, 30, 60)], &[], &[]));
        assert!(anomaly.what.contains("client 1's read grant (token 15"), "{anomaly}");
        // Not if the writer's lease was lost.
        let lost = Grant { kept: false, ..grant("rw", 4, 14, 0, 20, 50) };
        assert_eq!(check(&[lost, reader("rw", 1, 15, 30, 60)], &[], &[]), vec![]);
    }

    #[test]
    fn a_write_under_a_read_lock_and_a_wrong_reentry() {
        let read = SharedRead { name: "rw".into(), client: 1, token: 11, first: 4, second: 4 };
        let moved = SharedRead { second: 5, ..read.clone() };
        let reads = [read, moved];
        let anomalies = check_locks(Recorded { reads: &reads, ..Default::default() });
        let anomaly = only(anomalies);
        assert!(anomaly.what.contains("read the counter as 4, then as 5"), "{anomaly}");

        let good = Reentry {
            name: "rw".into(),
            client: 2,
            token: 20,
            token_again: 20,
            holds_after_acquire: 2,
            holds_after_release: 1,
            kept: true,
        };
        let wrong = [
            Reentry { token_again: 21, ..good.clone() },
            Reentry { holds_after_acquire: 1, ..good.clone() },
            Reentry { holds_after_release: 0, ..good.clone() },
        ];
        assert_eq!(check_locks(Recorded { reentries: std::slice::from_ref(&good), ..Default::default() }), vec![]);
        for r in wrong {
            let anomaly = only(check_locks(Recorded { reentries: &[r], ..Default::default() }));
            assert!(anomaly.what.contains("reentrant acquire"), "{anomaly}");
        }
        let unkept = Reentry { holds_after_release: 0, kept: false, ..good };
        assert_eq!(check_locks(Recorded { reentries: &[unkept], ..Default::default() }), vec![]);
    }
}
