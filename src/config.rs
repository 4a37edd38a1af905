//! The server's command line: etcd's flag names, each also a `RAFTLOCK_*`
//! environment variable, so that etcd users feel at home.
//!
//! With no flags at all raftlock runs a single-member cluster on
//! `127.0.0.1:2379` (clients) and `127.0.0.1:2380` (peers), with its data in
//! `./default.raftlock`.
//!
//! Member IDs are derived, as etcd's are, from what identifies a member: its
//! advertised peer URLs and the cluster token. Every member computes every other
//! member's ID from `--initial-cluster` alone, so bootstrap needs no exchange.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{ArgAction, Parser, ValueEnum};

use crate::base::ids::{go_duration, is_https, member_id, url_addr, url_host, url_hostport};
use crate::base::limits::DEFAULT_QUOTA_BYTES;
use crate::base::listen::Listener;
use crate::base::tls::{AutoCert, ServerTls, TlsFiles, TlsPolicy};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterState {
    /// Bootstrap a new cluster from `--initial-cluster`.
    New,
    /// Join a cluster that has already added this member.
    Existing,
}

#[derive(Parser, Debug, Clone)]
#[command(name = "raftlock", version, long_version = crate::base::version::long(), about = "A Raft-replicated lock server that speaks the etcd v3 API")]
pub struct Config {
    /// Human-readable name of this member.
    #[arg(long, env = "RAFTLOCK_NAME", default_value = "default")]
    pub name: String,
    /// Where this member keeps its data [default: ./<name>.raftlock].
    #[arg(long, env = "RAFTLOCK_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Comma-separated URLs to listen on for client traffic.
    #[arg(long, env = "RAFTLOCK_LISTEN_CLIENT_URLS", default_value = "http://127.0.0.1:2379")]
    pub listen_client_urls: String,
    /// Comma-separated client URLs to advertise to the cluster [default: the listen URLs].
    #[arg(long, env = "RAFTLOCK_ADVERTISE_CLIENT_URLS")]
    pub advertise_client_urls: Option<String>,
    /// The most concurrent gRPC streams (calls) on one client connection; a
    /// client over it waits for a stream to end. etcd's default (no bound to
    /// speak of): a waiting Lock holds a stream, and a bound can leave the
    /// holder's Unlock waiting behind the waiters on the same connection.
    #[arg(long, env = "RAFTLOCK_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Disk space this member keeps free: below it, it refuses writes that
    /// add data and raises its NOSPACE alarm; it takes them again once twice
    /// as much is free (raftlock's; see the README's Operations section).
    #[arg(long, env = "RAFTLOCK_DISK_SPACE_RESERVE_BYTES", default_value_t = 256 << 20)]
    pub disk_space_reserve_bytes: u64,
    /// At start, once caught up, compare this member's key-value history
    /// with every peer's (HashKV) and refuse to serve if it differs.
    #[arg(long, env = "RAFTLOCK_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = false, default_missing_value = "true")]
    pub experimental_initial_corrupt_check: bool,
    /// Comma-separated URLs that serve only /metrics and the health
    /// endpoints (which the client URLs serve too); https ones use the client
    /// port's TLS flags.
    #[arg(long, env = "RAFTLOCK_LISTEN_METRICS_URLS")]
    pub listen_metrics_urls: Option<String>,
    /// Comma-separated URLs to listen on for peer traffic.
    #[arg(long, env = "RAFTLOCK_LISTEN_PEER_URLS", default_value = "http://127.0.0.1:2380")]
    pub listen_peer_urls: String,
    /// This member's peer URLs as the other members reach them [default: the listen URLs].
    #[arg(long, env = "RAFTLOCK_INITIAL_ADVERTISE_PEER_URLS")]
    pub initial_advertise_peer_urls: Option<String>,
    /// The initial members, `name=peer-url,...` [default: this member alone].
    #[arg(long, env = "RAFTLOCK_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// etcd's DNS discovery: the initial members from this domain's SRV
    /// records (`_etcd-server-ssl._tcp`, `_etcd-server._tcp`), instead of
    /// --initial-cluster.
    #[arg(long, env = "RAFTLOCK_DISCOVERY_SRV")]
    pub discovery_srv: Option<String>,
    /// A suffix to the SRV names (`_etcd-server-<name>._tcp`): clusters sharing a domain.
    #[arg(long, env = "RAFTLOCK_DISCOVERY_SRV_NAME")]
    pub discovery_srv_name: Option<String>,
    /// With --discovery-srv, bootstrap only once the records name this many members (waiting until they do).
    #[arg(long, env = "RAFTLOCK_INITIAL_CLUSTER_SIZE")]
    pub initial_cluster_size: Option<usize>,
    /// `new` to bootstrap a cluster, `existing` to join one.
    #[arg(long, env = "RAFTLOCK_INITIAL_CLUSTER_STATE", value_enum, default_value = "new")]
    pub initial_cluster_state: ClusterState,
    /// A token that makes member and cluster IDs unique to one cluster.
    #[arg(long, env = "RAFTLOCK_INITIAL_CLUSTER_TOKEN", default_value = "raftlock-cluster")]
    pub initial_cluster_token: String,
    /// Raft heartbeat interval in milliseconds.
    #[arg(long, env = "RAFTLOCK_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Raft election timeout in milliseconds (a follower waits between one and
    /// two of these without a heartbeat before it campaigns).
    #[arg(long, env = "RAFTLOCK_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Log entries applied between two snapshots; after a snapshot the log
    /// before it is purged (all but --snapshot-catchup-entries).
    #[arg(long, env = "RAFTLOCK_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Log entries kept behind a snapshot, so that a member a little behind
    /// catches up from the log rather than by a whole snapshot.
    #[arg(
        long,
        alias = "experimental-snapshot-catchup-entries",
        env = "RAFTLOCK_SNAPSHOT_CATCHUP_ENTRIES",
        default_value_t = 5_000
    )]
    pub snapshot_catchup_entries: u64,
    /// The bytes of newest log entries a member keeps decoded in memory;
    /// older ones are read back from the WAL when a lagging follower (or
    /// apply) needs them. Small values make the tests read the WAL back.
    #[arg(
        long,
        env = "RAFTLOCK_EXPERIMENTAL_LOG_MEMORY_BYTES",
        default_value_t = crate::base::limits::HOT_LOG_BYTES
    )]
    pub experimental_log_memory_bytes: u64,
    /// How often watchers that asked for progress notifications get one, in ms
    /// (etcd's default is ten minutes); at least 1.
    #[arg(
        long,
        env = "RAFTLOCK_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value_t = 600_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub watch_progress_notify_interval: u64,
    /// Client TLS: the server certificate (PEM) for `https://` client URLs.
    #[arg(long, env = "RAFTLOCK_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Client TLS: the key of --cert-file (PEM).
    #[arg(long, env = "RAFTLOCK_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Client TLS: the CA that signs client certificates.
    #[arg(long, env = "RAFTLOCK_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Client TLS: require a client certificate signed by --trusted-ca-file.
    #[arg(long, env = "RAFTLOCK_CLIENT_CERT_AUTH", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = false, default_missing_value = "true")]
    pub client_cert_auth: bool,
    /// Client TLS with a self-signed certificate made under the data directory.
    #[arg(long, env = "RAFTLOCK_AUTO_TLS", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = false, default_missing_value = "true")]
    pub auto_tls: bool,
    /// Peer TLS: this member's certificate (PEM), served and presented to peers.
    #[arg(long, env = "RAFTLOCK_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Peer TLS: the key of --peer-cert-file (PEM).
    #[arg(long, env = "RAFTLOCK_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Peer TLS: the CA that signs the members' certificates.
    #[arg(long, env = "RAFTLOCK_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Peer TLS: require peers to present a certificate signed by --peer-trusted-ca-file.
    #[arg(long, env = "RAFTLOCK_PEER_CLIENT_CERT_AUTH", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = false, default_missing_value = "true")]
    pub peer_client_cert_auth: bool,
    /// Peer TLS with self-signed certificates (encrypted, not authenticated).
    #[arg(long, env = "RAFTLOCK_PEER_AUTO_TLS", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = false, default_missing_value = "true")]
    pub peer_auto_tls: bool,
    /// Peer TLS: only peers whose certificate has this CommonName are let in.
    #[arg(long, env = "RAFTLOCK_PEER_CERT_ALLOWED_CN")]
    pub peer_cert_allowed_cn: Option<String>,
    /// Comma-separated TLS 1.2 cipher suites, by Go's names (TLS 1.3's are fixed).
    #[arg(long, env = "RAFTLOCK_CIPHER_SUITES")]
    pub cipher_suites: Option<String>,
    /// The lowest TLS version accepted: TLS1.2 or TLS1.3.
    #[arg(long, env = "RAFTLOCK_TLS_MIN_VERSION")]
    pub tls_min_version: Option<String>,
    /// The highest TLS version accepted: TLS1.2 or TLS1.3.
    #[arg(long, env = "RAFTLOCK_TLS_MAX_VERSION")]
    pub tls_max_version: Option<String>,
    /// How many years --auto-tls and --peer-auto-tls certificates are valid.
    #[arg(long, env = "RAFTLOCK_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// Auth tokens: `simple`, or `jwt,pub-key=FILE,priv-key=FILE,sign-method=ALG[,ttl=5m]`.
    #[arg(long, env = "RAFTLOCK_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// Seconds a simple token lives after its last use.
    #[arg(long, env = "RAFTLOCK_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt cost of stored passwords (4 to 31).
    #[arg(long, env = "RAFTLOCK_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// Space quota, in bytes: how much the state may weigh (its whole MVCC
    /// history, leases) before writes that add data are refused with a NOSPACE
    /// alarm. 0: 2 GiB (etcd's default); negative: no quota.
    #[arg(long, env = "RAFTLOCK_QUOTA_BACKEND_BYTES", default_value_t = 0, allow_hyphen_values = true)]
    pub quota_backend_bytes: i64,
    /// `periodic`: keep --auto-compaction-retention of time; `revision`: keep
    /// that many revisions.
    #[arg(long, env = "RAFTLOCK_AUTO_COMPACTION_MODE", value_enum, default_value = "periodic")]
    pub auto_compaction_mode: CompactionMode,
    /// History auto compaction keeps: a duration (`30m`, a bare number is
    /// hours) in periodic mode, a revision count in revision mode; 0: off.
    #[arg(long, env = "RAFTLOCK_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// How often revision-mode auto compaction looks (raftlock's; etcd's is
    /// fixed at 5m).
    #[arg(long, env = "RAFTLOCK_AUTO_COMPACTION_CHECK_INTERVAL", default_value = "5m")]
    pub auto_compaction_check_interval: String,
    /// Leases proposed for expiry a second at most, when many lapse at once (etcd's: 1000).
    #[arg(long, env = "RAFTLOCK_LEASE_EXPIRY_RATE", default_value_t = crate::base::limits::EXPIRIES_PER_SECOND as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_expiry_rate: u64,
    /// Log filter (tracing's env-filter syntax).
    #[arg(long, env = "RAFTLOCK_LOG_LEVEL", default_value = "info,openraft=warn")]
    pub log_level: String,
}

/// `--auto-compaction-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompactionMode {
    Periodic,
    Revision,
}

/// What auto compaction keeps (see `node::compactor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much time of history.
    Periodic(Duration),
    /// Keep this many revisions, looking every `every`.
    Revision { keep: i64, every: Duration },
}

/// The two ports a member listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Client,
    Peer,
}

impl Port {
    /// "client" or "peer", as in `--listen-<name>-urls`.
    fn name(self) -> &'static str {
        match self {
            Port::Client => "client",
            Port::Peer => "peer",
        }
    }

    /// What the port's TLS flags start with: `--cert-file`, `--peer-cert-file`.
    fn flag_prefix(self) -> &'static str {
        match self {
            Port::Client => "",
            Port::Peer => "peer-",
        }
    }
}

/// One member of the initial cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialMember {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
}

impl Config {
    /// The space quota in bytes (`None`: no quota).
    pub fn quota_bytes(&self) -> Option<u64> {
        match self.quota_backend_bytes {
            0 => Some(DEFAULT_QUOTA_BYTES),
            n if n < 0 => None,
            n => Some(n as u64),
        }
    }

    /// What auto compaction keeps (`None`: off), as etcd reads the flags.
    pub fn auto_compaction(&self) -> anyhow::Result<Option<AutoCompaction>> {
        let retention = self.auto_compaction_retention.trim();
        let compaction = match self.auto_compaction_mode {
            CompactionMode::Periodic => {
                let period = match retention.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours * 3600),
                    Err(_) => go_duration(retention)
                        .map_err(|e| anyhow::anyhow!("--auto-compaction-retention {retention:?}: {e}"))?,
                };
                (!period.is_zero()).then_some(AutoCompaction::Periodic(period))
            }
            CompactionMode::Revision => {
                let keep: i64 = retention.parse().map_err(|_| {
                    anyhow::anyhow!("--auto-compaction-retention {retention:?}: revision mode takes a revision count")
                })?;
                let every = go_duration(&self.auto_compaction_check_interval)?;
                anyhow::ensure!(!every.is_zero(), "--auto-compaction-check-interval must be above 0");
                (keep > 0).then_some(AutoCompaction::Revision { keep, every })
            }
        };
        Ok(compaction)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("{}.raftlock", self.name)))
    }

    pub fn advertise_peer_urls(&self) -> Vec<String> {
        split_urls(self.initial_advertise_peer_urls.as_deref().unwrap_or(&self.listen_peer_urls))
    }

    pub fn advertise_client_urls(&self) -> Vec<String> {
        split_urls(self.advertise_client_urls.as_deref().unwrap_or(&self.listen_client_urls))
    }

    pub fn client_listen_addrs(&self) -> anyhow::Result<Vec<SocketAddr>> {
        split_urls(&self.listen_client_urls).iter().map(|u| url_addr(u)).collect()
    }

    pub fn peer_listen_addrs(&self) -> anyhow::Result<Vec<SocketAddr>> {
        split_urls(&self.listen_peer_urls).iter().map(|u| url_addr(u)).collect()
    }

    /// What both ports allow (versions, suites).
    fn tls_policy(&self) -> TlsPolicy {
        TlsPolicy {
            min_version: self.tls_min_version.clone(),
            max_version: self.tls_max_version.clone(),
            cipher_suites: self.cipher_suites.as_deref().map(split_urls),
        }
    }

    /// One port's listen URLs, certificate flags, and automatic certificate
    /// (under `<data-dir>/fixtures/<port>`, valid for the hosts of its listen
    /// and advertise URLs and for localhost).
    fn port_tls(&self, port: Port) -> (Vec<String>, TlsFiles, AutoCert) {
        let (listen, advertise, files) = match port {
            Port::Client => (
                split_urls(&self.listen_client_urls),
                self.advertise_client_urls(),
                TlsFiles {
                    cert: self.cert_file.clone(),
                    key: self.key_file.clone(),
                    trusted_ca: self.trusted_ca_file.clone(),
                    client_cert_auth: self.client_cert_auth,
                    auto: self.auto_tls,
                    allowed_cn: None,
                },
            ),
            Port::Peer => (
                split_urls(&self.listen_peer_urls),
                self.advertise_peer_urls(),
                TlsFiles {
                    cert: self.peer_cert_file.clone(),
                    key: self.peer_key_file.clone(),
                    trusted_ca: self.peer_trusted_ca_file.clone(),
                    client_cert_auth: self.peer_client_cert_auth,
                    auto: self.peer_auto_tls,
                    allowed_cn: self.peer_cert_allowed_cn.clone(),
                },
            ),
        };
        let mut hosts: Vec<String> =
            listen.iter().chain(&advertise).filter_map(|u| url_host(u).ok()).map(str::to_string).collect();
        hosts.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
        hosts.sort();
        hosts.dedup();
        let auto = AutoCert {
            dir: self.data_dir().join("fixtures").join(port.name()),
            hosts,
            validity_years: self.self_signed_cert_validity,
        };
        (listen, files, auto)
    }

    /// A port's listeners: each listen URL's address, with TLS for
    /// `https://`; an https URL without a certificate is an error naming
    /// the flags it needs.
    pub fn listeners(&self, port: Port) -> anyhow::Result<Vec<Listener>> {
        let (urls, ..) = self.port_tls(port);
        self.listeners_on(port, &urls, &format!("--listen-{}-urls", port.name()))
    }

    /// Where /metrics and the health endpoints are served besides the
    /// client URLs (`--listen-metrics-urls`), with the client port's TLS.
    pub fn metrics_listeners(&self) -> anyhow::Result<Vec<Listener>> {
        let urls = split_urls(self.listen_metrics_urls.as_deref().unwrap_or(""));
        self.listeners_on(Port::Client, &urls, "--listen-metrics-urls")
    }

    /// Listeners on `urls`, with `port`'s TLS for the https ones; `flag`
    /// names the URLs in errors.
    fn listeners_on(&self, port: Port, urls: &[String], flag: &str) -> anyhow::Result<Vec<Listener>> {
        if urls.is_empty() {
            return Ok(Vec::new());
        }
        let (_, files, auto) = self.port_tls(port);
        let prefix = port.flag_prefix();
        let tls = ServerTls::new(&files, &self.tls_policy(), &auto, prefix)?.map(Arc::new);
        urls.iter()
            .map(|url| {
                let addr = url_addr(url)?;
                match (is_https(url), &tls) {
                    (false, _) => Ok(Listener { addr, tls: None }),
                    (true, Some(tls)) => Ok(Listener { addr, tls: Some(tls.clone()) }),
                    (true, None) => bail!(
                        "{flag} has {url}, and an https URL needs --{prefix}cert-file and \
                         --{prefix}key-file, or --{prefix}auto-tls"
                    ),
                }
            })
            .collect()
    }

    /// How this member dials `https://` peers (None without peer TLS).
    pub fn peer_client_tls(&self) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
        let (_, files, auto) = self.port_tls(Port::Peer);
        crate::base::tls::peer_client_config(&files, &self.tls_policy(), &auto)
    }

    /// The address peer connections leave from: the one peer address this
    /// member listens on, unless it listens on several or on all addresses.
    pub fn peer_source_address(&self) -> anyhow::Result<Option<std::net::IpAddr>> {
        Ok(match self.peer_listen_addrs()?.as_slice() {
            [one] if !one.ip().is_unspecified() => Some(one.ip()),
            _ => None,
        })
    }

    /// With --discovery-srv: --initial-cluster from DNS (setting both is an
    /// error, as in etcd). A member that has data already is a member: DNS
    /// is not asked again (a record changed since cannot refuse its restart).
    pub async fn discover(&mut self) -> anyhow::Result<()> {
        let Some(domain) = self.discovery_srv.clone() else {
            anyhow::ensure!(self.initial_cluster_size.is_none(), "--initial-cluster-size needs --discovery-srv");
            return Ok(());
        };
        if self.initial_cluster.is_some() {
            bail!(
                "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\""
            );
        }
        if crate::storage::data_dir::holds_member_data(&self.data_dir()) {
            return Ok(());
        }
        let (advertise, suffix) = (self.advertise_peer_urls(), self.discovery_srv_name.as_deref());
        let size = self.initial_cluster_size.filter(|_| self.initial_cluster_state == ClusterState::New);
        let cluster = crate::base::resolve::srv_cluster_of_size(&domain, suffix, &self.name, &advertise, size).await?;
        tracing::info!(%domain, initial_cluster = %cluster, "the initial members, from DNS SRV records");
        self.initial_cluster = Some(cluster);
        Ok(())
    }

    /// The members named by `--initial-cluster` (or this member alone), by ID.
    pub fn initial_members(&self) -> anyhow::Result<BTreeMap<u64, InitialMember>> {
        let spec = match &self.initial_cluster {
            Some(s) => s.clone(),
            None => {
                self.advertise_peer_urls().iter().map(|u| format!("{}={u}", self.name)).collect::<Vec<_>>().join(",")
            }
        };
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, url) =
                part.split_once('=').with_context(|| format!("--initial-cluster: `{part}` is not name=url"))?;
            url_hostport(url)?;
            by_name.entry(name.to_string()).or_default().push(url.to_string());
        }
        let mut members = BTreeMap::new();
        for (name, peer_urls) in by_name {
            let id = member_id(&peer_urls, &self.initial_cluster_token);
            if members.insert(id, InitialMember { id, name: name.clone(), peer_urls }).is_some() {
                bail!("--initial-cluster: two members share the peer URLs of `{name}`");
            }
        }
        if !members.values().any(|m| m.name == self.name) {
            bail!("--initial-cluster does not name this member (`{}`)", self.name);
        }
        Ok(members)
    }

    /// This member's ID.
    pub fn member_id(&self) -> u64 {
        member_id(&self.advertise_peer_urls(), &self.initial_cluster_token)
    }

    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.election_timeout)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.heartbeat_interval == 0 || self.election_timeout < 5 * self.heartbeat_interval {
            bail!("--election-timeout must be at least 5 times --heartbeat-interval");
        }
        if self.snapshot_count == 0 {
            bail!("--snapshot-count must be at least 1");
        }
        if !(4..=31).contains(&self.bcrypt_cost) {
            bail!("--bcrypt-cost must be between 4 and 31");
        }
        let peer_tls = self.peer_cert_file.is_some() || self.peer_auto_tls;
        if !peer_tls {
            if let Some(url) = self.initial_members()?.values().flat_map(|m| &m.peer_urls).find(|u| is_https(u)) {
                bail!(
                    "peer URL {url} is https://, which needs --peer-cert-file and --peer-key-file, or --peer-auto-tls"
                );
            }
        }
        self.validate_peer_authentication()?;
        let me = self.member_id();
        let members = self.initial_members()?;
        match members.get(&me) {
            Some(m) if m.name == self.name => Ok(()),
            _ => bail!(
                "--initial-cluster names `{}` with other peer URLs than --initial-advertise-peer-urls ({})",
                self.name,
                self.advertise_peer_urls().join(",")
            ),
        }
    }
}

impl Config {
    /// `--peer-client-cert-auth` that could not be kept is refused
    /// (`tls::refuse_unkept_client_auth`).
    fn validate_peer_authentication(&self) -> anyhow::Result<()> {
        let (listen, files, _) = self.port_tls(Port::Peer);
        crate::base::tls::refuse_unkept_client_auth(&files, &listen, "peer-")
    }

    /// Whether peers must prove who they are (`--peer-client-cert-auth`,
    /// validated above). Without it, whoever reaches the peer port can act
    /// as a member (see the README's security section).
    pub fn peers_authenticated(&self) -> bool {
        self.peer_client_cert_auth
    }
}

fn split_urls(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|u| !u.is_empty()).map(String::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_a_single_member_on_2379() {
        let c = Config::parse_from(["raftlock"]);
        c.validate().unwrap();
        assert_eq!(c.data_dir(), PathBuf::from("default.raftlock"));
        assert_eq!(c.client_listen_addrs().unwrap(), ["127.0.0.1:2379".parse().unwrap()]);
        let members = c.initial_members().unwrap();
        assert_eq!(members.len(), 1);
        assert!(members.contains_key(&c.member_id()));
    }

    /// `--peer-client-cert-auth` that could not be kept stops the start:
    /// without a CA (with or without `--peer-auto-tls`), or with a plaintext
    /// peer URL; with https peers and a CA it is taken.
    #[test]
    fn peer_client_cert_auth_that_cannot_be_kept_is_refused() {
        let https =
            ["--listen-peer-urls", "https://127.0.0.1:2380", "--initial-advertise-peer-urls", "https://127.0.0.1:2380"];
        let with = |extra: &[&str]| {
            let mut args = vec!["raftlock", "--peer-client-cert-auth"];
            args.extend(extra);
            Config::parse_from(args).validate().map_err(|e| e.to_string())
        };
        let auto = with(&[&https[..], &["--peer-auto-tls"]].concat()).unwrap_err();
        assert!(auto.contains("needs --peer-trusted-ca-file") && auto.contains("self-signed"), "{auto}");
        let plain =
            with(&["--peer-cert-file", "m.pem", "--peer-key-file", "m.key", "--peer-trusted-ca-file", "ca.pem"])
                .unwrap_err();
        assert!(plain.contains("http://127.0.0.1:2380") && plain.contains("present no certificate"), "{plain}");
        let files = ["--peer-cert-file", "m.pem", "--peer-key-file", "m.key", "--peer-trusted-ca-file", "ca.pem"];
        with(&[&https[..], &files[..]].concat()).unwrap();
    }

    #[test]
    fn a_progress_notify_interval_of_zero_is_refused() {
        assert!(Config::try_parse_from(["raftlock", "--watch-progress-notify-interval", "0"]).is_err());
        let c = Config::parse_from(["raftlock", "--watch-progress-notify-interval", "1"]);
        assert_eq!(c.watch_progress_notify_interval, 1);
    }

    #[test]
    fn every_member_derives_the_same_ids() {
        let cluster = "a=http://127.0.0.1:2380,b=http://127.0.0.1:2381";
        let a = Config::parse_from(["raftlock", "--name", "a", "--initial-cluster", cluster]);
        let b = Config::parse_from([
            "raftlock",
            "--name",
            "b",
            "--listen-peer-urls",
            "http://127.0.0.1:2381",
            "--initial-cluster",
            cluster,
        ]);
        a.validate().unwrap();
        b.validate().unwrap();
        assert_eq!(a.initial_members().unwrap(), b.initial_members().unwrap());
        assert_ne!(a.member_id(), b.member_id());
        let wrong = Config::parse_from(["raftlock", "--name", "b", "--initial-cluster", cluster]);
        assert!(wrong.validate().is_err(), "b's own peer URL must match --initial-cluster");
    }
}
