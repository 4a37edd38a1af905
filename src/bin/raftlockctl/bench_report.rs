//! A bench run's report: throughput, latency percentiles, errors, the
//! longest gap without an answer, and CPU per request of the client and of
//! the servers (from /proc, when their PIDs are given).

use std::time::Duration;

use crate::bench::{BenchArgs, DriverKind, Workload};

#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub workload: String,
    pub driver: DriverKind,
    pub clients: usize,
    pub total: u64,
    pub errors: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The longest time without a successful request (any clients), from
    /// the start of the run to its end: how long the service was
    /// unavailable, during a failover.
    pub max_gap_ms: f64,
    /// This client's own CPU time (user and system, every thread) over the
    /// measured run, per request answered: on a machine the client shares
    /// with the servers, what the client takes from them.
    pub client_cpu_us_per_op: f64,
    /// The CPU time of the processes named by `--server-pids` over the
    /// measured run, per request answered (absent without them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_op: Option<f64>,
    /// watch-fanout: from each put's answer (not its sending) to the last
    /// event it caused, p50 and p99 (zero where the events came first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_answer_ms: Option<(f64, f64)>,
    /// lock and native-lock on one contended lock of one permit: from a
    /// release's sending to the next holder's grant, p50 and p99.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff_ms: Option<(f64, f64)>,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<16} driver={:?} clients={:<3} ops={} errors={} time={:.2}s  {:>9.0} ops/s  p50={:.3}ms p90={:.3}ms p99={:.3}ms max={:.3}ms max-gap={:.1}ms client-cpu={:.1}us/op",
            self.workload,
            self.driver,
            self.clients,
            self.total,
            self.errors,
            self.seconds,
            self.ops_per_sec,
            self.p50_ms,
            self.p90_ms,
            self.p99_ms,
            self.max_ms,
            self.max_gap_ms,
            self.client_cpu_us_per_op
        )
    }
}

pub(crate) fn report(args: &BenchArgs, mut latencies: Vec<Duration>, errors: u64, elapsed: f64) -> BenchReport {
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1e3
    };
    BenchReport {
        driver: args.driver,
        workload: match args.workload {
            Workload::Lock | Workload::NativeLock => format!("{:?}/{}", args.workload, args.lock_names).to_lowercase(),
            other => format!("{other:?}").to_lowercase(),
        },
        clients: args.clients,
        total: latencies.len() as u64,
        errors,
        seconds: elapsed,
        ops_per_sec: latencies.len() as f64 / elapsed,
        p50_ms: pct(0.50),
        p90_ms: pct(0.90),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        max_gap_ms: 0.0,
        client_cpu_us_per_op: 0.0,
        server_cpu_us_per_op: None,
        after_answer_ms: None,
        handoff_ms: None,
    }
}

/// CPU time used so far (user and system, every thread): by this process,
/// and by the servers' processes when they were named.
pub(crate) struct CpuUsed {
    client: Duration,
    servers: Option<Duration>,
}

impl CpuUsed {
    pub(crate) fn now(server_pids: &[u32]) -> CpuUsed {
        // SAFETY: getrusage only writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let client = if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
            let time = |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
            time(usage.ru_utime) + time(usage.ru_stime)
        } else {
            Duration::ZERO
        };
        let servers = (!server_pids.is_empty()).then(|| server_pids.iter().map(|&pid| process_cpu(pid)).sum());
        CpuUsed { client, servers }
    }

    /// Set `r`'s CPU figures: what was used from `start` to this, per
    /// request answered.
    pub(crate) fn record_since(&self, start: &CpuUsed, r: &mut BenchReport) {
        let per_op = |cpu: Duration| cpu.as_secs_f64() * 1e6 / r.total.max(1) as f64;
        r.client_cpu_us_per_op = per_op(self.client.saturating_sub(start.client));
        r.server_cpu_us_per_op = self.servers.zip(start.servers).map(|(end, start)| per_op(end.saturating_sub(start)));
    }
}

/// The CPU time (user and system, every thread) process `pid` has used,
/// from /proc: zero for one that is gone.
fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The fields after the command name (which is in parentheses and may
    // hold spaces): utime and stime are the 12th and 13th of them.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    // SAFETY: sysconf only reads a system setting.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(ticks as f64 / per_second)
}
