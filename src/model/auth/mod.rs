//! etcd's v3 auth: who a request comes from, and whether it may.
//!
//! - [`store`]: the replicated users, roles and permissions, and the checks
//!   (deterministic; changed only by apply).
//! - [`tokens`]: the tokens a member accepts — etcd's `simple` tokens (handed
//!   out through the log, so every member knows them, each member timing
//!   them out on its own) or signed JWTs (`--auth-token jwt,...`).
//! - passwords: bcrypt at `--bcrypt-cost`, hashed and checked by the member
//!   that took the request, off the async runtime.
//!
//! Where checks happen (as in etcd): writes are checked by apply, against the
//! store as it stands when the entry is applied (`Command::AsUser`), so no
//! write slips through on a permission revoked while it was in flight; reads,
//! watches and the admin-only calls are checked by the member serving them,
//! against its applied store.
//!
//! Caveat: the lock and election recipes check READ and WRITE on the lock
//! name's prefix when the request arrives; the writes they then make for the
//! caller are not checked again at apply.

pub mod checks;
pub mod store;
pub mod tokens;

use serde::{Deserialize, Serialize};

pub use store::{AuthCommand, AuthStore, Caller, PermKind, Permission, TokenEffect};
pub use tokens::{TokenConfig, Tokens};

/// Why auth refused something; each is one of etcd's errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AuthError {
    #[error("permission denied")]
    PermissionDenied,
    #[error("authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("user name is empty")]
    UserEmpty,
    #[error("user name not found")]
    UserNotFound,
    #[error("user name already exists")]
    UserAlreadyExists,
    #[error("role name is empty")]
    RoleEmpty,
    #[error("role name not found")]
    RoleNotFound,
    #[error("role name already exists")]
    RoleAlreadyExists,
    #[error("role is not granted to the user")]
    RoleNotGranted,
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    #[error("permission not given")]
    PermissionNotGiven,
    #[error("authentication is not enabled")]
    NotEnabled,
    #[error("invalid auth token")]
    InvalidToken,
    #[error("invalid auth management")]
    InvalidManagement,
    #[error("revision of auth store is old")]
    OldRevision,
    #[error("root user does not exist")]
    RootUserNotExist,
    #[error("root user does not have root role")]
    RootRoleNotExist,
    /// Authenticate for a user created with `no_password`.
    #[error("authentication failed, password was given for no password user")]
    NoPasswordUser,
}

/// A bcrypt hash of `password` at `cost` (4 to 31). CPU-heavy at the
/// default cost (tens of milliseconds): call it off the async runtime.
pub fn hash_password(password: &str, cost: u32) -> anyhow::Result<String> {
    Ok(bcrypt::hash(password, cost)?)
}

/// Whether `password` matches `hash`. CPU-heavy, as [`hash_password`].
pub fn password_matches(password: &str, hash: &str) -> bool {
    bcrypt::verify(password, hash).unwrap_or(false)
}
