//! The bottom layer: what every other layer may use, and which uses nothing
//! else of raftlock's.
//!
//! - [`ids`]: member and cluster IDs, URLs, Go-style durations;
//! - [`codec`]: the byte encoding of log entries, peer payloads and files;
//! - [`limits`]: every size, batch and queue budget;
//! - [`shutdown`]: how every task learns the node stops, and how it waits;
//! - [`batcher`]: calls grouped into bounded batches;
//! - [`metrics`]: the Prometheus registry, with etcd's metric names;
//! - [`tls`]: rustls configurations for both ports, from etcd's TLS flags;
//! - [`listen`]: binding and serving a port's listeners, plain or TLS;
//! - [`version`]: raftlock's release, the etcd API level, how both print.
//!
//! Invariant: no file here names a module of the crate outside `base`.

pub mod batcher;
pub mod codec;
pub mod ids;
pub mod limits;
pub mod listen;
pub mod metrics;
pub mod resolve;
pub mod shutdown;
pub mod tls;
pub mod version;
