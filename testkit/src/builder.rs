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
        cluster.initial_cluster = cluster.initial_cluster_of_members();
        Ok(cluster)
    }

    /// Start every member (without waiting for them to serve). Refuses if
    /// a member's address is taken: on fixed addresses (the fault suite's),
    /// a member left running by an earlier, interrupted run would otherwise
    /// answer this run's clients with that run's data. On ports the harness
    /// chose ([`Addressing::Ports`]) a port found taken here was taken after
    /// [`crate::free_port`] checked it, by a process outside the harness's
    /// claims (a socket that was bound but not yet listening passes that
    /// check): the cluster's ports are chosen again, and who held the port
    /// is printed (and kept in `PORT_CLAIMS/taken.log`, which `scripts/test.sh`
    /// shows), a few times before giving up.
    pub fn spawn(self) -> anyhow::Result<Cluster> {
        let mut cluster = self.unstarted()?;
        let mut choices = 1;
        while let Some((ip, port, e)) = taken_port(&cluster) {
            let holder = port_holder(port);
            if cluster.addressing == Addressing::Loopback || choices == 5 {
                anyhow::bail!("{ip}:{port} is taken ({e}): is a member of an earlier run still running?\n{holder}");
            }
            let said =
                format!("testkit: {ip}:{port} was taken after it was chosen ({e}); choosing the ports again\n{holder}");
            eprintln!("{said}");
            // A passing test's stderr is not shown: scripts/test.sh prints this file.
            let log = format!("{}/taken.log", crate::PORT_CLAIMS);
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
                let _ = std::io::Write::write_all(&mut f, format!("{said}\n").as_bytes());
            }
            cluster.choose_ports_again();
            choices += 1;
        }
        for i in 0..cluster.len() {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }
}

impl Cluster {
    /// `--initial-cluster` naming every member and its peer URL.
    pub(crate) fn initial_cluster_of_members(&self) -> String {
        self.members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",")
    }

    /// New ports from [`crate::free_port`] for every member of a cluster none of
    /// whose members has started ([`Addressing::Ports`] only).
    pub(crate) fn choose_ports_again(&mut self) {
        assert!(self.addressing == Addressing::Ports && self.members.iter().all(|m| m.pid().is_none()));
        for m in &mut self.members {
            (m.client_port, m.peer_port) = (crate::free_port(), crate::free_port());
        }
        self.initial_cluster = self.initial_cluster_of_members();
    }
}

/// The first member address of `cluster` that cannot be bound now.
fn taken_port(cluster: &Cluster) -> Option<(String, u16, std::io::Error)> {
    cluster.members.iter().find_map(|m| {
        [m.client_port, m.peer_port]
            .into_iter()
            .find_map(|port| std::net::TcpListener::bind((m.ip.as_str(), port)).err().map(|e| (m.ip.clone(), port, e)))
    })
}

/// What `ss` says of the sockets on local `port`, with their processes: for
/// the log of a port found taken.
fn port_holder(port: u16) -> String {
    let filter = format!("sport = :{port}");
    match std::process::Command::new("ss").args(["-tanpH", &filter]).output() {
        Ok(out) if out.status.success() => {
            format!("sockets on port {port} (ss -tanp):\n{}", String::from_utf8_lossy(&out.stdout))
        }
        Ok(out) => format!("ss -tanp failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => format!("no ss to show who holds port {port}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port found taken before the start is seen, and choosing again
    /// gives every member new ports that the initial cluster names.
    #[test]
    fn a_taken_port_is_found_and_the_ports_are_chosen_again() {
        let mut cluster = Cluster::builder(2).unstarted().unwrap();
        assert!(taken_port(&cluster).is_none());
        let before: Vec<_> = cluster.members.iter().map(|m| (m.client_port, m.peer_port)).collect();
        let holder = std::net::TcpListener::bind(("127.0.0.1", before[1].1)).unwrap();
        let (_, port, _) = taken_port(&cluster).expect("the held port is taken");
        assert_eq!(port, before[1].1);
        let holder_said = port_holder(port);
        assert!(holder_said.contains("LISTEN") && holder_said.contains(&format!("127.0.0.1:{port}")), "{holder_said}");
        cluster.choose_ports_again();
        assert!(taken_port(&cluster).is_none());
        for (m, (client, peer)) in cluster.members.iter().zip(&before) {
            assert!(m.client_port != *client && m.peer_port != *peer);
            assert!(cluster.initial_cluster.contains(&m.peer_url()), "{}", cluster.initial_cluster);
        }
        assert!(!cluster.initial_cluster.contains(&format!(":{}", before[1].1)));
        drop(holder);
    }
}
