//! The raftlock server binary: parse flags, start the node, serve peers and
//! clients, and shut down cleanly on SIGTERM or SIGINT.

use clap::Parser;
use raftlock::config::{Config, Port};
use raftlock::Node;
use tokio::signal::unix::{signal, SignalKind};

/// mimalloc rather than glibc's malloc: the server allocates and frees many
/// small buffers per request (HTTP/2 frames, messages, log entries), where
/// glibc's malloc showed in the profile (docs/performance-notes.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A runtime with a worker per core: work that holds one thread for a while
/// (applying a large batch, capturing the state for a checkpoint, a request
/// that waits on the store's lock) leaves the others to send heartbeats and
/// answer clients. With a single thread, any such moment stopped heartbeats
/// with it (`scripts/bench.sh stall`).
///
/// Without tokio's LIFO slot. With it, a task that another task wakes runs
/// next on that worker. A batch of writes ends by waking the request of
/// every write in it, and each request, as it finishes, wakes its HTTP/2
/// connection, which then ran at once and wrote that one response to its
/// socket: a `writev` per response. In the worker's ordinary queue, the
/// requests of a batch finish first and the connection writes all their
/// responses in one. Members' `writev` per put, 64 clients: 1.72 with the
/// slot, 1.00 without. A task in the slot can't be stolen by another
/// worker either, so it may wait while its worker's thread is busy or
/// descheduled. The cost: a chain of messages on idle cores, such as a
/// lock handed from waiter to waiter, runs about 7% slower
/// (docs/performance-notes.md).
///
/// The switch is in tokio's unstable API: `.cargo/config.toml` builds with
/// `--cfg tokio_unstable`.
fn main() -> anyhow::Result<()> {
    #[cfg(not(tokio_unstable))]
    compile_error!(
        "the server is built with `--cfg tokio_unstable` (.cargo/config.toml); a RUSTFLAGS variable replaces that \
         file's flags: add `--cfg tokio_unstable` to it"
    );
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    #[cfg(tokio_unstable)]
    runtime.disable_lifo_slot();
    runtime.build()?.block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    let mut config = Config::parse();
    // Files this process creates are its own alone (0600, directories 0700):
    // the data directory holds tokens and password hashes
    // (`storage::data_dir`).
    // SAFETY: umask only sets the process's file mode mask.
    unsafe { libc::umask(0o077) };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&config.log_level))
        .with_target(false)
        .init();
    disable_transparent_huge_pages();
    config.discover().await?;

    // Every port is bound before the node opens its storage: a taken port
    // stops the start before anything is written (a fresh data directory
    // would otherwise hold a newly bootstrapped cluster).
    let peer_listeners = raftlock::bind_listeners(config.listeners(Port::Peer)?)?;
    let client_listeners = raftlock::bind_listeners(config.listeners(Port::Client)?)?;
    let metrics_listeners = raftlock::bind_listeners(config.metrics_listeners()?)?;
    let node = Node::start(&config).await?;
    if !config.peers_authenticated() {
        tokio::spawn(warn_of_open_peers_under_auth(node.clone()));
    }
    let peers = tokio::spawn(node.clone().serve_peers(peer_listeners));
    if config.experimental_initial_corrupt_check {
        if let Err(e) = node.check_initial_corruption().await {
            tracing::error!(error = %e, "initial corruption check failed; this member does not serve");
            node.shutdown().await;
            return Err(e);
        }
    }
    let api = raftlock::ClientApi::new(node.clone(), raftlock::ApiSettings::from_config(&config));
    let clients = tokio::spawn(api.clone().serve_clients(client_listeners));
    let metrics = tokio::spawn(api.serve_metrics(metrics_listeners));
    tracing::info!(
        name = %config.name,
        member_id = format!("{:x}", node.id),
        clients = %config.listen_client_urls,
        peers = %config.listen_peer_urls,
        data_dir = %config.data_dir().display(),
        "raftlock is serving"
    );

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let failed = tokio::select! {
        _ = term.recv() => None,
        _ = int.recv() => None,
        _ = node.removed() => {
            tracing::error!("this member has been removed from the cluster; it stops serving");
            Some(Ok(Ok(())))
        }
        r = peers => Some(r),
        r = clients => Some(r),
        r = metrics => Some(r),
        why = node.failed() => {
            tracing::error!(%why, "raft stopped (a storage failure); this member stops");
            Some(Ok(Err(anyhow::anyhow!("raft stopped: {why}"))))
        }
    };
    tracing::info!("shutting down");
    if failed.is_none() {
        match node.hand_over_leadership().await {
            Ok(Some(to)) => tracing::info!(to = format!("{to:x}"), "handed leadership over before stopping"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not hand leadership over before stopping"),
        }
    }
    node.shutdown().await;
    match failed {
        Some(Ok(Err(e))) => Err(e),
        Some(Err(e)) => Err(e.into()),
        _ => Ok(()),
    }
}

/// Turn transparent huge pages off for this process (Linux; a failure only
/// costs speed): mimalloc asks for huge pages, and the kernel then zeroes
/// 2 MiB at every first touch, which showed in followers' profiles as the
/// state grew (docs/performance-notes.md).
fn disable_transparent_huge_pages() {
    // SAFETY: prctl with an integer option and integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not turn transparent huge pages off");
    }
}

/// With plaintext or unauthenticated peers, say once — as soon as the
/// applied state shows auth on, at start (once the log is replayed) or when
/// it is turned on later — what an open peer port allows.
async fn warn_of_open_peers_under_auth(node: std::sync::Arc<Node>) {
    let mut stopping = node.stopping();
    loop {
        if node.state().auth().enabled {
            tracing::warn!(
                "auth is on, but peers are not authenticated (no --peer-client-cert-auth): whoever reaches the peer \
                 port can act as a member — replicate, vote, and forward writes as any user, root included. Serve \
                 peers over https:// with --peer-client-cert-auth and --peer-trusted-ca-file, or keep the peer \
                 port on a network only members reach"
            );
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            _ = stopping.stopped() => return,
        }
    }
}
