//! Check 11: a live holder is told when its grant is taken from it.
//!
//! A holder follows its own grant with the Rust client's
//! `Client::grant_ended` (what `Guard::lost` waits on) while someone else
//! ends the grant: a plain KV delete of its key, or a revoke of its lease.
//! Each such end is recorded with the instants the taking was invoked and
//! answered, and when (and how) the holder was told.
//!
//! Judged, for each taken grant:
//! - told, if its holder kept following for the whole bound after the
//!   taking was answered: the end is committed by then, and the holder's
//!   member applies it at once if live, ends the stream within three
//!   election timeouts if cut off from the leader, or is found dead by the
//!   client's pings if frozen; the stream is then picked up elsewhere;
//! - told within the bound ([`told_within`]);
//! - told rightly: a delete is an end by a request (`Released`), a revoke a
//!   lease's end (`LeaseEnded`); `Ended` (the cause unknown: told from
//!   history, after the stream was picked up again) fits both;
//! - not told before the taking was invoked: nothing had ended the grant.
//!
//! Caveat: "told" is what the client library concluded; the order of the
//! events on the stream (its own end before any successor's grant) is the
//! stream's own invariant, tested where the stream is built
//! (`locks::observe`).

use serde::{Deserialize, Serialize};

use super::format_time;
use crate::history::{Anomaly, Time};

const CHECKER: &str = "lost";

/// How a grant was taken from its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Taken {
    /// Its key was deleted by a KV request.
    Deleted,
    /// Its lease was revoked.
    Revoked,
}

/// A grant taken from a live holder that followed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostGrant {
    pub name: String,
    pub client: usize,
    pub token: i64,
    pub taken: Taken,
    /// When the delete or revoke was invoked, and when it was answered.
    pub taken_invoked: Time,
    pub taken_at: Time,
    /// When the client told the holder its grant ended, and how (the lock
    /// event's kind name); `None`: not told while it followed.
    pub told_at: Option<Time>,
    pub told_kind: String,
    /// Until when the holder followed the grant.
    pub followed_until: Time,
}

/// The bound, in ns, for a fault run with leases of `ttl_s` seconds,
/// election timeouts of `election_ms` and the client's pings
/// (`ping_ms` + `ping_timeout_ms`): a cut-off member ends its streams after
/// three election timeouts; a frozen one is found by a ping unanswered;
/// one more second for the client to pick the stream up again elsewhere.
pub fn told_within(ttl_s: u64, election_ms: u64, ping_ms: u64, ping_timeout_ms: u64) -> u64 {
    let ms = ttl_s * 1000 + (3 * election_ms).max(ping_ms + ping_timeout_ms) + 1000;
    ms * 1_000_000
}

/// Check 11 over every taken grant (see the module doc).
pub fn check_lost(lost: &[LostGrant], bound: u64) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for l in lost {
        let who =
            format!("client {}'s grant (token {}), {:?} at {}", l.client, l.token, l.taken, format_time(l.taken_at));
        let deadline = l.taken_at + bound;
        let what = match l.told_at {
            None if l.followed_until >= deadline => Some(format!(
                "{who}, was never told to its holder, which followed it until {}",
                format_time(l.followed_until)
            )),
            None => None,
            Some(told) if told < l.taken_invoked => Some(format!(
                "{who}, was told ended ({}) at {}, before anything ended it (invoked {})",
                l.told_kind,
                format_time(told),
                format_time(l.taken_invoked)
            )),
            Some(told) if told > deadline => Some(format!(
                "{who}, was told to its holder {} ms after, over the bound of {} ms",
                (told - l.taken_at) / 1_000_000,
                bound / 1_000_000
            )),
            Some(_) => {
                let fits = match l.taken {
                    Taken::Deleted => ["Released", "Ended"],
                    Taken::Revoked => ["LeaseEnded", "Ended"],
                };
                (!fits.contains(&l.told_kind.as_str())).then(|| format!("{who}, was told as {}", l.told_kind))
            }
        };
        if let Some(what) = what {
            anomalies.push(Anomaly::new(CHECKER, &l.name, what));
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Time = 1_000_000;

    fn lost(taken: Taken, told_at: Option<Time>, kind: &str, followed_until: Time) -> LostGrant {
        LostGrant {
            name: "lock/0".into(),
            client: 16,
            token: 40,
            taken,
            taken_invoked: 100 * MS,
            taken_at: 110 * MS,
            told_at,
            told_kind: kind.into(),
            followed_until,
        }
    }

    #[test]
    fn the_bound_is_the_ttl_and_the_slower_way_to_find_a_member_gone() {
        assert_eq!(told_within(3, 1000, 6000, 3000), (3000 + 9000 + 1000) * MS);
        assert_eq!(told_within(3, 4000, 6000, 3000), (3000 + 12000 + 1000) * MS);
    }

    #[test]
    fn a_holder_told_in_time_and_rightly_passes() {
        let bound = 1000 * MS;
        let ok = [
            lost(Taken::Deleted, Some(112 * MS), "Released", 112 * MS),
            lost(Taken::Deleted, Some(900 * MS), "Ended", 900 * MS),
            lost(Taken::Revoked, Some(111 * MS), "LeaseEnded", 111 * MS),
            // Told while the delete was in flight: it may have been applied.
            lost(Taken::Revoked, Some(105 * MS), "LeaseEnded", 105 * MS),
            // Not followed for the whole bound (the run ended): nothing claimed.
            lost(Taken::Deleted, None, "", 600 * MS),
        ];
        assert!(check_lost(&ok, bound).is_empty());
    }

    #[test]
    fn known_bad_histories_are_found() {
        let bound = 1000 * MS;
        let cases = [
            (lost(Taken::Deleted, None, "", 1200 * MS), "never told"),
            (lost(Taken::Deleted, Some(1500 * MS), "Released", 1500 * MS), "over the bound"),
            (lost(Taken::Deleted, Some(50 * MS), "Released", 50 * MS), "before anything ended it"),
            (lost(Taken::Deleted, Some(120 * MS), "LeaseEnded", 120 * MS), "told as LeaseEnded"),
            (lost(Taken::Revoked, Some(120 * MS), "Released", 120 * MS), "told as Released"),
        ];
        for (history, expected) in cases {
            let found = check_lost(std::slice::from_ref(&history), bound);
            assert_eq!(found.len(), 1, "{history:?}");
            assert!(found[0].what.contains(expected), "{}: {}", expected, found[0].what);
            assert_eq!(found[0].checker, "lost");
        }
    }
}
