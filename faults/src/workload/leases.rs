//! Leases kept alive, then abandoned.
//!
//! Each client grants a lease (TTL [`TTL`]), attaches `lease/<client>/<id>`
//! to it, and keeps it alive once a second through one member at a time —
//! for a while, or until the run ends — then abandons it and starts
//! another. Every keepalive is recorded with the TTL it was answered with.
//! A watcher over `lease/` (see `watches`) tells when each key was deleted.

use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper, PutOptions};
use raftlock_faults::check::leases::LeaseRecord;
use raftlock_faults::history::{Op, Outcome, NEVER};

use super::{bounded, keep_alive_once, Context, Rng, BACKOFF};
use crate::cluster::connect;

pub const PREFIX: &str = "lease/";
/// The TTL of every lease, in seconds.
pub const TTL: i64 = 3;
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);

/// A lease and the key attached to it.
pub struct KeptLease {
    pub key: String,
    pub record: LeaseRecord,
}

async fn open_keepalive(c: &mut Client, lease: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream), String> {
    bounded(c.lease_keep_alive(lease)).await
}

pub async fn client(ctx: Context, id: usize, seed: u64) -> Vec<KeptLease> {
    let mut rng = Rng::new(seed);
    let mut leases = Vec::new();
    let mut member = id % ctx.endpoints.len();
    while !ctx.stopping() {
        let mut c = match connect(&[ctx.endpoints[member].clone()]).await {
            Ok(c) => c,
            Err(_) => {
                member = rng.below(ctx.endpoints.len());
                ctx.pause(BACKOFF).await;
                continue;
            }
        };
        let Ok(granted) = bounded(c.lease_grant(TTL, None)).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        let lease = granted.id();
        let key = format!("{PREFIX}{id}/{lease:x}");
        let mut record = LeaseRecord {
            lease,
            client: id,
            ttl_secs: TTL,
            keepalives: Vec::new(),
            abandoned_at: None,
            revoked_seen_at: None,
            exists_at_end: false,
        };
        if bounded(c.put(key.as_str(), "held", Some(PutOptions::new().with_lease(lease)))).await.is_err() {
            // Whether its key exists is unknown, so nothing can be judged
            // by it: the lease is given up unrecorded (it expires anyway).
            continue;
        }
        let keep_until_end = rng.chance(30);
        let keep_for = rng.between(Duration::from_secs(4), Duration::from_secs(12));
        let until = tokio::time::Instant::now() + keep_for;
        let mut stream = None;
        loop {
            if ctx.stopping() {
                // Given up when the run ends: it must be revoked in time too.
                record.abandoned_at = Some(ctx.clock.now());
                break;
            }
            if !keep_until_end && tokio::time::Instant::now() >= until {
                record.abandoned_at = Some(ctx.clock.now());
                break;
            }
            if stream.is_none() {
                match open_keepalive(&mut c, lease).await {
                    Ok(s) => stream = Some(s),
                    Err(_) => {
                        member = rng.below(ctx.endpoints.len());
                        if let Ok(other) = connect(&[ctx.endpoints[member].clone()]).await {
                            c = other;
                        }
                        ctx.pause(BACKOFF).await;
                        continue;
                    }
                }
            }
            let (keeper, answers) = stream.as_mut().expect("opened above");
            let invoke = ctx.clock.now();
            let answer = keep_alive_once(keeper, answers).await;
            match answer {
                Ok(Some(ttl)) => {
                    record.keepalives.push(Op {
                        client: id,
                        invoke,
                        complete: ctx.clock.now(),
                        input: (),
                        outcome: Outcome::Ok(ttl),
                    });
                    if ttl <= 0 {
                        // Gone (its keepalives did not get through in time).
                        record.abandoned_at = Some(ctx.clock.now());
                        break;
                    }
                }
                Ok(None) | Err(_) => {
                    let outcome = Outcome::Unknown(match answer {
                        Err(e) => e,
                        _ => "keepalive stream ended".to_string(),
                    });
                    record.keepalives.push(Op { client: id, invoke, complete: NEVER, input: (), outcome });
                    stream = None;
                }
            }
            ctx.pause(KEEPALIVE_EVERY).await;
        }
        leases.push(KeptLease { key, record });
    }
    leases
}
