//! The bench's etcd-client driver in a raftlockctl built without it (the
//! `bench-etcd-client` feature is off): `--driver etcd-client` is refused
//! with what to do instead. The crate's build script needs `protoc`, so a
//! plain `cargo build` leaves it out; `scripts/release-bins.sh` and
//! `scripts/test.sh` build with it.
//!
//! Invariant: nothing of this driver can be made, so the types below are
//! uninhabited and their methods are never called.

use std::convert::Infallible;

use raftlock::client::ClientTls;

use crate::bench::BenchArgs;

/// Never made: no connection of this driver exists in this build.
#[derive(Clone)]
pub struct Client(Infallible);

/// Refuse the driver: it is not in this build.
pub async fn connect(
    _endpoints: &[String],
    _tls: Option<&ClientTls>,
    _credentials: Option<&(String, String)>,
) -> anyhow::Result<Client> {
    anyhow::bail!(
        "this raftlockctl was built without the etcd-client driver: build it with \
         `cargo build --release --features bench-etcd-client` (needs protoc)"
    )
}

/// Never made (see [`Client`]).
pub struct EtcdClientDriver(Infallible);

impl EtcdClientDriver {
    pub async fn new(client: Client, _args: &BenchArgs, _lock_name: Vec<u8>) -> anyhow::Result<EtcdClientDriver> {
        match client.0 {}
    }

    pub async fn put(&mut self, _key: Vec<u8>, _value: &[u8]) -> anyhow::Result<()> {
        match self.0 {}
    }

    pub async fn request(&mut self, _args: &BenchArgs, _key: Vec<u8>, _n: u64, _value: &[u8]) -> anyhow::Result<()> {
        match self.0 {}
    }

    pub async fn finish(&mut self) {
        match self.0 {}
    }
}
