//! The replicated model: what every member computes identically from the
//! same log, and nothing else. Deterministic — no clocks, no randomness, no
//! I/O, no openraft — so that two members applying the same entries hold the
//! same state.
//!
//! - [`command`]: the log's entries (`Command`) and their results;
//! - [`mvcc`]: the revisioned key-value store (ranges, txns, history,
//!   compaction);
//! - [`lease`]: the lease table (TTLs and attached keys; time is the
//!   leader's, `node::lease::keeper`);
//! - [`lock_delay`]: which deletions start a lock-delay, and its keys;
//! - [`alarm`]: NOSPACE and CORRUPT alarms;
//! - [`auth`]: users, roles, permission checks and the token table;
//! - [`applied`]: the applied state readers share with apply, and the
//!   change batches it hands to watchers;
//! - [`watch`] and [`watch_routes`]: watch filters, and routing each applied
//!   batch to the watchers of the keys it changed.
//!
//! Invariant: nothing here names a layer above (`raft`, `node`, `locks`,
//! `api`); `crate::base` is the only other module it uses.

pub mod alarm;
pub mod applied;
pub mod auth;
pub mod command;
pub mod lease;
pub mod lock_delay;
pub mod mvcc;
pub mod range_index;
pub mod watch;
pub mod watch_routes;
