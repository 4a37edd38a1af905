//! Listening: bind every address first (so that a taken port fails start-up
//! at once), then serve a router on each until the node shuts down. Used for
//! the peer port (here, by the node) and the client port (`crate::api`).

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::{Router, TcpIncoming};

/// Serve a router made by `make` on each of `addrs` until `shutdown` turns true.
pub async fn serve(
    addrs: Vec<SocketAddr>,
    make: impl Fn() -> Router,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut listeners = Vec::new();
    for addr in addrs {
        let listener = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
        listeners.push(listener);
    }
    let mut servers = Vec::new();
    for listener in listeners {
        // Small request/response pairs must not wait for Nagle's algorithm.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let stopped = super::shutdown_started(shutdown.clone());
        servers.push(tokio::spawn(make().serve_with_incoming_shutdown(incoming, stopped)));
    }
    for s in servers {
        s.await??;
    }
    Ok(())
}
