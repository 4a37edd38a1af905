//! The commands that hold a stream or ask every endpoint: `elect`,
//! `observe`, `watch`, `lease`, `endpoint status|health`, `snapshot save`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use raftlock::proto::etcdserverpb as etcd;
use raftlock::proto::mvccpb;
use raftlock::proto::v3electionpb as election;

use super::cli::{Format, LeaseCmd};
use super::hold::Signals;
use super::output::{kv_json, owner_json, owner_line, text};
use super::Ctl;

pub(crate) async fn elect(
    ctl: &Ctl,
    name: String,
    proposal: Option<String>,
    listen: bool,
    ttl: i64,
) -> Result<ExitCode> {
    let mut signals = Signals::new()?;
    let show = |kv: &mvccpb::KeyValue| {
        ctl.print(format!("{}\n{}", text(&kv.key), text(&kv.value)), json!({"name": name, "leader": kv_json(kv)}));
    };
    if listen {
        let mut stream = ctl
            .client
            .election()
            .observe(election::LeaderRequest { name: name.clone().into_bytes() })
            .await?
            .into_inner();
        loop {
            tokio::select! {
                msg = stream.message() => match msg? {
                    Some(r) => if let Some(kv) = &r.kv { show(kv) },
                    None => return Ok(ExitCode::SUCCESS),
                },
                _ = signals.recv() => return Ok(ExitCode::SUCCESS),
            }
        }
    }
    let proposal = proposal.ok_or_else(|| anyhow!("elect needs a PROPOSAL (or --listen)"))?;
    let session = ctl.client.session(ttl).await?;
    let leadership = tokio::select! {
        l = session.campaign(&name, proposal.as_bytes()) => l?,
        _ = signals.recv() => {
            session.close().await?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let r = ctl.client.leader(name.as_bytes()).await?;
    if let Some(kv) = &r.kv {
        show(kv);
    }
    let code = tokio::select! {
        _ = signals.recv() => ExitCode::SUCCESS,
        _ = session.lost() => {
            eprintln!("Error: leadership of {name} lost: its lease ended");
            ExitCode::FAILURE
        }
    };
    if !session.is_lost() {
        leadership.resign().await?;
    }
    session.close().await?;
    Ok(code)
}

/// `observe NAME`: a lock's events, one line (or JSON object) each, until
/// interrupted: its holders and waiters first, then every change.
pub(crate) async fn observe(ctl: &Ctl, name: String, permits: u32, rev: i64) -> Result<ExitCode> {
    use raftlock::proto::raftlock::v1::lock_event::Kind;
    let mut signals = Signals::new()?;
    let mut stream = ctl.client.observe(name.as_bytes(), permits, rev).await?;
    loop {
        let message = tokio::select! {
            m = stream.message() => match m? {
                Some(m) => m,
                None => return Ok(ExitCode::SUCCESS),
            },
            _ = signals.recv() => return Ok(ExitCode::SUCCESS),
        };
        for e in &message.events {
            // The proto's name, as a flag would spell it: LEASE_ENDED is lease-ended.
            let kind = e.kind().as_str_name().to_lowercase().replace('_', "-");
            let owner = e.owner.clone().unwrap_or_default();
            let mut human = format!("{:<11} {}  rev={}", kind, owner_line(&owner), e.revision);
            if matches!(e.kind(), Kind::Waiting | Kind::Queued) {
                human += &format!("  position={}", e.position);
            }
            if e.was_holding {
                human += "  (was holding)";
            }
            if e.kind() == Kind::DelayStarted {
                human += &format!("  lock-delay={}ms", e.lock_delay_ms);
            }
            ctl.print(
                human,
                json!({"name": name, "event": kind, "revision": e.revision, "position": e.position,
                       "was_holding": e.was_holding, "lock_delay_ms": e.lock_delay_ms,
                       "owner": owner_json(&owner)}),
            );
        }
    }
}

pub(crate) async fn watch(ctl: &Ctl, create: etcd::WatchCreateRequest) -> Result<ExitCode> {
    use etcd::watch_request::RequestUnion;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(etcd::WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) }).await?;
    let mut stream = ctl.client.watch().watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let mut signals = Signals::new()?;
    loop {
        let r = tokio::select! {
            r = stream.message() => match r? {
                Some(r) => r,
                None => return Ok(ExitCode::SUCCESS),
            },
            _ = signals.recv() => return Ok(ExitCode::SUCCESS),
        };
        if r.canceled {
            bail!("watch canceled: {}", if r.cancel_reason.is_empty() { "by the server" } else { &r.cancel_reason });
        }
        for e in &r.events {
            let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 { "DELETE" } else { "PUT" };
            let kv = e.kv.clone().unwrap_or_default();
            let mut human = format!("{kind}\n{}", text(&kv.key));
            if kind == "PUT" {
                human += &format!("\n{}", text(&kv.value));
            }
            let prev = e.prev_kv.as_ref().map(kv_json);
            ctl.print(human, json!({"type": kind, "kv": kv_json(&kv), "prev_kv": prev}));
        }
    }
}

pub(crate) async fn lease(ctl: &Ctl, cmd: LeaseCmd) -> Result<ExitCode> {
    let mut leases = ctl.client.lease();
    match cmd {
        LeaseCmd::Grant { ttl } => {
            let r = ctl.call(leases.lease_grant(etcd::LeaseGrantRequest { ttl, id: 0 })).await?;
            ctl.print(
                format!("lease {:x} granted with TTL({}s)", r.id, r.ttl),
                json!({"id": format!("{:x}", r.id), "ttl": r.ttl}),
            );
        }
        LeaseCmd::Revoke { id } => {
            ctl.call(leases.lease_revoke(etcd::LeaseRevokeRequest { id })).await?;
            ctl.print(format!("lease {id:x} revoked"), json!({"id": format!("{id:x}"), "revoked": true}));
        }
        LeaseCmd::Keepalive { id, once } => {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let mut stream =
                leases.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
            let mut signals = Signals::new()?;
            loop {
                tx.send(etcd::LeaseKeepAliveRequest { id }).await?;
                let r = stream.message().await?.ok_or_else(|| anyhow!("keepalive stream closed"))?;
                if r.ttl <= 0 {
                    bail!("lease {id:x} expired or revoked");
                }
                ctl.print(
                    format!("lease {id:x} keepalived with TTL({})", r.ttl),
                    json!({"id": format!("{id:x}"), "ttl": r.ttl}),
                );
                if once {
                    break;
                }
                let period = Duration::from_secs((r.ttl as u64 / 3).max(1));
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = signals.recv() => break,
                }
            }
        }
        LeaseCmd::Ttl { id, keys } => {
            let r = ctl.call(leases.lease_time_to_live(etcd::LeaseTimeToLiveRequest { id, keys })).await?;
            let key_list: Vec<String> = r.keys.iter().map(|k| text(k)).collect();
            let human = if r.ttl < 0 {
                format!("lease {id:x} already expired")
            } else if keys {
                format!(
                    "lease {id:x} granted with TTL({}s), remaining({}s), attached keys({:?})",
                    r.granted_ttl, r.ttl, key_list
                )
            } else {
                format!("lease {id:x} granted with TTL({}s), remaining({}s)", r.granted_ttl, r.ttl)
            };
            ctl.print(
                human,
                json!({"id": format!("{id:x}"), "ttl": r.ttl, "granted_ttl": r.granted_ttl, "keys": key_list}),
            );
        }
        LeaseCmd::List => {
            let r = ctl.call(leases.lease_leases(etcd::LeaseLeasesRequest {})).await?;
            let ids: Vec<String> = r.leases.iter().map(|l| format!("{:x}", l.id)).collect();
            ctl.print(format!("found {} leases\n{}", ids.len(), ids.join("\n")).trim_end(), json!({"leases": ids}));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Status of every endpoint, each asked directly.
pub(crate) async fn endpoint_status(ctl: &Ctl) -> Result<ExitCode> {
    let mut failed = false;
    for endpoint in &ctl.endpoints {
        let status = async {
            let client = ctl.connect_one(endpoint).await?;
            let s = ctl.call(client.maintenance().status(etcd::StatusRequest {})).await?;
            anyhow::Ok(s)
        };
        match tokio::time::timeout(ctl.timeout, status).await.unwrap_or_else(|_| Err(anyhow!("timed out"))) {
            Ok(s) => {
                let h = s.header.unwrap_or_default();
                ctl.print(
                    format!(
                        "{endpoint}, {:x}, {}, {} B, leader={}, learner={}, term={}, index={}, applied={}{}",
                        h.member_id,
                        s.version,
                        s.db_size,
                        s.leader == h.member_id,
                        s.is_learner,
                        s.raft_term,
                        s.raft_index,
                        s.raft_applied_index,
                        if s.errors.is_empty() { String::new() } else { format!(", errors={:?}", s.errors) },
                    ),
                    json!({"endpoint": endpoint, "member_id": format!("{:x}", h.member_id), "version": s.version,
                           "db_size": s.db_size, "leader": format!("{:x}", s.leader), "is_leader": s.leader == h.member_id,
                           "is_learner": s.is_learner, "raft_term": s.raft_term, "raft_index": s.raft_index,
                           "raft_applied_index": s.raft_applied_index, "errors": s.errors}),
                );
            }
            Err(e) => {
                failed = true;
                eprintln!("{endpoint}: {e:#}");
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Save the first endpoint's snapshot to `file` (written aside, then
/// renamed), or to a file named for the time in the directory `file`, of
/// which the `retain` newest snapshots are kept.
pub(crate) async fn snapshot_save(ctl: &Ctl, file: &std::path::Path, retain: Option<u32>) -> Result<ExitCode> {
    use tokio::io::AsyncWriteExt;
    let dir = file.is_dir().then(|| file.to_path_buf());
    if retain.is_some() && dir.is_none() {
        anyhow::bail!("--retain needs a directory to save in, and {} is not one", file.display());
    }
    let named;
    let file = match &dir {
        Some(dir) => {
            named = dir.join(format!("{SNAPSHOT_PREFIX}{}.db", utc_stamp(std::time::SystemTime::now())));
            named.as_path()
        }
        None => file,
    };
    let client = ctl.connect_one(&ctl.endpoints[0]).await?;
    let mut stream = client.maintenance().snapshot(etcd::SnapshotRequest {}).await?.into_inner();
    let partial = file.with_extension("part");
    let mut out = tokio::fs::File::create(&partial).await.with_context(|| format!("creating {}", partial.display()))?;
    let (mut bytes, mut revision) = (0u64, 0);
    while let Some(chunk) = stream.message().await? {
        if let Some(h) = &chunk.header {
            revision = h.revision;
        }
        out.write_all(&chunk.blob).await?;
        bytes += chunk.blob.len() as u64;
    }
    out.sync_all().await?;
    tokio::fs::rename(&partial, file).await?;
    if let (Some(dir), Some(retain)) = (&dir, retain) {
        prune_snapshots(dir, retain as usize)?;
    }
    ctl.print(
        format!("Snapshot saved at {} ({bytes} bytes, revision {revision})", file.display()),
        json!({"file": file.display().to_string(), "bytes": bytes, "revision": revision}),
    );
    Ok(ExitCode::SUCCESS)
}

/// `member list`, `member add`, `member remove`, printed as etcdctl prints them.
pub(crate) async fn member(ctl: &Ctl, cmd: crate::cli::MemberCmd) -> Result<ExitCode> {
    use crate::cli::MemberCmd;
    let list = |members: &[etcd::Member]| -> (Vec<String>, Vec<Value>) {
        let human = members.iter().map(|m| {
            let started = if m.client_ur_ls.is_empty() { "unstarted" } else { "started" };
            let (peers, clients) = (m.peer_ur_ls.join(","), m.client_ur_ls.join(","));
            format!("{:x}, {started}, {}, {peers}, {clients}, {}", m.id, m.name, m.is_learner)
        });
        let json = members.iter().map(|m| {
            json!({"id": format!("{:x}", m.id), "name": m.name, "peer_urls": m.peer_ur_ls,
                   "client_urls": m.client_ur_ls, "is_learner": m.is_learner})
        });
        (human.collect(), json.collect())
    };
    match cmd {
        MemberCmd::List => {
            let r = ctl.call(ctl.client.cluster().member_list(etcd::MemberListRequest { linearizable: false })).await?;
            let (human, json) = list(&r.members);
            ctl.print(human.join("\n"), json!({ "members": json }));
        }
        MemberCmd::Add { name, peer_urls, learner } => {
            let req = etcd::MemberAddRequest { peer_ur_ls: peer_urls.clone(), is_learner: learner };
            let r = ctl.call(ctl.client.cluster().member_add(req)).await?;
            let id = r.member.as_ref().map_or(0, |m| m.id);
            let cluster = r.header.as_ref().map_or(0, |h| h.cluster_id);
            // The new member's --initial-cluster: every member by name (the
            // new one by the name given here), each with its peer URLs.
            let initial: Vec<String> = r
                .members
                .iter()
                .flat_map(|m| {
                    let name = if m.id == id { name.clone() } else { m.name.clone() };
                    m.peer_ur_ls.iter().map(move |u| format!("{name}={u}")).collect::<Vec<_>>()
                })
                .collect();
            let (_, json) = list(&r.members);
            let human = format!(
                "Member {id:x} added to cluster {cluster:x}\n\nRAFTLOCK_NAME=\"{name}\"\nRAFTLOCK_INITIAL_CLUSTER=\"{}\"\n\
                 RAFTLOCK_INITIAL_ADVERTISE_PEER_URLS=\"{}\"\nRAFTLOCK_INITIAL_CLUSTER_STATE=\"existing\"",
                initial.join(","),
                peer_urls.join(",")
            );
            ctl.print(human, json!({"id": format!("{id:x}"), "cluster_id": format!("{cluster:x}"), "members": json}));
        }
        MemberCmd::Remove { id } => {
            let parsed = u64::from_str_radix(id.trim_start_matches("0x"), 16)
                .map_err(|_| anyhow!("bad member ID arg ({id}), expecting ID in Hex"))?;
            let r = ctl.call(ctl.client.cluster().member_remove(etcd::MemberRemoveRequest { id: parsed })).await?;
            let cluster = r.header.as_ref().map_or(0, |h| h.cluster_id);
            ctl.print(
                format!("Member {parsed:x} removed from cluster {cluster:x}"),
                json!({"id": format!("{parsed:x}"), "cluster_id": format!("{cluster:x}")}),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The names of the snapshots `snapshot save DIR` makes begin so.
const SNAPSHOT_PREFIX: &str = "raftlock-snapshot-";

/// `t` as `20261129T153000Z` (UTC), which sorts as time does.
fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", rest / 3_600, rest / 60 % 60, rest % 60)
}

/// Remove all but the `retain` newest `raftlock-snapshot-*.db` in `dir`.
fn prune_snapshots(dir: &std::path::Path, retain: usize) -> Result<()> {
    let mut saved: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(SNAPSHOT_PREFIX) && name.ends_with(".db")
        })
        .collect();
    saved.sort();
    let excess = saved.len().saturating_sub(retain);
    for old in &saved[..excess] {
        std::fs::remove_file(old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

/// `snapshot restore`: a new member's data directory from a saved file.
pub(crate) async fn snapshot_restore(args: &crate::cli::RestoreArgs, format: crate::cli::Format) -> Result<ExitCode> {
    let opts = raftlock::restore::RestoreOptions {
        file: args.file.clone(),
        name: args.name.clone(),
        initial_cluster: args
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{}={}", args.name, args.initial_advertise_peer_urls)),
        initial_cluster_token: args.initial_cluster_token.clone(),
        initial_advertise_peer_urls: args.initial_advertise_peer_urls.clone(),
        data_dir: args.data_dir.clone(),
        skip_hash_check: args.skip_hash_check,
        bump_revision: args.bump_revision,
        mark_compacted: args.mark_compacted || args.bump_revision > 0,
    };
    let r = raftlock::restore::restore(&opts).await?;
    match format {
        crate::cli::Format::Json => println!(
            "{}",
            json!({"data_dir": r.data_dir.display().to_string(), "member_id": format!("{:x}", r.member_id),
                   "cluster_id": format!("{:x}", r.cluster_id), "members": r.members, "revision": r.revision})
        ),
        crate::cli::Format::Simple => println!(
            "Restored revision {} into {} (member {:x} of {} in cluster {:x})",
            r.revision,
            r.data_dir.display(),
            r.member_id,
            r.members,
            r.cluster_id
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Health of every endpoint, each asked directly: healthy when it has a
/// leader and answers a linearizable read in time (etcd's check).
pub(crate) async fn endpoint_health(ctl: &Ctl) -> Result<ExitCode> {
    let mut failed = false;
    for endpoint in &ctl.endpoints {
        let started = std::time::Instant::now();
        let check = async {
            let client = ctl.connect_one(endpoint).await?;
            let read = etcd::RangeRequest { key: b"health".to_vec(), ..Default::default() };
            ctl.call(client.kv().range(read)).await?;
            anyhow::Ok(())
        };
        let outcome = tokio::time::timeout(ctl.timeout, check).await.unwrap_or_else(|_| Err(anyhow!("timed out")));
        let took = started.elapsed();
        match &outcome {
            Ok(()) => ctl.print(
                format!("{endpoint} is healthy: took = {took:?}"),
                json!({"endpoint": endpoint, "health": true, "took_ms": took.as_secs_f64() * 1e3}),
            ),
            Err(e) => {
                failed = true;
                match ctl.format {
                    Format::Simple => eprintln!("{endpoint} is unhealthy: {e:#}"),
                    Format::Json => {
                        println!("{}", json!({"endpoint": endpoint, "health": false, "error": format!("{e:#}")}))
                    }
                }
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn snapshot_names_carry_the_utc_time() {
        let at = |secs| super::utc_stamp(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "19700101T000000Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
        assert_eq!(at(1_795_960_245), "20261129T135045Z");
        assert_eq!(at(4_107_542_399), "21000228T235959Z");
    }

    #[test]
    fn pruning_keeps_the_newest_snapshots_and_nothing_else_goes() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "raftlock-snapshot-20261127T000000Z.db",
            "raftlock-snapshot-20261128T000000Z.db",
            "raftlock-snapshot-20261129T000000Z.db",
            "other.db",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        super::prune_snapshots(dir.path(), 2).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(
            left,
            ["other.db", "raftlock-snapshot-20261128T000000Z.db", "raftlock-snapshot-20261129T000000Z.db"]
        );
    }
}
