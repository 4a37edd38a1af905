//! Watchers that survive faults: each follows a key prefix from a start
//! revision, asks for progress every half second, and when its stream
//! breaks re-opens it on another member from the revision after the last
//! one it was told about (an event's, or a progress notification's).
//! Everything it receives is recorded with the time it arrived.
//!
//! [`reference`] replays the same prefix after the run, on a healed cluster:
//! the history the recorded streams are checked against.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions, WatchResponse};
use raftlock_faults::check::watches::{EventKind, KeyValue, WatchEvent, WatchMessage, WatchStream};

use super::{bounded, Context, Rng, BACKOFF};
use crate::cluster::connect;

const PROGRESS_EVERY: Duration = Duration::from_millis(500);

fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
    }
}

fn events(resp: &WatchResponse) -> Vec<WatchEvent> {
    resp.events()
        .iter()
        .filter_map(|e| {
            Some(WatchEvent {
                kind: match e.event_type() {
                    EventType::Put => EventKind::Put,
                    EventType::Delete => EventKind::Delete,
                },
                kv: key_value(e.kv()?),
                prev_kv: e.prev_kv().map(key_value),
            })
        })
        .collect()
}

fn options(from: i64) -> WatchOptions {
    WatchOptions::new().with_prefix().with_prev_key().with_progress_notify().with_start_revision(from)
}

/// Follow `prefix` from `start_revision` until the run stops.
pub async fn watcher(ctx: Context, name: String, prefix: String, start_revision: i64, seed: u64) -> WatchStream {
    let mut rng = Rng::new(seed);
    let mut recorded =
        WatchStream { name, prefix: prefix.clone().into_bytes(), start_revision, prev_kv: true, messages: Vec::new() };
    let mut next_from = start_revision;
    let mut member = (seed as usize) % ctx.endpoints.len();
    let mut opened_before = false;
    'streams: while !ctx.stopping() {
        let opened = async {
            let mut c = connect(&[ctx.endpoints[member].clone()]).await.map_err(|e| e.to_string())?;
            let mut stream = bounded(c.watch(prefix.as_str(), Some(options(next_from)))).await?;
            // The first response says the watcher was created.
            match bounded(stream.message()).await? {
                Some(resp) if resp.created() && !resp.canceled() => Ok((c, stream)),
                other => Err(format!("watch not created: {other:?}")),
            }
        };
        let (_client, mut stream) = match opened.await {
            Ok(s) => s,
            Err(_) => {
                member = rng.below(ctx.endpoints.len());
                ctx.pause(BACKOFF).await;
                continue;
            }
        };
        if opened_before {
            recorded.messages.push(WatchMessage::Reconnected { from_revision: next_from, received: ctx.clock.now() });
        }
        opened_before = true;
        let mut stop = ctx.stop.clone();
        let mut ask = tokio::time::interval(PROGRESS_EVERY);
        loop {
            let resp = tokio::select! {
                r = stream.message() => r,
                _ = ask.tick() => {
                    if stream.request_progress().await.is_err() {
                        member = rng.below(ctx.endpoints.len());
                        continue 'streams;
                    }
                    continue;
                }
                _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                    // One last progress notification: a loss after the last
                    // event received would not show otherwise.
                    if stream.request_progress().await.is_ok() {
                        if let Ok(Ok(Some(resp))) = tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
                            record(&mut recorded, &mut next_from, resp, ctx.clock.now());
                        }
                    }
                    break 'streams;
                }
            };
            let received = ctx.clock.now();
            match resp {
                Ok(Some(resp)) if resp.canceled() => {
                    let reason = resp.cancel_reason().to_string();
                    let compact_revision = resp.compact_revision();
                    recorded.messages.push(WatchMessage::Canceled { reason, compact_revision, received });
                    break 'streams;
                }
                Ok(Some(resp)) => record(&mut recorded, &mut next_from, resp, received),
                Ok(None) | Err(_) => {
                    member = rng.below(ctx.endpoints.len());
                    ctx.pause(BACKOFF).await;
                    continue 'streams;
                }
            }
        }
    }
    recorded
}

/// Record an event or progress response; move the position to resume from.
fn record(recorded: &mut WatchStream, next_from: &mut i64, resp: WatchResponse, received: u64) {
    let revision = resp.header().map_or(0, |h| h.revision());
    let events = events(&resp);
    if events.is_empty() {
        *next_from = (*next_from).max(revision + 1);
        recorded.messages.push(WatchMessage::Progress { revision, received });
    } else {
        let last = events.iter().map(|e| e.kv.mod_revision).max().unwrap_or(0);
        *next_from = (*next_from).max(last + 1);
        recorded.messages.push(WatchMessage::Events { revision, events, received });
    }
}

/// Every event on `prefix` from `start_revision` through the store's
/// revision now, replayed through `endpoint` (a healed cluster).
pub async fn reference(endpoint: &str, prefix: &str, start_revision: i64) -> anyhow::Result<Vec<WatchEvent>> {
    let mut c = connect(&[endpoint.to_string()]).await?;
    let end = c.get(prefix, None).await?.header().map_or(0, |h| h.revision());
    let mut stream = c.watch(prefix, Some(options(start_revision))).await?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("the replay of {prefix} did not reach revision {end} in 60 s");
        }
        // Once the replay goes quiet, a progress notification says how far it got.
        let Ok(resp) = tokio::time::timeout(Duration::from_millis(200), stream.message()).await else {
            stream.request_progress().await?;
            continue;
        };
        let resp = resp?.ok_or_else(|| anyhow::anyhow!("the replay of {prefix} ended early"))?;
        if resp.canceled() {
            anyhow::bail!("the replay of {prefix} was canceled: {}", resp.cancel_reason());
        }
        let evs = events(&resp);
        let progress = evs.is_empty() && !resp.created();
        out.extend(evs);
        if progress && resp.header().map_or(0, |h| h.revision()) >= end {
            return Ok(out);
        }
    }
}
