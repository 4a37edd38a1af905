//! Listening: bind every address first (so that a taken port fails start-up
//! at once), then serve a router on each until the node stops. Used for the
//! peer port (by the node) and the client port (`crate::api`).
//!
//! At a stop the servers stop accepting, and requests in flight get
//! [`STOP_GRACE`] to finish (Raft still runs meanwhile, so a write waiting
//! for its commit gets its answer); then the servers are dropped with
//! whatever connections remain. Without that bound a client that keeps its
//! side of a stream open (a watch, a keepalive) would hold the stop up.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::transport::server::{Router, TcpIncoming};

use crate::shutdown::Stopping;

/// How long requests in flight at a stop have to finish.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// Serve a router made by `make` on each of `addrs` until the node stops (see
/// the module doc); the node's stop waits for this to return.
pub async fn serve(addrs: Vec<SocketAddr>, make: impl Fn() -> Router, mut stopping: Stopping) -> anyhow::Result<()> {
    let mut listeners = Vec::new();
    for addr in addrs {
        let listener = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
        listeners.push(listener);
    }
    let mut servers = JoinSet::new();
    for listener in listeners {
        // Small request/response pairs must not wait for Nagle's algorithm.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut stopping = stopping.clone();
        let stopped = async move { stopping.stopped().await };
        servers.spawn(make().serve_with_incoming_shutdown(incoming, stopped));
    }
    let all_done = async {
        while let Some(done) = servers.join_next().await {
            done??;
        }
        anyhow::Ok(())
    };
    let grace_over = async {
        stopping.stopped().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        done = all_done => done,
        // Dropping the set aborts the servers still waiting on connections.
        _ = grace_over => Ok(()),
    }
}
