//! Grants taken from live holders: a native mutex holder that follows its
//! own grant with the Rust client's `Client::grant_ended` (what
//! `Guard::lost` waits on, over every member), while, one grant in three,
//! its grant is taken from it as an operator or a buggy peer would: a KV
//! delete of its key (one in six), or a revoke of its lease (one in six).
//! The holder then waits to be told, for the bound and no longer; the
//! other grants it keeps, increments the lock's counter under (fenced, as
//! every mutex holder does) and releases.
//!
//! Recorded for check 11 (`check::lost`): each taken grant, the instants
//! the taking was invoked and answered, and when and how the holder was
//! told. Every grant is also recorded as the other lock clients' are, for
//! the exclusion, token and fencing checks; a taken one as not kept.

use std::time::Duration;

use raftlock::proto::raftlock::v1::lock_event::Kind;
use raftlock_faults::check::locks::Grant;
use raftlock_faults::check::lost::{LostGrant, Taken};

use super::locks::{acquire_native, increment, open_session, release, Api, Ask, LockHistory, ACQUIRE_WAIT};
use super::{bounded, Context, Rng, BACKOFF};

/// One client taking `names` in turn; one grant in three is taken from it.
/// `told_within` (ns): how long it waits to be told of a taken grant.
pub async fn client(ctx: Context, id: usize, names: Vec<String>, seed: u64, told_within: u64) -> LockHistory {
    let mut rng = Rng::new(seed);
    let mut history = LockHistory::default();
    let mut member = id % ctx.endpoints.len();
    let Ok(follower) = raftlock::client::Client::connect(ctx.endpoints.iter()).await else {
        return history;
    };
    while !ctx.stopping() {
        let Some((mut c, mut native, lease)) = open_session(&ctx, member).await else {
            member = rng.below(ctx.endpoints.len());
            ctx.pause(BACKOFF).await;
            continue;
        };
        while !ctx.stopping() {
            let name = names[rng.below(names.len())].clone();
            let acquire_invoked = ctx.clock.now();
            let ask = Ask { permits: 1, read: false, wait: ACQUIRE_WAIT, lock_delay_ms: 0 };
            let Ok(held) = acquire_native(&mut native, &name, lease.id, ask).await else { break };
            let granted_at = ctx.clock.now();
            // Follow the grant from now on, as a holder waiting on `lost()`.
            let told = {
                let (follower, key, token, clock) = (follower.clone(), held.key.clone(), held.token, ctx.clock);
                tokio::spawn(async move {
                    let kind = follower.grant_ended(&key, token).await;
                    (clock.now(), kind)
                })
            };
            let taken = match rng.below(6) {
                0 => Some(Taken::Deleted),
                1 => Some(Taken::Revoked),
                _ => None,
            };
            let Some(taken) = taken else {
                // Kept: fenced increments, then a release.
                let mut deposed = false;
                for _ in 0..2 {
                    match increment(&mut c, &name, &held, id, &mut history).await {
                        Some(true) => {}
                        Some(false) => deposed = true,
                        None => break,
                    }
                    if deposed {
                        break;
                    }
                }
                let released_at = ctx.clock.now();
                let released = release(Api::Native { permits: 1 }, &mut c, &mut native, &held).await;
                told.abort();
                let kept = !deposed && matches!(released, Ok(true)) && lease.covers(granted_at, released_at);
                history.grants.push(grant(&name, id, held.token, acquire_invoked, granted_at, released_at, kept));
                if released.is_err() {
                    break;
                }
                continue;
            };
            // Taken: by a request that is not the holder's release.
            let taken_invoked = ctx.clock.now();
            let answered = match taken {
                Taken::Deleted => bounded(c.delete(held.key.clone(), None)).await.map(|r| r.deleted() == 1),
                Taken::Revoked => {
                    lease.keeper.abort();
                    bounded(c.lease_revoke(lease.id)).await.map(|_| true)
                }
            };
            let taken_at = ctx.clock.now();
            let kept = lease.covers(granted_at, taken_invoked);
            history.grants.push(grant(&name, id, held.token, acquire_invoked, granted_at, taken_invoked, kept));
            if !matches!(answered, Ok(true)) {
                // Not known taken (or taken by someone else first): nothing to judge.
                told.abort();
                break;
            }
            let wait = Duration::from_nanos(told_within) + Duration::from_millis(500);
            let mut told = told;
            let outcome = tokio::time::timeout(wait, &mut told).await;
            told.abort();
            let followed_until = ctx.clock.now();
            let (told_at, told_kind) = match outcome {
                Ok(Ok((at, Ok(kind)))) => (Some(at), kind_name(kind)),
                Ok(Ok((at, Err(e)))) => (Some(at), format!("an error: {e}")),
                Ok(Err(_)) | Err(_) => (None, String::new()),
            };
            history.lost.push(LostGrant {
                name,
                client: id,
                token: held.token,
                taken,
                taken_invoked,
                taken_at,
                told_at,
                told_kind,
                followed_until,
            });
            if taken == Taken::Revoked {
                break;
            }
        }
        lease.give_up(&mut c).await;
        member = rng.below(ctx.endpoints.len());
    }
    history
}

fn grant(
    name: &str,
    client: usize,
    token: i64,
    acquire_invoked: u64,
    granted_at: u64,
    ended: u64,
    kept: bool,
) -> Grant {
    Grant {
        name: name.to_string(),
        client,
        permits: 1,
        token,
        acquire_invoked,
        granted_at,
        released_at: ended,
        kept,
        shared: false,
        multi: false,
        lock_delay_ms: 0,
        ended_after: None,
    }
}

/// The event kind's name as the checker reads it.
fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::Released => "Released",
        Kind::LeaseEnded => "LeaseEnded",
        Kind::Ended => "Ended",
        other => return format!("{other:?}"),
    }
    .to_string()
}
