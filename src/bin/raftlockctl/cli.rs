//! `raftlockctl`'s command line: every command, flag and environment
//! variable (clap), and the parsers of durations and lease IDs.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "raftlockctl", version, long_version = raftlock::version::long(), about = "Command-line client for raftlock")]
pub(crate) struct Cli {
    /// Comma-separated client URLs (or host:port).
    #[arg(
        long,
        env = "RAFTLOCK_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ',',
        global = true
    )]
    pub(crate) endpoints: Vec<String>,
    /// Find the endpoints in this domain's SRV records instead
    /// (`_etcd-client-ssl._tcp`, `_etcd-client._tcp`), as etcdctl does.
    #[arg(long, env = "RAFTLOCK_DISCOVERY_SRV", global = true)]
    pub(crate) discovery_srv: Option<String>,
    /// A suffix to the SRV service names (`_etcd-client-<name>._tcp`).
    #[arg(long, env = "RAFTLOCK_DISCOVERY_SRV_NAME", global = true)]
    pub(crate) discovery_srv_name: Option<String>,
    /// The CA certificate (PEM) that verifies the servers' certificates (https).
    #[arg(id = "tls_cacert", long = "cacert", env = "RAFTLOCK_CACERT", global = true)]
    pub(crate) cacert: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for servers that require one.
    #[arg(id = "tls_cert", long = "cert", env = "RAFTLOCK_CERT", global = true, requires = "tls_key")]
    pub(crate) cert: Option<std::path::PathBuf>,
    /// The key of --cert (PEM).
    #[arg(id = "tls_key", long = "key", env = "RAFTLOCK_KEY", global = true, requires = "tls_cert")]
    pub(crate) key: Option<std::path::PathBuf>,
    /// Log in as this user while etcd's auth is on: `name` or `name:password`.
    #[arg(long, env = "RAFTLOCK_USER", global = true)]
    pub(crate) user: Option<String>,
    /// The password of --user (when --user has none).
    #[arg(long, env = "RAFTLOCK_PASSWORD", global = true, hide_env_values = true)]
    pub(crate) password: Option<String>,
    /// Output format.
    #[arg(short = 'w', long = "write-out", value_enum, default_value = "simple", global = true)]
    pub(crate) write_out: Format,
    /// Time limit of each request (not of waiting for a lock or watching).
    #[arg(long, default_value = "5s", value_parser = parse_duration, global = true)]
    pub(crate) command_timeout: Duration,
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Simple,
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Acquire a lock (or several together, all or none: a multi-lock); run
    /// CMD while holding it, or hold it until interrupted.
    Lock(LockArgs),
    /// Release a grant by key, fenced by its token.
    Release {
        key: String,
        #[arg(long)]
        token: i64,
    },
    /// Tell whether a grant still holds its lock, read linearizably: exit 0
    /// if it does, 1 if not.
    Validate {
        key: String,
        #[arg(long)]
        token: i64,
        #[arg(long, default_value_t = 1)]
        permits: u32,
    },
    /// Print a lock's events until interrupted: its holders and waiters,
    /// then every place queued, granted and ended (released, or its lease's end).
    Observe {
        name: String,
        #[arg(long, default_value_t = 1)]
        permits: u32,
        /// Start with the changes from this revision on (history included).
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
    /// Show who holds a lock and who waits for it.
    Describe {
        name: String,
        #[arg(long, default_value_t = 1)]
        permits: u32,
        /// Show at most this many waiters, first in line first (0: all of
        /// them, asked a page at a time).
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// List the locks under a name prefix.
    List {
        #[arg(default_value = "")]
        prefix: String,
        #[arg(long, default_value_t = 1)]
        permits: u32,
        /// List at most this many locks (0: all of them, asked a page at a
        /// time).
        #[arg(long, default_value_t = 0)]
        limit: u32,
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
    Bench(crate::bench::BenchArgs),
    /// Print raftlockctl's version and the etcd API level it speaks (no
    /// server is asked; `endpoint status` shows the members').
    Version,
    /// Downgrade the cluster to the previous raftlock release (as etcdctl
    /// 3.6's `downgrade`): `validate` checks that it may, `enable` stops
    /// every member from using what that release lacks (then replace the
    /// members' binaries one at a time), `cancel` undoes `enable`.
    #[command(subcommand)]
    Downgrade(DowngradeCmd),
}

#[derive(Subcommand)]
pub(crate) enum DowngradeCmd {
    /// Whether the cluster may be downgraded to VERSION (the release
    /// before the cluster version, e.g. 0.1 or 0.1.0).
    Validate { version: String },
    /// Start a downgrade to VERSION.
    Enable { version: String },
    /// Stop the downgrade in progress (VERSION is ignored, as etcdctl's).
    Cancel { version: Option<String> },
}

#[derive(Args)]
pub(crate) struct LockArgs {
    /// The lock's name; several names take them all together (a
    /// multi-lock), with one fencing token for all.
    #[arg(required = true, value_name = "NAME")]
    pub(crate) names: Vec<String>,
    /// TTL of the lock's session lease, in seconds: how long a crashed holder keeps it.
    #[arg(long, default_value_t = 10)]
    pub(crate) ttl: i64,
    /// Give up if the lock is not granted within this time (e.g. 500ms, 10s, 2m).
    #[arg(long, value_parser = parse_duration, conflicts_with = "try_once")]
    pub(crate) wait: Option<Duration>,
    /// Try once and give up at once if the lock is held.
    #[arg(long = "try")]
    pub(crate) try_once: bool,
    /// Semaphore: how many owners may hold the lock at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) permits: u32,
    /// Take a read lock: shared with other readers, exclusive of writers
    /// (every other `lock`, and etcd's locks, on the name).
    #[arg(long, conflicts_with = "permits")]
    pub(crate) read: bool,
    /// Shown to others by `describe` (default: user@host pid N).
    #[arg(long)]
    pub(crate) metadata: Option<String>,
    /// Lock-delay (e.g. 15s, at most 60s): if the lock is lost without being
    /// released (the lease ends, the key is deleted by someone else), nobody
    /// is granted it for this long. One exclusive lock only.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) lock_delay: Option<Duration>,
    /// The command to run while holding the lock.
    #[arg(last = true)]
    pub(crate) command: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum LeaseCmd {
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
pub(crate) enum MemberCmd {
    /// List the members of the cluster.
    List,
    /// Add a member; then start it with --initial-cluster-state existing
    /// and the --initial-cluster this prints.
    Add {
        name: String,
        /// Its peer URLs, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        peer_urls: Vec<String>,
        /// As a learner: it gets the log but does not vote until promoted.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a member, by its ID (hex, as `member list` prints it).
    Remove { id: String },
}

#[derive(Subcommand)]
pub(crate) enum SnapshotCmd {
    /// Stream one member's state (the first endpoint's) to a file. Given a
    /// directory, the file is `raftlock-snapshot-<UTC time>.db` in it.
    Save {
        file: std::path::PathBuf,
        /// With a directory: keep only this many snapshots in it, removing
        /// the oldest `raftlock-snapshot-*.db` once the new one is saved.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        retain: Option<u32>,
    },
    /// Make a new member's data directory from a saved file (offline; every
    /// member of the new cluster is restored from the same file with the same
    /// --initial-cluster and --initial-cluster-token, then started with them).
    Restore(RestoreArgs),
}

/// etcdutl's `snapshot restore` flags.
#[derive(clap::Args)]
pub(crate) struct RestoreArgs {
    /// The file `snapshot save` wrote.
    pub file: std::path::PathBuf,
    /// The member's name.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// The new cluster's members, `name=peer-url,...` [default: this member alone].
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// The new cluster's token (member IDs derive from it).
    #[arg(long, default_value = "raftlock-cluster")]
    pub initial_cluster_token: String,
    /// This member's peer URLs.
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    pub initial_advertise_peer_urls: String,
    /// The data directory to make [default: ./<name>.raftlock]; it must not exist.
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Restore even if the file's SHA-256 trailer does not match.
    #[arg(long)]
    pub skip_hash_check: bool,
    /// How far the revision jumps past the backup's, so that no fencing
    /// token (a revision) the old cluster handed out after the backup is
    /// handed out again. 0 keeps the backup's revision.
    #[arg(long, default_value_t = raftlock::restore::DEFAULT_BUMP_REVISION)]
    pub bump_revision: u64,
    /// Mark the jumped-to revision compacted, so that reads and watches from
    /// older revisions are refused rather than miss the old cluster's later
    /// writes. On whenever --bump-revision is above 0 (the flag is accepted
    /// as etcdutl's; with --bump-revision 0 it is an error).
    #[arg(long)]
    pub mark_compacted: bool,
}

#[derive(Subcommand)]
pub(crate) enum EndpointCmd {
    /// Status of each endpoint.
    Status,
    /// Whether each endpoint serves a linearizable read (fails without a leader).
    Health,
}

/// `1500ms`, `10s`, `2m`, `1h`; a bare number is seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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
pub(crate) fn parse_lease_id(s: &str) -> Result<i64, String> {
    i64::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|_| format!("invalid lease ID {s:?} (hex expected)"))
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
