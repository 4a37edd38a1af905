//! The bench's second driver: the `etcd-client` crate, the Rust client
//! applications use, so that both systems are also measured as an application
//! sees them and not only through raftlockctl's own gRPC code.
//!
//! Each of the `--conns` clients is one `etcd_client::Client` connected to
//! every endpoint: the crate balances each request over its members (tonic's
//! balanced channel), so with three endpoints about two requests in three
//! reach a follower, which forwards writes to the leader. The bench's request
//! loops share those clients round-robin, as tasks of an application share
//! its client.
//!
//! Caveat: the crate's balanced channel passes every request through a
//! buffer task of its own; that cost is the client's and the same for both
//! systems.

use anyhow::Context;
pub use etcd_client::Client;
use etcd_client::{Compare, CompareOp, ConnectOptions, GetOptions, LockOptions, Txn, TxnOp};
use raftlock::client::ClientTls;

use crate::bench::{BenchArgs, Workload};

/// Connect one balanced client to all of `endpoints`.
pub async fn connect(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    credentials: Option<&(String, String)>,
) -> anyhow::Result<Client> {
    let mut options = ConnectOptions::new();
    if let Some(tls) = tls {
        options = options.with_tls(tls.config());
    }
    if let Some((user, password)) = credentials {
        options = options.with_user(user.clone(), password.clone());
    }
    Client::connect(endpoints, Some(options)).await.with_context(|| format!("connecting to {}", endpoints.join(",")))
}

/// One request loop's client and identity.
pub struct EtcdClientDriver {
    client: Client,
    /// Lock workloads: the loop's lease and lock name.
    lease: i64,
    lock_name: Vec<u8>,
}

impl EtcdClientDriver {
    pub async fn new(mut client: Client, args: &BenchArgs, lock_name: Vec<u8>) -> anyhow::Result<EtcdClientDriver> {
        let lease = match args.workload {
            Workload::Lock => client.lease_grant(crate::bench::LOCK_LEASE_TTL, None).await?.id(),
            Workload::Put
            | Workload::Get
            | Workload::GetSerializable
            | Workload::Txn
            | Workload::Range
            | Workload::Count => 0,
            Workload::NativeLock | Workload::LeaseKey | Workload::WatchHistory | Workload::WatchFanout => {
                anyhow::bail!("--driver etcd-client runs put, get, get-serializable, txn, range, count and lock")
            }
        };
        Ok(EtcdClientDriver { client, lease, lock_name })
    }

    pub async fn put(&mut self, key: Vec<u8>, value: &[u8]) -> anyhow::Result<()> {
        self.client.put(key, value, None).await?;
        Ok(())
    }

    /// Request `n` of the run, whose key is `key`.
    pub async fn request(&mut self, args: &BenchArgs, key: Vec<u8>, n: u64, value: &[u8]) -> anyhow::Result<()> {
        match args.workload {
            Workload::Put => self.put(key, value).await?,
            Workload::Get => {
                self.client.get(key, None).await?;
            }
            Workload::GetSerializable => {
                self.client.get(key, Some(GetOptions::new().with_serializable())).await?;
            }
            Workload::Range | Workload::Count => {
                let (key, range_end, limit, count_only) = crate::bench_range::range_request(args, n);
                let mut options = GetOptions::new().with_range(range_end).with_limit(limit);
                if count_only {
                    options = options.with_count_only();
                }
                let answer = self.client.get(key, Some(options)).await?;
                crate::bench_range::check_range(args, answer.kvs().len() as u64).map_err(anyhow::Error::msg)?;
            }
            Workload::Txn => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Greater, -1)])
                    .and_then([TxnOp::put(key, value, None)]);
                self.client.txn(txn).await?;
            }
            Workload::Lock => {
                let options = LockOptions::new().with_lease(self.lease);
                let cycle = async {
                    let held = self.client.lock(self.lock_name.clone(), Some(options)).await?;
                    self.client.unlock(held.key()).await
                };
                if let Err(e) = cycle.await {
                    // A failed cycle may leave the lease's key queued, or
                    // holding, with nobody to unlock it: start afresh.
                    let _ = self.client.lease_revoke(self.lease).await;
                    self.lease = self.client.lease_grant(crate::bench::LOCK_LEASE_TTL, None).await?.id();
                    return Err(e.into());
                }
            }
            Workload::NativeLock | Workload::LeaseKey | Workload::WatchHistory | Workload::WatchFanout => {
                unreachable!("refused by new()")
            }
        }
        Ok(())
    }

    /// Revoke the loop's lease, if it has one.
    pub async fn finish(&mut self) {
        if self.lease != 0 {
            let _ = self.client.lease_revoke(self.lease).await;
        }
    }
}
