//! The node's side of etcd's auth: who a token names, password checks and
//! hashing, and authentication (which hands out a token through the log for
//! simple tokens, or signs one for JWT).
//!
//! bcrypt is slow on purpose (tens of milliseconds at the default cost): it
//! runs on tokio's blocking pool, never on the runtime's workers, in one of
//! a few slots, and not at all for a name or address locked out after
//! failing too often (`node::passwords`).

use super::passwords::Refused;
use super::{Node, ServerError, WriteError};
use crate::model::auth::{AuthCommand, AuthError, Caller, Tokens};
use crate::model::mvcc::Revision;

/// How often an authentication is tried again when users or roles changed
/// between its password check and its log entry.
const AUTHENTICATE_ATTEMPTS: usize = 3;

impl Node {
    /// Who `token` names. A simple token handed out through another member
    /// may not be applied here yet: an unknown one is looked up again after
    /// a read barrier has brought this member up to date.
    pub async fn identify(&self, token: &str) -> Result<Caller, WriteError> {
        let lookup = || self.state.tokens().caller(token);
        if let Some(caller) = lookup() {
            return Ok(caller);
        }
        if !self.state.tokens().is_jwt() {
            self.read_barrier().await?;
            if let Some(caller) = lookup() {
                return Ok(caller);
            }
        }
        Err(AuthError::InvalidToken.into())
    }

    /// Whether a verified client certificate's CommonName names the caller
    /// (`--client-cert-auth`, with auth on: otherwise nobody needs a name, and
    /// no certificate is parsed).
    pub fn names_users_by_certificate(&self) -> bool {
        self.client_cert_auth && self.state.auth().enabled
    }

    /// Check `name`'s password and hand out a token; returns the token and
    /// the store's revision.
    /// `from` is the client's address, if known (failures are counted per
    /// address too).
    pub async fn authenticate(
        &self,
        name: String,
        password: String,
        from: Option<std::net::IpAddr>,
    ) -> Result<(String, Revision), WriteError> {
        for attempt in 1..=AUTHENTICATE_ATTEMPTS {
            self.read_barrier().await?;
            let (hash, checked) = {
                let auth = self.state.auth();
                if !auth.enabled {
                    return Err(AuthError::NotEnabled.into());
                }
                let user = auth.users.get(&name).ok_or(AuthError::AuthFailed)?;
                (user.password.clone().ok_or(AuthError::NoPasswordUser)?, auth.revision)
            };
            let matches = self.passwords.check(&name, from, password.clone(), hash).await.map_err(refused)?;
            if !matches {
                return Err(AuthError::AuthFailed.into());
            }
            if self.state.tokens().is_jwt() {
                let token = self.state.tokens().sign(&name, checked).map_err(|e| {
                    tracing::error!(error = %e, "signing an auth token");
                    AuthError::AuthFailed
                })?;
                return Ok((token, self.revision()));
            }
            let token = format!("{}.{checked}", Tokens::new_simple_token());
            let cmd = AuthCommand::Authenticate { name: name.clone(), token: token.clone(), checked };
            match self.change_auth(cmd, &Caller::nobody()).await {
                Ok(revision) => return Ok((token, revision)),
                Err(WriteError::Denied(AuthError::OldRevision)) if attempt < AUTHENTICATE_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// A bcrypt hash of `password` at `--bcrypt-cost`.
    pub async fn hash_password(&self, password: String) -> Result<String, WriteError> {
        match self.passwords.hash(password).await.map_err(refused)? {
            Ok(hash) => Ok(hash),
            Err(e) => {
                tracing::error!(error = %e, "hashing a password");
                Err(ServerError::Stopped.into())
            }
        }
    }
}

/// A password check that did not run, as the client is told.
fn refused(r: Refused) -> WriteError {
    match r {
        Refused::TooManyRequests => ServerError::TooManyRequests.into(),
        Refused::Stopped => ServerError::Stopped.into(),
    }
}
