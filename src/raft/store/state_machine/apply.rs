//! The deterministic apply: what one committed command does to the applied
//! state, and what that call must persist and publish. No openraft, no
//! storage, no clock, no randomness — every member computes the same result
//! from the same entry, which is what lets a member replay its log after a
//! crash and arrive where the others are.
//!
//! A deterministic failure (a compacted revision, an unknown lease) is a
//! result (`CommandResult::Rejected`) with the store unchanged. Each command
//! is answered with its own result variant or `Rejected` (the node's typed
//! writes rely on it).
//!
//! Lock order is the state's (`crate::model::applied`): a lease-table guard taken
//! while the MVCC store is locked is dropped before [`Apply::record`] locks
//! the table again.

use std::sync::Arc;

use crate::model::alarm::AlarmKind;
use crate::model::applied::{AppliedState, MemberAttrs};
use crate::model::auth::{AuthCommand, Caller, TokenEffect};
use crate::model::command::{Command, CommandResult};
use crate::model::mvcc::{Change, MvccError, MvccStore, SharedVersion};
use crate::raft::store::state_machine::layout::JournalOp;

/// One apply call's work on `state`: what it changed, to be persisted
/// (`journal`) and published to watchers (`published`) once the call ends.
pub(super) struct Apply<'a> {
    state: &'a AppliedState,
    pub journal: Vec<JournalOp<SharedVersion>>,
    pub published: Vec<Change>,
    /// The revisions at which a lease's end deleted its keys, ascending
    /// (`AppliedChanges::lease_ended`).
    pub lease_ended: Vec<i64>,
    /// This member's ID, by which it finds its own forwarded writes (None:
    /// it answers none).
    me: Option<u64>,
    /// The results of this member's forwarded writes, by tag, for their
    /// waiters (`raft::write::forwarded`) once the call ends.
    pub answered: Vec<(u64, CommandResult)>,
}

impl<'a> Apply<'a> {
    pub fn new(state: &'a AppliedState, me: Option<u64>) -> Apply<'a> {
        Apply { state, journal: Vec::new(), published: Vec::new(), lease_ended: Vec::new(), me, answered: Vec::new() }
    }

    /// Apply one command of an entry appended in `term`; `is_member` tells
    /// whether a member ID is in the configuration applied so far.
    pub fn command(&mut self, cmd: Command, term: u64, is_member: &dyn Fn(u64) -> bool) -> CommandResult {
        if let Command::Batch(shared) = cmd {
            // The log's copy of the entry usually still holds the batch: its
            // commands are copied here, as apply moves their keys and values
            // into the store.
            let cmds = Arc::unwrap_or_clone(shared);
            // Batches are never nested: a nested one is refused whole,
            // never run (see `malformed`).
            return CommandResult::Batch(
                cmds.into_iter()
                    .map(|c| match c {
                        Command::Batch(_) => self.malformed(),
                        c => self.command(c, term, is_member),
                    })
                    .collect(),
            );
        }
        if let Command::Forwarded { origin, tag, command } = cmd {
            // A forwarded write is one command.
            let result = match *command {
                Command::Batch(_) | Command::Forwarded { .. } => self.malformed(),
                command => self.command(command, term, is_member),
            };
            // Its own member answers it; the leader only needs to know that
            // it was applied (`raft::peer::server`).
            if self.me == Some(origin) {
                self.answered.push((tag, result));
                return CommandResult::Empty;
            }
            return result;
        }
        if let Command::AsUser { user, auth_revision, command } = cmd {
            // While auth is off (the common case) nothing needs checking.
            let enabled = self.state.auth().enabled;
            let refused = if !enabled {
                None
            } else {
                let (leases, auth) = (self.state.leases(), self.state.auth());
                let caller = Caller { user, revision: auth_revision };
                crate::model::auth::checks::check_command(&auth, &caller, &command, &leases).err()
            };
            return match refused {
                Some(error) => CommandResult::Denied { error, revision: self.state.mvcc().revision() },
                None => self.command(command.into(), term, is_member),
            };
        }
        if let Command::Auth(cmd) = cmd {
            return self.auth(cmd);
        }
        if let Command::Alarm { action, member, kind } = cmd {
            let revision = self.state.mvcc().revision();
            let mut alarms = self.state.alarms_mut();
            let alarm = alarms.apply(action, member, kind);
            self.journal.push(JournalOp::Alarms(alarms.clone()));
            return CommandResult::Alarm { alarm, revision };
        }
        // While a NOSPACE alarm is raised, nothing that adds data is applied.
        let adds_data = match &cmd {
            Command::Put(_) | Command::LeaseGrant { .. } => true,
            Command::Txn(t) => t.quota_cost() > 0,
            _ => false,
        };
        if adds_data && self.state.alarms().any(AlarmKind::NoSpace) {
            return CommandResult::Rejected { error: MvccError::NoSpace, revision: self.state.mvcc().revision() };
        }
        let state = self.state;
        let m = crate::base::metrics::metrics();
        match &cmd {
            Command::Put(_) => m.puts.inc(),
            Command::DeleteRange(_) => m.deletes.inc(),
            Command::Txn(_) => m.txns.inc(),
            _ => {}
        }
        let expiry = matches!(cmd, Command::LeaseExpire { .. });
        let mut mvcc = state.mvcc_mut();
        let rejected = |error, mvcc: &MvccStore| CommandResult::Rejected { error, revision: mvcc.revision() };
        match cmd {
            Command::Put(req) => {
                // The lease guard must be gone before `record` locks the table.
                let outcome = mvcc.put(req, &*state.leases());
                match outcome {
                    Ok((result, changes)) => {
                        self.record(changes);
                        CommandResult::Put(result)
                    }
                    Err(e) => rejected(e, &mvcc),
                }
            }
            Command::DeleteRange(req) => {
                let (result, changes) = mvcc.delete_range(&req);
                self.record(changes);
                CommandResult::DeleteRange(result)
            }
            Command::Txn(req) => {
                let outcome = mvcc.txn(&req, &*state.leases());
                match outcome {
                    Ok((result, changes)) => {
                        self.record(changes);
                        CommandResult::Txn(result)
                    }
                    Err(e) => rejected(e, &mvcc),
                }
            }
            Command::LeaseGrant { id, ttl } => {
                if state.leases_mut().grant(id, ttl) {
                    m.leases_granted.inc();
                    self.journal.push(JournalOp::LeaseGrant { id, ttl });
                    CommandResult::LeaseGranted { id, ttl, revision: mvcc.revision() }
                } else {
                    rejected(MvccError::LeaseExists, &mvcc)
                }
            }
            Command::LeaseExpire { term: decided_in, .. } if decided_in != term => {
                CommandResult::ExpiryOfAnotherTerm { revision: mvcc.revision() }
            }
            Command::LeaseRevoke { id } | Command::LeaseExpire { id, .. } => {
                let keys = state.leases_mut().revoke(id);
                match keys {
                    Some(keys) => {
                        m.leases_revoked.inc();
                        if expiry {
                            m.leases_expired.inc();
                        }
                        self.journal.push(JournalOp::LeaseRevoke(id));
                        let (revision, changes) = mvcc.delete_keys(&keys);
                        if !changes.is_empty() {
                            self.lease_ended.push(revision);
                        }
                        self.record(changes);
                        CommandResult::LeaseRevoked { revision }
                    }
                    None => rejected(MvccError::LeaseNotFound, &mvcc),
                }
            }
            Command::Compact { revision } => match mvcc.compact(revision) {
                Ok(()) => {
                    self.state.compacted();
                    self.journal.push(JournalOp::Compact(revision));
                    CommandResult::Compacted { revision: mvcc.revision() }
                }
                Err(e) => rejected(e, &mvcc),
            },
            Command::PublishMember { id, name, client_urls } => {
                // A publish that commits after its member was removed is
                // void: a member added back must start as a new one.
                if is_member(id) {
                    let attrs = MemberAttrs { name, client_urls };
                    self.journal.push(JournalOp::Member(id, attrs.clone()));
                    state.members_mut().insert(id, attrs);
                }
                CommandResult::MemberPublished { revision: mvcc.revision() }
            }
            Command::Batch(_)
            | Command::Forwarded { .. }
            | Command::AsUser { .. }
            | Command::Auth(_)
            | Command::Alarm { .. } => {
                unreachable!("handled above")
            }
        }
    }

    /// The answer to a command this code never proposes (it can reach the
    /// log only from a hostile or broken peer): nothing runs, and every
    /// member answers the same. Apply must be total: a panic here would
    /// stop every member at the same entry, and again at every restart.
    fn malformed(&self) -> CommandResult {
        CommandResult::Rejected { error: MvccError::Malformed, revision: self.state.mvcc().revision() }
    }

    /// An auth change: the store changes (and is journaled whole: it is
    /// small), and this member's tokens follow.
    fn auth(&mut self, cmd: AuthCommand) -> CommandResult {
        let revision = self.state.mvcc().revision();
        let mut auth = self.state.auth_mut();
        let effect = match auth.apply(cmd) {
            Ok(effect) => effect,
            Err(error) => return CommandResult::Denied { error, revision },
        };
        let tokens = self.state.tokens();
        match effect {
            TokenEffect::None => {}
            TokenEffect::ForgetAll => tokens.forget_all(),
            TokenEffect::ForgetUser(user) => tokens.forget_user(&user),
            // Handing out a token changes nothing replicated.
            TokenEffect::Assign { token, user } => {
                tokens.assign(token, user);
                return CommandResult::AuthChanged { revision };
            }
        }
        self.journal.push(JournalOp::Auth(auth.clone()));
        CommandResult::AuthChanged { revision }
    }

    /// A new configuration was applied: a member that left forgets what it
    /// published, so that, added again, it is a new member (see
    /// `node::members::refuse_if_bootstrapped`).
    pub fn configuration(&mut self, is_member: &dyn Fn(u64) -> bool) {
        let mut members = self.state.members_mut();
        let gone: Vec<u64> = members.keys().copied().filter(|id| !is_member(*id)).collect();
        for id in gone {
            members.remove(&id);
            self.journal.push(JournalOp::MemberGone(id));
        }
    }

    /// Record a write's changes: in the journal, in the lease table's
    /// attachments, and for the watchers.
    fn record(&mut self, changes: Vec<Change>) {
        self.state.leases_mut().track(&changes);
        self.journal.extend(changes.iter().map(|c| JournalOp::Version(SharedVersion::of_change(c))));
        self.published.extend(changes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvcc::PutRequest;

    fn everyone(_: u64) -> bool {
        true
    }

    /// An expiry counts only in the term it was decided in: a deposed
    /// leader's expiry, appended by the next leader in a later term, is void.
    #[test]
    fn an_expiry_is_applied_only_in_the_term_that_decided_it() {
        let state = AppliedState::default();
        let mut apply = Apply::new(&state, None);
        apply.command(Command::LeaseGrant { id: 7, ttl: 5 }, 1, &everyone);
        let attached = PutRequest { key: "held".into(), value: "v".into(), lease: 7, ..Default::default() };
        apply.command(Command::Put(attached), 1, &everyone);
        let stale = apply.command(Command::LeaseExpire { id: 7, term: 1 }, 2, &everyone);
        assert_eq!(stale, CommandResult::ExpiryOfAnotherTerm { revision: 2 });
        assert!(state.leases().get(7).is_some(), "the lease outlived a stale expiry");
        let batch = Command::Batch(Arc::new(vec![Command::LeaseExpire { id: 7, term: 2 }]));
        let current = apply.command(batch, 2, &everyone);
        assert_eq!(current, CommandResult::Batch(vec![CommandResult::LeaseRevoked { revision: 3 }]));
        assert!(state.leases().get(7).is_none());
        assert_eq!(apply.published.len(), 2, "the put and the deletion of its key");
    }

    /// A forwarded write is applied as its command on every member; only
    /// the member it came from keeps the result, for its waiter.
    #[test]
    fn a_forwarded_write_is_answered_by_the_member_it_came_from() {
        let forwarded = || Command::Forwarded {
            origin: 2,
            tag: 40,
            command: Box::new(Command::Put(PutRequest { key: "k".into(), value: "v".into(), ..Default::default() })),
        };
        let (leader, origin) = (AppliedState::default(), AppliedState::default());
        let mut on_leader = Apply::new(&leader, Some(1));
        let result = on_leader.command(Command::Batch(Arc::new(vec![forwarded()])), 1, &everyone);
        let CommandResult::Batch(results) = result else { panic!("a batch result") };
        assert!(matches!(&results[..], [CommandResult::Put(p)] if p.revision == 2), "{results:?}");
        assert!(on_leader.answered.is_empty());
        let mut on_origin = Apply::new(&origin, Some(2));
        assert_eq!(on_origin.command(forwarded(), 1, &everyone), CommandResult::Empty);
        assert!(matches!(&on_origin.answered[..], [(40, CommandResult::Put(p))] if p.revision == 2));
        assert_eq!(origin.mvcc().revision(), 2, "applied there too");
    }

    /// Commands no proposer makes (a batch in a batch, a forwarded batch)
    /// are refused, not run and not a panic: apply is total.
    #[test]
    fn malformed_commands_are_refused_not_run() {
        let state = AppliedState::default();
        let mut apply = Apply::new(&state, Some(1));
        let put = || Command::Put(PutRequest { key: "k".into(), value: "v".into(), ..Default::default() });
        let nested = Command::Batch(Arc::new(vec![Command::Batch(Arc::new(vec![put()])), put()]));
        let CommandResult::Batch(results) = apply.command(nested, 1, &everyone) else { panic!("a batch result") };
        assert_eq!(results[0], CommandResult::Rejected { error: MvccError::Malformed, revision: 1 });
        assert!(matches!(results[1], CommandResult::Put(_)), "the batch's good command still ran");
        let forwarded_batch =
            Command::Forwarded { origin: 2, tag: 1, command: Box::new(Command::Batch(Arc::new(vec![put()]))) };
        let result = apply.command(forwarded_batch, 1, &everyone);
        assert_eq!(result, CommandResult::Rejected { error: MvccError::Malformed, revision: 2 });
        assert_eq!(state.mvcc().revision(), 2, "only the good put was applied");
    }

    /// A member's publish that commits after its removal changes nothing; a
    /// configuration without a member drops what it published.
    #[test]
    fn only_members_keep_published_attributes() {
        let state = AppliedState::default();
        let mut apply = Apply::new(&state, None);
        let publish = |id| Command::PublishMember { id, name: format!("m{id}"), client_urls: vec![] };
        apply.command(publish(1), 1, &|id| id == 1);
        apply.command(publish(2), 1, &|id| id == 1);
        assert_eq!(state.members().keys().copied().collect::<Vec<_>>(), [1]);
        apply.configuration(&|id| id == 2);
        assert!(state.members().is_empty());
        assert_eq!(apply.journal.len(), 2, "one publish and one departure");
    }
}
