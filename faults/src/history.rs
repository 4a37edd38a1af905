//! The recorded history of a fault run: what every client asked, when, and
//! what it was told.
//!
//! Every time is in nanoseconds since the run began, read from one monotonic
//! clock that all clients share, so times of different clients compare.
//! An operation is recorded from the client's side: `invoke` is taken just
//! before the request is sent and `complete` just after the answer arrives, so
//! the server-side effect lies somewhere inside `[invoke, complete]`.
//!
//! Invariants the recorder keeps: `invoke <= complete`; `complete == NEVER`
//! exactly when the outcome is [`Outcome::Unknown`]; a [`Outcome::Failed`]
//! outcome is recorded only when the request certainly had no effect (the
//! server refused it before proposing it). Everything else — timeouts, lost
//! connections, a leader change while the request was in flight — is
//! `Unknown`, because the request may still take effect later.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Nanoseconds since the run began, on one monotonic clock shared by every client.
pub type Time = u64;

/// The completion time of an operation whose outcome is unknown: it may take
/// effect at any point after its invocation, or never.
pub const NEVER: Time = u64::MAX;

/// What a client learned about one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome<T> {
    /// The request took effect and answered this.
    Ok(T),
    /// The request certainly did not take effect; the text says why.
    Failed(String),
    /// Timeout, connection lost, leader changed: the request may or may not
    /// have taken effect, at any time after it was invoked. The text says why.
    Unknown(String),
}

/// One operation of one client, from invocation to completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op<I, O> {
    pub client: usize,
    pub invoke: Time,
    /// [`NEVER`] iff `outcome` is [`Outcome::Unknown`].
    pub complete: Time,
    pub input: I,
    pub outcome: Outcome<O>,
}

/// A violated guarantee, worded for the person doing the post-mortem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// Which checker found it: "linearizable", "serializable-reads", "locks",
    /// "leases", "watches", "acknowledged-writes".
    pub checker: String,
    /// The key, lock name, lease id or watch stream it concerns.
    pub subject: String,
    /// What went wrong: the clients, times and revisions involved.
    pub what: String,
}

impl Anomaly {
    pub fn new(checker: &str, subject: impl Into<String>, what: impl Into<String>) -> Anomaly {
        Anomaly { checker: checker.to_string(), subject: subject.into(), what: what.into() }
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.checker, self.subject, self.what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anomaly_display_names_checker_and_subject() {
        let anomaly = Anomaly::new("locks", "jobs/nightly", "two holders");
        assert_eq!(anomaly.to_string(), "[locks] jobs/nightly: two holders");
    }

    #[test]
    fn op_round_trips_through_json() {
        let op: Op<u64, bool> =
            Op { client: 3, invoke: 10, complete: NEVER, input: 7, outcome: Outcome::Unknown("timeout".into()) };
        let json = serde_json::to_string(&op).expect("serializes");
        let back: Op<u64, bool> = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, op);
    }
}
