//! raftlock's fault suite: for each nemesis, a fresh cluster of real
//! `raftlock` processes, the workloads running against it while the nemesis
//! injects faults, then every recorded history checked.
//!
//! ```text
//!   raftlock-faults [--minutes M] [--nemesis a,b] [--members 3|5] [--seed S]
//!   raftlock-faults --elections
//!   raftlock-faults --hostile [--attack a,b]
//!   raftlock-faults --upgrade [--old-raftlock PATH] [--minutes M]
//! ```
//!
//! `--elections` runs the election checks of `elections` instead (pre-vote
//! and check-quorum under partitions); `--hostile` the hostile-client suite
//! (`hostile`: attacks on a cluster under a memory ceiling, each followed by
//! checks that every member still serves); `--upgrade` the rolling upgrade
//! and downgrade between the previous release and this one, leader last and
//! leader first (`upgrade`), under the workloads both releases serve.
//!
//! Prints one row per nemesis — operations, faults injected, anomalies
//! (must be 0), histories the linearizability checker could not decide —
//! and exits non-zero if any anomaly was found. A run with anomalies keeps
//! its histories (`history.json`) and the members' data and logs for the
//! post-mortem; a clean run deletes them unless `--keep` is given.
//!
//! Needs root (nftables), Debian's libfaketime for the clock-jump and mixed
//! nemeses, and the `raftlock` binary (by default the one beside this
//! binary, as cargo builds both).

mod cluster;
mod elections;
mod hostile;
mod nemesis;
mod net;
mod upgrade;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use raftlock_faults::check::leases::check_leases;
use raftlock_faults::check::linearizable::RegisterInput;
use raftlock_faults::check::locks::{check_locks, Counter, Recorded as LocksRecorded};
use raftlock_faults::check::lost::check_lost;
use raftlock_faults::check::watches::{check_watch, EventKind, WatchMessage, WatchStream};
use raftlock_faults::check::writes::check_acknowledged;
use raftlock_faults::check::{check_register, check_serializable_reads, Verdict};
use raftlock_faults::history::{Anomaly, Outcome};
use tokio::task::JoinHandle;

use cluster::{connect, Clocks, Cluster, ELECTION_MS};
use nemesis::{Injector, Nemesis};
use net::Partition;
use workload::locks::{Api, LockHistory};
use workload::registers::RegisterHistory;
use workload::{Clock, Context, Rng};

#[derive(Parser)]
#[command(about = "Run raftlock under faults and check what its clients saw")]
struct Args {
    /// Minutes of faults per nemesis.
    #[arg(long, default_value_t = 0.33)]
    minutes: f64,
    /// Nemeses to run, comma-separated (default: all, each alone, then mixed).
    #[arg(long, value_delimiter = ',')]
    nemesis: Vec<String>,
    /// Members per cluster.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Seed of every random choice (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The raftlock server binary.
    #[arg(long)]
    raftlock: Option<PathBuf>,
    /// Where runs keep their data, logs and histories.
    #[arg(long, default_value = "target/faults")]
    dir: PathBuf,
    /// Keep data, logs and histories of clean runs too.
    #[arg(long)]
    keep: bool,
    /// Run the election checks (pre-vote, check-quorum) instead of nemeses.
    #[arg(long)]
    elections: bool,
    /// Run the hostile-client suite instead of nemeses.
    #[arg(long)]
    hostile: bool,
    /// With --hostile: the attacks to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    attack: Vec<String>,
    /// Run the rolling upgrade nemeses (upgrade-leader-last,
    /// upgrade-leader-first) instead of the others.
    #[arg(long)]
    upgrade: bool,
    /// The previous release's `raftlock` (default: where
    /// scripts/old-release.sh builds it).
    #[arg(long)]
    old_raftlock: Option<PathBuf>,
}

/// The linearizability checker's budget of search steps per key.
const SEARCH_BUDGET: usize = 20_000_000;

struct Row {
    nemesis: &'static str,
    ops: usize,
    /// Lock grants: all, read locks, those that re-entered, those of
    /// multi-locks; and Validate answers (all, "current"); grants with a
    /// lock-delay (all, ended involuntarily).
    grants: (usize, usize, usize, usize),
    validations: (usize, usize),
    delayed: (usize, usize),
    /// Grants taken from their holders (check 11): how many, how many told,
    /// and the longest a holder waited to be told (ms).
    taken: (usize, usize, u64),
    /// The long queue's grants and its longest wait (ms); the leases that
    /// expired in storms.
    hot: (usize, u64, usize),
    /// An upgrade run's replacements, a line each.
    replacements: Vec<String>,
    faults: u64,
    anomalies: Vec<Anomaly>,
    undecided: usize,
    seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let nemeses: Vec<Nemesis> = if args.nemesis.is_empty() && args.upgrade {
        Nemesis::upgrades()
    } else if args.nemesis.is_empty() {
        Nemesis::all()
    } else {
        args.nemesis
            .iter()
            .map(|n| Nemesis::parse(n).ok_or_else(|| anyhow::anyhow!("unknown nemesis {n}")))
            .collect::<anyhow::Result<_>>()?
    };
    let binary = match &args.raftlock {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("raftlock"),
    };
    anyhow::ensure!(binary.exists(), "no raftlock binary at {} (build it, or pass --raftlock)", binary.display());
    let old_binary = upgrade::old_binary(args.old_raftlock.as_deref());
    if nemeses.iter().any(|n| n.upgrades_members()) {
        anyhow::ensure!(
            old_binary.exists(),
            "no previous release at {} (scripts/old-release.sh builds it, or pass --old-raftlock)",
            old_binary.display()
        );
    }
    let run_dir = args.dir.join(format!("run-{seed}"));
    if args.elections {
        let dir = run_dir.join("elections");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        println!("raftlock election checks: 3 members, data under {}", dir.display());
        elections::run(&binary, &dir).await?;
        let _ = std::fs::remove_dir_all(&run_dir);
        return Ok(());
    }
    if args.hostile {
        let dir = run_dir.join("hostile");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        println!("raftlock hostile-client suite: 3 members under ulimit -v, data under {}", dir.display());
        let rows = hostile::run(&binary, &dir, &args.attack).await?;
        let failed: Vec<&str> = rows.iter().filter(|r| r.outcome.is_err()).map(|r| r.attack).collect();
        println!("{} passed, {} failed", rows.len() - failed.len(), failed.len());
        if !failed.is_empty() {
            println!("  data and logs kept in {}", dir.display());
            anyhow::bail!("hostile suite: {} failed", failed.join(", "));
        }
        if !args.keep {
            let _ = std::fs::remove_dir_all(&run_dir);
        }
        return Ok(());
    }
    println!(
        "raftlock fault suite: {} members, {:.1} min per nemesis, seed {seed}, data under {}",
        args.members,
        args.minutes,
        run_dir.display()
    );

    let mut rows = Vec::new();
    let mut rng = Rng::new(seed);
    let suite_started = std::time::Instant::now();
    for nemesis in nemeses {
        let dir = run_dir.join(nemesis.name());
        // A run with the same seed may have left its data behind.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let duration = Duration::from_secs_f64(args.minutes * 60.0);
        let started = std::time::Instant::now();
        let mut row = run(nemesis, (&binary, &old_binary), &dir, args.members, duration, rng.next()).await?;
        row.seconds = started.elapsed().as_secs();
        let failed = !row.anomalies.is_empty();
        println!(
            "  {:<22} {:>8} ops {:>4} faults {:>3} anomalies {:>2} undecided  ({} s)",
            row.nemesis,
            row.ops,
            row.faults,
            row.anomalies.len(),
            row.undecided,
            row.seconds
        );
        let (grants, read, reentered, multi) = row.grants;
        let (validated, current) = row.validations;
        let (delayed, lost) = row.delayed;
        let (taken, told, slowest) = row.taken;
        println!(
            "  {:<22} {grants:>8} lock grants: {read} read, {reentered} re-entered, {multi} in multi-locks, \
             {delayed} with a lock-delay ({lost} ended involuntarily); {validated} validated ({current} current); \
             {taken} taken from their holders, {told} told (slowest {slowest} ms)",
            ""
        );
        let (queue_grants, longest_wait, storm_leases) = row.hot;
        if queue_grants + storm_leases > 0 {
            println!(
                "  {:<22} {queue_grants:>8} grants from a queue of {QUEUE_WAITERS} on {QUEUE} (longest wait {longest_wait} \
                 ms); {storm_leases} leases abandoned in storms of up to {}",
                "",
                workload::storm::BATCH * STORM_CLIENTS.len()
            );
        }
        for r in &row.replacements {
            println!("  {:<22} {r}", "");
        }
        for a in row.anomalies.iter().take(20) {
            println!("      {a}");
        }
        if failed {
            println!("      history, data and logs kept in {}", dir.display());
        } else if !args.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        rows.push(row);
    }
    print_table(&rows);
    println!("{} nemeses in {} s", rows.len(), suite_started.elapsed().as_secs());
    let _ = std::fs::remove_dir(&run_dir);
    let anomalies: usize = rows.iter().map(|r| r.anomalies.len()).sum();
    if anomalies > 0 {
        anyhow::bail!("{anomalies} anomalies found (seed {seed})");
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!();
    println!("| nemesis | operations | faults | anomalies | undecided |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        println!("| {} | {} | {} | {} | {} |", r.nemesis, r.ops, r.faults, r.anomalies.len(), r.undecided);
    }
    let (ops, faults, anomalies): (usize, u64, usize) =
        rows.iter().fold((0, 0, 0), |(o, f, a), r| (o + r.ops, f + r.faults, a + r.anomalies.len()));
    println!("| **all** | {ops} | {faults} | {anomalies} | {} |", rows.iter().map(|r| r.undecided).sum::<usize>());
}

/// Everything the workloads of one run recorded.
struct Recorded {
    registers: RegisterHistory,
    acked: Vec<(String, u64)>,
    leases: Vec<workload::leases::KeptLease>,
    locks: LockHistory,
    watches: Vec<WatchStream>,
}

struct Workloads {
    registers: Vec<JoinHandle<RegisterHistory>>,
    writes: Vec<JoinHandle<Vec<(String, u64)>>>,
    leases: Vec<JoinHandle<Vec<workload::leases::KeptLease>>>,
    locks: Vec<JoinHandle<LockHistory>>,
    watches: Vec<JoinHandle<WatchStream>>,
    /// The watchers of lease keys, stopped apart (see `stop_workloads`).
    lease_watches: Vec<JoinHandle<WatchStream>>,
}

const REGISTER_KEYS: usize = 6;
const LOCK_NAMES: [&str; 2] = ["lock/0", "lock/1"];
const SEMAPHORE: &str = "sem/0";
/// The hot name of the long queue: [`QUEUE_WAITERS`] clients, half with
/// etcd's Lock and half with the native mutex, waiting in one FIFO.
const QUEUE: &str = "queue/0";
const QUEUE_WAITERS: usize = 24;
/// The mass-expiry clients' ids (the lease clients have 0..3): each
/// abandons [`workload::storm::BATCH`] leases at once, again and again.
const STORM_CLIENTS: std::ops::Range<usize> = 100..102;

/// Check 11's bound, in ns: how soon a holder must be told that its grant
/// was taken (see `raftlock_faults::check::lost::told_within`).
fn told_within() -> u64 {
    let (ping, ping_timeout) = (raftlock::client::PING_INTERVAL, raftlock::client::PING_TIMEOUT);
    let ttl = workload::locks::TTL as u64;
    raftlock_faults::check::lost::told_within(
        ttl,
        ELECTION_MS,
        ping.as_millis() as u64,
        ping_timeout.as_millis() as u64,
    )
}

/// Start every workload (with `every` false, only those both the previous
/// release and this one serve: no multi-locks, lock-delays or lock events;
/// nor the long queue and the storms, which keep the upgrade runs' load as
/// it was).
/// The lease watcher follows `lease_ctx`, which stops later than the rest:
/// it must see the revocations of the leases that the others abandon when
/// they stop.
fn start_workloads(ctx: &Context, lease_ctx: &Context, start_revision: i64, rng: &mut Rng, every: bool) -> Workloads {
    let mut w = Workloads {
        registers: vec![],
        writes: vec![],
        leases: vec![],
        locks: vec![],
        watches: vec![],
        lease_watches: vec![],
    };
    for id in 0..8 {
        w.registers.push(tokio::spawn(workload::registers::client(ctx.clone(), id, REGISTER_KEYS, rng.next())));
    }
    for id in 0..2 {
        w.writes.push(tokio::spawn(workload::writes::client(ctx.clone(), id, rng.next())));
    }
    for id in 0..3 {
        w.leases.push(tokio::spawn(workload::leases::client(ctx.clone(), id, rng.next())));
    }
    let names: Vec<String> = LOCK_NAMES.iter().map(|s| s.to_string()).collect();
    for id in 0..6 {
        let api = if id % 2 == 0 { Api::Etcd } else { Api::Native { permits: 1 } };
        w.locks.push(tokio::spawn(workload::locks::client(ctx.clone(), id, api, names.clone(), rng.next())));
    }
    for id in 6..9 {
        let api = Api::Native { permits: 2 };
        w.locks.push(tokio::spawn(workload::locks::client(ctx.clone(), id, api, vec![SEMAPHORE.into()], rng.next())));
    }
    // Readers and writers on the names etcd's Lock and the native mutex use.
    for id in 9..12 {
        w.locks.push(tokio::spawn(workload::locks::client(ctx.clone(), id, Api::ReadWrite, names.clone(), rng.next())));
    }
    // Multi-locks of both names, asked for in shuffled orders.
    for id in (12..14).filter(|_| every) {
        w.locks.push(tokio::spawn(workload::locks::multi_client(ctx.clone(), id, names.clone(), rng.next())));
    }
    // Mutex holders with a lock-delay, on the same names, some of which die holding them.
    for id in (14..16).filter(|_| every) {
        w.locks.push(tokio::spawn(workload::locks::client(ctx.clone(), id, Api::Delayed, names.clone(), rng.next())));
    }
    // Mutex holders that follow their grants while some are taken from them.
    for id in (16..18).filter(|_| every) {
        w.locks.push(tokio::spawn(workload::lost::client(ctx.clone(), id, names.clone(), rng.next(), told_within())));
    }
    // A long queue on one hot name, with fenced increments like the others.
    for id in (18..18 + QUEUE_WAITERS).filter(|_| every) {
        let api = if id % 2 == 0 { Api::Etcd } else { Api::Native { permits: 1 } };
        w.locks.push(tokio::spawn(workload::locks::client(ctx.clone(), id, api, vec![QUEUE.into()], rng.next())));
    }
    // Lease-expiry storms, checked with the other leases.
    for id in STORM_CLIENTS.filter(|_| every) {
        w.leases.push(tokio::spawn(workload::storm::client(ctx.clone(), id, rng.next())));
    }
    for i in 0..2 {
        let (name, prefix) = (format!("watch-{i}-{}", workload::registers::PREFIX), workload::registers::PREFIX);
        w.watches.push(tokio::spawn(workload::watches::watcher(
            ctx.clone(),
            name,
            prefix.into(),
            start_revision,
            rng.next(),
        )));
    }
    // Two watchers of the lease keys, starting on different members: a
    // revocation counts from the first that saw it.
    let members = ctx.endpoints.len() as u64;
    for k in 0..2 {
        let (name, prefix) = (format!("watch-{}-{}", 2 + k, workload::leases::PREFIX), workload::leases::PREFIX);
        let seed = rng.next() / members * members + k;
        let watcher = workload::watches::watcher(lease_ctx.clone(), name, prefix.into(), start_revision, seed);
        w.lease_watches.push(tokio::spawn(watcher));
    }
    w
}

/// Every workload's history; a workload that panicked is a bug of the
/// suite, never an empty history.
async fn join<T>(handles: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a workload panicked"));
    }
    out
}

/// Stop the workloads (`stop` has been sent): the lease clients first; then
/// the lease watchers once every abandoned lease has had its TTL and
/// `revoke_bound` to go; then the rest.
async fn stop_workloads(
    w: Workloads,
    clock: Clock,
    stop_lease_watchers: tokio::sync::watch::Sender<bool>,
    revoke_bound: Duration,
) -> Recorded {
    let leases: Vec<workload::leases::KeptLease> = join(w.leases).await.into_iter().flatten().collect();
    let last_abandoned = leases.iter().filter_map(|l| l.record.abandoned_at).max().unwrap_or(0);
    let ttl = Duration::from_secs(workload::leases::TTL as u64);
    let watch_until = Duration::from_nanos(last_abandoned) + ttl + revoke_bound + Duration::from_secs(1);
    tokio::time::sleep(watch_until.saturating_sub(Duration::from_nanos(clock.now()))).await;
    let _ = stop_lease_watchers.send(true);
    let mut registers = RegisterHistory::default();
    for h in join(w.registers).await {
        registers.merge(h);
    }
    let mut locks = LockHistory::default();
    for h in join(w.locks).await {
        locks.merge(h);
    }
    let watches = join(w.watches.into_iter().chain(w.lease_watches).collect()).await;
    Recorded { registers, acked: join(w.writes).await.into_iter().flatten().collect(), leases, locks, watches }
}

/// One nemesis on a fresh cluster: faults for `duration`, then the checks.
/// `binaries`: this release's `raftlock` and the previous one's (which the
/// upgrade nemeses start the members on).
async fn run(
    nemesis: Nemesis,
    binaries: (&Path, &Path),
    dir: &Path,
    members: usize,
    duration: Duration,
    seed: u64,
) -> anyhow::Result<Row> {
    let mut rng = Rng::new(seed);
    let mut net = Partition::new()?;
    let clocks = if nemesis.moves_clocks() { Some(Clocks::new(dir)?) } else { None };
    let mut rolling = nemesis.upgrades_members().then(|| {
        let releases = upgrade::Releases {
            old: binaries.1.to_path_buf(),
            old_name: "0.1.0",
            new: binaries.0.to_path_buf(),
            new_name: raftlock::version::RAFTLOCK,
        };
        let order = if nemesis == Nemesis::UpgradeLeaderFirst {
            upgrade::Order::LeaderFirst
        } else {
            upgrade::Order::LeaderLast
        };
        upgrade::Rolling::new(releases, order, members)
    });
    let first_binary = if rolling.is_some() { binaries.1 } else { binaries.0 };
    let mut cluster = cluster::start(first_binary, dir, members, clocks)?;
    cluster.wait_healthy(Duration::from_secs(60)).await?;
    let clock = Clock::start();
    let start_revision =
        connect(&cluster.endpoints()).await?.get("start", None).await?.header().map_or(0, |h| h.revision()) + 1;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (stop_lease_watcher, lease_stop_rx) = tokio::sync::watch::channel(false);
    let ctx = Context::new(clock, cluster.endpoints(), stop_rx);
    let lease_ctx = Context::new(clock, cluster.endpoints(), lease_stop_rx);
    if let Some(rolling) = rolling.as_mut() {
        rolling.hold_lock(&cluster, &ctx).await?;
    }
    let workloads = start_workloads(&ctx, &lease_ctx, start_revision, &mut rng, rolling.is_none());

    let mut anomalies = Vec::new();
    let mut injector = Injector::new(rng.next());
    let mut log = Vec::new();
    let until = tokio::time::Instant::now() + duration;
    // Let the workloads get going before the first fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // An upgrade run goes on until its members have gone up, back down and
    // up again (`upgrade::Rolling::round_done`).
    while tokio::time::Instant::now() < until || rolling.as_ref().is_some_and(|r| !r.round_done()) {
        let step = match rolling.as_mut() {
            Some(rolling) => rolling.step(&mut cluster, &clock).await,
            None => injector.cycle(nemesis, &mut cluster, &mut net).await,
        };
        let did = match step {
            Ok(did) => did,
            Err(e) => {
                // The cluster did not behave as the nemesis requires (a
                // member with lost data let in, a rejoin that never
                // completed): an anomaly; heal and go on.
                anomalies.push(Anomaly::new("nemesis", nemesis.name(), e.to_string()));
                cluster.heal()?;
                net.heal()?;
                format!("{}: failed: {e}", nemesis.name())
            }
        };
        log.push(format!("{:>9.3}s {did}", clock.now() as f64 / 1e9));
        if let Err(e) = cluster.wait_healthy(Duration::from_secs(30)).await {
            anomalies.push(Anomaly::new("availability", nemesis.name(), format!("after `{did}` was healed: {e}")));
            cluster.wait_healthy(Duration::from_secs(60)).await?;
        }
        tokio::time::sleep(rng.between(Duration::from_millis(500), Duration::from_millis(2500))).await;
    }
    std::fs::write(dir.join("nemesis.log"), log.join("\n"))?;
    if let Some(rolling) = rolling.as_mut() {
        rolling.finish(&cluster).await;
    }
    let healed_at = clock.now();
    let _ = stop.send(true);
    // Abandoned leases get their TTL and the time an expiry may take, with
    // the lease watchers looking on.
    let revoke_bound = Duration::from_millis(2 * ELECTION_MS + 2000);
    let recorded = stop_workloads(workloads, clock, stop_lease_watcher, revoke_bound).await;
    anomalies.extend(check(&cluster, &recorded, start_revision, healed_at, revoke_bound).await?);
    let mut replacements = Vec::new();
    let mut faults = injector.faults;
    if let Some(rolling) = rolling.as_mut() {
        anomalies.append(&mut rolling.anomalies);
        let writes: Vec<u64> = recorded
            .registers
            .ops
            .values()
            .flatten()
            .filter(|op| matches!(op.input, RegisterInput::Write(_)) && matches!(op.outcome, Outcome::Ok(_)))
            .map(|op| op.complete)
            .collect();
        replacements = rolling.report(&writes);
        faults = rolling.replacements.len() as u64;
    }

    let ops = recorded.registers.len()
        + recorded.acked.len()
        + recorded.leases.iter().map(|l| l.record.keepalives.len() + 1).sum::<usize>()
        + recorded.locks.grants.len()
        + recorded.locks.writes.len()
        + 2 * recorded.locks.reads.len()
        + 2 * recorded.locks.reentries.len()
        + recorded.locks.validations.len()
        + recorded.watches.iter().map(|w| w.messages.len()).sum::<usize>();
    let undecided = anomalies.iter().filter(|a| a.checker == "undecided").count();
    anomalies.retain(|a| a.checker != "undecided");
    if !anomalies.is_empty() {
        save(dir, &recorded, &anomalies)?;
    }
    let locks = &recorded.locks;
    let grants = (
        locks.grants.len(),
        locks.grants.iter().filter(|g| g.shared).count(),
        locks.reentries.len(),
        locks.grants.iter().filter(|g| g.multi).count(),
    );
    let validations = (locks.validations.len(), locks.validations.iter().filter(|v| v.current).count());
    let delayed = locks.grants.iter().filter(|g| g.lock_delay_ms > 0);
    let delayed = (delayed.clone().count(), delayed.filter(|g| g.ended_after.is_some()).count());
    let told = locks.lost.iter().filter_map(|l| Some(l.told_at?.saturating_sub(l.taken_at) / 1_000_000));
    let taken = (locks.lost.len(), told.clone().count(), told.max().unwrap_or(0));
    let queued = locks.grants.iter().filter(|g| g.name == QUEUE);
    let longest_wait = queued.clone().map(|g| (g.granted_at - g.acquire_invoked) / 1_000_000).max().unwrap_or(0);
    let storm_leases = recorded.leases.iter().filter(|l| STORM_CLIENTS.contains(&l.record.client)).count();
    let hot = (queued.count(), longest_wait, storm_leases);
    Ok(Row {
        delayed,
        taken,
        hot,
        nemesis: nemesis.name(),
        ops,
        grants,
        validations,
        faults,
        replacements,
        anomalies,
        undecided,
        seconds: 0,
    })
}

/// Run every checker over what was recorded, reading the final state
/// through the healed cluster. Undecided linearizability checks come back
/// as anomalies of the checker "undecided" (counted apart).
async fn check(
    cluster: &Cluster,
    rec: &Recorded,
    start_revision: i64,
    healed_at: u64,
    revoke_bound: Duration,
) -> anyhow::Result<Vec<Anomaly>> {
    let mut anomalies = Vec::new();
    let mut c = connect(&cluster.endpoints()).await?;

    for (key, ops) in &rec.registers.ops {
        match check_register(key, None, ops, SEARCH_BUDGET) {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable(a) => anomalies.push(a),
            Verdict::Undecided { explored } => {
                anomalies.push(Anomaly::new("undecided", key.as_str(), format!("{explored} steps")))
            }
        }
        let reads = rec.registers.serializable.get(key).map(Vec::as_slice).unwrap_or(&[]);
        anomalies.extend(check_serializable_reads(key, None, ops, reads));
    }

    let present = workload::writes::present(&mut c).await?;
    anomalies.extend(check_acknowledged(&rec.acked, &present));

    let mut counters = Vec::new();
    for name in LOCK_NAMES.into_iter().chain([QUEUE]) {
        let resp = c.get(workload::locks::counter_key(name), None).await?;
        let final_value = resp.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok()).unwrap_or(0);
        let (increments_ok, increments_unknown) = rec.locks.increments.get(name).copied().unwrap_or((0, 0));
        counters.push(Counter { name: name.to_string(), final_value, increments_ok, increments_unknown });
    }
    anomalies.extend(check_locks(LocksRecorded {
        grants: &rec.locks.grants,
        writes: &rec.locks.writes,
        counters: &counters,
        reads: &rec.locks.reads,
        reentries: &rec.locks.reentries,
        liveness: &rec.locks.liveness,
        validations: &rec.locks.validations,
    }));
    anomalies.extend(check_lost(&rec.locks.lost, told_within()));

    // When the lease watcher first saw each lease key deleted.
    let mut deleted: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for stream in rec.watches.iter().filter(|w| w.prefix == workload::leases::PREFIX.as_bytes()) {
        for m in &stream.messages {
            if let WatchMessage::Events { events, received, .. } = m {
                for e in events.iter().filter(|e| e.kind == EventKind::Delete) {
                    deleted.entry(e.kv.key.clone()).or_insert(*received);
                }
            }
        }
    }
    let lease_keys =
        c.get(workload::leases::PREFIX, Some(etcd_client::GetOptions::new().with_prefix().with_keys_only())).await?;
    let existing: std::collections::BTreeSet<Vec<u8>> = lease_keys.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    let leases: Vec<_> = rec
        .leases
        .iter()
        .map(|l| {
            let mut r = l.record.clone();
            r.revoked_seen_at = deleted.get(l.key.as_bytes()).copied();
            r.exists_at_end = existing.contains(l.key.as_bytes());
            r
        })
        .collect();
    anomalies.extend(check_leases(&leases, healed_at, revoke_bound.as_nanos() as u64));

    let endpoint = cluster.endpoints()[0].clone();
    let mut references = BTreeMap::new();
    for stream in &rec.watches {
        let prefix = String::from_utf8_lossy(&stream.prefix).to_string();
        if !references.contains_key(&prefix) {
            references.insert(prefix.clone(), workload::watches::reference(&endpoint, &prefix, start_revision).await?);
        }
        anomalies.extend(check_watch(stream, &references[&prefix]));
    }
    Ok(anomalies)
}

/// Keep what a failing run recorded, as JSON, for the post-mortem.
fn save(dir: &Path, rec: &Recorded, anomalies: &[Anomaly]) -> anyhow::Result<()> {
    let leases: Vec<_> = rec.leases.iter().map(|l| (&l.key, &l.record)).collect();
    let history = serde_json::json!({
        "anomalies": anomalies,
        "registers": rec.registers.ops,
        "serializable_reads": rec.registers.serializable,
        "acknowledged": rec.acked,
        "leases": leases,
        "lock_grants": rec.locks.grants,
        "guarded_writes": rec.locks.writes,
        "shared_reads": rec.locks.reads,
        "reentries": rec.locks.reentries,
        "validations": rec.locks.validations,
        "lost_grants": rec.locks.lost,
        "watches": rec.watches,
    });
    std::fs::write(dir.join("history.json"), serde_json::to_vec(&history)?)?;
    Ok(())
}
