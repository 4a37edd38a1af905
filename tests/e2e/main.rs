//! raftlock end to end: real members (`raftlock` processes) on this machine,
//! driven through the clients users run (the `etcd-client` crate, the HTTP
//! gateway, raftlockctl). One test binary for every behaviour test; each
//! module is one concern.

use raftlock_testkit as common;

mod auth;
mod client_conformance;
mod cluster_ops;
mod discovery;
mod disk_faults;
mod durability;
mod gateway;
mod in_process;
mod kubernetes;
mod kv;
mod lease;
mod lock_delay;
mod lock_events;
mod lock_sets;
mod locks;
mod native_locks;
mod operations;
mod prometheus;
mod raftlockctl;
mod security;
mod versions;
mod watch;
