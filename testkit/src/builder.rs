//! How a test or a suite describes the cluster it wants ([`Builder`]):
//! the binary, the directory, how members are addressed, their flags and
//! timing, TLS, clocks and an address-space ceiling.

use std::path::{Path, PathBuf};

use etcd_client::ConnectOptions;

use crate::certs::Certs;
use crate::clocks::Clocks;
use crate::cluster::{Addressing, Cluster};

/// How a cluster is made: [`Cluster::builder`], then [`Builder::spawn`]
/// (start the members) or [`Builder::unstarted`] (choose their addresses
/// and directories only).
pub struct Builder {
    pub(crate) n: usize,
    pub(crate) binary: PathBuf,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) temp: Option<tempfile::TempDir>,
    pub(crate) addressing: Addressing,
    pub(crate) scheme: &'static str,
    pub(crate) args: Vec<String>,
    pub(crate) heartbeat_ms: u64,
    pub(crate) election_ms: u64,
    pub(crate) clocks: Option<Clocks>,
    pub(crate) memory_limit: Option<u64>,
    pub(crate) connect: Option<ConnectOptions>,
}

impl Builder {
    /// The `raftlock` binary to run (by default the one cargo built beside
    /// the running test binary).
    pub fn binary(mut self, binary: &Path) -> Builder {
        self.binary = binary.to_path_buf();
        self
    }

    /// Data directories and logs under `dir` (by default a temporary
    /// directory the cluster owns).
    pub fn dir(mut self, dir: &Path) -> Builder {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Data directories and logs in `temp`, which the cluster then owns.
    pub fn temp_dir(mut self, temp: tempfile::TempDir) -> Builder {
        self.temp = Some(temp);
        self
    }

    pub fn addressing(mut self, addressing: Addressing) -> Builder {
        self.addressing = addressing;
        self
    }

    /// Flags every member gets on top of the cluster's own.
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Builder {
        self.args.extend(args.iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// `--heartbeat-interval` and `--election-timeout`, in milliseconds.
    pub fn timing(mut self, heartbeat_ms: u64, election_ms: u64) -> Builder {
        self.heartbeat_ms = heartbeat_ms;
        self.election_ms = election_ms;
        self
    }

    /// mTLS on both ports of every member (certificates from `certs`); the
    /// harness's clients connect as `alice`.
    pub fn tls(mut self, certs: &Certs) -> Builder {
        self.args.extend(certs.member_flags());
        self.scheme = "https";
        self.connect = Some(certs.client_options(&certs.alice));
        self
    }

    /// Every member under libfaketime, its wall clock true until moved.
    pub fn clocks(mut self, clocks: Clocks) -> Builder {
        self.clocks = Some(clocks);
        self
    }

    /// Every member (and every restart of it) under an address-space
    /// ceiling of `bytes`, as `ulimit -v` sets it: an allocation past it
    /// fails in the member, which aborts.
    pub fn memory_limit(mut self, bytes: u64) -> Builder {
        self.memory_limit = Some(bytes);
        self
    }

    /// The members' addresses and directories chosen, none started.
    pub fn unstarted(self) -> anyhow::Result<Cluster> {
        let Builder { n, binary, dir, temp, addressing, scheme, args, heartbeat_ms, election_ms, .. } = self;
        let temp = match (&dir, temp) {
            (None, None) => Some(tempfile::tempdir()?),
            (_, temp) => temp,
        };
        let dir = dir.unwrap_or_else(|| temp.as_ref().expect("a temporary directory").path().to_path_buf());
        if let Some(clocks) = &self.clocks {
            for i in 0..n {
                clocks.set(i, 0)?;
            }
        }
        let mut cluster = Cluster {
            members: Vec::new(),
            binary,
            dir,
            temp,
            addressing,
            scheme,
            initial_cluster: String::new(),
            extra_args: args,
            heartbeat_ms,
            election_ms,
            clocks: self.clocks,
            memory_limit: self.memory_limit,
            connect: self.connect,
            env: Vec::new(),
        };
        for _ in 0..n {
            cluster.new_member();
        }
        cluster.initial_cluster =
            cluster.members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",");
        Ok(cluster)
    }

    /// Start every member (without waiting for them to serve). Refuses if
    /// a member's address is taken: on fixed addresses (the fault suite's),
    /// a member left running by an earlier, interrupted run would otherwise
    /// answer this run's clients with that run's data.
    pub fn spawn(self) -> anyhow::Result<Cluster> {
        let mut cluster = self.unstarted()?;
        for m in &cluster.members {
            for port in [m.client_port, m.peer_port] {
                if let Err(e) = std::net::TcpListener::bind((m.ip.as_str(), port)) {
                    anyhow::bail!("{}:{port} is taken ({e}): is a member of an earlier run still running?", m.ip);
                }
            }
        }
        for i in 0..cluster.len() {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }
}
