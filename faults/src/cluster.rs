//! The fault suite's clusters: the toolkit's one harness
//! (`raftlock_testkit::cluster`) with member `i` on its own loopback address,
//! 127.0.0.(11+i), client port 2379 and peer port 2380 (so that
//! `net::Partition` can cut any link between two members), etcd's default
//! Raft timing, and little of the log kept in memory.
//!
//! Caveat: the fixed ports mean one suite at a time per machine.

use std::path::Path;

use raftlock_testkit::cluster::{Addressing, Builder};
pub use raftlock_testkit::cluster::{Clocks, Cluster, View};
pub use raftlock_testkit::connect;

/// Raft timing of the members under test: etcd's defaults.
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_MS: u64 = 1000;
/// `--experimental-log-memory-bytes` of every member (the default is 32 MiB):
/// every member catching up after a fault is sent entries read back from
/// the WAL.
const LOG_MEMORY_BYTES: u64 = 64 << 10;

fn builder(binary: &Path, dir: &Path, n: usize) -> Builder {
    Cluster::builder(n)
        .binary(binary)
        .dir(dir)
        .addressing(Addressing::Loopback)
        .timing(HEARTBEAT_MS, ELECTION_MS)
        .args(&["--experimental-log-memory-bytes", &LOG_MEMORY_BYTES.to_string()])
}

/// Start `n` members with data and logs under `dir`; with `clocks`, under
/// libfaketime, their wall clocks true until moved.
pub fn start(binary: &Path, dir: &Path, n: usize, clocks: Option<Clocks>) -> anyhow::Result<Cluster> {
    let builder = builder(binary, dir, n);
    match clocks {
        Some(clocks) => builder.clocks(clocks).spawn(),
        None => builder.spawn(),
    }
}

/// [`start`], each member (and each restart of it) under an address-space
/// ceiling of `memory_limit` bytes (`ulimit -v`).
pub fn start_limited(binary: &Path, dir: &Path, n: usize, memory_limit: u64) -> anyhow::Result<Cluster> {
    builder(binary, dir, n).memory_limit(memory_limit).spawn()
}
