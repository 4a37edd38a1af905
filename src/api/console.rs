//! The web console: `/ui` on the client port, served by the same listener
//! as the gateway (with TLS when the port has it). Its pages are plain
//! HTML, CSS and JavaScript modules embedded in the binary at build time
//! (`console/`: no npm, no CDN, it works offline). They read and act only
//! through the gateway's JSON API (`/v3/...`, `/v1/locks/...`) with the
//! visitor's auth token, so a visitor can do nothing through the console
//! that its permissions do not allow, and every request meets the same
//! checks as a gRPC one.
//!
//! One route is the console's own: `GET /ui/api/cluster`, every member's
//! status ([`Node::cluster_status`], each asked over the peer port within
//! [`MEMBER_TIMEOUT`]) as one JSON line every [`CLUSTER_EVERY`] for as long
//! as the page reads it, so that a member that stops answering shows within
//! two seconds. With auth on it needs a token that names a user.
//!
//! Caveats: the assets are served with `Cache-Control: no-cache`, so a
//! browser asks again and an upgraded member serves its own console at once;
//! they are small and sent uncompressed. Member and lease IDs are written
//! as hexadecimal strings (etcdctl's form; a JavaScript number cannot hold
//! every 64-bit ID).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde_json::json;

use crate::node::Node;

/// How long the cluster page waits for a member's status.
pub const MEMBER_TIMEOUT: Duration = Duration::from_millis(800);
/// How often the cluster page is told every member's status.
pub const CLUSTER_EVERY: Duration = Duration::from_secs(1);

/// The embedded files: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("console/index.html")),
    ("console.css", "text/css; charset=utf-8", include_str!("console/console.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("console/app.js")),
    ("cluster.js", "text/javascript; charset=utf-8", include_str!("console/cluster.js")),
    ("locks.js", "text/javascript; charset=utf-8", include_str!("console/locks.js")),
    ("leases.js", "text/javascript; charset=utf-8", include_str!("console/leases.js")),
    ("keys.js", "text/javascript; charset=utf-8", include_str!("console/keys.js")),
];

/// The console's routes.
pub fn routes(node: Arc<Node>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("index.html") }))
        .route("/ui/api/cluster", get(move |headers: HeaderMap| cluster(node.clone(), headers)))
        .route("/ui/{file}", get(|Path(file): Path<String>| async move { asset(&file) }))
}

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => {
            ([(header::CONTENT_TYPE, *kind), (header::CACHE_CONTROL, "no-cache")], *body).into_response()
        }
        None => (StatusCode::NOT_FOUND, "Not Found\n").into_response(),
    }
}

/// `GET /ui/api/cluster` (see the module doc).
async fn cluster(node: Arc<Node>, headers: HeaderMap) -> Response {
    if node.state().auth().enabled {
        let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
        let token = token.strip_prefix("Bearer ").unwrap_or(token);
        let named = match token.is_empty() {
            true => false,
            false => node.identify(token).await.is_ok_and(|caller| !caller.user.is_empty()),
        };
        if !named {
            let body = json!({"error": "user name is empty", "code": 16, "message": "user name is empty"});
            let kind = [(header::CONTENT_TYPE, "application/json")];
            return (StatusCode::UNAUTHORIZED, kind, body.to_string()).into_response();
        }
    }
    let mut stopping = node.stopping();
    let lines = futures::stream::unfold((node, true), |(node, first)| async move {
        if !first {
            tokio::time::sleep(CLUSTER_EVERY).await;
        }
        let mut line = serde_json::to_vec(&view(&node).await).expect("a JSON value encodes");
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), (node, false)))
    })
    .take_until(async move { stopping.stopped().await });
    let kind = [(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-cache")];
    (kind, Body::from_stream(lines)).into_response()
}

/// Every member's status, as the cluster page shows it.
async fn view(node: &Node) -> serde_json::Value {
    let members: Vec<serde_json::Value> = node
        .cluster_status(MEMBER_TIMEOUT)
        .await
        .into_iter()
        .map(|(m, status)| {
            let (status, error) = match status {
                Ok(s) => (
                    json!({
                        "leader": format!("{:x}", s.leader),
                        "raft_term": s.raft_term,
                        "raft_index": s.raft_index,
                        "applied_index": s.applied_index,
                        "db_size": s.db_size,
                        "release": s.release,
                    }),
                    serde_json::Value::Null,
                ),
                Err(e) => (serde_json::Value::Null, json!(e)),
            };
            json!({
                "id": format!("{:x}", m.id),
                "name": m.name,
                "peer_urls": m.peer_urls,
                "client_urls": m.client_urls,
                "is_learner": m.is_learner,
                "status": status,
                "error": error,
            })
        })
        .collect();
    let alarms: Vec<serde_json::Value> = node
        .state()
        .alarms()
        .list()
        .into_iter()
        .map(|(member, kind)| json!({"member": format!("{member:x}"), "alarm": kind.name()}))
        .collect();
    json!({
        "served_by": format!("{:x}", node.id),
        "quota": node.quota_bytes(),
        "members": members,
        "alarms": alarms,
    })
}
