//! The alert and recording rules (`deploy/prometheus/`) and the Grafana
//! dashboard (`deploy/grafana/`) against a real Prometheus (Debian's
//! `prometheus`, which scripts/test.sh installs) scraping a real 3-member
//! cluster every second: every member is `up`; every recording rule makes
//! series; every selector in every rule names series that exist; every
//! dashboard expression parses and returns data; and "members down" goes
//! pending when a member is killed and resolves when it returns.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{free_port, Cluster};

/// Prometheus, killed when the test ends.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.0 GET (so that Prometheus answers with a plain body, not
/// chunks): the status and the body; (0, "") when nothing answers.
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else { return (0, String::new()) };
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    async fn start(dir: &Path, targets: &[String]) -> Prometheus {
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/raftlock.rules.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{}'", t.trim_start_matches("http://"))).collect();
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: raftlock\n    static_configs: [{{targets: [{}]}}]\n",
            rules.display(),
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("running prometheus: scripts/test.sh installs it (Debian's prometheus)");
        let prometheus = Prometheus { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&prometheus.addr, "/-/ready").await.0 != 200 {
            assert!(Instant::now() < deadline, "Prometheus never became ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        prometheus
    }

    /// An instant query's result vector; panics when it does not parse.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let (status, body) = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(expr))).await;
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {e}: {body}"));
        assert_eq!((status, answer["status"].as_str()), (200, Some("success")), "{expr}: {body}");
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The result of `expr` once it is not empty (within `secs`).
    async fn data(&self, expr: &str, secs: u64) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let result = self.query(expr).await;
            if !result.is_empty() {
                return result;
            }
            assert!(Instant::now() < deadline, "no data for {expr}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until `expr` has `n` series (within `secs`).
    async fn series(&self, expr: &str, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let result = self.query(expr).await;
            if result.len() == n {
                return;
            }
            assert!(Instant::now() < deadline, "{expr}: {result:?}, not {n} series");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The state of alert `name` (None: inactive).
    async fn alert(&self, name: &str) -> Option<String> {
        let (_, body) = http_get(&self.addr, "/api/v1/alerts").await;
        let answer: Value = serde_json::from_str(&body).unwrap();
        let alerts = answer["data"]["alerts"].as_array().cloned().unwrap_or_default();
        let alert = alerts.iter().find(|a| a["labels"]["alertname"].as_str() == Some(name));
        alert.map(|a| a["state"].as_str().unwrap_or_default().to_string())
    }
}

/// The `expr:` and `record:` values of the rules file (a YAML parser's view).
fn rules() -> (Vec<String>, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/raftlock.rules.yml");
    let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (mut exprs, mut records) = (Vec::new(), Vec::new());
    for group in doc["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            exprs.push(rule["expr"].as_str().unwrap().to_string());
            if let Some(record) = rule["record"].as_str() {
                records.push(record.to_string());
            }
        }
    }
    (exprs, records)
}

/// The series selectors of `expr` (`metric{labels}` or a bare metric):
/// raftlock's metric prefixes, its recording rules' and `up`.
fn selectors(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    while i < bytes.len() {
        if bytes[i] == b'"' {
            // A string: skip it.
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && word(bytes[i]) {
                i += 1;
            }
            let name = &expr[start..i];
            let series =
                ["etcd_", "raftlock_", "raftlock:", "grpc_server_", "process_"].iter().any(|p| name.starts_with(p))
                    || name == "up";
            // (Label names, function names and keywords have none of the
            // series' prefixes; a selector's braces are read with it.)
            if series && !expr[i..].trim_start().starts_with('(') {
                let mut selector = name.to_string();
                if expr[i..].starts_with('{') {
                    let end = i + expr[i..].find('}').unwrap() + 1;
                    selector.push_str(&expr[i..end]);
                    i = end;
                }
                found.insert(selector);
            }
            continue;
        }
        i += 1;
    }
    found
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_cluster_and_evaluates_every_rule_and_panel() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let prometheus = Prometheus::start(dir.path(), &cluster.endpoints()).await;

    // Traffic every panel and rule reads: puts, a v3lock lock and a native
    // one, leases granted, revoked and expired, and failed requests.
    let mut c = cluster.client(0).await;
    for i in 0..20 {
        c.put(format!("prom/{i}"), "v", None).await.unwrap();
    }
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let key = c.lock("prom/lock", Some(etcd_client::LockOptions::new().with_lease(lease))).await.unwrap();
    c.unlock(key.key().to_vec()).await.unwrap();
    c.lease_revoke(lease).await.unwrap();
    let short = c.lease_grant(1, None).await.unwrap().id();
    c.put("prom/expires", "v", Some(etcd_client::PutOptions::new().with_lease(short))).await.unwrap();
    let native = raftlock::client::Client::connect([cluster.endpoints()[1].clone()]).await.unwrap();
    let session = native.session(10).await.unwrap();
    let raftlock::client::Acquisition::Held(guard) =
        session.lock("prom/native", raftlock::client::LockOptions::default()).await.unwrap()
    else {
        panic!("a free lock was busy")
    };
    guard.release().await.unwrap();
    // FailedPrecondition ("authentication is not enabled") and NotFound.
    let options = etcd_client::ConnectOptions::new().with_user("nobody", "secret");
    assert!(etcd_client::Client::connect([cluster.endpoints()[2].clone()], Some(options)).await.is_err());
    assert!(c.lease_revoke(424_242).await.is_err());

    // Every member is up.
    prometheus.series("up{job=\"raftlock\"} == 1", 3, 30).await;

    // Every recording rule produces series.
    let (exprs, records) = rules();
    for record in &records {
        prometheus.data(record, 30).await;
    }
    // Every rule parses, and every series it selects exists: the selector
    // itself has data, or (for label values only rare events make, as
    // grpc_code="DeadlineExceeded") its metric has series carrying each
    // label it matches on.
    for expr in &exprs {
        prometheus.query(expr).await;
        for selector in selectors(expr) {
            if !prometheus.query(&format!("count({selector})")).await.is_empty() {
                continue;
            }
            let (metric, matchers) = selector.split_once('{').unwrap_or((&selector, "}"));
            prometheus.data(&format!("count({metric})"), 20).await;
            for matcher in matchers.trim_end_matches('}').split(',').filter(|m| !m.trim().is_empty()) {
                let label = matcher.trim().split(|c| c == '=' || c == '!').next().unwrap();
                prometheus.data(&format!("count({metric}{{{label}!=\"\"}})"), 20).await;
            }
        }
    }

    // Every dashboard expression parses and returns data, with the
    // dashboard's variables as Grafana would fill them in.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/raftlock.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap().replace("$job", "raftlock").replace("$__rate_interval", "1m");
            prometheus.data(&expr, 20).await;
            panels += 1;
        }
    }
    assert!(panels >= 20, "{panels} dashboard expressions");

    // A member killed: "members down" goes pending (its `for` is 10 m), and
    // resolves when the member is back.
    let mut cluster = cluster;
    cluster.kill(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(prometheus.alert("RaftlockMembersDown").await.as_deref(), Some("pending" | "firing")) {
        assert!(Instant::now() < deadline, "RaftlockMembersDown never went pending");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cluster.restart(2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.alert("RaftlockMembersDown").await.is_some() {
        assert!(Instant::now() < deadline, "RaftlockMembersDown did not resolve");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    prometheus.series("up{job=\"raftlock\"} == 1", 3, 30).await;
}

#[test]
fn selectors_are_the_series_an_expression_reads() {
    let found = selectors(
        "sum by (job, instance) (rate(grpc_server_handled_total{job=~\".*raftlock.*\", grpc_code!=\"OK\"}[5m])) \
         / raftlock:grpc_server_handled:rate5m > 1 and on (job) up == 0",
    );
    let expected = [
        "grpc_server_handled_total{job=~\".*raftlock.*\", grpc_code!=\"OK\"}",
        "raftlock:grpc_server_handled:rate5m",
        "up",
    ];
    assert_eq!(found, expected.iter().map(|s| s.to_string()).collect());
}
