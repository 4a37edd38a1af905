//! The checkers that judge a recorded history. Each is a pure function of what
//! the harness recorded and returns the anomalies it found, worded so that a
//! person doing a post-mortem can find the operations involved:
//!
//! - [`linearizable`]: per key, a Wing–Gong search (with Lowe's memoization)
//!   for a linearization of reads, writes and compare-and-swaps on a register;
//!   and a lighter check that serializable (possibly stale) reads return only
//!   values that were written.
//! - [`locks`]: lock and semaphore safety — unique fencing tokens, mutual
//!   exclusion, tokens that grow with time, fenced writes that never land out
//!   of order, and counters that lost no increment.
//! - [`lost`]: a live holder is told, rightly and in time, when someone
//!   else deletes its lock key or revokes its lease.
//! - [`leases`]: a lease kept alive is never revoked (safety), and an abandoned
//!   lease is revoked within a bound (liveness).
//! - [`watches`]: a watch stream is ordered, unique, atomic per revision,
//!   reliable (no gap, no altered event) and honours progress notifications.
//! - [`writes`]: an acknowledged write is never lost.
//!
//! The one rule they all share: an [`Outcome::Unknown`] is never treated as
//! failed nor as succeeded, only as possible — it may have taken effect at any
//! time after its invocation, or never. A checker that cannot tell whether a
//! history is correct says so (as [`Verdict::Undecided`]) rather than report
//! an anomaly.
//!
//! [`Outcome::Unknown`]: crate::history::Outcome::Unknown

pub mod leases;
pub mod linearizable;
pub mod locks;
pub mod lost;
pub mod watches;
pub mod writes;

pub use leases::{check_leases, LeaseRecord};
pub use linearizable::{check_register, check_serializable_reads, RegisterInput, RegisterOutput, Verdict};
pub use locks::{check_locks, Counter, Grant, GuardedWrite};
pub use watches::{check_watch, EventKind, KeyValue, WatchEvent, WatchMessage, WatchStream};
pub use writes::check_acknowledged;

use crate::history::{Time, NEVER};

/// A time for a person to read: seconds since the run began, to the nanosecond.
pub(crate) fn format_time(time: Time) -> String {
    if time == NEVER {
        "never".to_string()
    } else {
        format!("{}.{:09}s", time / 1_000_000_000, time % 1_000_000_000)
    }
}

/// A TTL in whole seconds as a duration on the history's clock; a TTL of zero
/// or less (the server's "gone") is no time at all.
pub(crate) fn secs_to_time(secs: i64) -> Time {
    u64::try_from(secs).unwrap_or(0).saturating_mul(1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_seconds() {
        assert_eq!(format_time(0), "0.000000000s");
        assert_eq!(format_time(1_500_000_007), "1.500000007s");
        assert_eq!(format_time(NEVER), "never");
    }

    #[test]
    fn ttls_convert_to_nanoseconds() {
        assert_eq!(secs_to_time(3), 3_000_000_000);
        assert_eq!(secs_to_time(0), 0);
        assert_eq!(secs_to_time(-1), 0);
        assert_eq!(secs_to_time(i64::MAX), u64::MAX);
    }
}
