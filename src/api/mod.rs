//! The client API: etcd's v3 gRPC services and raftlock's native lock API, as
//! tonic adapters over the node.
//!
//! Every handler has the same four steps: validate the request (etcd's checks,
//! etcd's errors) -> call the node -> map errors (`error`, one place) -> fill
//! the response header. No handler touches Raft or storage directly.
//!
//! Limits (etcd's, on every service: [`limits`]): a request larger than
//! [`MAX_REQUEST_BYTES`] is refused with "request is too large"; the gRPC
//! layer accepts messages up to [`MAX_REQUEST_BYTES`] + 512 KiB so that such
//! requests reach that check, and refuses larger ones as etcd does.

pub mod auth;
pub mod cluster;
pub mod console;
pub mod error;
pub mod gateway;
pub mod health;
pub mod http;
pub mod kv;
pub mod lease;
pub mod limits;
pub mod lock;
pub mod maintenance;
pub mod native_lock;
pub mod observe_codec;
pub mod served;
pub mod watch;

use std::sync::Arc;

use tonic::service::Routes;
use tonic::transport::Server;

use crate::base::limits::MAX_TXN_OPS;
use crate::locks::stats::Grants;
use crate::node::Node;
use crate::proto::etcdserverpb::ResponseHeader;

pub use limits::check_request_size;
/// How long a client connection may be idle before the server pings it
/// (etcd's `--grpc-keepalive-interval` default).
const CLIENT_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2 * 60 * 60);
/// How long the server waits for the answer to that ping before it closes
/// the connection (etcd's `--grpc-keepalive-timeout` default).
const CLIENT_KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Whether a request carries etcd's `hasleader: true` metadata (clientv3's
/// `WithRequireLeader`): it must not be served by a member without a leader.
pub fn requires_leader<T>(req: &tonic::Request<T>) -> bool {
    req.metadata().get("hasleader").is_some_and(|v| v == "true")
}

/// How many bytes of request data one client connection may have sent that
/// the member has not read yet (HTTP/2's connection window; each stream's
/// own stays hyper's 1 MiB). It is 8 times hyper's default for what it also
/// sets: HTTP/2 (h2) ends a connection with GOAWAY ENHANCE_YOUR_CALM once
/// the small DATA frames waiting in it carry more framing overhead than half
/// this window (about 256 bytes a frame, less its payload). At hyper's 1 MiB
/// that is some 2,300 tiny messages waiting at once: a busy client (lease
/// keepalives or watch creates on many streams of one connection) lost the
/// connection whenever its member stalled for a moment and then found them
/// all waiting. At 8 MiB a whole stream's worth of watch creates (10,000)
/// fits, and a flood of tiny messages is still cut off (the hostile
/// suite's `watch-create-pipeline`). Caveat: h2 works the budget out from
/// this configured window; hyper's adaptive window (off, tonic's default)
/// would shrink it again.
const CLIENT_CONNECTION_WINDOW: u32 = 8 << 20;

/// A response header from this node at `revision`.
pub fn header(node: &Node, revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader { cluster_id: node.cluster_id, member_id: node.id, revision, raft_term: node.raft_term() })
}

/// The client port's settings (from the command line).
#[derive(Clone, Debug)]
pub struct ApiSettings {
    /// `--max-concurrent-streams`.
    pub max_concurrent_streams: u32,
    /// How often watchers that asked for it get a progress notification
    /// (`--experimental-watch-progress-notify-interval`).
    pub watch_progress_interval: std::time::Duration,
}

impl ApiSettings {
    pub fn from_config(config: &crate::config::Config) -> ApiSettings {
        ApiSettings {
            max_concurrent_streams: config.max_concurrent_streams,
            watch_progress_interval: std::time::Duration::from_millis(config.watch_progress_notify_interval),
        }
    }
}

/// What a member's client and metrics ports serve: the node, the client
/// port's settings, and the lock grants this member's lock APIs made (the
/// holders metric counts those still held).
#[derive(Clone)]
pub struct ClientApi {
    node: Arc<Node>,
    settings: ApiSettings,
    grants: Arc<Grants>,
}

impl ClientApi {
    pub fn new(node: Arc<Node>, settings: ApiSettings) -> ClientApi {
        ClientApi { node, settings, grants: Arc::default() }
    }

    /// Serve the client API on `listeners` until the node shuts down: the
    /// gRPC services, and the HTTP endpoints ([`http`]) on the same port.
    pub async fn serve_clients(self, listeners: Vec<crate::base::listen::Bound>) -> anyhow::Result<()> {
        let ClientApi { node, settings, grants } = self;
        let health = health::service(node.clone());
        // Lock-delays end on this member's clock while it leads (`locks::delay`).
        let delays = Arc::new(crate::locks::delay::DelayClock::default());
        tokio::spawn(crate::locks::delay::run(node.clone(), delays.clone(), node.stopping()));
        let hubs = native_lock::observe_hubs(node.clone());
        let make = || {
            let mut grpc = Routes::builder();
            grpc.add_service(health.clone())
                .add_service(kv::KvService::server(node.clone()))
                .add_service(auth::AuthService::server(node.clone()))
                .add_service(cluster::ClusterService::server(node.clone()))
                .add_service(maintenance::MaintenanceService::server(node.clone()))
                .add_service(lease::LeaseService::server(node.clone()))
                .add_service(watch::WatchService::server(node.clone(), settings.watch_progress_interval))
                .add_service(lock::LockService::server(node.clone(), grants.clone()))
                .add_service(lock::ElectionService::server(node.clone(), grants.clone()))
                .add_service(native_lock::LocksService::server(
                    node.clone(),
                    grants.clone(),
                    delays.clone(),
                    hubs.clone(),
                ));
            let grpc = grpc.routes().into_axum_router();
            let routes = grpc
                .clone()
                .merge(gateway::routes(grpc))
                .merge(http::routes(node.clone(), grants.clone()))
                .merge(console::routes(node.clone()));
            Server::builder()
                .accept_http1(true)
                .max_concurrent_streams(Some(settings.max_concurrent_streams))
                .initial_connection_window_size(CLIENT_CONNECTION_WINDOW)
                // etcd's --grpc-keepalive-interval and -timeout defaults: a client
                // that vanished without closing its connection (its watch and
                // keepalive streams with it) is let go of within about two hours.
                .http2_keepalive_interval(Some(CLIENT_KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(CLIENT_KEEPALIVE_TIMEOUT))
                .add_routes(Routes::from(routes))
        };
        crate::base::listen::serve(listeners, make, node.stopping()).await
    }

    /// Serve only the HTTP endpoints ([`http`]) on `listeners`
    /// (`--listen-metrics-urls`) until the node shuts down.
    pub async fn serve_metrics(self, listeners: Vec<crate::base::listen::Bound>) -> anyhow::Result<()> {
        let ClientApi { node, grants, .. } = self;
        if listeners.is_empty() {
            node.stopping().stopped().await;
            return Ok(());
        }
        let make = || {
            Server::builder().accept_http1(true).add_routes(Routes::from(http::routes(node.clone(), grants.clone())))
        };
        crate::base::listen::serve(listeners, make, node.stopping()).await
    }
}

/// Parse a streamed gateway body as the gateway does (the fuzz targets'
/// entry).
#[cfg(fuzzing)]
pub fn fuzz_gateway(bytes: &[u8]) {
    gateway::fuzz_objects(bytes);
}
