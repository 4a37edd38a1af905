//! The replicated auth store: users, roles, their permissions, whether auth
//! is on, and the auth revision. Changed only by [`AuthStore::apply`], in log
//! order, so that every member holds the same store; read by the API layer to
//! decide who may do what ([`AuthStore::check`], [`AuthStore::check_admin`]).
//!
//! Rules (etcd's, `../shared/ETCD-REFERENCE.md`):
//! - the revision starts at 1 and grows by one with every change of a user or
//!   a role, and when auth is disabled (not when it is enabled); a caller checked
//!   at an older revision is refused with `AuthOldRevision`, so that no
//!   request passes on permissions that have since changed;
//! - a user holding role `root` may do anything; role `root` has no stored
//!   permissions; while auth is on, user `root`, its `root` role and role
//!   `root` cannot be removed;
//! - a permission covers a key (`range_end` empty), a range `[key,
//!   range_end)`, or every key from `key` on (`range_end` = `\0`); a request
//!   is allowed when the union of the user's permissions of the right kind
//!   covers its whole range.
//!
//! Passwords are stored as bcrypt hashes, computed by the member that took
//! the request (the log never carries a password).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AuthError;

pub const ROOT: &str = "root";

/// What a permission allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermKind {
    Read,
    Write,
    ReadWrite,
}

impl PermKind {
    fn allows(self, wanted: PermKind) -> bool {
        self == PermKind::ReadWrite || self == wanted
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub kind: PermKind,
    pub key: Vec<u8>,
    /// Empty: the single key; `\0`: every key from `key` on.
    pub range_end: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bcrypt hash; `None` for a user that cannot log in with a password
    /// (etcd's `no_password`: a client certificate names it).
    pub password: Option<String>,
    /// Sorted, without duplicates.
    pub roles: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// Sorted by key.
    pub perms: Vec<Permission>,
}

/// An auth change, as replicated. Passwords are already hashed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    Enable,
    Disable,
    UserAdd {
        name: String,
        password: Option<String>,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password: String,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        user: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        role: String,
        perm: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
    /// Give `name` the simple token `token`; its password was checked at
    /// auth revision `checked`.
    Authenticate {
        name: String,
        token: String,
        checked: u64,
    },
}

impl AuthCommand {
    /// Whether only a `root` user may ask for it while auth is on.
    pub fn needs_admin(&self) -> bool {
        !matches!(self, AuthCommand::Authenticate { .. })
    }
}

/// What an applied [`AuthCommand`] did to the tokens of the members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenEffect {
    None,
    /// Forget every token (auth was disabled).
    ForgetAll,
    /// Forget this user's tokens (deleted, or its password changed).
    ForgetUser(String),
    /// Hand out this token for this user.
    Assign {
        token: String,
        user: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredAuth")]
pub struct AuthStore {
    pub enabled: bool,
    pub revision: u64,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
    /// What each user may do, merged from its roles: derived from the
    /// above whenever they change or are loaded, never stored.
    #[serde(skip)]
    granted: Granted,
}

/// The stored part of an [`AuthStore`] (its encoding); decoding one builds
/// the derived index.
#[derive(Deserialize)]
struct StoredAuth {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

impl From<StoredAuth> for AuthStore {
    fn from(s: StoredAuth) -> AuthStore {
        let mut store = AuthStore {
            enabled: s.enabled,
            revision: s.revision,
            users: s.users,
            roles: s.roles,
            granted: Granted::default(),
        };
        store.index();
        store
    }
}

/// Per user: whether it holds role root, and the union of its READ and of
/// its WRITE permissions as sorted, disjoint, non-adjacent intervals, so
/// that a check is a binary search with no allocation.
#[derive(Clone, Debug, Default)]
struct Granted(std::collections::HashMap<String, UserGrants>);

/// Derived data: equal whenever the stored data is.
impl PartialEq for Granted {
    fn eq(&self, _: &Granted) -> bool {
        true
    }
}
impl Eq for Granted {}

#[derive(Clone, Debug, Default)]
struct UserGrants {
    root: bool,
    read: Vec<Interval>,
    write: Vec<Interval>,
}

impl Default for AuthStore {
    fn default() -> Self {
        AuthStore {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            granted: Granted::default(),
        }
    }
}

/// Who a request comes from, as its token or certificate says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// Empty: nobody (no token, no certificate).
    pub user: String,
    /// The auth revision the caller's credentials stand for: the one a JWT
    /// was issued at, [`Caller::CURRENT`] for credentials that stand for the
    /// store as it is whenever they are checked (simple tokens,
    /// certificates), 0 for nobody.
    pub revision: u64,
}

impl Caller {
    /// The revision of credentials that never go stale (see `revision`).
    pub const CURRENT: u64 = u64::MAX;

    pub fn nobody() -> Caller {
        Caller::default()
    }
}

fn is_root(user: &User) -> bool {
    user.roles.iter().any(|r| r == ROOT)
}

impl AuthStore {
    /// Apply one change; `Err` leaves the store unchanged.
    pub fn apply(&mut self, cmd: AuthCommand) -> Result<TokenEffect, AuthError> {
        use AuthCommand::*;
        let effect = match cmd {
            Enable => {
                if !self.enabled {
                    let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                    if !is_root(root) {
                        return Err(AuthError::RootRoleNotExist);
                    }
                    self.enabled = true;
                }
                return Ok(TokenEffect::None);
            }
            // Disabling counts as a change (etcd's revision moves); enabling does not.
            Disable if !self.enabled => return Ok(TokenEffect::None),
            Disable => {
                self.enabled = false;
                TokenEffect::ForgetAll
            }
            Authenticate { name, token, checked } => {
                if !self.enabled {
                    return Err(AuthError::NotEnabled);
                }
                if !self.users.contains_key(&name) {
                    return Err(AuthError::AuthFailed);
                }
                if checked != self.revision {
                    return Err(AuthError::OldRevision);
                }
                return Ok(TokenEffect::Assign { token, user: name });
            }
            UserAdd { name, password } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(&name) {
                    return Err(AuthError::UserAlreadyExists);
                }
                self.users.insert(name, User { password, roles: Vec::new() });
                TokenEffect::None
            }
            UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                self.users.remove(&name).ok_or(AuthError::UserNotFound)?;
                TokenEffect::ForgetUser(name)
            }
            UserChangePassword { name, password } => {
                let user = self.users.get_mut(&name).ok_or(AuthError::UserNotFound)?;
                user.password = Some(password);
                TokenEffect::ForgetUser(name)
            }
            UserGrantRole { user, role } => {
                if role != ROOT && !self.roles.contains_key(&role) {
                    let _ = self.users.get(&user).ok_or(AuthError::UserNotFound)?;
                    return Err(AuthError::RoleNotFound);
                }
                let u = self.users.get_mut(&user).ok_or(AuthError::UserNotFound)?;
                match u.roles.binary_search(&role) {
                    // Granting a role the user holds changes nothing (etcd ignores it).
                    Ok(_) => return Ok(TokenEffect::None),
                    Err(at) => u.roles.insert(at, role),
                }
                TokenEffect::None
            }
            UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                let u = self.users.get_mut(&user).ok_or(AuthError::UserNotFound)?;
                let at = u.roles.binary_search(&role).map_err(|_| AuthError::RoleNotGranted)?;
                u.roles.remove(at);
                TokenEffect::None
            }
            RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(&name) {
                    return Err(AuthError::RoleAlreadyExists);
                }
                self.roles.insert(name, Role::default());
                TokenEffect::None
            }
            RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                self.roles.remove(&name).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.retain(|r| *r != name);
                }
                TokenEffect::None
            }
            RoleGrantPermission { role, perm } => {
                let r = self.roles.get_mut(&role).ok_or(AuthError::RoleNotFound)?;
                match r.perms.iter_mut().find(|p| p.key == perm.key && p.range_end == perm.range_end) {
                    Some(existing) => existing.kind = perm.kind,
                    None => {
                        r.perms.push(perm);
                        r.perms.sort_by(|a, b| a.key.cmp(&b.key));
                    }
                }
                TokenEffect::None
            }
            RoleRevokePermission { role, key, range_end } => {
                let r = self.roles.get_mut(&role).ok_or(AuthError::RoleNotFound)?;
                let before = r.perms.len();
                r.perms.retain(|p| !(p.key == key && p.range_end == range_end));
                if r.perms.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
                TokenEffect::None
            }
        };
        self.revision += 1;
        self.index();
        Ok(effect)
    }

    /// Rebuild what each user may do (see [`Granted`]).
    fn index(&mut self) {
        let merged = |user: &User, kind: PermKind| {
            let mut spans: Vec<Interval> = user
                .roles
                .iter()
                .filter_map(|r| self.roles.get(r))
                .flat_map(|r| r.perms.iter())
                .filter(|p| p.kind.allows(kind))
                .map(|p| Interval::of(&p.key, &p.range_end))
                .filter(|i| !i.is_empty())
                .collect();
            spans.sort_by(|a, b| a.start.cmp(&b.start));
            let mut out: Vec<Interval> = Vec::with_capacity(spans.len());
            for span in spans {
                match out.last_mut() {
                    // Overlapping or adjacent: extend the last one.
                    Some(last) if last.end.as_ref().is_none_or(|end| span.start <= *end) => {
                        last.end = match (last.end.take(), span.end) {
                            (Some(a), Some(b)) => Some(a.max(b)),
                            _ => None,
                        };
                    }
                    _ => out.push(span),
                }
            }
            out
        };
        self.granted.0 = self
            .users
            .iter()
            .map(|(name, user)| {
                let grants = UserGrants {
                    root: is_root(user),
                    read: merged(user, PermKind::Read),
                    write: merged(user, PermKind::Write),
                };
                (name.clone(), grants)
            })
            .collect();
    }

    /// May `caller` do a `kind` operation on `[key, range_end)` (a single key
    /// when `range_end` is empty)? Always, while auth is off.
    pub fn check(&self, caller: &Caller, key: &[u8], range_end: &[u8], kind: PermKind) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if caller.revision == 0 {
            return Err(AuthError::UserEmpty);
        }
        if caller.revision < self.revision {
            return Err(AuthError::OldRevision);
        }
        let grants = self.granted.0.get(&caller.user).ok_or(AuthError::PermissionDenied)?;
        let spans = match kind {
            PermKind::Read => &grants.read,
            PermKind::Write => &grants.write,
            PermKind::ReadWrite => unreachable!("checks ask for READ or WRITE"),
        };
        if grants.root || covered(spans, key, range_end) {
            return Ok(());
        }
        Err(AuthError::PermissionDenied)
    }

    /// Is `caller` a user at all (while auth is on): authenticated, at a
    /// revision not older than the store's, and still there? What a request
    /// that touches no key but takes room needs (LeaseGrant: anonymous
    /// leases would fill the quota for everyone).
    pub fn check_user(&self, caller: &Caller) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if caller.revision == 0 || caller.user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if caller.revision < self.revision {
            return Err(AuthError::OldRevision);
        }
        if !self.users.contains_key(&caller.user) {
            return Err(AuthError::UserNotFound);
        }
        Ok(())
    }

    /// May `caller` manage the cluster and auth (does it hold role `root`)?
    pub fn check_admin(&self, caller: &Caller) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if caller.user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        let user = self.users.get(&caller.user).ok_or(AuthError::UserNotFound)?;
        if is_root(user) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Whether `user` holds role `role`.
    pub fn has_role(&self, user: &str, role: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.iter().any(|r| r == role))
    }
}

/// Whether `spans` (sorted, disjoint, non-adjacent) cover all of `[key,
/// range_end)` (a single key when `range_end` is empty, every key from `key`
/// on when it is `\0`). One span must hold it all, as spans that touched
/// were merged.
fn covered(spans: &[Interval], key: &[u8], range_end: &[u8]) -> bool {
    if !matches!(range_end, [] | [0]) && range_end <= key {
        return false; // an empty range is no request etcd grants
    }
    // The last span starting at or before `key`.
    let at = spans.partition_point(|s| s.start.as_slice() <= key);
    let Some(span) = at.checked_sub(1).map(|i| &spans[i]) else { return false };
    match (&span.end, range_end) {
        (None, _) => true,
        // A key: the span must reach past it (any end > key is >= key\0).
        (Some(end), []) => end.as_slice() > key,
        (Some(_), [0]) => false,
        (Some(end), wanted) => wanted > key && end.as_slice() >= wanted,
    }
}

/// `[start, end)`; `end` None = unbounded.
#[derive(Clone, Debug)]
struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    fn of(key: &[u8], range_end: &[u8]) -> Interval {
        let end = match range_end {
            [] => {
                let mut next = key.to_vec();
                next.push(0);
                Some(next)
            }
            [0] => None,
            end => Some(end.to_vec()),
        };
        Interval { start: key.to_vec(), end }
    }

    fn is_empty(&self) -> bool {
        self.end.as_ref().is_some_and(|e| *e <= self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(perms: &[(PermKind, &str, &str)]) -> (AuthStore, Caller) {
        let mut s = AuthStore::default();
        s.apply(AuthCommand::UserAdd { name: "root".into(), password: None }).unwrap();
        s.apply(AuthCommand::UserGrantRole { user: "root".into(), role: "root".into() }).unwrap();
        s.apply(AuthCommand::UserAdd { name: "u".into(), password: None }).unwrap();
        s.apply(AuthCommand::RoleAdd { name: "r".into() }).unwrap();
        for (kind, key, end) in perms {
            let perm = Permission { kind: *kind, key: key.as_bytes().to_vec(), range_end: end.as_bytes().to_vec() };
            s.apply(AuthCommand::RoleGrantPermission { role: "r".into(), perm }).unwrap();
        }
        s.apply(AuthCommand::UserGrantRole { user: "u".into(), role: "r".into() }).unwrap();
        s.apply(AuthCommand::Enable).unwrap();
        let caller = Caller { user: "u".into(), revision: s.revision };
        (s, caller)
    }

    #[test]
    fn ranges_are_allowed_only_when_the_union_of_permissions_covers_them() {
        use PermKind::*;
        let (s, u) = store_with(&[(Read, "a", "c"), (ReadWrite, "c", "e"), (Write, "x", ""), (Read, "z", "\0")]);
        assert_eq!(s.check(&u, b"b", b"", Read), Ok(()));
        assert_eq!(s.check(&u, b"a", b"e", Read), Ok(()), "two adjacent permissions cover it");
        assert_eq!(s.check(&u, b"a", b"e\0", Read), Err(AuthError::PermissionDenied));
        assert_eq!(s.check(&u, b"a", b"e", Write), Err(AuthError::PermissionDenied));
        assert_eq!(s.check(&u, b"d", b"", Write), Ok(()));
        assert_eq!(s.check(&u, b"x", b"", Write), Ok(()));
        assert_eq!(s.check(&u, b"x", b"x\0", Write), Ok(()), "a key is the range [key, key\\0)");
        assert_eq!(s.check(&u, b"x", b"y", Write), Err(AuthError::PermissionDenied));
        assert_eq!(s.check(&u, b"zz", b"\0", Read), Ok(()), "from-key covers everything after");
        assert_eq!(s.check(&u, b"b", b"a", Read), Err(AuthError::PermissionDenied), "an empty range is no grant");
        let root = Caller { user: "root".into(), revision: s.revision };
        assert_eq!(s.check(&root, b"\0", b"\0", Write), Ok(()));
        assert_eq!(s.check(&Caller::nobody(), b"b", b"", Read), Err(AuthError::UserEmpty));
        let stale = Caller { user: "u".into(), revision: s.revision - 1 };
        assert_eq!(s.check(&stale, b"b", b"", Read), Err(AuthError::OldRevision));
    }

    #[test]
    fn root_cannot_be_locked_out_while_auth_is_on() {
        let (mut s, _) = store_with(&[]);
        let before = s.clone();
        assert_eq!(s.apply(AuthCommand::UserDelete { name: "root".into() }), Err(AuthError::InvalidManagement));
        let revoke = AuthCommand::UserRevokeRole { user: "root".into(), role: "root".into() };
        assert_eq!(s.apply(revoke), Err(AuthError::InvalidManagement));
        assert_eq!(s.apply(AuthCommand::RoleDelete { name: "root".into() }), Err(AuthError::InvalidManagement));
        assert_eq!(s, before, "refused changes change nothing, not even the revision");
        s.apply(AuthCommand::Disable).unwrap();
        assert_eq!(s.revision, before.revision + 1, "disabling counts as a change");
        s.apply(AuthCommand::Disable).unwrap();
        assert_eq!(s.revision, before.revision + 1, "disabling it again does not");
        s.apply(AuthCommand::UserDelete { name: "root".into() }).unwrap();
        assert_eq!(s.apply(AuthCommand::Enable), Err(AuthError::RootUserNotExist));
    }
}
