//! Prometheus metrics, under etcd's names where etcd has one (so that its
//! dashboards and alerts work unchanged), and raftlock's own for locks and
//! for how writes are batched.
//!
//! One registry per process ([`metrics`]): a process runs one member, and
//! every layer records into it without threading handles through (the WAL's
//! fsyncs, the state store's commits, the peer network, apply, the gRPC
//! services, the lock recipes). Values that are a view of the state (has a
//! leader, revisions, sizes, keys) are set when the registry is scraped
//! ([`Metrics::refresh`] from `api::http`), not kept up to date on every write.
//!
//! Caveats: gRPC message counts are exact for unary calls; a stream counts
//! one message each way when it starts. `etcd_network_peer_round_trip_time_seconds`
//! times the peer calls openraft makes (votes, snapshots, append entries
//! outside the pipelines) and the pipelines' heartbeat round trips.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Every metric this member exports.
pub struct Metrics {
    registry: Registry,
    // Server.
    pub has_leader: IntGauge,
    pub is_leader: IntGauge,
    pub leader_changes: IntCounter,
    pub proposals_committed: IntGauge,
    pub proposals_applied: IntGauge,
    pub proposals_pending: IntGauge,
    pub proposals_failed: IntCounter,
    pub slow_apply: IntCounter,
    pub quota_backend_bytes: IntGauge,
    // Disk.
    pub wal_fsync: Histogram,
    pub backend_commit: Histogram,
    // Network.
    pub peer_round_trip: HistogramVec,
    pub peer_sent_bytes: IntCounterVec,
    // MVCC.
    pub db_total_size: IntGauge,
    pub db_size_in_use: IntGauge,
    pub puts: IntCounter,
    pub ranges: IntCounter,
    pub deletes: IntCounter,
    pub txns: IntCounter,
    pub keys: IntGauge,
    pub current_revision: IntGauge,
    pub compact_revision: IntGauge,
    // gRPC.
    pub grpc_started: IntCounterVec,
    pub grpc_handled: IntCounterVec,
    pub grpc_received: IntCounterVec,
    pub grpc_sent: IntCounterVec,
    pub grpc_handling: HistogramVec,
    // Leases.
    pub leases_granted: IntCounter,
    pub leases_revoked: IntCounter,
    pub leases_renewed: IntCounter,
    pub leases_expired: IntCounter,
    pub lease_expiries_overdue: IntGauge,
    // Alarms (raftlock's own).
    pub alarms: prometheus::IntGaugeVec,
    // Locks (raftlock's own).
    pub lock_waiters: IntGauge,
    pub lock_holders: IntGauge,
    pub history_spill_bytes: IntGauge,
    pub lock_grant: HistogramVec,
    // Batching (raftlock's own).
    pub proposal_batch: Histogram,
    pub forwarded_batch: Histogram,
    // Watches (raftlock's own).
    pub watch_inbox_overflows: IntCounter,
    pub lock_event_rejoins: IntCounter,
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// The labels of a gRPC call, as go-grpc-prometheus names them.
const GRPC_CALL: &[&str] = &["grpc_type", "grpc_service", "grpc_method"];

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("a valid metric");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("a valid metric");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        // etcd's disk histograms: 1 ms doubling, 14 buckets (to about 8 s).
        let disk_buckets = exponential_buckets(0.001, 2.0, 14).expect("valid buckets");
        // Commands per batch: 1 doubling, up to the most a batch holds.
        let most = crate::base::limits::MAX_BATCH_COMMANDS;
        let batch_buckets = exponential_buckets(1.0, 2.0, most.ilog2() as usize + 1).expect("valid buckets");
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h =
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid metric");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let histograms = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels).expect("a valid metric");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let metrics = Metrics {
            has_leader: gauge("etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not."),
            is_leader: gauge("etcd_server_is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise."),
            leader_changes: counter("etcd_server_leader_changes_seen_total", "The number of leader changes seen."),
            proposals_committed: gauge(
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed.",
            ),
            proposals_applied: gauge(
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied.",
            ),
            proposals_pending: gauge(
                "etcd_server_proposals_pending",
                "The current number of pending proposals to commit.",
            ),
            proposals_failed: counter(
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen.",
            ),
            slow_apply: counter("etcd_server_slow_apply_total", "The total number of slow apply requests."),
            quota_backend_bytes: gauge(
                "etcd_server_quota_backend_bytes",
                "Current backend storage quota size in bytes.",
            ),
            wal_fsync: histogram(
                "etcd_disk_wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
                &disk_buckets,
            ),
            backend_commit: histogram(
                "etcd_disk_backend_commit_duration_seconds",
                "The latency distributions of commit called by backend.",
                &disk_buckets,
            ),
            peer_round_trip: histograms(
                "etcd_network_peer_round_trip_time_seconds",
                "Round-Trip-Time histogram between peers",
                &["To"],
                exponential_buckets(0.0001, 2.0, 16).expect("valid buckets"),
            ),
            peer_sent_bytes: counters(
                "etcd_network_peer_sent_bytes_total",
                "The total number of bytes sent to peers.",
                &["To"],
            ),
            db_total_size: gauge(
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            db_size_in_use: gauge(
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            ),
            puts: counter("etcd_mvcc_put_total", "Total number of puts seen by this member."),
            ranges: counter("etcd_mvcc_range_total", "Total number of ranges seen by this member."),
            deletes: counter("etcd_mvcc_delete_total", "Total number of deletes seen by this member."),
            txns: counter("etcd_mvcc_txn_total", "Total number of txns seen by this member."),
            keys: gauge("etcd_debugging_mvcc_keys_total", "Total number of keys."),
            current_revision: gauge("etcd_debugging_mvcc_current_revision", "The current revision of store."),
            compact_revision: gauge(
                "etcd_debugging_mvcc_compact_revision",
                "The revision of the last compaction in store.",
            ),
            grpc_started: counters(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                GRPC_CALL,
            ),
            grpc_handled: counters(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            ),
            grpc_received: counters(
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
                GRPC_CALL,
            ),
            grpc_sent: counters(
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
                GRPC_CALL,
            ),
            grpc_handling: histograms(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                GRPC_CALL,
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            ),
            leases_granted: counter("etcd_debugging_lease_granted_total", "The total number of granted leases."),
            leases_revoked: counter(
                "etcd_debugging_lease_revoked_total",
                "The total number of revoked leases (revoked by a request or expired).",
            ),
            leases_renewed: counter(
                "etcd_debugging_lease_renewed_total",
                "The number of renewed leases seen by the leader.",
            ),
            leases_expired: counter(
                "raftlock_lease_expired_total",
                "Leases this member applied the expiry of (their TTL ran out on the leader's clock).",
            ),
            lease_expiries_overdue: gauge(
                "raftlock_lease_expiries_overdue",
                "On the leader: leases whose deadline has passed and whose expiry is not applied yet (expiries are proposed at --lease-expiry-rate, 20,000 a second by default).",
            ),
            alarms: {
                let g = prometheus::IntGaugeVec::new(
                    Opts::new("raftlock_alarms", "Members with this alarm raised (NOSPACE, CORRUPT), as this member applied them."),
                    &["alarm"],
                )
                .expect("a valid metric");
                registry.register(Box::new(g.clone())).expect("registered once");
                g
            },
            lock_waiters: gauge(
                "raftlock_lock_waiters",
                "Lock, semaphore and election requests waiting for their turn on this member.",
            ),
            lock_holders: gauge(
                "raftlock_lock_holders",
                "Grants made through this member whose owner key still exists (native locks, v3lock Lock, Campaign).",
            ),
            history_spill_bytes: gauge(
                "raftlock_history_spill_bytes",
                "Bytes of superseded values held in the history spill (out of memory, on disk, not synced).",
            ),
            lock_grant: histograms(
                "raftlock_lock_grant_duration_seconds",
                "Time from a lock request's arrival to its grant, by API.",
                &["api"],
                exponential_buckets(0.0005, 2.0, 20).expect("valid buckets"),
            ),
            proposal_batch: histogram(
                "raftlock_proposal_batch_commands",
                "Commands per log entry this member proposed as leader and had committed and applied.",
                &batch_buckets,
            ),
            forwarded_batch: histogram(
                "raftlock_forwarded_batch_commands",
                "Commands per batch this member sent on its forwarding stream to the leader.",
                &batch_buckets,
            ),
            watch_inbox_overflows: counter(
                "raftlock_watch_inbox_overflows_total",
                "Times a watch session (or a semaphore waiter, or an election observer) fell so far behind apply that its queued changes were dropped; it then read them from history.",
            ),
            lock_event_rejoins: counter(
                "raftlock_lock_event_rejoins_total",
                "Times a lock-event stream (Observe) fell so far behind its lock's shared events that it read them again from history.",
            ),
            registry,
        };
        // What this binary is: etcd's gauge (its label the etcd API level,
        // which dashboards read as the server's version) and raftlock's own.
        let info = |name: &str, help: &str, labels: &[(&str, &str)]| {
            let names: Vec<&str> = labels.iter().map(|(n, _)| *n).collect();
            let g = prometheus::IntGaugeVec::new(Opts::new(name, help), &names).expect("a valid metric");
            g.with_label_values(&labels.iter().map(|(_, v)| *v).collect::<Vec<_>>()).set(1);
            metrics.registry.register(Box::new(g)).expect("registered once");
        };
        use super::version::{ETCD_API, GIT_SHA, RAFTLOCK};
        info(
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            &[("server_version", ETCD_API)],
        );
        info(
            "raftlock_build_info",
            "The raftlock release this member runs, its commit and the etcd API level it serves; always 1.",
            &[("version", RAFTLOCK), ("git_sha", GIT_SHA), ("etcd_api", ETCD_API)],
        );
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            metrics.registry.register(Box::new(process)).expect("registered once");
        }
        metrics
    }

    /// The registry in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// Time `f`, recording its duration in `histogram`.
pub fn timed<T>(histogram: &Histogram, f: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    let out = f();
    histogram.observe(start.elapsed().as_secs_f64());
    out
}

/// An apply call slower than this counts as slow (etcd's 100 ms).
pub const SLOW_APPLY: Duration = Duration::from_millis(100);
