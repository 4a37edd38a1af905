//! The web console: `/ui` on the client port, served by the same listener
//! as the gateway (with TLS when the port has it). Its pages are plain
//! HTML, CSS and JavaScript modules embedded in the binary at build time
//! (`console/`: no npm, no CDN, it works offline). They read and act only
//! through the gateway's JSON API (`/v3/...`, `/v1/locks/...`) with the
//! visitor's auth token, so a visitor can do nothing through the console
//! that its permissions do not allow, and every request meets the same
//! checks as a gRPC one.
//!
//! Two routes are the console's own, each a JSON line every second for as
//! long as the page reads it (a line's work starts a second after the last
//! one's did, however long that took), and with auth on each needs a token
//! that names a user:
//! - `GET /ui/api/cluster`: every member's status ([`Node::cluster_status`],
//!   each asked over the peer port within [`MEMBER_TIMEOUT`]), so that a
//!   member that stops answering shows within two seconds.
//! - `GET /ui/api/leases?after=ID&limit=N`: a page of leases in ID order
//!   (how many in all, and where the next page starts), each with its TTL
//!   left (asked of the leader, as TimeToLive is), its granted TTL, its key
//!   count and the first keys the visitor may read, and whether the visitor
//!   may revoke it (WRITE on every key on it, as LeaseRevoke checks). etcd
//!   has no watch on leases: this is how the leases page stays current.
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
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde_json::json;

use crate::model::auth::{Caller, PermKind};
use crate::node::Node;

/// How long the cluster page waits for a member's status.
pub const MEMBER_TIMEOUT: Duration = Duration::from_millis(800);
/// How often the cluster page is told every member's status, and the
/// leases page its leases.
pub const CLUSTER_EVERY: Duration = Duration::from_secs(1);
/// How many leases a page of the leases page holds at most.
const LEASES_PAGE_MAX: usize = 500;
/// How many of a lease's keys the leases page is told.
const LEASE_KEYS_SHOWN: usize = 10;

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
        .route(
            "/ui/api/cluster",
            get({
                let node = node.clone();
                move |headers: HeaderMap| cluster(node.clone(), headers)
            }),
        )
        .route("/ui/api/leases", get(move |headers: HeaderMap, uri: Uri| leases(node.clone(), headers, uri)))
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

/// Who asks, for a console route: with auth on, a token that names a user
/// (else the 401 to answer).
async fn visitor(node: &Node, headers: &HeaderMap) -> Result<Caller, Response> {
    if !node.state().auth().enabled {
        return Ok(Caller::default());
    }
    let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    let token = token.strip_prefix("Bearer ").unwrap_or(token);
    match token.is_empty() {
        true => None,
        false => node.identify(token).await.ok().filter(|caller| !caller.user.is_empty()),
    }
    .ok_or_else(|| {
        let body = json!({"error": "user name is empty", "code": 16, "message": "user name is empty"});
        let kind = [(header::CONTENT_TYPE, "application/json")];
        (StatusCode::UNAUTHORIZED, kind, body.to_string()).into_response()
    })
}

/// A JSON line from `line()` at once and then every [`CLUSTER_EVERY`] (from
/// when the last one began), until the node stops or the page goes.
fn every_second<F, Fut>(node: &Node, line: F) -> Response
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = serde_json::Value> + Send,
{
    let mut stopping = node.stopping();
    let lines = futures::stream::unfold((line, tokio::time::Instant::now()), |(line, at)| async move {
        tokio::time::sleep_until(at).await;
        let mut bytes = serde_json::to_vec(&line().await).expect("a JSON value encodes");
        bytes.push(b'\n');
        let next = (at + CLUSTER_EVERY).max(tokio::time::Instant::now());
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), (line, next)))
    })
    .take_until(async move { stopping.stopped().await });
    let kind = [(header::CONTENT_TYPE, "application/x-ndjson"), (header::CACHE_CONTROL, "no-cache")];
    (kind, Body::from_stream(lines)).into_response()
}

/// `GET /ui/api/cluster` (see the module doc).
async fn cluster(node: Arc<Node>, headers: HeaderMap) -> Response {
    if let Err(refused) = visitor(&node, &headers).await {
        return refused;
    }
    let shown = node.clone();
    every_second(&node, move || {
        let node = shown.clone();
        async move { view(&node).await }
    })
}

/// `GET /ui/api/leases` (see the module doc).
async fn leases(node: Arc<Node>, headers: HeaderMap, uri: Uri) -> Response {
    let caller = match visitor(&node, &headers).await {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let (mut after, mut limit) = (None, 50);
    for (name, value) in uri.query().unwrap_or("").split('&').filter_map(|pair| pair.split_once('=')) {
        let parsed = match name {
            "after" => value.parse().map(|id| after = Some(id)).is_ok(),
            "limit" => value.parse().map(|n: usize| limit = n.clamp(1, LEASES_PAGE_MAX)).is_ok(),
            _ => true,
        };
        if !parsed {
            let body = json!({"error": format!("{name}: not a number"), "code": 3, "message": "bad query"});
            return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], body.to_string())
                .into_response();
        }
    }
    let shown = node.clone();
    let caller = Arc::new(caller);
    every_second(&node, move || {
        let (node, caller) = (shown.clone(), caller.clone());
        async move { lease_page(&node, &caller, after, limit).await }
    })
}

/// A page of leases as the leases page shows it (see the module doc). The
/// lease table's lock is let go before the auth store's is taken.
async fn lease_page(node: &Node, caller: &Caller, after: Option<i64>, limit: usize) -> serde_json::Value {
    let (count, taken, more) = {
        let leases = node.state().leases();
        let mut taken: Vec<(i64, i64, Vec<Vec<u8>>)> =
            leases.after(after).take(limit + 1).map(|l| (l.id, l.ttl, l.keys.iter().cloned().collect())).collect();
        let more = taken.len() > limit;
        taken.truncate(limit);
        (leases.len(), taken, more)
    };
    let may = |key: &[u8], kind| crate::api::auth::check(node, caller, key, &[], kind).is_ok();
    let next = more.then(|| taken.last().map(|(id, _, _)| id.to_string())).flatten();
    // TTLs left: only the leader keeps lease time.
    let ttls = futures::future::join_all(taken.iter().map(|(id, _, _)| async move {
        match tokio::time::timeout(MEMBER_TIMEOUT, node.time_to_live(*id)).await {
            Ok(Ok(Some(status))) => json!(status.remaining),
            _ => serde_json::Value::Null,
        }
    }))
    .await;
    let page: Vec<serde_json::Value> = taken
        .iter()
        .zip(ttls)
        .map(|((id, granted, keys), ttl)| {
            let shown: Vec<String> = keys
                .iter()
                .filter(|k| may(k, PermKind::Read))
                .take(LEASE_KEYS_SHOWN)
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            json!({
                "id": format!("{id:016x}"),
                "ID": id.to_string(),
                "ttl": ttl,
                "granted_ttl": granted,
                "key_count": keys.len(),
                "keys": shown,
                "revocable": keys.iter().all(|k| may(k, PermKind::Write)),
            })
        })
        .collect();
    json!({"count": count, "leases": page, "next": next})
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
