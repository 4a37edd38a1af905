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
//! one's did, however long that took). With auth on each needs a token
//! that names a user, looked at again before every line: a token the
//! member no longer knows (an auth change, a restart) or a user deleted
//! ends the stream with a refusal. (Looking a simple token up keeps it
//! alive, as any request with it does.)
//! - `GET /ui/api/cluster`: every member's status ([`Node::cluster_status`],
//!   each asked over the peer port within [`MEMBER_TIMEOUT`]), so that a
//!   member that stops answering shows within two seconds.
//! - `GET /ui/api/leases?after=ID&limit=N`: a page of leases in ID order
//!   (how many in all, and where the next page starts), each with whether
//!   the visitor may revoke it (WRITE on every key on it, as LeaseRevoke
//!   checks) and, as TimeToLive tells them only to who may READ every key
//!   on the lease, its TTL left, its granted TTL, its key count and first
//!   keys. etcd has no watch on leases: this is how the leases page stays
//!   current. Bounded: a page holds at most [`LEASES_PAGE_MAX`] leases,
//!   each lease's TTL is asked of the leader every [`LEASE_TTL_EVERY`] at
//!   most (counted down in between), a member serves
//!   [`LEASE_STREAMS_MAX`] such streams at once (more are refused with
//!   "too many requests"), and a lease with more than
//!   [`LEASE_KEYS_CHECKED`] keys is judged by one check over the range from
//!   its first key to its last (which can refuse a visitor who may in fact
//!   read each key: the page then hides what it holds).
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
use tonic::Status;

use crate::model::auth::{Caller, PermKind};
use crate::node::Node;

/// How long the cluster page waits for a member's status.
pub const MEMBER_TIMEOUT: Duration = Duration::from_millis(800);
/// How often the cluster page is told every member's status, and the
/// leases page its leases.
pub const CLUSTER_EVERY: Duration = Duration::from_secs(1);
/// How many leases a page of the leases page holds at most.
const LEASES_PAGE_MAX: usize = 100;
/// How many of a lease's keys the leases page is told.
const LEASE_KEYS_SHOWN: usize = 10;
/// How many of a lease's keys are checked one by one against the visitor's
/// permissions (see [`lease_page`]).
const LEASE_KEYS_CHECKED: usize = 64;
/// How often a lease stream asks the leader for a lease's TTL; it counts
/// down in between.
const LEASE_TTL_EVERY: Duration = Duration::from_secs(5);
/// How many lease streams a member serves at once (each asks the leader
/// for up to [`LEASES_PAGE_MAX`] TTLs every [`LEASE_TTL_EVERY`]).
const LEASE_STREAMS_MAX: usize = 8;

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
        // A user deleted since its token (a JWT) was issued is refused too.
        false => node
            .identify(token)
            .await
            .ok()
            .filter(|caller| !caller.user.is_empty() && node.state().auth().check_user(caller).is_ok()),
    }
    .ok_or_else(|| super::gateway::error(&nobody()))
}

/// The refusal of a visitor who names no user (answered 401 by the gateway's
/// mapping, which the pages take as "sign in").
fn nobody() -> Status {
    Status::unauthenticated("etcdserver: user name is empty")
}

/// A JSON line from `line()` at once and then every [`CLUSTER_EVERY`] (from
/// when the last one began), until the node stops or the page goes. The
/// visitor is asked for again before each line: once refused, the last
/// line is the refusal, as the gateway ends a failed stream.
fn every_second<F, Fut>(node: Arc<Node>, headers: HeaderMap, line: F) -> Response
where
    F: Fn(Caller) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = serde_json::Value> + Send,
{
    let mut stopping = node.stopping();
    let state = (node, headers, line, tokio::time::Instant::now(), false);
    let lines = futures::stream::unfold(state, |(node, headers, line, at, refused)| async move {
        if refused {
            return None;
        }
        tokio::time::sleep_until(at).await;
        let (mut bytes, refused) = match visitor(&node, &headers).await {
            Ok(caller) => (serde_json::to_vec(&line(caller).await).expect("a JSON value encodes"), false),
            Err(_) => (super::gateway::error_line(&nobody()), true),
        };
        bytes.push(b'\n');
        let next = (at + CLUSTER_EVERY).max(tokio::time::Instant::now());
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), (node, headers, line, next, refused)))
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
    every_second(node, headers, move |_| {
        let node = shown.clone();
        async move { view(&node).await }
    })
}

/// The lease streams (`/ui/api/leases`) this process may serve at once: a
/// stream holds a permit for as long as it lives.
static LEASE_STREAMS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LEASE_STREAMS_MAX);

/// `GET /ui/api/leases` (see the module doc).
async fn leases(node: Arc<Node>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(refused) = visitor(&node, &headers).await {
        return refused;
    }
    let (mut after, mut limit) = (None, 50);
    for (name, value) in uri.query().unwrap_or("").split('&').filter_map(|pair| pair.split_once('=')) {
        let parsed = match name {
            "after" => value.parse().map(|id| after = Some(id)).is_ok(),
            "limit" => value.parse().map(|n: usize| limit = n.clamp(1, LEASES_PAGE_MAX)).is_ok(),
            _ => true,
        };
        if !parsed {
            return super::gateway::error(&Status::invalid_argument(format!("{name}: not a number")));
        }
    }
    let Ok(permit) = LEASE_STREAMS.try_acquire() else {
        return super::gateway::error(&Status::resource_exhausted("etcdserver: too many requests"));
    };
    let ttls = Arc::new(std::sync::Mutex::new(LeaseTtls::default()));
    let shown = node.clone();
    every_second(node, headers, move |caller| {
        // The permit is held for as long as the stream (which owns this closure) lives.
        let _permit = &permit;
        let (node, ttls) = (shown.clone(), ttls.clone());
        async move { lease_page(&node, &caller, after, limit, &ttls).await }
    })
}

/// What a lease stream last heard of its leases' TTLs: each lease's seconds
/// left (`None` if the leader did not say), and when it was asked.
#[derive(Default)]
struct LeaseTtls(std::collections::HashMap<i64, (Option<i64>, tokio::time::Instant)>);

/// A lease as the lease table held it when a page was taken: all its keys
/// when it has at most [`LEASE_KEYS_CHECKED`], else its first
/// [`LEASE_KEYS_SHOWN`] and its last.
struct LeaseRow {
    id: i64,
    granted: i64,
    key_count: usize,
    keys: Vec<Vec<u8>>,
    last: Option<Vec<u8>>,
}

/// A page of leases as the leases page shows it (see the module doc).
/// The lease table is held only to copy the page out of it; the auth store
/// is read once per page, after.
async fn lease_page(
    node: &Node,
    caller: &Caller,
    after: Option<i64>,
    limit: usize,
    ttls: &std::sync::Mutex<LeaseTtls>,
) -> serde_json::Value {
    let (count, rows, more) = {
        let leases = node.state().leases();
        let mut rows: Vec<LeaseRow> = leases
            .after(after)
            .take(limit + 1)
            .map(|l| {
                let all = l.keys.len() <= LEASE_KEYS_CHECKED;
                LeaseRow {
                    id: l.id,
                    granted: l.ttl,
                    key_count: l.keys.len(),
                    keys: l
                        .keys
                        .iter()
                        .take(if all { LEASE_KEYS_CHECKED } else { LEASE_KEYS_SHOWN })
                        .cloned()
                        .collect(),
                    last: (!all).then(|| l.keys.last().cloned()).flatten(),
                }
            })
            .collect();
        let more = rows.len() > limit;
        rows.truncate(limit);
        (leases.len(), rows, more)
    };
    let next = more.then(|| rows.last().map(|row| row.id.to_string())).flatten();
    // May the visitor do `kind` to every key on the lease? Past
    // LEASE_KEYS_CHECKED keys, judged over the range from the first to the
    // last: enough, and a little more than needed.
    let (readable, revocable): (Vec<bool>, Vec<bool>) = {
        let auth = node.state().auth();
        let may_all = |row: &LeaseRow, kind: PermKind| match &row.last {
            None => row.keys.iter().all(|k| auth.check(caller, k, &[], kind).is_ok()),
            Some(last) => auth.check(caller, &row.keys[0], &[last.as_slice(), &[0]].concat(), kind).is_ok(),
        };
        rows.iter().map(|row| (may_all(row, PermKind::Read), may_all(row, PermKind::Write))).unzip()
    };
    let ttl_left = lease_ttls(node, &rows, &readable, ttls).await;
    let page: Vec<serde_json::Value> = rows
        .iter()
        .zip(readable.iter().zip(revocable))
        .zip(ttl_left)
        .map(|((row, (&readable, revocable)), ttl)| {
            // As TimeToLive: what a lease holds, only to who may read all of it.
            let shown: Vec<String> =
                row.keys.iter().take(LEASE_KEYS_SHOWN).map(|k| String::from_utf8_lossy(k).into_owned()).collect();
            json!({
                "id": format!("{:016x}", row.id),
                "ID": row.id.to_string(),
                "ttl": ttl,
                "granted_ttl": if readable { json!(row.granted) } else { serde_json::Value::Null },
                "key_count": if readable { json!(row.key_count) } else { serde_json::Value::Null },
                "keys": if readable { json!(shown) } else { serde_json::Value::Null },
                "revocable": revocable,
            })
        })
        .collect();
    json!({"count": count, "leases": page, "next": next})
}

/// The seconds left on each readable lease of `rows` (`null` for the
/// others, and where the leader did not answer within [`MEMBER_TIMEOUT`]):
/// asked of the leader (TimeToLive) when last asked [`LEASE_TTL_EVERY`]
/// ago or never, else counted down from its last answer (or `null` again,
/// after no answer: a slow leader is not asked every second).
async fn lease_ttls(
    node: &Node,
    rows: &[LeaseRow],
    readable: &[bool],
    ttls: &std::sync::Mutex<LeaseTtls>,
) -> Vec<serde_json::Value> {
    let now = tokio::time::Instant::now();
    let known: Vec<Option<(Option<i64>, tokio::time::Instant)>> = {
        let mut ttls = ttls.lock().expect("lease TTLs poisoned");
        ttls.0.retain(|id, _| rows.iter().any(|row| row.id == *id));
        rows.iter().map(|row| ttls.0.get(&row.id).copied()).collect()
    };
    let asks = rows.iter().zip(readable).zip(&known).map(|((row, &readable), known)| async move {
        if !readable {
            return (row.id, None, false);
        }
        if let Some((left, at)) = known.filter(|(_, at)| now.duration_since(*at) < LEASE_TTL_EVERY) {
            let counted = left.map(|left| (left - now.duration_since(at).as_secs() as i64).max(0));
            return (row.id, counted, false);
        }
        match tokio::time::timeout(MEMBER_TIMEOUT, node.time_to_live(row.id)).await {
            Ok(Ok(Some(status))) => (row.id, Some(status.remaining), true),
            _ => (row.id, None, true),
        }
    });
    let answers = futures::future::join_all(asks).await;
    let mut ttls = ttls.lock().expect("lease TTLs poisoned");
    answers
        .into_iter()
        .map(|(id, left, asked)| {
            if asked {
                ttls.0.insert(id, (left, now));
            }
            left.map_or(serde_json::Value::Null, |left| json!(left))
        })
        .collect()
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
