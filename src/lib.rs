//! raftlock: a Raft-replicated lock server that speaks the etcd v3 API.
//!
//! The crate's folders are its layers, top to bottom; a file uses only files
//! of its own layer and of the layers below (`scripts/check-layers.py`
//! checks it, with no import circle between files):
//! ```text
//!   api/       the client port: etcd's gRPC services, the lock API, the
//!              HTTP/JSON gateway, /metrics and health
//!   locks/     lock, semaphore, read-write lock and election recipes
//!   node/      the node facade: typed writes, linearizable reads, lease
//!              time, membership, compaction, the disk reserve
//!   raft/      replication behind one face: openraft, the log store and
//!              state machine, the write path, cluster changes, the peer
//!              protocol (the only module that names openraft)
//!   model/     the replicated model, deterministic: commands, MVCC,
//!              leases, alarms, auth, the applied state, watch routing
//!   storage/   the WAL and the state store (the only module that names sled)
//!   config     the command line (etcd's flags)
//!   base/      ids and URLs, the byte codec, limits, shutdown, batching,
//!              metrics, TLS, listeners; `proto`: the generated gRPC types
//! ```
//! Beside them: `client` (the Rust client `raftlockctl` uses), `restore` (a
//! member's data directory from a backup) and, only under `cfg(fuzzing)`,
//! `fuzz` (the fuzz targets' entry points).
//!
//! The write, read, lock, lease and watch paths, file by file, are drawn in
//! `docs/architecture.md`, the one map of this crate.
//!
//! The crate's public surface is what the binaries, the tests and the fault
//! suite use; everything else is crate-private.

mod api;
mod base;
pub mod client;
pub mod config;
#[cfg(fuzzing)]
pub mod fuzz;
mod locks;
mod model;
mod node;
pub mod proto;
mod raft;
pub mod restore;
mod storage;

pub use api::{ApiSettings, ClientApi};
pub use base::ids;
/// The watch caps hostile clients are held to (the hostile suite's floods
/// go one past them).
pub use base::limits::{MAX_WATCHED_RANGES, MAX_WATCHERS_PER_STREAM};
pub use base::listen::bind as bind_listeners;
pub use base::resolve;
/// raftlock's release and the etcd API level (`raftlockctl version`, tests).
pub use base::version;
pub use locks::prefix_end;
/// How often the leader looks for leases whose deadline passed.
pub use node::lease::keeper::TICK as LEASE_TICK;
pub use node::versions::ClusterVersion;
pub use node::Node;
