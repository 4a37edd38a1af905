//! The lock-and-run supervisor: `raftlockctl lock NAME... [-- CMD]` takes a
//! native lock (several names: a multi-lock, all or none), then holds it
//! while CMD runs (or until a signal), passing the fencing token to CMD and
//! stopping CMD if the lock is lost: its lease could not be kept alive, or
//! the lock's events say the grant ended (its lease was revoked, or its key
//! deleted by someone else) — told as soon as a member applies the change.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};

use raftlock::client::{Acquisition, LockOptions, MultiAcquisition, Session};

use super::cli::{Format, LockArgs};
use super::output::{owner_json, owner_line, text};
use super::{Ctl, NOT_ACQUIRED};

/// Wait for SIGINT, SIGTERM or SIGHUP; returns the signal's number.
pub(crate) struct Signals(Vec<(i32, tokio::signal::unix::Signal)>);

impl Signals {
    pub(crate) fn new() -> Result<Signals> {
        let kinds = [
            (libc::SIGINT, SignalKind::interrupt()),
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
        ];
        Ok(Signals(kinds.into_iter().map(|(n, k)| Ok((n, signal(k)?))).collect::<std::io::Result<_>>()?))
    }

    pub(crate) async fn recv(&mut self) -> i32 {
        let waits = self.0.iter_mut().map(|(n, s)| Box::pin(async move { s.recv().await.map(|_| *n) }));
        futures::future::select_all(waits).await.0.unwrap_or(libc::SIGTERM)
    }
}

pub(crate) async fn lock(ctl: &Ctl, args: LockArgs) -> Result<ExitCode> {
    let granting = tokio::time::timeout(ctl.timeout, ctl.client.session(args.ttl));
    let session = granting.await.map_err(|_| anyhow!("granting the lock's lease: timed out"))??;
    let outcome = hold(ctl, &args, &session).await;
    // Whatever happened, revoke the lease: it releases the lock (or gives up
    // the place in its queue) at once. If the cluster cannot be reached, the
    // lease ends by itself within its TTL.
    match tokio::time::timeout(ctl.timeout, session.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("Warning: revoking the lock's lease: {e}"),
        Err(_) => eprintln!("Warning: revoking the lock's lease: timed out; it expires within {}s", args.ttl),
    }
    outcome
}

/// Acquire the lock in `session`, then hold it: while CMD runs, or until a
/// signal (or the loss of the lease) when there is no CMD.
pub(crate) async fn hold(ctl: &Ctl, args: &LockArgs, session: &Session) -> Result<ExitCode> {
    let metadata = args.metadata.clone().unwrap_or_else(default_metadata);
    let wait = if args.try_once { Some(Duration::ZERO) } else { args.wait };
    let options = LockOptions {
        wait,
        permits: args.permits,
        metadata: metadata.into_bytes(),
        read: args.read,
        reentrant: false,
        lock_delay: args.lock_delay.unwrap_or_default(),
    };
    let mut signals = Signals::new()?;
    let name = args.names.join(" ");
    let taking = async {
        if let [one] = args.names.as_slice() {
            Ok::<_, anyhow::Error>(match session.lock(one, options).await? {
                Acquisition::Held(guard) => Ok((vec![text(guard.key())], guard.token())),
                Acquisition::Busy(holders) => Err((one.clone(), holders)),
            })
        } else {
            Ok(match session.lock_all(&args.names, options).await? {
                // One txn queued them all: one token for every grant.
                MultiAcquisition::Held(guard) => Ok((
                    guard.grants().iter().map(|g| text(&g.key)).collect(),
                    guard.grants().first().map_or(0, |g| g.token),
                )),
                MultiAcquisition::Busy { blocked_on, holders } => Err((text(&blocked_on), holders)),
            })
        }
    };
    let acquired = tokio::select! {
        r = taking => r?,
        // The server removes our places in the queues when the call goes away.
        sig = signals.recv() => return Ok(ExitCode::from((128 + sig) as u8)),
    };
    let (keys, token) = match acquired {
        Ok(held) => held,
        Err((blocked, holders)) => {
            let human = match holders.first() {
                Some(h) => format!("lock {blocked} is held by {}", owner_line(h)),
                None => format!("lock {blocked} was not acquired"),
            };
            match ctl.format {
                Format::Simple => eprintln!("{human}"),
                Format::Json => {
                    let holders: Vec<Value> = holders.iter().map(owner_json).collect();
                    println!("{}", json!({"acquired": false, "name": blocked, "holders": holders}));
                }
            }
            return Ok(ExitCode::from(NOT_ACQUIRED));
        }
    };
    let lost_lock = std::pin::pin!(lost(ctl, session, &keys, token));
    let key = keys.join("\n");
    if !args.command.is_empty() {
        return run_holding(&name, &args.command, session, &key, token, &mut signals, lost_lock).await;
    }
    ctl.print(
        format!("{key}\ntoken {token}"),
        json!({"acquired": true, "name": name, "key": key, "keys": keys, "token": token,
               "lease": format!("{:x}", session.lease()), "mode": if args.read { "read" } else { "write" }}),
    );
    Ok(tokio::select! {
        _ = signals.recv() => ExitCode::SUCCESS,
        reason = lost_lock => {
            eprintln!("Error: lock {name} lost: {reason}");
            ExitCode::FAILURE
        }
    })
}

/// Resolves when the lock held under `session` (its grants `keys`, all made
/// with `token`) is lost, saying how: the session could not keep its lease
/// alive, or a grant's events tell that it ended ([`raftlock::client::Client::grant_ended`]).
async fn lost(ctl: &Ctl, session: &Session, keys: &[String], token: i64) -> String {
    use raftlock::proto::raftlock::v1::lock_event::Kind;
    let ended = async {
        let ends = keys.iter().map(|key| Box::pin(ctl.client.grant_ended(key.as_bytes(), token)));
        match futures::future::select_all(ends).await.0 {
            Ok(Kind::LeaseEnded) => "its lease ended".to_string(),
            Ok(Kind::Released) => "its key was deleted by another client".to_string(),
            Ok(_) => "its key is gone".to_string(),
            // The events cannot be followed (refused): the lease alone tells.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = session.lost() => "its lease ended".to_string(),
        reason = ended => reason,
    }
}

pub(crate) fn default_metadata() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{user}@{host} pid {}", std::process::id())
}

/// How long CMD has to stop after SIGTERM, once the lock is lost, before SIGKILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(10);

/// Run `command` while the lock is held: the name, key and fencing token go
/// in its environment (a multi-lock's names space-separated and its keys
/// one per line; its one token is every grant's), SIGTERM and SIGHUP to us are passed on (a terminal's SIGINT
/// reaches it directly: it is in our process group), and if the lease is lost
/// it gets SIGTERM, then SIGKILL after [`STOP_GRACE`]. Returns the command's
/// exit code (128 + signal if it was killed; 127 if it could not be started),
/// or failure if the lock was lost.
pub(crate) async fn run_holding(
    name: &str,
    command: &[String],
    session: &Session,
    key: &str,
    token: i64,
    signals: &mut Signals,
    mut lost_lock: std::pin::Pin<&mut impl std::future::Future<Output = String>>,
) -> Result<ExitCode> {
    let spawned = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("RAFTLOCK_LOCK_NAME", name)
        .env("RAFTLOCK_LOCK_KEY", key)
        .env("RAFTLOCK_FENCING_TOKEN", token.to_string())
        .env("RAFTLOCK_LEASE_ID", format!("{:x}", session.lease()))
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("Error: running {}: {e}", command[0]);
            return Ok(ExitCode::from(127));
        }
    };
    let pid = child.id().map(|p| p as i32);
    let signal_child = |sig: i32| {
        if let Some(pid) = pid {
            // SAFETY: kill(2) on our own child, which has not been reaped yet
            // (we are still waiting for it).
            unsafe { libc::kill(pid, sig) };
        }
    };
    let mut lost = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            sig = signals.recv() => if sig != libc::SIGINT {
                signal_child(sig);
            },
            reason = &mut lost_lock, if !lost => {
                lost = true;
                kill_at = Some(tokio::time::Instant::now() + STOP_GRACE);
                eprintln!("Error: lock {name} lost: {reason}; stopping {}", command[0]);
                signal_child(libc::SIGTERM);
            }
            _ = async { tokio::time::sleep_until(kill_at.expect("set")).await }, if kill_at.is_some() => {
                kill_at = None;
                signal_child(libc::SIGKILL);
            }
        }
    };
    if lost {
        return Ok(ExitCode::FAILURE);
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
