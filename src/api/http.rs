//! The plain-HTTP endpoints etcd serves on its client port (and on
//! `--listen-metrics-urls`): `/metrics`, `/health`, `/livez`, `/readyz`,
//! `/version`. They share the client port with gRPC (routed by path; HTTP/1.1 and
//! HTTP/2 both accepted).
//!
//! - `/metrics`: Prometheus' text format (`crate::base::metrics`), the view of the
//!   state refreshed on each scrape.
//! - `/health`: etcd's JSON, `{"health":"true","reason":""}`; 503 with
//!   `RAFT NO LEADER`, `ALARM NOSPACE` / `ALARM CORRUPT` (unless
//!   `?exclude=NOSPACE`...), or the linearizable read's failure (unless
//!   `?serializable=true`).
//! - `/version`: etcd's JSON, `{"etcdserver":"3.5.0","etcdcluster":"3.5.0"}`
//!   (the etcd API level raftlock implements), with `"raftlock"`, this
//!   member's release, and `"raftlockcluster"`, the cluster version as this
//!   member sees it (`node::versions`), and `"raftlockdowngrade"`, the
//!   release a downgrade in progress goes to (`null`: none).
//! - `/livez`: the process serves a serializable read. `/readyz`: no CORRUPT
//!   alarm, a serializable and a linearizable read, not a learner. Both answer
//!   `ok` (with `?verbose`, one `[+]check ok` line per check first), or 503
//!   with `[-]check failed: reason` lines.
//!
//! Caveat: the linearizable read of `/health` and `/readyz` waits at most
//! [`READ_TIMEOUT`], so that a probe never hangs.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::base::metrics::metrics;
use crate::locks::stats::Grants;
use crate::model::alarm::AlarmKind;
use crate::node::Node;

/// How long a health check's linearizable read may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// The routes, for the client port and the metrics port.
pub fn routes(node: Arc<Node>, grants: Arc<Grants>) -> Router {
    let (n1, n2, n3, n4) = (node.clone(), node.clone(), node.clone(), node.clone());
    Router::new()
        .route("/metrics", get(move || scrape(node.clone(), grants.clone())))
        .route("/health", get(move |uri: Uri| health(n1.clone(), uri)))
        .route("/livez", get(move |uri: Uri| livez(n2.clone(), uri)))
        .route("/readyz", get(move |uri: Uri| readyz(n3.clone(), uri)))
        .route("/version", get(move || version(n4.clone())))
}

/// etcd's `/version` (the etcd API level as both the server's and the
/// cluster's version, which is what etcd's tools compare), with raftlock's
/// own release beside it and the cluster's (the lowest of the members', or
/// etcd's "not_decided" until every member has told its own).
async fn version(node: Arc<Node>) -> Response {
    use crate::base::version::{ETCD_API, RAFTLOCK};
    use crate::node::versions::ClusterVersion;
    let cluster = match node.cluster_version() {
        ClusterVersion::Decided(v) => v.to_string(),
        ClusterVersion::NotDecided(_) => "not_decided".to_string(),
    };
    let body = serde_json::json!({
        "etcdserver": ETCD_API,
        "etcdcluster": ETCD_API,
        "raftlock": RAFTLOCK,
        "raftlockcluster": cluster,
        "raftlockdowngrade": node.downgrade_target(),
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn scrape(node: Arc<Node>, grants: Arc<Grants>) -> Response {
    refresh(&node, &grants);
    let body = metrics().encode();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// Set the metrics that are a view of the member's state.
fn refresh(node: &Node, grants: &Grants) {
    let m = metrics();
    let status = node.status();
    m.has_leader.set(i64::from(status.leader != 0));
    m.is_leader.set(i64::from(status.leader == node.id));
    m.proposals_committed.set(status.raft_index as i64);
    m.proposals_applied.set(status.applied_index as i64);
    m.proposals_pending.set(node.pending_proposals() as i64);
    m.quota_backend_bytes.set(node.quota_bytes().map_or(0, |q| q as i64));
    m.db_total_size.set(node.disk_size() as i64);
    m.db_size_in_use.set(status.db_size as i64);
    let (revision, compacted, keys, spilled) = {
        let mvcc = node.state().mvcc();
        (mvcc.revision(), mvcc.compact_revision(), mvcc.live_keys(), mvcc.spill().map_or(0, |s| s.held_bytes()))
    };
    m.history_spill_bytes.set(spilled as i64);
    m.current_revision.set(revision);
    m.compact_revision.set(compacted.max(0));
    m.keys.set(keys as i64);
    m.lock_holders.set(grants.held(node.state()) as i64);
    m.lease_expiries_overdue.set(node.overdue_lease_expiries() as i64);
    let alarms = node.state().alarms().list();
    for kind in [AlarmKind::NoSpace, AlarmKind::Corrupt] {
        let raised = alarms.iter().filter(|(_, k)| *k == kind).count();
        m.alarms.with_label_values(&[kind.name()]).set(raised as i64);
    }
}

/// The value of query parameter `name`, if given (`?verbose` gives "").
fn query<'a>(uri: &'a Uri, name: &str) -> Option<&'a str> {
    uri.query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

/// Every value of query parameter `name` (`?exclude=NOSPACE&exclude=CORRUPT`).
fn query_all<'a>(uri: &'a Uri, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    uri.query().unwrap_or("").split('&').filter_map(move |pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then_some(value)
    })
}

/// A linearizable read's barrier, bounded by [`READ_TIMEOUT`].
async fn linearizable_read(node: &Node) -> Result<(), String> {
    match tokio::time::timeout(READ_TIMEOUT, node.read_barrier()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_string()),
    }
}

async fn health(node: Arc<Node>, uri: Uri) -> Response {
    let excluded: Vec<&str> = query_all(&uri, "exclude").collect();
    let serializable = query(&uri, "serializable") == Some("true");
    let alarm = node.state().alarms().list().into_iter().map(|(_, kind)| kind.name()).find(|k| !excluded.contains(k));
    let reason = if let Some(kind) = alarm {
        Some(format!("ALARM {kind}"))
    } else if !node.has_leader() {
        Some("RAFT NO LEADER".to_string())
    } else if serializable {
        None
    } else {
        linearizable_read(&node).await.err().map(|e| format!("QGET ERROR:{e}"))
    };
    let (status, health, reason) = match reason {
        None => (StatusCode::OK, "true", String::new()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, "false", reason),
    };
    let body = serde_json::json!({ "health": health, "reason": reason }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// One named check's outcome.
type Check = (&'static str, Result<(), String>);

async fn livez(_node: Arc<Node>, uri: Uri) -> Response {
    // A serializable read needs only the local state, which is always there
    // while the process runs.
    report("livez", vec![("serializable_read", Ok(()))], &uri)
}

async fn readyz(node: Arc<Node>, uri: Uri) -> Response {
    let corrupt = node.state().alarms().any(AlarmKind::Corrupt);
    let learner = node.status().is_learner;
    let checks = vec![
        ("data_corruption", if corrupt { Err("alarm CORRUPT raised".to_string()) } else { Ok(()) }),
        ("serializable_read", Ok(())),
        ("linearizable_read", linearizable_read(&node).await),
        ("non_learner", if learner { Err("this member is a learner".to_string()) } else { Ok(()) }),
    ];
    report("readyz", checks, &uri)
}

/// The checks as etcd (and Kubernetes) print them.
fn report(what: &str, checks: Vec<Check>, uri: &Uri) -> Response {
    let failed = checks.iter().any(|(_, r)| r.is_err());
    let verbose = query(uri, "verbose").is_some();
    let mut body = String::new();
    if failed || verbose {
        for (name, outcome) in &checks {
            match outcome {
                Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
                Err(e) => body.push_str(&format!("[-]{name} failed: {e}\n")),
            }
        }
    }
    let status = if failed {
        body.push_str(&format!("{what} check failed\n"));
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        body.push_str("ok\n");
        StatusCode::OK
    };
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}
