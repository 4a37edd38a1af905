//! `raftlockctl`: the command-line client for raftlock, for people and scripts.
//!
//! Locks (`lock`, `release`, `describe`, `list`) use raftlock's native API;
//! everything else (`elect`, `get`/`put`/`del`/`watch`, `lease`, `member`,
//! `endpoint`) is the etcd v3 API and works against etcd too. Output is human
//! text by default and one JSON document per result with `-w json` (keys and
//! values as UTF-8 text, lossily). Exit codes: 0 success, 1 error, 75 lock not
//! acquired within the wait; `lock NAME -- CMD` exits with CMD's code.

mod bench;
// Without the feature, the driver is a module that refuses to connect.
#[cfg_attr(not(feature = "bench-etcd-client"), path = "bench_etcd_client_absent.rs")]
mod bench_etcd_client;
mod bench_fanout;
mod bench_load;
mod bench_range;
mod bench_report;
mod cli;
mod commands;
mod hold;
mod output;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};

use raftlock::client::{endpoint_url, Client, ClientTls};
use raftlock::proto::etcdserverpb as etcd;
use raftlock::proto::raftlock::v1 as locks;

use cli::{Cli, Cmd, DowngradeCmd, EndpointCmd, Format, SnapshotCmd};
use output::{kv_json, owner_json, owner_line, text};

/// Exit code when the lock was not acquired within the wait (EX_TEMPFAIL).
pub(crate) const NOT_ACQUIRED: u8 = 75;

/// The range `[key, range_end)` from the KEY/RANGE_END/--prefix arguments;
/// an empty prefix is every key (`"\0"` to `"\0"`, as etcdctl sends it).
fn key_range(key: String, range_end: Option<String>, prefix: bool) -> (Vec<u8>, Vec<u8>) {
    match (range_end, prefix) {
        (Some(end), _) => (key.into_bytes(), end.into_bytes()),
        (None, true) if key.is_empty() => (vec![0], vec![0]),
        (None, true) => {
            let end = raftlock::prefix_end(key.as_bytes());
            (key.into_bytes(), end)
        }
        (None, false) => (key.into_bytes(), Vec::new()),
    }
}

/// What every command works with: the client, the output format, the
/// per-request timeout and the endpoints as given.
pub(crate) struct Ctl {
    pub(crate) client: Client,
    pub(crate) format: Format,
    pub(crate) timeout: Duration,
    pub(crate) endpoints: Vec<String>,
    /// TLS for `https://` endpoints.
    pub(crate) tls: Option<ClientTls>,
    /// --user's name and password, while etcd's auth is on.
    pub(crate) credentials: Option<(String, String)>,
}

/// A client of `endpoints`, logged in when `credentials` are given.
async fn connect(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    credentials: Option<&(String, String)>,
    timeout: Duration,
) -> Result<Client> {
    let joined = endpoints.join(",");
    let connecting = async {
        let endpoints = reachable(endpoints).await;
        let mut client =
            Client::connect_with(&endpoints, tls).await.with_context(|| format!("connecting to {joined}"))?;
        if let Some((user, password)) = credentials {
            client.authenticate(user, password).await.with_context(|| format!("authenticating as {user}"))?;
        }
        anyhow::Ok(client)
    };
    tokio::time::timeout(timeout, connecting).await.map_err(|_| anyhow!("connecting to {joined}: timed out"))?
}

/// Of several endpoints, those that accept a TCP connection within a second
/// (tried at once); all of them when none does. A command makes a request
/// or a few, and the client spreads requests over its endpoints: one sent
/// to a member that is down would fail the command, though the others
/// serve (a stopped member's address can stay in DNS: a Kubernetes pod
/// being replaced is still published).
async fn reachable(endpoints: &[String]) -> Vec<String> {
    if endpoints.len() < 2 {
        return endpoints.to_vec();
    }
    let accepts = |endpoint: String| async move {
        for (url, _) in raftlock::resolve::url_addresses(&raftlock::client::endpoint_url(&endpoint)).await {
            let Ok(addr) = raftlock::ids::url_hostport(&url).unwrap_or_default().parse::<std::net::SocketAddr>() else {
                continue;
            };
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return Some(endpoint);
            }
        }
        None
    };
    let found: Vec<String> =
        futures::future::join_all(endpoints.iter().cloned().map(accepts)).await.into_iter().flatten().collect();
    if found.is_empty() {
        endpoints.to_vec()
    } else {
        found
    }
}

impl Ctl {
    /// A client of `endpoint` alone, with this command's TLS and user.
    pub(crate) async fn connect_one(&self, endpoint: &str) -> Result<Client> {
        connect(&[endpoint.to_string()], self.tls.as_ref(), self.credentials.as_ref(), self.timeout).await
    }

    pub(crate) fn print(&self, human: impl std::fmt::Display, json: Value) {
        match self.format {
            Format::Simple => println!("{human}"),
            Format::Json => println!("{json}"),
        }
    }

    /// Run one request under the command timeout.
    pub(crate) async fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => Ok(r.map_err(|s| anyhow!("{}", s.message()))?.into_inner()),
            Err(_) => bail!("request timed out after {:?}", self.timeout),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    // With a CA or a certificate, endpoints given as host:port mean https.
    let tls = (cli.cacert.is_some() || cli.cert.is_some())
        .then(|| ClientTls::from_files(cli.cacert.as_deref(), cli.cert.as_deref(), cli.key.as_deref()))
        .transpose()?;
    let given = match &cli.discovery_srv {
        Some(domain) => raftlock::resolve::srv_endpoints(domain, cli.discovery_srv_name.as_deref()).await?,
        None => cli.endpoints.clone(),
    };
    let endpoints: Vec<String> = given
        .iter()
        .map(|e| if tls.is_some() && !e.contains("://") { format!("https://{e}") } else { endpoint_url(e) })
        .collect();
    let credentials = match (&cli.user, &cli.password) {
        (None, _) => None,
        (Some(user), password) => Some(match (user.split_once(':'), password) {
            (Some((name, pw)), _) => (name.to_string(), pw.to_string()),
            (None, Some(pw)) => (user.clone(), pw.clone()),
            (None, None) => anyhow::bail!("--user {user} needs a password: --user {user}:PASSWORD or --password"),
        }),
    };
    if let Cmd::Version = &cli.command {
        use raftlock::version::{ETCD_API_MINOR, RAFTLOCK};
        match cli.write_out {
            Format::Json => println!("{}", serde_json::json!({"raftlockctl": RAFTLOCK, "api": ETCD_API_MINOR})),
            Format::Simple => println!("raftlockctl version: {RAFTLOCK}\nAPI version: {ETCD_API_MINOR}"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Cmd::Snapshot(SnapshotCmd::Restore(args)) = &cli.command {
        return commands::snapshot_restore(args, cli.write_out).await;
    }
    if let Cmd::Bench(args) = &cli.command {
        let token = match &credentials {
            Some(_) => {
                connect(&endpoints, tls.as_ref(), credentials.as_ref(), cli.command_timeout).await?.token_interceptor()
            }
            None => Default::default(),
        };
        let report = bench::run(&endpoints, tls.as_ref(), token, credentials.as_ref(), args).await?;
        match cli.write_out {
            Format::Json => println!("{}", serde_json::to_string(&report)?),
            Format::Simple => println!("{report}"),
        }
        anyhow::ensure!(report.errors == 0, "{} requests failed", report.errors);
        return Ok(ExitCode::SUCCESS);
    }
    let client = connect(&endpoints, tls.as_ref(), credentials.as_ref(), cli.command_timeout).await?;
    let ctl = Ctl { client, format: cli.write_out, timeout: cli.command_timeout, endpoints, tls, credentials };
    match cli.command {
        Cmd::Lock(args) => hold::lock(&ctl, args).await,
        Cmd::Release { key, token } => {
            let req = locks::ReleaseRequest { key: key.into_bytes(), token, ..Default::default() };
            let r = ctl.call(ctl.client.locks().release(req)).await?;
            let human = if r.released && r.holds > 0 {
                format!("one hold released; the lease still holds the lock {} more time(s)", r.holds)
            } else if r.released {
                "released".to_string()
            } else if r.current_token == 0 {
                "not released: the key no longer exists".to_string()
            } else {
                format!("not released: the key belongs to a later grant (token {})", r.current_token)
            };
            ctl.print(human, json!({"released": r.released, "holds": r.holds, "current_token": r.current_token}));
            Ok(if r.released { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Cmd::Validate { key, token, permits } => {
            let r = ctl
                .call(ctl.client.locks().validate(locks::ValidateRequest {
                    key: key.clone().into_bytes(),
                    token,
                    permits,
                }))
                .await?;
            let human = if r.current {
                format!("current  lease={:x}  ttl={}", r.lease, r.ttl)
            } else if r.current_token == 0 {
                format!("not current: {key} no longer exists")
            } else if r.current_token != token {
                format!("not current: {key} belongs to a later grant (token {})", r.current_token)
            } else {
                format!("not current: {key} waits for the lock")
            };
            let lease = format!("{:x}", r.lease);
            ctl.print(
                human,
                json!({"current": r.current, "current_token": r.current_token, "lease": lease, "ttl": r.ttl,
                       "revision": r.header.map_or(0, |h| h.revision)}),
            );
            Ok(if r.current { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Cmd::Describe { name, permits, limit } => {
            // The server answers a page of waiters at a time: follow `more`.
            let page = |limit: usize, after: Option<&locks::Owner>| locks::DescribeRequest {
                name: name.clone().into_bytes(),
                permits,
                limit: limit.min(u32::MAX as usize) as u32,
                waiters_after: after.map_or(0, |w| w.token),
                waiters_after_key: after.map_or(Vec::new(), |w| w.key.clone()),
            };
            let wanted = if limit == 0 { usize::MAX } else { limit as usize };
            let mut d = ctl.call(ctl.client.locks().describe(page(wanted, None))).await?;
            while d.more && d.waiters.len() < wanted && !d.waiters.is_empty() {
                let next = page(wanted - d.waiters.len(), d.waiters.last());
                let next = ctl.call(ctl.client.locks().describe(next)).await?;
                d.waiters.extend(next.waiters);
                d.more = next.more;
            }
            let mut human = String::new();
            if let Some(delay) = &d.lock_delay {
                human += &format!(
                    "{name}: in a lock-delay of {}ms since revision {} ({}ms left); nobody is granted it meanwhile\n",
                    delay.delay_ms, delay.revision, delay.remaining_ms
                );
            } else if d.holders.is_empty() {
                human += &format!("{name}: free");
            }
            for o in &d.holders {
                human += &format!("holder  {}\n", owner_line(o));
            }
            for o in &d.waiters {
                human += &format!("waiter  {}\n", owner_line(o));
            }
            let json = json!({
                "name": name,
                "holders": d.holders.iter().map(owner_json).collect::<Vec<_>>(),
                "waiters": d.waiters.iter().map(owner_json).collect::<Vec<_>>(),
                "lock_delay": d.lock_delay.as_ref().map(|l| json!({
                    "delay_ms": l.delay_ms, "revision": l.revision, "remaining_ms": l.remaining_ms,
                })),
            });
            ctl.print(human.trim_end(), json);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List { prefix, permits, limit } => {
            // The server answers a page of locks at a time: follow `next_page`.
            let wanted = if limit == 0 { usize::MAX } else { limit as usize };
            let mut r = locks::ListResponse::default();
            loop {
                let req = locks::ListRequest {
                    prefix: prefix.clone().into_bytes(),
                    permits,
                    limit: (wanted - r.locks.len()).min(u32::MAX as usize) as u32,
                    page: std::mem::take(&mut r.next_page),
                };
                let page = ctl.call(ctl.client.locks().list(req)).await?;
                r.locks.extend(page.locks);
                r.next_page = page.next_page;
                if r.next_page.is_empty() || r.locks.len() >= wanted {
                    break;
                }
            }
            let human: Vec<String> = r
                .locks
                .iter()
                .map(|l| {
                    let holders: Vec<String> =
                        l.holders.iter().map(|o| format!("{}@{}", text(&o.key), o.token)).collect();
                    format!("{}  holders={}  waiters={}", text(&l.name), holders.join(","), l.waiters)
                })
                .collect();
            let json: Vec<Value> = r
                .locks
                .iter()
                .map(|l| {
                    json!({"name": text(&l.name), "holders": l.holders.iter().map(owner_json).collect::<Vec<_>>(),
                           "waiters": l.waiters})
                })
                .collect();
            ctl.print(human.join("\n"), json!({ "locks": json }));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Elect { name, proposal, listen, ttl } => commands::elect(&ctl, name, proposal, listen, ttl).await,
        Cmd::Get { key, range_end: end, prefix, rev, limit, keys_only, count_only } => {
            let (key, range_end) = key_range(key, end, prefix);
            let req = etcd::RangeRequest {
                key,
                range_end,
                revision: rev,
                limit,
                keys_only,
                count_only,
                ..Default::default()
            };
            let r = ctl.call(ctl.client.kv().range(req)).await?;
            let mut human = Vec::new();
            for kv in &r.kvs {
                human.push(text(&kv.key));
                if !keys_only {
                    human.push(text(&kv.value));
                }
            }
            if count_only {
                human.push(r.count.to_string());
            }
            let revision = r.header.map_or(0, |h| h.revision);
            let json = json!({"revision": revision, "count": r.count, "more": r.more,
                              "kvs": r.kvs.iter().map(kv_json).collect::<Vec<_>>()});
            ctl.print(human.join("\n"), json);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Put { key, value, lease } => {
            let req = etcd::PutRequest {
                key: key.into_bytes(),
                value: value.into_bytes(),
                lease: lease.unwrap_or(0),
                ..Default::default()
            };
            let r = ctl.call(ctl.client.kv().put(req)).await?;
            ctl.print("OK", json!({"revision": r.header.map_or(0, |h| h.revision)}));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Del { key, range_end: end, prefix } => {
            let (key, range_end) = key_range(key, end, prefix);
            let req = etcd::DeleteRangeRequest { key, range_end, prev_kv: false };
            let r = ctl.call(ctl.client.kv().delete_range(req)).await?;
            ctl.print(r.deleted, json!({"deleted": r.deleted, "revision": r.header.map_or(0, |h| h.revision)}));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Observe { name, permits, rev } => commands::observe(&ctl, name, permits, rev).await,
        Cmd::Watch { key, range_end: end, prefix, rev, prev_kv } => {
            let (key, range_end) = key_range(key, end, prefix);
            let create =
                etcd::WatchCreateRequest { key, range_end, start_revision: rev, prev_kv, ..Default::default() };
            commands::watch(&ctl, create).await
        }
        Cmd::Lease(cmd) => commands::lease(&ctl, cmd).await,
        Cmd::Member(cmd) => commands::member(&ctl, cmd).await,
        Cmd::Downgrade(cmd) => {
            use etcd::downgrade_request::DowngradeAction;
            let (action, version, done) = match cmd {
                DowngradeCmd::Validate { version } => {
                    (DowngradeAction::Validate, version, "Downgrade validate success")
                }
                DowngradeCmd::Enable { version } => (DowngradeAction::Enable, version, "Downgrade enable success"),
                DowngradeCmd::Cancel { version } => {
                    (DowngradeAction::Cancel, version.unwrap_or_default(), "Downgrade cancel success")
                }
            };
            let req = etcd::DowngradeRequest { action: action as i32, version };
            let r = ctl.call(ctl.client.maintenance().downgrade(req)).await?;
            ctl.print(
                format!("{done}, cluster version {}", r.version),
                json!({"cluster_version": r.version, "revision": r.header.map_or(0, |h| h.revision)}),
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Endpoint(EndpointCmd::Status) => commands::endpoint_status(&ctl).await,
        Cmd::Endpoint(EndpointCmd::Health) => commands::endpoint_health(&ctl).await,
        Cmd::Snapshot(SnapshotCmd::Save { file, retain }) => commands::snapshot_save(&ctl, &file, retain).await,
        Cmd::Bench(_) | Cmd::Version | Cmd::Snapshot(SnapshotCmd::Restore(_)) => unreachable!("handled above"),
    }
}
