//! Conformance with etcd: the scenarios in `tests/conformance/*.json` are run
//! through the `etcd-client` crate and every response is normalized (header
//! revision, kvs, counts, `more`, errors as gRPC code + message; member and
//! cluster IDs and terms dropped). The goldens next to them were recorded
//! against real etcd 3.5.1 by `scripts/record-goldens.sh`, which runs the
//! ignored `record_goldens` test below; `raftlock_matches_etcd_goldens` runs
//! the same scenarios against a 3-member raftlock cluster, through a follower,
//! and reports every op whose response differs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::golden::load;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaderKey, LeaseGrantOptions,
    LeaseTimeToLiveOptions, LockOptions, ProclaimOptions, PutOptions, ResignOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions, WatchResponse,
};
use serde_json::{json, Value};

const SUITES: &[&str] = &["kv", "lease_watch", "locks"];

/// The key-range flags that etcd-client's get, delete and watch options share
/// (by method name; they have no common trait).
macro_rules! with_key_range {
    ($options:expr, $op:expr) => {{
        let mut o = $options;
        if flag($op, "prefix") {
            o = o.with_prefix();
        }
        if flag($op, "from_key") {
            o = o.with_from_key();
        }
        if let Some(end) = $op["range_end"].as_str() {
            o = o.with_range(end);
        }
        o
    }};
}

fn suite_path(name: &str, golden: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    dir.join(if golden { format!("{name}.golden.json") } else { format!("{name}.json") })
}

// ---------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------

fn text(bytes: &[u8]) -> Value {
    if bytes.len() > 64 {
        json!(format!("<{} bytes>", bytes.len()))
    } else {
        json!(String::from_utf8_lossy(bytes))
    }
}

fn kv(kv: &etcd_client::KeyValue) -> Value {
    json!({
        "key": text(kv.key()), "value": text(kv.value()),
        "create_revision": kv.create_revision(), "mod_revision": kv.mod_revision(),
        "version": kv.version(), "lease": kv.lease(),
    })
}

fn header(h: Option<&etcd_client::ResponseHeader>) -> Value {
    h.map_or(Value::Null, |h| json!({"revision": h.revision()}))
}

fn get_resp(r: &etcd_client::GetResponse) -> Value {
    json!({"header": header(r.header()), "kvs": r.kvs().iter().map(kv).collect::<Vec<_>>(), "more": r.more(), "count": r.count()})
}

fn put_resp(r: &etcd_client::PutResponse) -> Value {
    json!({"header": header(r.header()), "prev_kv": r.prev_key().map(kv)})
}

fn del_resp(r: &etcd_client::DeleteResponse) -> Value {
    json!({"header": header(r.header()), "deleted": r.deleted(), "prev_kvs": r.prev_kvs().iter().map(kv).collect::<Vec<_>>()})
}

fn txn_resp(r: &etcd_client::TxnResponse) -> Value {
    let responses: Vec<Value> = r
        .op_responses()
        .iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => json!({"range": get_resp(g)}),
            TxnOpResponse::Put(p) => json!({"put": put_resp(p)}),
            TxnOpResponse::Delete(d) => json!({"delete": del_resp(d)}),
            TxnOpResponse::Txn(t) => json!({"txn": txn_resp(t)}),
        })
        .collect();
    json!({"header": header(r.header()), "succeeded": r.succeeded(), "responses": responses})
}

fn watch_resp(r: &WatchResponse) -> Value {
    let events: Vec<Value> = r
        .events()
        .iter()
        .map(|e| {
            json!({
                "type": if e.event_type() == EventType::Put { "PUT" } else { "DELETE" },
                "kv": e.kv().map(kv),
                "prev_kv": e.prev_kv().map(kv),
            })
        })
        .collect();
    json!({
        "header": header(r.header()), "watch_id": r.watch_id(), "created": r.created(), "canceled": r.canceled(),
        "compact_revision": r.compact_revision(), "cancel_reason": r.cancel_reason(), "events": events,
    })
}

/// A remaining TTL depends on time; only its sign is compared.
fn remaining(ttl: i64) -> Value {
    if ttl > 0 {
        json!("positive")
    } else {
        json!(ttl)
    }
}

fn watch_options(op: &Value, current: i64) -> WatchOptions {
    let mut o = with_key_range!(WatchOptions::new(), op);
    if let Some(r) = revision(&op["rev"], current) {
        o = o.with_start_revision(r);
    }
    if flag(op, "prev_kv") {
        o = o.with_prev_key();
    }
    let mut filters = Vec::new();
    if flag(op, "no_put") {
        filters.push(WatchFilterType::NoPut);
    }
    if flag(op, "no_delete") {
        filters.push(WatchFilterType::NoDelete);
    }
    if !filters.is_empty() {
        o = o.with_filters(filters);
    }
    if let Some(id) = op["watch_id"].as_i64() {
        o = o.with_watch_id(id);
    }
    o
}

fn leader_key(k: &LeaderKey) -> Value {
    json!({"name": text(k.name()), "key": text(k.key()), "rev": k.rev(), "lease": k.lease()})
}

/// The leader key an op names: `name`, `key`, `rev` (may be relative) and `lease`.
fn leader_of(op: &Value, current: i64) -> LeaderKey {
    LeaderKey::new()
        .with_name(s(op, "name"))
        .with_key(s(op, "key"))
        .with_rev(revision(&op["rev"], current).unwrap_or(0))
        .with_lease(op["lease"].as_i64().unwrap_or(0))
}

async fn next_watch_response(stream: &mut etcd_client::WatchStream) -> Value {
    match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
        Ok(Ok(Some(r))) => watch_resp(&r),
        Ok(Ok(None)) => json!("closed"),
        Ok(Err(e)) => error(e),
        Err(_) => json!("timeout"),
    }
}

/// Open a watch, run the follow-up ops, then take `responses` responses
/// (the first is the creation); `progress` asks for one more at the end.
async fn run_watch(c: &mut Client, op: &Value, current: i64) -> Value {
    let mut stream = match c.watch(s(op, "key"), Some(watch_options(op, current))).await {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let want = op["responses"].as_u64().unwrap_or(1) as usize;
    let mut responses = Vec::new();
    responses.push(next_watch_response(&mut stream).await);
    let mut then = Vec::new();
    for o in op["then"].as_array().cloned().unwrap_or_default() {
        then.push(Box::pin(run_op(c, &o)).await);
    }
    while responses.len() < want {
        responses.push(next_watch_response(&mut stream).await);
    }
    if flag(op, "progress") {
        stream.request_progress().await.expect("progress request");
        responses.push(next_watch_response(&mut stream).await);
    }
    json!({"responses": responses, "then": then})
}

fn error(e: etcd_client::Error) -> Value {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            json!({"error": {"code": format!("{:?}", s.code()), "message": s.message()}})
        }
        other => json!({"client_error": other.to_string()}),
    }
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

fn s<'a>(op: &'a Value, field: &str) -> &'a str {
    op[field].as_str().unwrap_or("")
}

fn flag(op: &Value, field: &str) -> bool {
    op[field].as_bool().unwrap_or(false)
}

/// A revision: a number, or "$-N" / "$+N" relative to `current`.
fn revision(v: &Value, current: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let rest = s.strip_prefix('$').expect("relative revisions start with $");
            Some(current + rest.parse::<i64>().expect("$-N or $+N"))
        }
        _ => None,
    }
}

fn get_options(op: &Value, current: i64) -> GetOptions {
    let mut o = with_key_range!(GetOptions::new(), op);
    if let Some(l) = op["limit"].as_i64() {
        o = o.with_limit(l);
    }
    if let Some(r) = revision(&op["rev"], current) {
        o = o.with_revision(r);
    }
    if let Some(sort) = op["sort"].as_array() {
        let target = match sort[0].as_str().unwrap() {
            "key" => SortTarget::Key,
            "version" => SortTarget::Version,
            "create" => SortTarget::Create,
            "mod" => SortTarget::Mod,
            "value" => SortTarget::Value,
            t => panic!("sort target {t}"),
        };
        let order = match sort[1].as_str().unwrap() {
            "none" => SortOrder::None,
            "ascend" => SortOrder::Ascend,
            "descend" => SortOrder::Descend,
            o => panic!("sort order {o}"),
        };
        o = o.with_sort(target, order);
    }
    if flag(op, "keys_only") {
        o = o.with_keys_only();
    }
    if flag(op, "count_only") {
        o = o.with_count_only();
    }
    if flag(op, "serializable") {
        o = o.with_serializable();
    }
    if let Some(r) = revision(&op["min_mod"], current) {
        o = o.with_min_mod_revision(r);
    }
    if let Some(r) = revision(&op["max_mod"], current) {
        o = o.with_max_mod_revision(r);
    }
    if let Some(r) = revision(&op["min_create"], current) {
        o = o.with_min_create_revision(r);
    }
    if let Some(r) = revision(&op["max_create"], current) {
        o = o.with_max_create_revision(r);
    }
    o
}

fn put_options(op: &Value) -> PutOptions {
    let mut o = PutOptions::new();
    if flag(op, "prev_kv") {
        o = o.with_prev_key();
    }
    if flag(op, "ignore_value") {
        o = o.with_ignore_value();
    }
    if flag(op, "ignore_lease") {
        o = o.with_ignore_lease();
    }
    if let Some(l) = op["lease"].as_i64() {
        o = o.with_lease(l);
    }
    o
}

fn delete_options(op: &Value) -> DeleteOptions {
    let mut o = with_key_range!(DeleteOptions::new(), op);
    if flag(op, "prev_kv") {
        o = o.with_prev_key();
    }
    o
}

fn compare(c: &Value) -> Compare {
    let result = match s(c, "result") {
        "=" => CompareOp::Equal,
        ">" => CompareOp::Greater,
        "<" => CompareOp::Less,
        "!=" => CompareOp::NotEqual,
        r => panic!("compare result {r}"),
    };
    let key = s(c, "key");
    let n = c["number"].as_i64().unwrap_or(0);
    let mut cmp = match s(c, "target") {
        "value" => Compare::value(key, result, s(c, "value")),
        "version" => Compare::version(key, result, n),
        "create" => Compare::create_revision(key, result, n),
        "mod" => Compare::mod_revision(key, result, n),
        "lease" => Compare::lease(key, result, n),
        t => panic!("compare target {t}"),
    };
    if flag(c, "prefix") {
        cmp = cmp.with_prefix();
    }
    if let Some(end) = c["range_end"].as_str() {
        cmp = cmp.with_range(end);
    }
    cmp
}

fn txn_op(op: &Value, current: i64) -> TxnOp {
    match s(op, "op") {
        "put" => TxnOp::put(s(op, "key"), s(op, "value"), Some(put_options(op))),
        "get" => TxnOp::get(s(op, "key"), Some(get_options(op, current))),
        "del" => TxnOp::delete(s(op, "key"), Some(delete_options(op))),
        "txn" => TxnOp::txn(txn(op, current)),
        o => panic!("txn op {o}"),
    }
}

fn txn(op: &Value, current: i64) -> Txn {
    let list = |f: &str| op[f].as_array().cloned().unwrap_or_default();
    let compares: Vec<Compare> = list("compare").iter().map(compare).collect();
    let success: Vec<TxnOp> = list("success").iter().map(|o| txn_op(o, current)).collect();
    let failure: Vec<TxnOp> = list("failure").iter().map(|o| txn_op(o, current)).collect();
    Txn::new().when(compares).and_then(success).or_else(failure)
}

async fn current_revision(c: &mut Client) -> i64 {
    c.get("conformance-probe", None).await.expect("probe read").header().unwrap().revision()
}

async fn run_op(c: &mut Client, op: &Value) -> Value {
    let current = current_revision(c).await;
    let result = match s(op, "op") {
        "put" => c.put(s(op, "key"), s(op, "value"), Some(put_options(op))).await.map(|r| put_resp(&r)),
        "put_big" => {
            let value = vec![b'x'; op["bytes"].as_u64().unwrap() as usize];
            c.put(s(op, "key"), value, None).await.map(|r| put_resp(&r))
        }
        "get" => c.get(s(op, "key"), Some(get_options(op, current))).await.map(|r| get_resp(&r)),
        "del" => c.delete(s(op, "key"), Some(delete_options(op))).await.map(|r| del_resp(&r)),
        "txn" => c.txn(txn(op, current)).await.map(|r| txn_resp(&r)),
        "txn_many" => {
            let puts = op["puts"].as_u64().unwrap_or(0);
            let compares = op["compares"].as_u64().unwrap_or(0);
            let t = Txn::new()
                .when(
                    (0..compares)
                        .map(|i| Compare::version(format!("cmp/{i}"), CompareOp::Equal, 0))
                        .collect::<Vec<_>>(),
                )
                .and_then((0..puts).map(|i| TxnOp::put(format!("many/{i}"), "v", None)).collect::<Vec<_>>());
            c.txn(t).await.map(|r| json!({"header": header(r.header()), "succeeded": r.succeeded()}))
        }
        "lease_grant" => {
            let opts = op["id"].as_i64().map(|id| LeaseGrantOptions::new().with_id(id));
            c.lease_grant(op["ttl"].as_i64().unwrap(), opts)
                .await
                .map(|r| json!({"header": header(r.header()), "id": r.id(), "ttl": r.ttl()}))
        }
        "lease_revoke" => {
            c.lease_revoke(op["id"].as_i64().unwrap()).await.map(|r| json!({"header": header(r.header())}))
        }
        "lease_ttl" => {
            let opts = flag(op, "keys").then(|| LeaseTimeToLiveOptions::new().with_keys());
            c.lease_time_to_live(op["id"].as_i64().unwrap(), opts).await.map(|r| {
                let mut keys: Vec<Value> = r.keys().iter().map(|k| text(k)).collect();
                keys.sort_by_key(|k| k.to_string());
                json!({"header": header(r.header()), "id": r.id(), "ttl": remaining(r.ttl()), "granted_ttl": r.granted_ttl(), "keys": keys})
            })
        }
        "lease_leases" => c.leases().await.map(|r| {
            let mut ids: Vec<i64> = r.leases().iter().map(|l| l.id()).collect();
            ids.sort_unstable();
            json!({"header": header(r.header()), "leases": ids})
        }),
        "lease_keepalive" => match c.lease_keep_alive(op["id"].as_i64().unwrap()).await {
            Ok((mut keeper, mut answers)) => {
                keeper.keep_alive().await.expect("keepalive");
                match answers.message().await {
                    Ok(Some(r)) => Ok(json!({"header": header(r.header()), "id": r.id(), "ttl": r.ttl()})),
                    Ok(None) => Ok(json!("closed")),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        },
        "watch" => Ok(run_watch(c, op, current).await),
        "lock" => {
            let opts = op["lease"].as_i64().map(|l| LockOptions::new().with_lease(l));
            c.lock(s(op, "name"), opts).await.map(|r| json!({"header": header(r.header()), "key": text(r.key())}))
        }
        "unlock" => c.unlock(s(op, "key")).await.map(|r| json!({"header": header(r.header())})),
        "campaign" => c
            .campaign(s(op, "name"), s(op, "value"), op["lease"].as_i64().unwrap())
            .await
            .map(|r| json!({"header": header(r.header()), "leader": r.leader().map(leader_key)})),
        "proclaim" => c
            .proclaim(s(op, "value"), Some(ProclaimOptions::new().with_leader(leader_of(op, current))))
            .await
            .map(|r| json!({"header": header(r.header())})),
        "leader" => c.leader(s(op, "name")).await.map(|r| json!({"header": header(r.header()), "kv": r.kv().map(kv)})),
        "resign" => c
            .resign(Some(ResignOptions::new().with_leader(leader_of(op, current))))
            .await
            .map(|r| json!({"header": header(r.header())})),
        "compact" => {
            let rev = revision(&op["rev"], current).expect("compact needs rev");
            c.compact(rev, None).await.map(|r| json!({"header": header(r.header())}))
        }
        o => panic!("unknown op {o}"),
    };
    result.unwrap_or_else(error)
}

/// Run every scenario of a suite; the result has one entry per op.
async fn run_suite(c: &mut Client, suite: &Value) -> Value {
    let mut out = Vec::new();
    for scenario in suite["scenarios"].as_array().unwrap() {
        let mut results = Vec::new();
        for op in scenario["ops"].as_array().unwrap() {
            results.push(json!({"op": op, "response": run_op(c, op).await}));
        }
        out.push(json!({"name": scenario["name"], "results": results}));
    }
    json!({"recorded_with": "etcd 3.5.1", "scenarios": out})
}

#[tokio::test]
async fn raftlock_matches_etcd_goldens() {
    let cluster = crate::common::Cluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    let mut mismatches = Vec::new();
    for suite in SUITES {
        let scenarios = load(&suite_path(suite, false));
        let golden = load(&suite_path(suite, true));
        let actual = run_suite(&mut c, &scenarios).await;
        mismatches.extend(crate::common::golden::mismatches(suite, &golden, &actual));
    }
    assert!(mismatches.is_empty(), "{} responses differ from etcd:\n{}", mismatches.len(), mismatches.join("\n"));
}

/// Records the goldens against a fresh single-member etcd 3.5.1. Run through
/// `scripts/record-goldens.sh`.
#[tokio::test]
#[ignore]
async fn record_goldens() {
    let etcd = crate::common::golden::RecordingEtcd::start(&[]).await;
    let mut c = Client::connect([etcd.url.clone()], None).await.unwrap();
    for suite in SUITES {
        let recorded = run_suite(&mut c, &load(&suite_path(suite, false))).await;
        std::fs::write(suite_path(suite, true), serde_json::to_string_pretty(&recorded).unwrap() + "\n").unwrap();
    }
}
