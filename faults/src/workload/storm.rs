//! Mass expiry: many leases, each with a key, granted together and then all
//! abandoned at the same instant, as when a fleet loses its sessions at once
//! (a network blip, a deploy).
//!
//! Each client grants [`BATCH`] leases (TTL [`TTL`]) through one member,
//! [`IN_FLIGHT`] at a time, attaches `lease/<client>/<lease>` to each, and
//! then abandons the whole batch: none is ever kept alive, so they expire
//! within the spread of their grants (about a second) of each other. It waits
//! out the batch's expiry before it grants the next, so each batch expires
//! as one storm.
//!
//! The grant's answer counts as the lease's first keepalive: it promises
//! life until the grant's invocation plus the TTL it answered. The records go
//! to the lease checker with those of [`super::leases`] (the lease watchers
//! watch `lease/`, which holds these keys too): no key may be seen deleted
//! before its promise ran out; every key must be seen deleted by its
//! abandonment + TTL (or the heal) + the revocation bound, and none may
//! exist at the end. A storm that the cluster revokes slowly (rate-limited,
//! or stalled behind its own deletes) fails the second check.
//!
//! Caveat: a lease whose grant or put had no certain answer is left
//! unrecorded (whether its key exists is unknown); it expires anyway.

use std::time::Duration;

use etcd_client::{Client, PutOptions};
use raftlock_faults::check::leases::LeaseRecord;
use raftlock_faults::history::{Op, Outcome};
use tokio::task::JoinSet;

use super::leases::{KeptLease, PREFIX, TTL};
use super::{bounded, Context, Rng, Roaming};

/// The leases of one storm, per client.
pub const BATCH: usize = 250;
/// Grants (each followed by its put) in flight at once.
const IN_FLIGHT: usize = 32;

pub async fn client(ctx: Context, id: usize, seed: u64) -> Vec<KeptLease> {
    let mut rng = Rng::new(seed);
    let mut roaming = Roaming::new(id % ctx.endpoints.len());
    let mut recorded = Vec::new();
    while !ctx.stopping() {
        let Some(c) = roaming.client(&ctx, &mut rng).await else { continue };
        let batch = grant_batch(&ctx, id, c.clone()).await;
        // Abandoned together: the storm starts a TTL from here.
        let abandoned_at = ctx.clock.now();
        let complete = batch.len() == BATCH;
        recorded.extend(batch.into_iter().map(|mut l| {
            l.record.abandoned_at = Some(abandoned_at);
            l
        }));
        if !complete {
            // Some grants or puts failed: the member may be down or cut off.
            roaming.failed(&ctx, &mut rng).await;
        }
        ctx.pause(Duration::from_secs(TTL as u64 + 1)).await;
    }
    recorded
}

/// Up to [`BATCH`] leases with their keys, [`IN_FLIGHT`] at a time; fewer
/// when requests fail or the run stops.
async fn grant_batch(ctx: &Context, id: usize, c: Client) -> Vec<KeptLease> {
    let mut tasks = JoinSet::new();
    let mut batch = Vec::new();
    for _ in 0..BATCH {
        if ctx.stopping() {
            break;
        }
        if tasks.len() >= IN_FLIGHT {
            batch.extend(tasks.join_next().await.expect("tasks are in flight").expect("a storm grant panicked"));
        }
        tasks.spawn(grant_one(ctx.clone(), id, c.clone()));
    }
    while let Some(done) = tasks.join_next().await {
        batch.extend(done.expect("a storm grant panicked"));
    }
    batch
}

async fn grant_one(ctx: Context, id: usize, mut c: Client) -> Option<KeptLease> {
    let invoke = ctx.clock.now();
    let granted = bounded(c.lease_grant(TTL, None)).await.ok()?;
    let complete = ctx.clock.now();
    let lease = granted.id();
    let key = format!("{PREFIX}{id}/{lease:x}");
    bounded(c.put(key.as_str(), "storm", Some(PutOptions::new().with_lease(lease)))).await.ok()?;
    let grant = Op { client: id, invoke, complete, input: (), outcome: Outcome::Ok(granted.ttl()) };
    let record = LeaseRecord {
        lease,
        client: id,
        ttl_secs: TTL,
        keepalives: vec![grant],
        abandoned_at: None,
        revoked_seen_at: None,
        exists_at_end: false,
    };
    Some(KeptLease { key, record })
}
