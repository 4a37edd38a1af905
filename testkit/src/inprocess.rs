//! The in-process tier: a cluster of raftlock members inside the test's own
//! process, each a real `Node` with its own data directory, peer port and
//! client port on 127.0.0.1, talking to the others over the real peer
//! protocol and serving the real client API — started the way the
//! `raftlock` binary starts a member (ports bound first, then the node, then
//! the peer and client services), without a process to spawn per member.
//!
//! For protocol tests that need no process fault: forwarding, read
//! indexes, leases, locks, watches, a member stopped cleanly and started
//! again. kill -9, SIGSTOP and the like need real processes
//! ([`crate::cluster`]).
//!
//! Run it on a multi-thread runtime (`#[tokio::test(flavor =
//! "multi_thread")]`), as the `raftlock` binary runs its member: three
//! members and their clients on one thread would measure nothing real.
//!
//! A cluster dropped while its members run stops them as
//! [`InProcessCluster::shutdown`] does (blocking the dropping thread, which
//! a multi-thread runtime allows).
//!
//! Caveats: the members share the process's metrics registry (their
//! counters add up), and a member stopped here is shut down cleanly, never
//! cut off mid-write.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::Client;
use raftlock::config::{Config, Port};
use raftlock::{ApiSettings, ClientApi, Node};

use crate::{free_port, ELECTION_MS, HEARTBEAT_MS};

/// One member of an [`InProcessCluster`].
pub struct InProcessMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    node: Option<Arc<Node>>,
    /// The peer and client services, ending when the node stops.
    serving: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProcessMember {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// Members in this process (see the module doc).
pub struct InProcessCluster {
    pub members: Vec<InProcessMember>,
    initial_cluster: String,
    _dir: tempfile::TempDir,
}

impl InProcessCluster {
    /// Start `n` members (50 ms heartbeat, 500 ms election timeout) and wait
    /// until they agree on a leader and serve.
    pub async fn start(n: usize) -> InProcessCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let members: Vec<InProcessMember> = (0..n)
            .map(|i| InProcessMember {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.raftlock")),
                node: None,
                serving: Vec::new(),
            })
            .collect();
        let initial_cluster =
            members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",");
        let mut cluster = InProcessCluster { members, initial_cluster, _dir: dir };
        for i in 0..n {
            cluster.start_member(i).await.expect("start a member");
        }
        cluster.wait_ready().await;
        cluster
    }

    /// Start member `i` (stopped, or never started) from its data
    /// directory, as the `raftlock` binary would with the same flags.
    pub async fn start_member(&mut self, i: usize) -> anyhow::Result<()> {
        let m = &self.members[i];
        anyhow::ensure!(m.node.is_none(), "member {i} is running");
        let args = [
            "raftlock".to_string(),
            format!("--name={}", m.name),
            format!("--data-dir={}", m.data_dir.display()),
            format!("--listen-client-urls={}", m.endpoint()),
            format!("--listen-peer-urls={}", m.peer_url()),
            format!("--initial-cluster={}", self.initial_cluster),
            format!("--heartbeat-interval={HEARTBEAT_MS}"),
            format!("--election-timeout={ELECTION_MS}"),
        ];
        let config = Config::try_parse_from(args)?;
        let peers = raftlock::bind_listeners(config.listeners(Port::Peer)?)?;
        let clients = raftlock::bind_listeners(config.listeners(Port::Client)?)?;
        let node = Node::start(&config).await?;
        let api = ClientApi::new(node.clone(), ApiSettings::from_config(&config));
        let m = &mut self.members[i];
        m.serving = vec![tokio::spawn(node.clone().serve_peers(peers)), tokio::spawn(api.serve_clients(clients))];
        m.node = Some(node);
        Ok(())
    }

    /// Stop member `i` cleanly (its node shuts down, its services end).
    pub async fn stop_member(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(node) = m.node.take() {
            node.shutdown().await;
        }
        for task in m.serving.drain(..) {
            let _ = task.await;
        }
    }

    /// Stop every member.
    pub async fn shutdown(mut self) {
        for i in 0..self.members.len() {
            self.stop_member(i).await;
        }
    }

    /// Member `i`'s node (it must run).
    pub fn node(&self, i: usize) -> &Arc<Node> {
        self.members[i].node.as_ref().expect("the member runs")
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(InProcessMember::endpoint).collect()
    }

    /// A client of member `i` alone.
    pub async fn client(&self, i: usize) -> Client {
        crate::connect(&[self.members[i].endpoint()]).await.expect("connect")
    }

    /// The index of the member that leads, as the running members see it
    /// (they must all agree), if any; no waiting.
    pub fn current_leader(&self) -> Option<usize> {
        let running: Vec<(usize, &Arc<Node>)> =
            self.members.iter().enumerate().filter_map(|(i, m)| Some((i, m.node.as_ref()?))).collect();
        let leaders: Vec<u64> = running.iter().map(|(_, node)| node.status().leader).collect();
        let leader = *leaders.first()?;
        if leader == 0 || leaders.iter().any(|l| *l != leader) {
            return None;
        }
        running.iter().find(|(_, node)| node.id == leader).map(|(i, _)| *i)
    }

    /// The index of the leader (waits until the cluster is ready).
    pub async fn leader(&self) -> usize {
        loop {
            self.wait_ready().await;
            if let Some(leader) = self.current_leader() {
                return leader;
            }
        }
    }

    /// A running member that does not lead (waits until there is a leader).
    pub async fn follower(&self) -> usize {
        let leader = self.leader().await;
        (0..self.members.len()).find(|&i| i != leader && self.members[i].node.is_some()).expect("a follower")
    }

    /// Wait (30 s at most) until the running members agree on a leader and
    /// each answers a linearizable read.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.current_leader().is_some() && self.all_read().await {
                return;
            }
            assert!(Instant::now() < deadline, "the in-process cluster was not ready in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn all_read(&self) -> bool {
        for node in self.members.iter().filter_map(|m| m.node.as_ref()) {
            let read = tokio::time::timeout(Duration::from_secs(2), node.read_barrier()).await;
            if !matches!(read, Ok(Ok(()))) {
                return false;
            }
        }
        true
    }
}

impl Drop for InProcessCluster {
    fn drop(&mut self) {
        if self.members.iter().all(|m| m.node.is_none()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                for i in 0..self.members.len() {
                    self.stop_member(i).await;
                }
            })
        });
    }
}
