//! `raftlockctl`: the command-line client for raftlock, for people and scripts.
//!
//! Locks (`lock`, `release`, `describe`, `list`) use raftlock's native API;
//! everything else (`elect`, `get`/`put`/`del`/`watch`, `lease`, `member`,
//! `endpoint`) is the etcd v3 API and works against etcd too. Output is human
//! text by default and one JSON document per result with `-w json` (keys and
//! values as UTF-8 text, lossily). Exit codes: 0 success, 1 error, 75 lock not
//! acquired within the wait; `lock NAME -- CMD` exits with CMD's code.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};

use raftlock::client::{endpoint_url, Acquisition, Client, LockOptions, Session};
use raftlock::proto::etcdserverpb as etcd;
use raftlock::proto::mvccpb;
use raftlock::proto::raftlock::v1 as locks;
use raftlock::proto::v3electionpb as election;

/// Exit code when the lock was not acquired within the wait (EX_TEMPFAIL).
const NOT_ACQUIRED: u8 = 75;

#[derive(Parser)]
#[command(name = "raftlockctl", version, about = "Command-line client for raftlock")]
struct Cli {
    /// Comma-separated client URLs (or host:port).
    #[arg(
        long,
        env = "RAFTLOCK_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'w', long = "write-out", value_enum, default_value = "simple", global = true)]
    write_out: Format,
    /// Time limit of each request (not of waiting for a lock or watching).
    #[arg(long, default_value = "5s", value_parser = parse_duration, global = true)]
    command_timeout: Duration,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Simple,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire a lock; run CMD while holding it, or hold it until interrupted.
    Lock(LockArgs),
    /// Release a grant by key, fenced by its token.
    Release {
        key: String,
        #[arg(long)]
        token: i64,
    },
    /// Show who holds a lock and who waits for it.
    Describe {
        name: String,
        #[arg(long, default_value_t = 1)]
        permits: u32,
    },
    /// List the locks under a name prefix.
    List {
        #[arg(default_value = "")]
        prefix: String,
        #[arg(long, default_value_t = 1)]
        permits: u32,
    },
    /// Campaign in an election with PROPOSAL and lead until interrupted; or
    /// with --listen, print each leader as it changes.
    Elect {
        name: String,
        proposal: Option<String>,
        #[arg(short, long)]
        listen: bool,
        /// TTL of the campaign's session lease, in seconds.
        #[arg(long, default_value_t = 10)]
        ttl: i64,
    },
    /// Read a key, a range [KEY, RANGE_END) or a prefix.
    Get {
        key: String,
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
        #[arg(long, default_value_t = 0)]
        rev: i64,
        #[arg(long, default_value_t = 0)]
        limit: i64,
        #[arg(long)]
        keys_only: bool,
        #[arg(long)]
        count_only: bool,
    },
    /// Write a key.
    Put {
        key: String,
        value: String,
        /// Attach to this lease (hex ID).
        #[arg(long, value_parser = parse_lease_id)]
        lease: Option<i64>,
    },
    /// Delete a key, a range or a prefix.
    Del {
        key: String,
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
    },
    /// Print the changes to a key, a range or a prefix until interrupted.
    Watch {
        key: String,
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
        /// Start at this revision (history included).
        #[arg(long, default_value_t = 0)]
        rev: i64,
        #[arg(long)]
        prev_kv: bool,
    },
    #[command(subcommand)]
    Lease(LeaseCmd),
    #[command(subcommand)]
    Member(MemberCmd),
    #[command(subcommand)]
    Endpoint(EndpointCmd),
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Drive the endpoints with concurrent clients and report ops/s and latency.
    Bench(raftlock::bench::BenchArgs),
}

#[derive(Args)]
struct LockArgs {
    name: String,
    /// TTL of the lock's session lease, in seconds: how long a crashed holder keeps it.
    #[arg(long, default_value_t = 10)]
    ttl: i64,
    /// Give up if the lock is not granted within this time (e.g. 500ms, 10s, 2m).
    #[arg(long, value_parser = parse_duration, conflicts_with = "try_once")]
    wait: Option<Duration>,
    /// Try once and give up at once if the lock is held.
    #[arg(long = "try")]
    try_once: bool,
    /// Semaphore: how many owners may hold the lock at once.
    #[arg(long, default_value_t = 1)]
    permits: u32,
    /// Shown to others by `describe` (default: user@host pid N).
    #[arg(long)]
    metadata: Option<String>,
    /// The command to run while holding the lock.
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Subcommand)]
enum LeaseCmd {
    /// Grant a lease with a TTL in seconds.
    Grant { ttl: i64 },
    /// Revoke a lease (and delete its keys).
    Revoke {
        #[arg(value_parser = parse_lease_id)]
        id: i64,
    },
    /// Keep a lease alive until interrupted (or once).
    Keepalive {
        #[arg(value_parser = parse_lease_id)]
        id: i64,
        #[arg(long)]
        once: bool,
    },
    /// Show a lease's remaining TTL.
    Ttl {
        #[arg(value_parser = parse_lease_id)]
        id: i64,
        /// Also list the keys attached to it.
        #[arg(long)]
        keys: bool,
    },
    /// List every lease.
    List,
}

#[derive(Subcommand)]
enum MemberCmd {
    /// List the members of the cluster.
    List,
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Stream one member's state (the first endpoint's) to a file.
    Save { file: std::path::PathBuf },
}

#[derive(Subcommand)]
enum EndpointCmd {
    /// Status of each endpoint.
    Status,
    /// Whether each endpoint serves a linearizable read (fails without a leader).
    Health,
}

/// `1500ms`, `10s`, `2m`, `1h`; a bare number is seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Lease IDs are hex, as etcdctl prints and reads them.
fn parse_lease_id(s: &str) -> Result<i64, String> {
    i64::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|_| format!("invalid lease ID {s:?} (hex expected)"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The range `[key, range_end)` from the KEY/RANGE_END/--prefix arguments;
/// an empty prefix is every key (`"\0"` to `"\0"`, as etcdctl sends it).
fn key_range(key: String, range_end: Option<String>, prefix: bool) -> (Vec<u8>, Vec<u8>) {
    match (range_end, prefix) {
        (Some(end), _) => (key.into_bytes(), end.into_bytes()),
        (None, true) if key.is_empty() => (vec![0], vec![0]),
        (None, true) => {
            let end = raftlock::locks::prefix_end(key.as_bytes());
            (key.into_bytes(), end)
        }
        (None, false) => (key.into_bytes(), Vec::new()),
    }
}

fn kv_json(kv: &mvccpb::KeyValue) -> Value {
    json!({
        "key": text(&kv.key), "value": text(&kv.value), "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision, "version": kv.version, "lease": format!("{:x}", kv.lease),
    })
}

fn owner_json(o: &locks::Owner) -> Value {
    json!({
        "key": text(&o.key), "token": o.token, "lease": format!("{:x}", o.lease), "ttl": o.ttl,
        "granted_ttl": o.granted_ttl, "metadata": text(&o.metadata),
    })
}

fn owner_line(o: &locks::Owner) -> String {
    let mut line = format!("{}  token={}  lease={:x}", text(&o.key), o.token, o.lease);
    if o.ttl >= 0 || o.granted_ttl > 0 {
        line += &format!("  ttl={}s/{}s", o.ttl, o.granted_ttl);
    }
    if !o.metadata.is_empty() {
        line += &format!("  {}", text(&o.metadata));
    }
    line
}

struct Ctl {
    client: Client,
    format: Format,
    timeout: Duration,
    endpoints: Vec<String>,
}

impl Ctl {
    fn print(&self, human: impl std::fmt::Display, json: Value) {
        match self.format {
            Format::Simple => println!("{human}"),
            Format::Json => println!("{json}"),
        }
    }

    /// Run one request under the command timeout.
    async fn call<T>(
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
    let endpoints: Vec<String> = cli.endpoints.iter().map(|e| endpoint_url(e)).collect();
    if let Cmd::Bench(args) = &cli.command {
        let report = raftlock::bench::run(&endpoints, args).await?;
        match cli.write_out {
            Format::Json => println!("{}", serde_json::to_string(&report)?),
            Format::Simple => println!("{report}"),
        }
        anyhow::ensure!(report.errors == 0, "{} requests failed", report.errors);
        return Ok(ExitCode::SUCCESS);
    }
    let client = tokio::time::timeout(cli.command_timeout, Client::connect(&endpoints))
        .await
        .map_err(|_| anyhow!("connecting to {}: timed out", endpoints.join(",")))?
        .with_context(|| format!("connecting to {}", endpoints.join(",")))?;
    let ctl = Ctl { client, format: cli.write_out, timeout: cli.command_timeout, endpoints };
    match cli.command {
        Cmd::Lock(args) => lock(&ctl, args).await,
        Cmd::Release { key, token } => {
            let req = locks::ReleaseRequest { key: key.into_bytes(), token };
            let r = ctl.call(ctl.client.locks().release(req)).await?;
            let human = if r.released {
                "released".to_string()
            } else if r.current_token == 0 {
                "not released: the key no longer exists".to_string()
            } else {
                format!("not released: the key belongs to a later grant (token {})", r.current_token)
            };
            ctl.print(human, json!({"released": r.released, "current_token": r.current_token}));
            Ok(if r.released { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Cmd::Describe { name, permits } => {
            let req = locks::DescribeRequest { name: name.clone().into_bytes(), permits };
            let d = ctl.call(ctl.client.locks().describe(req)).await?;
            let mut human = String::new();
            if d.holders.is_empty() {
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
            });
            ctl.print(human.trim_end(), json);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List { prefix, permits } => {
            let req = locks::ListRequest { prefix: prefix.into_bytes(), permits };
            let r = ctl.call(ctl.client.locks().list(req)).await?;
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
        Cmd::Elect { name, proposal, listen, ttl } => elect(&ctl, name, proposal, listen, ttl).await,
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
        Cmd::Watch { key, range_end: end, prefix, rev, prev_kv } => {
            let (key, range_end) = key_range(key, end, prefix);
            let create =
                etcd::WatchCreateRequest { key, range_end, start_revision: rev, prev_kv, ..Default::default() };
            watch(&ctl, create).await
        }
        Cmd::Lease(cmd) => lease(&ctl, cmd).await,
        Cmd::Member(MemberCmd::List) => {
            let r = ctl.call(ctl.client.cluster().member_list(etcd::MemberListRequest { linearizable: false })).await?;
            let human: Vec<String> = r
                .members
                .iter()
                .map(|m| {
                    let started = if m.client_ur_ls.is_empty() { "unstarted" } else { "started" };
                    format!(
                        "{:x}, {started}, {}, {}, {}, {}",
                        m.id,
                        m.name,
                        m.peer_ur_ls.join(","),
                        m.client_ur_ls.join(","),
                        m.is_learner
                    )
                })
                .collect();
            let json: Vec<Value> = r
                .members
                .iter()
                .map(|m| {
                    json!({"id": format!("{:x}", m.id), "name": m.name, "peer_urls": m.peer_ur_ls,
                           "client_urls": m.client_ur_ls, "is_learner": m.is_learner})
                })
                .collect();
            ctl.print(human.join("\n"), json!({ "members": json }));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Endpoint(EndpointCmd::Status) => endpoint_status(&ctl).await,
        Cmd::Endpoint(EndpointCmd::Health) => endpoint_health(&ctl).await,
        Cmd::Snapshot(SnapshotCmd::Save { file }) => snapshot_save(&ctl, &file).await,
        Cmd::Bench(_) => unreachable!("handled above"),
    }
}

/// Wait for SIGINT, SIGTERM or SIGHUP; returns the signal's number.
struct Signals(Vec<(i32, tokio::signal::unix::Signal)>);

impl Signals {
    fn new() -> Result<Signals> {
        let kinds = [
            (libc::SIGINT, SignalKind::interrupt()),
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
        ];
        Ok(Signals(kinds.into_iter().map(|(n, k)| Ok((n, signal(k)?))).collect::<std::io::Result<_>>()?))
    }

    async fn recv(&mut self) -> i32 {
        let waits = self.0.iter_mut().map(|(n, s)| Box::pin(async move { s.recv().await.map(|_| *n) }));
        futures::future::select_all(waits).await.0.unwrap_or(libc::SIGTERM)
    }
}

async fn lock(ctl: &Ctl, args: LockArgs) -> Result<ExitCode> {
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
async fn hold(ctl: &Ctl, args: &LockArgs, session: &Session) -> Result<ExitCode> {
    let metadata = args.metadata.clone().unwrap_or_else(default_metadata);
    let wait = if args.try_once { Some(Duration::ZERO) } else { args.wait };
    let options = LockOptions { wait, permits: args.permits, metadata: metadata.into_bytes() };
    let mut signals = Signals::new()?;
    let acquired = tokio::select! {
        r = session.lock(&args.name, options) => r?,
        // The server removes our place in the queue when the call goes away.
        sig = signals.recv() => return Ok(ExitCode::from((128 + sig) as u8)),
    };
    let guard = match acquired {
        Acquisition::Held(guard) => guard,
        Acquisition::Busy(holders) => {
            let human = match holders.first() {
                Some(h) => format!("lock {} is held by {}", args.name, owner_line(h)),
                None => format!("lock {} was not acquired", args.name),
            };
            match ctl.format {
                Format::Simple => eprintln!("{human}"),
                Format::Json => {
                    let holders: Vec<Value> = holders.iter().map(owner_json).collect();
                    println!("{}", json!({"acquired": false, "name": args.name, "holders": holders}));
                }
            }
            return Ok(ExitCode::from(NOT_ACQUIRED));
        }
    };
    let (key, token) = (text(guard.key()), guard.token());
    if !args.command.is_empty() {
        return run_holding(&args.name, &args.command, session, &key, token, &mut signals).await;
    }
    ctl.print(
        format!("{key}\ntoken {token}"),
        json!({"acquired": true, "name": args.name, "key": key, "token": token, "lease": format!("{:x}", session.lease())}),
    );
    Ok(tokio::select! {
        _ = signals.recv() => ExitCode::SUCCESS,
        _ = session.lost() => {
            eprintln!("Error: lock {} lost: its lease ended", args.name);
            ExitCode::FAILURE
        }
    })
}

fn default_metadata() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{user}@{host} pid {}", std::process::id())
}

/// How long CMD has to stop after SIGTERM, once the lock is lost, before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Run `command` while the lock is held: the key and fencing token go in its
/// environment, SIGTERM and SIGHUP to us are passed on (a terminal's SIGINT
/// reaches it directly: it is in our process group), and if the lease is lost
/// it gets SIGTERM, then SIGKILL after [`STOP_GRACE`]. Returns the command's
/// exit code (128 + signal if it was killed; 127 if it could not be started),
/// or failure if the lock was lost.
async fn run_holding(
    name: &str,
    command: &[String],
    session: &Session,
    key: &str,
    token: i64,
    signals: &mut Signals,
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
            _ = session.lost(), if !lost => {
                lost = true;
                kill_at = Some(tokio::time::Instant::now() + STOP_GRACE);
                eprintln!("Error: lock {name} lost: its lease ended; stopping {}", command[0]);
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

async fn elect(ctl: &Ctl, name: String, proposal: Option<String>, listen: bool, ttl: i64) -> Result<ExitCode> {
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

async fn watch(ctl: &Ctl, create: etcd::WatchCreateRequest) -> Result<ExitCode> {
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

async fn lease(ctl: &Ctl, cmd: LeaseCmd) -> Result<ExitCode> {
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
async fn endpoint_status(ctl: &Ctl) -> Result<ExitCode> {
    let mut failed = false;
    for endpoint in &ctl.endpoints {
        let status = async {
            let client = Client::connect([endpoint]).await?;
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

/// Save the first endpoint's snapshot to `file` (written aside, then renamed).
async fn snapshot_save(ctl: &Ctl, file: &std::path::Path) -> Result<ExitCode> {
    use tokio::io::AsyncWriteExt;
    let client = Client::connect([&ctl.endpoints[0]]).await?;
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
    ctl.print(
        format!("Snapshot saved at {} ({bytes} bytes, revision {revision})", file.display()),
        json!({"file": file.display().to_string(), "bytes": bytes, "revision": revision}),
    );
    Ok(ExitCode::SUCCESS)
}

/// Health of every endpoint, each asked directly: healthy when it has a
/// leader and answers a linearizable read in time (etcd's check).
async fn endpoint_health(ctl: &Ctl) -> Result<ExitCode> {
    let mut failed = false;
    for endpoint in &ctl.endpoints {
        let started = std::time::Instant::now();
        let check = async {
            let client = Client::connect([endpoint]).await?;
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
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(parse_lease_id("694d77aa9e38260f"), Ok(0x694d77aa9e38260f));
        assert_eq!(parse_lease_id("0x1f"), Ok(0x1f));
        assert!(parse_lease_id("xyz").is_err());
    }
}
