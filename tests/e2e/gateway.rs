//! The HTTP/JSON gateway, spoken with curl as users do. The scenarios in
//! `tests/conformance/gateway.json` are requests (unary and streaming, good
//! and bad, with and without auth tokens); the golden next to them holds
//! etcd 3.5.1's gateway's answers, recorded by `scripts/record-goldens.sh`
//! (the ignored `record_gateway_golden` below), and
//! `raftlock_gateway_matches_etcd_golden` replays them against raftlock.
//! raftlock's native lock API under `/v1/locks/`, which etcd has not, and a
//! watch that stays open for new events are checked on their own.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::golden::load;
use serde_json::{json, Value};

fn suite_path(golden: bool) -> PathBuf {
    let name = if golden { "gateway.golden.json" } else { "gateway.json" };
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance").join(name)
}

/// An HTTP answer: its status and body, as curl got them.
struct Answer {
    status: u16,
    body: String,
}

/// Send `body` to `url` + `path` with curl; for a stream, read for `stream`.
async fn curl(
    url: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    auth: Option<&str>,
    stream: Option<Duration>,
) -> Answer {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-s", "-N", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(auth) = auth {
        cmd.args(["-H", &format!("Authorization: {auth}")]);
    }
    if let Some(stream) = stream {
        cmd.args(["--max-time", &format!("{:.3}", stream.as_secs_f64())]);
    }
    if body.is_some() {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", "@-"]);
    }
    cmd.arg(format!("{url}{path}"));
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("curl (scripts/test.sh installs it)");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(body) = body {
        tokio::io::AsyncWriteExt::write_all(&mut stdin, body.as_bytes()).await.unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    Answer { status: status.trim().parse().unwrap_or(0), body: body.to_string() }
}

/// What of an answer is compared: the status, and the body as JSON (a
/// stream's as one JSON value per line) without what differs between any two
/// clusters (member and cluster IDs, terms) or what `varies` names.
fn normalize(answer: &Answer, streamed: bool, varies: &[&str]) -> Value {
    let parse = |text: &str| serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()));
    let mut body = if streamed {
        Value::Array(answer.body.lines().filter(|l| !l.trim().is_empty()).map(parse).collect())
    } else {
        parse(&answer.body)
    };
    scrub(&mut body, varies);
    json!({"status": answer.status, "body": body})
}

fn scrub(value: &mut Value, varies: &[&str]) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(header)) = map.get_mut("header") {
                for id in ["cluster_id", "member_id", "raft_term"] {
                    header.remove(id);
                }
            }
            if map.get("token").is_some_and(Value::is_string) {
                map.insert("token".into(), json!("<token>"));
            }
            for (key, v) in map.iter_mut() {
                if varies.contains(&key.as_str()) {
                    *v = json!("<varies>");
                } else {
                    scrub(v, varies);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| scrub(v, varies)),
        _ => {}
    }
}

/// Run every scenario against the gateway at `url`, as the golden records them.
async fn run_suite(url: &str, scenarios: &Value) -> Value {
    let mut token = String::new();
    let mut out = Vec::new();
    for scenario in scenarios["scenarios"].as_array().unwrap() {
        let mut results = Vec::new();
        for op in scenario["ops"].as_array().unwrap() {
            let method = op["method"].as_str().unwrap_or("POST");
            let body = match (&op["raw"], &op["body"]) {
                (Value::String(raw), _) => Some(raw.clone()),
                (_, Value::Null) => None,
                (_, body) => Some(body.to_string()),
            };
            let auth = op["auth"].as_str().map(|a| a.replace("$token", &token));
            let stream = op["stream_ms"].as_u64().map(Duration::from_millis);
            let path = op["path"].as_str().unwrap();
            let answer = curl(url, method, path, body.as_deref(), auth.as_deref(), stream).await;
            if let Ok(Value::Object(b)) = serde_json::from_str::<Value>(&answer.body) {
                if let Some(Value::String(t)) = b.get("token") {
                    token = t.clone();
                }
            }
            let varies: Vec<&str> =
                op["varies"].as_array().map_or(vec![], |v| v.iter().filter_map(Value::as_str).collect());
            results.push(json!({"op": op, "response": normalize(&answer, stream.is_some(), &varies)}));
        }
        out.push(json!({"name": scenario["name"], "results": results}));
    }
    json!({"recorded_with": "etcd 3.5.1", "scenarios": out})
}

#[tokio::test]
async fn raftlock_gateway_matches_etcd_golden() {
    let cluster = crate::common::Cluster::start(1).await;
    let actual = run_suite(&cluster.members[0].endpoint(), &load(&suite_path(false))).await;
    let mismatches = crate::common::golden::mismatches("gateway", &load(&suite_path(true)), &actual);
    assert!(mismatches.is_empty(), "{} answers differ from etcd's:\n{}", mismatches.len(), mismatches.join("\n"));
}

/// Records the golden against a fresh single-member etcd 3.5.1. Run through
/// `scripts/record-goldens.sh`.
#[tokio::test]
#[ignore]
async fn record_gateway_golden() {
    let etcd = crate::common::golden::RecordingEtcd::start(&[]).await;
    let recorded = run_suite(&etcd.url, &load(&suite_path(false))).await;
    std::fs::write(suite_path(true), serde_json::to_string_pretty(&recorded).unwrap() + "\n").unwrap();
}

/// Standard base64, as the gateway's JSON carries bytes.
fn b64(s: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

async fn post(url: &str, path: &str, body: Value) -> Value {
    let answer = curl(url, "POST", path, Some(&body.to_string()), None, None).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

#[tokio::test]
async fn native_locks_over_http_and_a_watch_that_stays_open() {
    let cluster = crate::common::Cluster::start(3).await;
    let url = cluster.members[1].endpoint();
    let lease = post(&url, "/v3/lease/grant", json!({"TTL": 30})).await["ID"].as_str().unwrap().to_string();
    let other = post(&url, "/v3/lease/grant", json!({"TTL": 30})).await["ID"].as_str().unwrap().to_string();

    // A read lock, shared; a writer is refused with the holders.
    let acquire = |lease: &str, mode: &str, wait_ms: i64| json!({"name": b64("reports"), "lease": lease, "mode": mode, "wait_ms": wait_ms, "metadata": b64("http")});
    let granted = post(&url, "/v1/locks/acquire", acquire(&lease, "READ", 0)).await;
    assert_eq!(granted["acquired"], json!(true), "{granted}");
    let lease_hex = format!("{:x}", lease.parse::<i64>().unwrap());
    assert_eq!(granted["key"], json!(b64(&format!("reports/read-{lease_hex}"))));
    assert_eq!(granted["holds"], json!(1));
    let token = granted["token"].as_str().unwrap().to_string();
    let refused = post(&url, "/v1/locks/acquire", acquire(&other, "WRITE", 0)).await;
    assert_eq!(refused.get("acquired"), None, "false is left out, as any default: {refused}");
    assert_eq!(refused["holders"][0]["token"], json!(token));
    assert_eq!(refused["holders"][0]["mode"], json!("READ"));

    let described = post(&url, "/v1/locks/describe", json!({"name": b64("reports")})).await;
    assert_eq!(described["holders"][0]["metadata"], json!(b64("http")));
    let listed = post(&url, "/v1/locks/list", json!({})).await;
    assert_eq!(listed["locks"][0]["name"], json!(b64("reports")));

    // Bad input gets the gRPC error as JSON, with etcd's status mapping.
    let answer =
        curl(&url, "POST", "/v1/locks/acquire", Some(&json!({"name": "", "lease": lease}).to_string()), None, None)
            .await;
    assert_eq!(answer.status, 400);
    let error: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        error,
        json!({"error": "raftlock: lock name is not provided", "code": 3, "message": "raftlock: lock name is not provided"})
    );

    // Validated while it holds: current, with its lease's TTL.
    let key = granted["key"].as_str().unwrap();
    let valid = post(&url, "/v1/locks/validate", json!({"key": key, "token": token})).await;
    assert_eq!((valid["current"].clone(), valid["current_token"].clone()), (json!(true), json!(token)), "{valid}");
    // Released with its token; then the writer gets it.
    let released = post(&url, "/v1/locks/release", json!({"key": key, "token": token})).await;
    assert_eq!(released["released"], json!(true));
    assert_eq!(post(&url, "/v1/locks/acquire", acquire(&other, "WRITE", 0)).await["acquired"], json!(true));
    let valid = post(&url, "/v1/locks/validate", json!({"key": key, "token": token})).await;
    assert_eq!(valid.get("current"), None, "no longer current: {valid}");

    // A multi-lock: two locks at once, one grant each; released together.
    let set = json!({"lease": lease, "wait_ms": 0, "locks": [{"name": b64("a")}, {"name": b64("b"), "mode": "WRITE"}]});
    let multi = post(&url, "/v1/locks/acquire", set).await;
    assert_eq!(multi["acquired"], json!(true), "{multi}");
    assert_eq!(multi["grants"][1]["name"], json!(b64("b")));
    assert_eq!(multi["grants"][0]["token"], multi["grants"][1]["token"]);
    let grants = multi["grants"].clone();
    let released = post(&url, "/v1/locks/release", json!({"grants": grants})).await;
    assert_eq!(released["released"], json!(true), "{released}");
    assert_eq!(released["results"].as_array().map(Vec::len), Some(2));

    // A lock's events, a line each: first the lock as it is (its holder's
    // event kind is HOLDING, proto3's default, so left out as etcd's PUT is).
    let body = json!({"name": b64("reports")}).to_string();
    let observed = curl(&url, "POST", "/v1/locks/observe", Some(&body), None, Some(Duration::from_secs(1))).await;
    let first: Value = serde_json::from_str(observed.body.lines().next().unwrap_or("{}")).unwrap();
    let holding = &first["result"]["events"][0];
    assert_eq!((holding.get("kind"), holding["owner"]["lease"].as_str()), (None, Some(other.as_str())), "{first}");

    // A watch stays open after its request body has ended, and reports a put
    // made later through another member.
    let watch_url = url.clone();
    let watching = tokio::spawn(async move {
        let body = json!({"create_request": {"key": b64("later")}}).to_string();
        curl(&watch_url, "POST", "/v3/watch", Some(&body), None, Some(Duration::from_secs(3))).await
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let put = post(&cluster.members[2].endpoint(), "/v3/kv/put", json!({"key": b64("later"), "value": b64("v")})).await;
    let answer = watching.await.unwrap();
    let lines: Vec<Value> = answer.body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "created, then the event: {}", answer.body);
    assert_eq!(lines[0]["result"]["created"], json!(true));
    let event = &lines[1]["result"]["events"][0]["kv"];
    assert_eq!((&event["key"], &event["value"]), (&json!(b64("later")), &json!(b64("v"))));
    assert_eq!(event["mod_revision"], put["header"]["revision"]);
}
