//! What each request needs from the auth store, as etcd decides it:
//!
//! - Put: WRITE on the key; READ on it too with `prev_kv`; with a lease, WRITE
//!   on every key already attached to that lease (whoever may not write them
//!   may not revoke the lease, so may not tie a key to it).
//! - DeleteRange: WRITE on the range; READ on it too with `prev_kv`.
//! - Txn: READ on every compare's range, then every op of both branches as
//!   above (inside a txn a put's `prev_kv` needs no READ, as in etcd; its
//!   lease's keys do need WRITE, which etcd 3.5.1 forgets), nested txns
//!   included.
//! - LeaseRevoke: WRITE on every attached key. LeaseGrant: an authenticated
//!   user (etcd asks for nothing; raftlock refuses anonymous grants, which
//!   could fill the space quota for everyone).
//! - Compact and every auth change: a `root` user (etcd's admin).
//!
//! Used by apply for `Command::AsUser` (against the store as it stands then)
//! and by the API layer for what it serves itself (read-only txns).

use super::{AuthError, AuthStore, Caller, PermKind};
use crate::model::command::UserCommand;
use crate::model::lease::LeaseTable;
use crate::model::mvcc::{RequestOp, TxnRequest};

/// May `caller` have `cmd` applied? Always, while auth is off.
pub fn check_command(
    auth: &AuthStore,
    caller: &Caller,
    cmd: &UserCommand,
    leases: &LeaseTable,
) -> Result<(), AuthError> {
    if !auth.enabled {
        return Ok(());
    }
    match cmd {
        UserCommand::Put(put) => {
            auth.check(caller, &put.key, &[], PermKind::Write)?;
            check_lease_keys(auth, caller, put.lease, leases)?;
            if put.prev_kv {
                auth.check(caller, &put.key, &[], PermKind::Read)?;
            }
            Ok(())
        }
        UserCommand::DeleteRange(del) => {
            auth.check(caller, &del.key, &del.range_end, PermKind::Write)?;
            if del.prev_kv {
                auth.check(caller, &del.key, &del.range_end, PermKind::Read)?;
            }
            Ok(())
        }
        UserCommand::Txn(txn) => check_txn(auth, caller, txn, leases),
        UserCommand::LeaseGrant { .. } => auth.check_user(caller),
        UserCommand::LeaseRevoke { id } => check_lease_keys(auth, caller, *id, leases),
        UserCommand::Compact { .. } => auth.check_admin(caller),
        UserCommand::Auth(a) if a.needs_admin() => auth.check_admin(caller),
        UserCommand::Auth(_) => Ok(()),
    }
}

/// WRITE on every key attached to lease `id` (none for no lease, or one
/// that does not exist). With auth off, nothing to check: the lease's keys
/// are not walked (a keepalive or Lock on a lease with many keys paid for
/// the walk).
pub fn check_lease_keys(auth: &AuthStore, caller: &Caller, id: i64, leases: &LeaseTable) -> Result<(), AuthError> {
    if id == 0 || !auth.enabled {
        return Ok(());
    }
    match leases.get(id) {
        Some(lease) => lease.keys.iter().try_for_each(|k| auth.check(caller, k, &[], PermKind::Write)),
        None => Ok(()),
    }
}

/// READ on every compare, then each op of both branches, recursively.
pub fn check_txn(auth: &AuthStore, caller: &Caller, txn: &TxnRequest, leases: &LeaseTable) -> Result<(), AuthError> {
    if !auth.enabled {
        return Ok(());
    }
    for c in &txn.compare {
        auth.check(caller, &c.key, &c.range_end, PermKind::Read)?;
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(r) => auth.check(caller, &r.key, &r.range_end, PermKind::Read)?,
            RequestOp::Put(p) => {
                auth.check(caller, &p.key, &[], PermKind::Write)?;
                check_lease_keys(auth, caller, p.lease, leases)?;
            }
            RequestOp::DeleteRange(d) => {
                if d.prev_kv {
                    auth.check(caller, &d.key, &d.range_end, PermKind::Read)?;
                }
                auth.check(caller, &d.key, &d.range_end, PermKind::Write)?;
            }
            RequestOp::Txn(t) => check_txn(auth, caller, t, leases)?,
        }
    }
    Ok(())
}
