//! raftlock: a Raft-replicated lock server that speaks the etcd v3 API.
//!
//! Layers, top to bottom (a module only uses the ones below it):
//! ```text
//!   api/        tonic adapters: validate -> call -> map error -> fill header
//!   server/     the node facade: write (forward to the leader), read (ReadIndex)
//!   raft/       the only module that names openraft: log store, state machine, network
//!   mvcc/       the deterministic data model (no tokio, no openraft, no tonic)
//!   storage/    the only module that names sled; the WAL
//! ```
//! `locks` holds the lock, semaphore and election queues the API serves;
//! `command` is the replicated log format; `state` the applied state shared
//! between the state machine and readers; `config` the command line. `client`
//! is the Rust client (used by `raftlockctl`) and `bench` the load generator.

pub mod api;
pub mod batcher;
pub mod bench;
pub mod client;
pub mod command;
pub mod config;
pub mod lease;
pub mod locks;
pub mod mvcc;
pub mod proto;
pub mod raft;
pub mod server;
pub mod state;
pub mod storage;
pub mod watch;
