//! Listening: bind every address first ([`bind`], before the node opens its
//! storage, so that a taken port stops start-up before anything is written),
//! then serve a router on each until the node stops ([`serve`]). Used for the
//! peer port (by the node), the client and metrics ports (`crate::api`).
//!
//! A bound address does not listen until it is served: until then a
//! connection to it is refused at once, as to a closed port, rather than
//! left waiting in a backlog nobody accepts from. A new member's start-up
//! check dials its peers while they may be in that state, and must not hang
//! on them. Caveat: the sockets are bound with `SO_REUSEADDR` (as the
//! standard library's listeners are, so a restarted member takes its port
//! back while old connections linger in TIME_WAIT), which on Linux lets two
//! sockets that do not listen yet share an address: of two members started
//! at the same instant on one port, the second fails only when it listens,
//! after its storage is open.
//!
//! A listener with TLS (an `https://` URL) runs each accepted connection's
//! handshake in a task of its own (`crate::base::tls::ServerTls::accept`, bounded
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

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::transport::server::{Router, TcpIncoming};

use crate::base::shutdown::Stopping;
use crate::base::tls::ServerTls;

/// One address to serve on, with TLS or without.
#[derive(Clone)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: Option<Arc<ServerTls>>,
}

/// An address bound and not yet listening (see the module doc), to be
/// served with [`serve`].
pub struct Bound {
    socket: TcpSocket,
    addr: SocketAddr,
    tls: Option<Arc<ServerTls>>,
}

/// Bind every address of `listeners`; the first that cannot be bound (a port
/// taken by another process, an address not on this host) is the error.
pub fn bind(listeners: Vec<Listener>) -> anyhow::Result<Vec<Bound>> {
    listeners
        .into_iter()
        .map(|Listener { addr, tls }| {
            let bound = || {
                let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
                // See the module doc. A port another socket listens on
                // stays taken.
                socket.set_reuseaddr(true)?;
                socket.bind(addr)?;
                std::io::Result::Ok(socket)
            };
            let socket = bound().map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
            Ok(Bound { socket, addr, tls })
        })
        .collect()
}

/// The backlog of connections the kernel holds for a served address.
const LISTEN_BACKLOG: u32 = 1024;

/// Handshakes finished but not yet taken by the server, per listener.
const ACCEPTED_BACKLOG: usize = 64;

/// How long requests in flight at a stop have to finish.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// Serve a router made by `make` on each of `bound` until the node stops (see
/// the module doc); the node's stop waits for this to return.
pub async fn serve(bound: Vec<Bound>, make: impl Fn() -> Router, mut stopping: Stopping) -> anyhow::Result<()> {
    let mut listening = Vec::new();
    for Bound { socket, addr, tls } in bound {
        let listener = socket.listen(LISTEN_BACKLOG).map_err(|e| anyhow::anyhow!("listening on {addr}: {e}"))?;
        listening.push((listener, tls));
    }
    let mut servers = JoinSet::new();
    for (listener, tls) in listening {
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
