//! etcd's alarms: conditions a member raises through the log, which then hold
//! on every member until an operator disarms them.
//!
//! - `NOSPACE`: a write would have taken the state past the space quota
//!   (`--quota-backend-bytes`), or the disk refused a write for want of space.
//!   While any member's NOSPACE alarm is active, apply refuses every write that
//!   adds data — Put, a Txn with a put in either branch, LeaseGrant — with
//!   etcd's "database space exceeded"; reads, deletions, compaction and lease
//!   revocation go on, so that an operator can make room and disarm.
//! - `CORRUPT`: a member's state differs from its peers' at the same revision.
//!
//! Invariants: alarms change only by applying `Command::Alarm`, so every
//! member holds the same set; the set is part of the replicated state
//! (journaled whole, in snapshots and backups).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// What an alarm is about (etcd's `AlarmType`, but for `NONE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    NoSpace,
    Corrupt,
}

impl AlarmKind {
    /// The name etcd gives it (`etcdctl alarm list`, `/health`).
    pub fn name(self) -> &'static str {
        match self {
            AlarmKind::NoSpace => "NOSPACE",
            AlarmKind::Corrupt => "CORRUPT",
        }
    }
}

/// Raise or disarm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlarmAction {
    Activate,
    Deactivate,
}

/// The alarms raised, by member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alarms(BTreeSet<(u64, AlarmKind)>);

impl Alarms {
    /// Apply one change; returns the alarm when the set changed, or when an
    /// activation found it already raised (etcd answers with it either way).
    pub fn apply(&mut self, action: AlarmAction, member: u64, kind: AlarmKind) -> Option<(u64, AlarmKind)> {
        match action {
            AlarmAction::Activate => {
                self.0.insert((member, kind));
                Some((member, kind))
            }
            AlarmAction::Deactivate => self.0.remove(&(member, kind)).then_some((member, kind)),
        }
    }

    /// Whether any member has raised `kind`.
    pub fn any(&self, kind: AlarmKind) -> bool {
        self.0.iter().any(|(_, k)| *k == kind)
    }

    /// Every alarm, by member then kind.
    pub fn list(&self) -> Vec<(u64, AlarmKind)> {
        self.0.iter().copied().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_are_raised_per_member_and_disarmed_one_by_one() {
        let mut alarms = Alarms::default();
        assert!(!alarms.any(AlarmKind::NoSpace));
        assert_eq!(alarms.apply(AlarmAction::Activate, 2, AlarmKind::NoSpace), Some((2, AlarmKind::NoSpace)));
        assert_eq!(alarms.apply(AlarmAction::Activate, 2, AlarmKind::NoSpace), Some((2, AlarmKind::NoSpace)));
        alarms.apply(AlarmAction::Activate, 1, AlarmKind::NoSpace);
        assert_eq!(alarms.list(), vec![(1, AlarmKind::NoSpace), (2, AlarmKind::NoSpace)]);
        assert_eq!(alarms.apply(AlarmAction::Deactivate, 1, AlarmKind::Corrupt), None, "not raised");
        alarms.apply(AlarmAction::Deactivate, 1, AlarmKind::NoSpace);
        assert!(alarms.any(AlarmKind::NoSpace), "member 2's alarm still holds");
        alarms.apply(AlarmAction::Deactivate, 2, AlarmKind::NoSpace);
        assert!(alarms.is_empty());
    }
}
