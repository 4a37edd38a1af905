//! raftlock: a Raft-replicated lock server that speaks the etcd v3 API.
//!
//! Layers, top to bottom (a module only uses the ones below it):
//! ```text
//!   api/        tonic adapters: validate -> call the node -> map error -> fill header
//!   locks/      lock, semaphore and election queues: recipes over the node's KV
//!   server/     the node facade: typed writes (forwarded to the leader),
//!               linearizable reads (ReadIndex), lease time, membership
//!   raft/       the only module that names openraft: log store, state machine,
//!               the peer protocol (raft/peer/), replication pipes
//!   auth/       etcd's auth: users, roles, permission checks, tokens
//!   command     the replicated log format (Command, CommandResult)
//!   applied     the applied state readers share with the state machine
//!   watch lease mvcc/     the deterministic data model (no tokio, no openraft)
//!   storage/    the only module that names sled; the WAL
//! ```
//! Beside them: `config` (the command line), `tls` (rustls configurations for
//! both ports, from etcd's TLS flags), `batcher` (group calls into
//! batches), `shutdown` (how every task learns the node stops, and how the
//! node waits for them), `proto` (generated gRPC types), `client` (the Rust client that
//! `raftlockctl` uses), and, only under `cfg(fuzzing)`, `fuzz` (the fuzz
//! targets' entry points into the decoders and apply).
//!
//! A write: `api::kv` -> `server::write` (`Node::put`) -> on the leader
//! `raft::proposer`, on a follower `raft::peer::forward` -> the leader's
//! proposer -> openraft -> `raft::log_store` (WAL) and `raft::pipeline`
//! (to followers) -> committed -> `raft::state_machine` applies it to `mvcc`
//! on every member -> the leader's result is the answer.
//!
//! A read: `api::kv` -> `server::read` (`Node::read_barrier`: a read index
//! from the leader, `raft::read_index`, then wait until applied) -> `applied`.
//!
//! A lock: `api::lock` / `api::native_lock` -> `locks` (a txn that queues the
//! caller's key, then a watch on the key before it) -> the write and read
//! paths above.
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
pub use base::listen::bind as bind_listeners;
pub use locks::prefix_end;
/// How fast a leader expires leases that lapsed together (etcd's rate).
pub use node::lease_keeper::{EXPIRIES_PER_TICK, TICK as LEASE_TICK};
pub use node::Node;
