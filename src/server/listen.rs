//! Listening: bind every address first (so that a taken port fails start-up
//! at once), then serve a router on each until the node stops. Used for the
//! peer port (by the node) and the client port (`crate::api`).
//!
//! A listener with TLS (an `https://` URL) runs each accepted connection's
//! handshake in a task of its own (`crate::tls::ServerTls::accept`, bounded
//! in time), so that a slow or failing handshake holds up no other
//! connection; only connections that finish it reach gRPC. A refused one is
//! logged at debug level: anyone can knock.
//!
//! At a stop the servers stop accepting, and requests in flight get
//! [`STOP_GRACE`] to finish (Raft still runs meanwhile, so a write waiting
//! for its commit gets its answer); then the servers are dropped with
//! whatever connections remain. Without that bound a client that keeps its
//! side of a stream open (a watch, a keepalive) would hold the stop up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::transport::server::{Router, TcpIncoming};

use crate::shutdown::Stopping;
use crate::tls::ServerTls;

/// One address to serve on, with TLS or without.
#[derive(Clone)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: Option<Arc<ServerTls>>,
}

/// Handshakes finished but not yet taken by the server, per listener.
const ACCEPTED_BACKLOG: usize = 64;

/// How long requests in flight at a stop have to finish.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// Serve a router made by `make` on each of `addrs` until the node stops (see
/// the module doc); the node's stop waits for this to return.
pub async fn serve(listeners: Vec<Listener>, make: impl Fn() -> Router, mut stopping: Stopping) -> anyhow::Result<()> {
    let mut bound = Vec::new();
    for Listener { addr, tls } in listeners {
        let listener = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
        bound.push((listener, tls));
    }
    let mut servers = JoinSet::new();
    for (listener, tls) in bound {
        let mut stopping = stopping.clone();
        let stopped = async move { stopping.stopped().await };
        match tls {
            None => {
                // Small request/response pairs must not wait for Nagle's algorithm.
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                servers.spawn(make().serve_with_incoming_shutdown(incoming, stopped));
            }
            Some(tls) => {
                let (accepted, incoming) = mpsc::channel(ACCEPTED_BACKLOG);
                tokio::spawn(accept_tls(listener, tls, accepted));
                let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
                servers.spawn(make().serve_with_incoming_shutdown(incoming, stopped));
            }
        }
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

/// Accept connections on `listener` and hand those that finish the TLS
/// handshake to the server through `accepted`, until the server is gone.
async fn accept_tls(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    accepted: mpsc::Sender<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>,
) {
    loop {
        let tcp = tokio::select! {
            tcp = listener.accept() => tcp,
            _ = accepted.closed() => return,
        };
        let (tcp, from) = match tcp {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!(error = %e, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (tls, accepted) = (tls.clone(), accepted.clone());
        tokio::spawn(async move {
            match tls.accept(tcp).await {
                Ok(stream) => {
                    let _ = accepted.send(Ok(stream)).await;
                }
                Err(e) => tracing::debug!(%from, error = %e, "TLS handshake refused"),
            }
        });
    }
}
