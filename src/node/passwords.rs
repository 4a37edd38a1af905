//! Bounded password work: bcrypt runs at most once per core at a time, and
//! a user or an address that keeps failing is made to wait.
//!
//! bcrypt is slow on purpose (tens of milliseconds at the default cost, and
//! `--bcrypt-cost` 31 takes hours). Run on tokio's shared blocking pool with
//! no bound, a flood of Authenticate requests — which need no credentials —
//! queued every snapshot, defragmentation and file write behind it. Here:
//! - at most [`PasswordGate::new`]'s `slots` (the number of cores) bcrypt
//!   runs at once; a request that cannot get a slot within [`SLOT_WAIT`]
//!   is refused as `etcdserver: too many requests`;
//! - failures are counted per user name and per client address. After
//!   [`FREE_FAILURES`] in a row, each further failure locks that name or
//!   address out for a doubling time (1 s, 2 s, 4 s … up to
//!   [`MAX_LOCKOUT`]); while locked out, an attempt is refused at once,
//!   before any bcrypt, as too many requests. A success clears the name's
//!   and the address's count. (The lockout answers differently from a
//!   wrong password, which tells an attacker nothing about the password.)
//!
//! Invariant: no bcrypt runs outside a slot.
//!
//! Caveats: the counts are this member's own (an attacker spreading over
//! members gets each member's allowance); at most [`MAX_TRACKED_LOGIN_FAILURES`] names and
//! addresses are tracked, the oldest quiet ones forgotten first — past that
//! new ones are not counted, and the slots remain the bound on CPU.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::base::limits::MAX_TRACKED_LOGIN_FAILURES;
use tokio::sync::Semaphore;

/// How long a password check waits for a bcrypt slot.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Failures in a row before the lockouts start.
pub const FREE_FAILURES: u32 = 5;
/// The longest lockout.
pub const MAX_LOCKOUT: Duration = Duration::from_secs(60);
/// A count that has seen no failure for this long is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Why a password check did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No bcrypt slot within [`SLOT_WAIT`], or the name or address is locked out.
    TooManyRequests,
    /// The member is stopping (the blocking pool is gone).
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Who {
    User(String),
    Address(IpAddr),
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    in_a_row: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// The password checks' bounds (see the module doc).
pub struct PasswordGate {
    slots: Semaphore,
    /// [`SLOT_WAIT`]; shorter in tests.
    slot_wait: Duration,
    failures: Mutex<HashMap<Who, Failures>>,
    /// `--bcrypt-cost` for the passwords this member hashes.
    cost: u32,
}

impl PasswordGate {
    pub fn new(slots: usize, cost: u32) -> PasswordGate {
        PasswordGate { slots: Semaphore::new(slots.max(1)), slot_wait: SLOT_WAIT, failures: Mutex::default(), cost }
    }

    /// One slot per core.
    pub fn per_core(cost: u32) -> PasswordGate {
        PasswordGate::new(std::thread::available_parallelism().map_or(1, |n| n.get()), cost)
    }

    /// Whether `password` matches `hash`, for user `user` asking from
    /// `from`: refused without a check while either is locked out, and
    /// counted (see the module doc).
    pub async fn check(
        &self,
        user: &str,
        from: Option<IpAddr>,
        password: String,
        hash: String,
    ) -> Result<bool, Refused> {
        let who = [Some(Who::User(user.to_string())), from.map(Who::Address)];
        if who.iter().flatten().any(|w| self.locked_out(w)) {
            return Err(Refused::TooManyRequests);
        }
        // Looked at again once a slot is had: checks queued behind a slot
        // while the failures that lock them out were counted run no bcrypt.
        let locked = || who.iter().flatten().any(|w| self.locked_out(w));
        let matches = self.run(move || crate::model::auth::password_matches(&password, &hash), locked).await?;
        for w in who.into_iter().flatten() {
            self.record(w, matches);
        }
        Ok(matches)
    }

    /// A bcrypt hash of `password` at `--bcrypt-cost`, in a slot.
    pub async fn hash(&self, password: String) -> Result<anyhow::Result<String>, Refused> {
        let cost = self.cost;
        self.run(move || crate::model::auth::hash_password(&password, cost), || false).await
    }

    /// Run `work` (bcrypt) on the blocking pool once a slot is free, unless
    /// `refused` says by then that it must not run.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
        refused: impl FnOnce() -> bool,
    ) -> Result<T, Refused> {
        let slot = match tokio::time::timeout(self.slot_wait, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) => return Err(Refused::Stopped),
            Err(_) => return Err(Refused::TooManyRequests),
        };
        if refused() {
            return Err(Refused::TooManyRequests);
        }
        let done = tokio::task::spawn_blocking(work).await.map_err(|_| Refused::Stopped);
        drop(slot);
        done
    }

    fn locked_out(&self, who: &Who) -> bool {
        let failures = self.failures.lock().expect("password failures lock poisoned");
        failures.get(who).and_then(|f| f.locked_until).is_some_and(|until| Instant::now() < until)
    }

    fn record(&self, who: Who, matched: bool) {
        let mut failures = self.failures.lock().expect("password failures lock poisoned");
        if matched {
            failures.remove(&who);
            return;
        }
        let now = Instant::now();
        if !failures.contains_key(&who) && failures.len() >= MAX_TRACKED_LOGIN_FAILURES {
            failures.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if failures.len() >= MAX_TRACKED_LOGIN_FAILURES {
                return;
            }
        }
        let f = failures.entry(who).or_insert(Failures { in_a_row: 0, last: now, locked_until: None });
        f.in_a_row += 1;
        f.last = now;
        if f.in_a_row > FREE_FAILURES {
            f.locked_until = Some(now + lockout(f.in_a_row - FREE_FAILURES));
        }
    }
}

/// The lockout after the `n`th failure past the free ones: 1 s, doubling,
/// at most [`MAX_LOCKOUT`].
fn lockout(n: u32) -> Duration {
    Duration::from_secs(1u64 << (n - 1).min(16)).min(MAX_LOCKOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(password: &str) -> String {
        crate::model::auth::hash_password(password, 4).unwrap()
    }

    /// After the free failures a name is locked out (refused before any
    /// bcrypt, even with the right password) and so is the address; another
    /// name from another address is not; the lockouts double to a ceiling.
    #[tokio::test]
    async fn failures_lock_out_a_name_and_an_address() {
        let gate = PasswordGate::new(2, 4);
        let addr: IpAddr = "10.0.0.9".parse().unwrap();
        let other: IpAddr = "10.0.0.10".parse().unwrap();
        for _ in 0..=FREE_FAILURES {
            assert_eq!(gate.check("alice", Some(addr), "wrong".into(), hash("right")).await, Ok(false));
        }
        assert_eq!(
            gate.check("alice", Some(other), "right".into(), hash("right")).await,
            Err(Refused::TooManyRequests)
        );
        assert_eq!(gate.check("bob", Some(addr), "right".into(), hash("right")).await, Err(Refused::TooManyRequests));
        assert_eq!(gate.check("bob", Some(other), "right".into(), hash("right")).await, Ok(true));
        assert_eq!(gate.check("carol", None, "right".into(), hash("right")).await, Ok(true));
        assert_eq!(
            (lockout(1), lockout(2), lockout(7), lockout(40)),
            (Duration::from_secs(1), Duration::from_secs(2), MAX_LOCKOUT, MAX_LOCKOUT)
        );
    }

    /// A success before the lockouts start clears the count.
    #[tokio::test]
    async fn a_success_clears_the_count() {
        let gate = PasswordGate::new(1, 4);
        for _ in 0..3 {
            for _ in 0..FREE_FAILURES {
                assert_eq!(gate.check("alice", None, "wrong".into(), hash("right")).await, Ok(false));
            }
            assert_eq!(gate.check("alice", None, "right".into(), hash("right")).await, Ok(true));
        }
    }

    /// No more bcrypt runs at once than there are slots: a check that
    /// cannot get one in time is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bcrypt_runs_only_in_a_slot() {
        let gate = PasswordGate { slot_wait: Duration::from_millis(100), ..PasswordGate::new(1, 4) };
        let held = gate.slots.acquire().await.unwrap();
        assert_eq!(gate.check("alice", None, "x".into(), hash("x")).await, Err(Refused::TooManyRequests));
        drop(held);
        assert_eq!(gate.check("alice", None, "x".into(), hash("x")).await, Ok(true));
    }
}
