//! The tokens a member accepts, by `--auth-token`:
//!
//! - `simple` (the default): a random token handed out by Authenticate. The
//!   token travels in the log entry that records the authentication, and
//!   every member, applying it, starts a TTL of its own (`--auth-token-ttl`,
//!   renewed whenever the token is used at that member). A token is forgotten
//!   when it times out, when its user is deleted or changes password, and
//!   when auth is disabled. A token names no revision: it stands for the
//!   store as it is now.
//! - `jwt,pub-key=FILE,priv-key=FILE,sign-method=ALG[,ttl=DURATION]`: a
//!   signed token with claims `username`, `revision` and `exp`, checked by
//!   signature alone (no log entry, no table). It carries the auth revision
//!   it was issued at, so any change of users or roles makes older tokens
//!   stale ("revision of auth store is old"); clients then authenticate again.
//!
//! Caveat: simple tokens live in memory only; a member that restarts knows
//! the tokens still in its log tail, each with a fresh TTL, and no others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::Caller;

/// How many simple tokens a member keeps before it drops the ones that
/// timed out (it also drops them as it meets them).
const SWEEP_EVERY: usize = 1024;

/// `--auth-token`, parsed.
#[derive(Clone)]
pub enum TokenConfig {
    Simple { ttl: Duration },
    Jwt(JwtConfig),
}

#[derive(Clone)]
pub struct JwtConfig {
    algorithm: jsonwebtoken::Algorithm,
    sign: Option<jsonwebtoken::EncodingKey>,
    verify: jsonwebtoken::DecodingKey,
    ttl: Duration,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

impl TokenConfig {
    /// Parse `--auth-token` (`simple`, or `jwt,key=value,...`); `ttl_secs`
    /// is `--auth-token-ttl`, for simple tokens.
    pub fn parse(spec: &str, ttl_secs: u64) -> anyhow::Result<TokenConfig> {
        let mut parts = spec.split(',');
        match parts.next().unwrap_or_default() {
            "simple" => Ok(TokenConfig::Simple { ttl: Duration::from_secs(ttl_secs.max(1)) }),
            "jwt" => {
                let mut opts: HashMap<&str, &str> = HashMap::new();
                for p in parts {
                    let (k, v) = p.split_once('=').with_context(|| format!("--auth-token: '{p}' is not key=value"))?;
                    opts.insert(k, v);
                }
                JwtConfig::new(&opts).map(TokenConfig::Jwt)
            }
            other => bail!("--auth-token: unknown token type '{other}' (simple or jwt)"),
        }
    }
}

impl JwtConfig {
    fn new(opts: &HashMap<&str, &str>) -> anyhow::Result<JwtConfig> {
        use jsonwebtoken::{Algorithm::*, DecodingKey, EncodingKey};
        let method = opts.get("sign-method").context("--auth-token jwt needs sign-method=")?;
        let algorithm: jsonwebtoken::Algorithm =
            method.parse().map_err(|_| anyhow::anyhow!("--auth-token: unknown sign-method '{method}'"))?;
        let read = |key: &str| -> anyhow::Result<Option<Vec<u8>>> {
            match opts.get(key) {
                Some(path) => Ok(Some(std::fs::read(path).with_context(|| format!("--auth-token {key}: {path}"))?)),
                None => Ok(None),
            }
        };
        let (private, public) = (read("priv-key")?, read("pub-key")?);
        let ttl = match opts.get("ttl") {
            Some(t) => crate::base::ids::go_duration(t).with_context(|| format!("--auth-token ttl: '{t}'"))?,
            None => Duration::from_secs(300),
        };
        let (sign, verify) = match algorithm {
            HS256 | HS384 | HS512 => {
                // etcd reads the shared secret from priv-key.
                let secret = private.context("--auth-token jwt with an HS method needs priv-key=")?;
                (Some(EncodingKey::from_secret(&secret)), DecodingKey::from_secret(&secret))
            }
            _ => {
                let public = public.context("--auth-token jwt needs pub-key=")?;
                let (sign, verify): (Option<EncodingKey>, DecodingKey) = match algorithm {
                    RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => (
                        private.map(|k| EncodingKey::from_rsa_pem(&k)).transpose()?,
                        DecodingKey::from_rsa_pem(&public)?,
                    ),
                    ES256 | ES384 => {
                        (private.map(|k| EncodingKey::from_ec_pem(&k)).transpose()?, DecodingKey::from_ec_pem(&public)?)
                    }
                    _ => {
                        (private.map(|k| EncodingKey::from_ed_pem(&k)).transpose()?, DecodingKey::from_ed_pem(&public)?)
                    }
                };
                (sign, verify)
            }
        };
        Ok(JwtConfig { algorithm, sign, verify, ttl })
    }
}

/// The tokens this member accepts (see the module doc).
pub struct Tokens {
    config: TokenConfig,
    /// Simple tokens: token -> (user, when it times out here, in
    /// milliseconds since `epoch`). Every request looks its token up, so the
    /// lookup takes the lock shared and renews the deadline in place.
    simple: RwLock<HashMap<String, (String, AtomicU64)>>,
    epoch: Instant,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens::new(TokenConfig::Simple { ttl: Duration::from_secs(300) })
    }
}

impl Tokens {
    pub fn new(config: TokenConfig) -> Tokens {
        Tokens { config, simple: RwLock::default(), epoch: Instant::now() }
    }

    pub fn is_jwt(&self) -> bool {
        matches!(self.config, TokenConfig::Jwt(_))
    }

    /// A new simple token: 16 random letters, as etcd's.
    pub fn new_simple_token() -> String {
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut bytes = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("system randomness");
        bytes.iter().map(|b| LETTERS[*b as usize % LETTERS.len()] as char).collect()
    }

    /// A signed token for `user` at auth revision `revision` (jwt only).
    pub fn sign(&self, user: &str, revision: u64) -> anyhow::Result<String> {
        let TokenConfig::Jwt(jwt) = &self.config else { bail!("not a jwt token provider") };
        let key = jwt.sign.as_ref().context("--auth-token jwt has no priv-key: this member cannot sign tokens")?;
        let exp = (SystemTime::now().duration_since(UNIX_EPOCH)? + jwt.ttl).as_secs();
        let claims = Claims { username: user.to_string(), revision, exp };
        Ok(jsonwebtoken::encode(&jsonwebtoken::Header::new(jwt.algorithm), &claims, key)?)
    }

    /// Apply's side of an authentication: accept `token` for `user` from now
    /// on (simple tokens; a JWT member keeps none).
    pub fn assign(&self, token: String, user: String) {
        let TokenConfig::Simple { ttl } = self.config else { return };
        let now = self.now_ms();
        let mut simple = self.simple.write().expect("token lock poisoned");
        if simple.len() >= SWEEP_EVERY && simple.len().is_power_of_two() {
            simple.retain(|_, (_, deadline)| deadline.load(Ordering::Relaxed) > now);
        }
        simple.insert(token, (user, AtomicU64::new(now + ttl.as_millis() as u64)));
    }

    pub fn forget_user(&self, user: &str) {
        self.simple.write().expect("token lock poisoned").retain(|_, (u, _)| u != user);
    }

    pub fn forget_all(&self) {
        self.simple.write().expect("token lock poisoned").clear();
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Who `token` names, with the revision it stands for (a simple token
    /// stands for the current store); `None` if this member does not accept it.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        match &self.config {
            TokenConfig::Simple { ttl } => {
                let now = self.now_ms();
                let simple = self.simple.read().expect("token lock poisoned");
                let (user, deadline) = simple.get(token)?;
                if deadline.load(Ordering::Relaxed) <= now {
                    drop(simple);
                    self.simple.write().expect("token lock poisoned").remove(token);
                    return None;
                }
                deadline.store(now + ttl.as_millis() as u64, Ordering::Relaxed);
                Some(Caller { user: user.clone(), revision: Caller::CURRENT })
            }
            TokenConfig::Jwt(jwt) => {
                let validation = jsonwebtoken::Validation::new(jwt.algorithm);
                let data = jsonwebtoken::decode::<Claims>(token, &jwt.verify, &validation).ok()?;
                Some(Caller { user: data.claims.username, revision: data.claims.revision })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(crate::base::ids::go_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(crate::base::ids::go_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(crate::base::ids::go_duration("1500ms").unwrap(), Duration::from_millis(1500));
        assert!(crate::base::ids::go_duration("5").is_err());
        assert!(crate::base::ids::go_duration("").is_err());
    }

    #[test]
    fn simple_tokens_time_out_unless_used_and_are_forgotten_with_their_user() {
        let tokens = Tokens::new(TokenConfig::Simple { ttl: Duration::from_millis(300) });
        tokens.assign("t1".into(), "alice".into());
        tokens.assign("t2".into(), "bob".into());
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(120));
            assert_eq!(tokens.caller("t1").map(|c| (c.user, c.revision)), Some(("alice".into(), Caller::CURRENT)));
        }
        assert!(tokens.caller("t2").is_none(), "bob's token timed out unused");
        tokens.forget_user("alice");
        assert!(tokens.caller("t1").is_none());
        assert_ne!(Tokens::new_simple_token(), Tokens::new_simple_token());
    }
}
