//! The Rust client's runner of the steps every raftlock client runs
//! (`clients/conformance/locks.json`; the Python client runs the same file
//! in `clients/python/tests/test_conformance.py`), against a real 3-member
//! cluster, one case after another, each under a prefix of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::Cluster;
use crate::native_locks::native;
use raftlock::client::{Acquisition, Client, Guard, Leadership, LockOptions, Session};
use raftlock::proto::raftlock::v1::lock_event::Kind;
use raftlock::proto::raftlock::v1::{DescribeRequest, ReleaseRequest};

/// A named grant: a lock's, or an election's leadership.
enum Grant {
    /// A lock's grant, followed from the moment it is granted (as a holder
    /// that works while it waits on `lost()` does).
    Lock {
        guard: Arc<Guard>,
        permits: u32,
        lost: Option<tokio::task::JoinHandle<Kind>>,
    },
    Leader(Leadership),
    Pending(tokio::task::JoinHandle<Result<Grant, String>>),
    /// A leadership given up: what it was.
    Resigned {
        key: Vec<u8>,
        token: i64,
    },
}

impl Grant {
    fn key_and_token(&self) -> (Vec<u8>, i64) {
        match self {
            Grant::Lock { guard, .. } => (guard.key().to_vec(), guard.token()),
            Grant::Leader(l) => (l.key.key.clone(), l.key.rev),
            Grant::Resigned { key, token } => (key.clone(), *token),
            Grant::Pending(_) => panic!("a background step was not awaited"),
        }
    }
}

fn text<'a>(step: &'a Value, field: &str) -> &'a str {
    step[field].as_str().unwrap_or_else(|| panic!("{field} missing in {step}"))
}

async fn acquire(session: Arc<Session>, name: Vec<u8>, step: Value) -> Result<Grant, String> {
    let wait_ms = step["wait_ms"].as_i64().unwrap_or(-1);
    let permits = step["permits"].as_u64().unwrap_or(1) as u32;
    let options = LockOptions {
        wait: (wait_ms >= 0).then(|| Duration::from_millis(wait_ms as u64)),
        permits,
        read: step["mode"].as_str() == Some("read"),
        reentrant: step["reentrant"].as_bool().unwrap_or(false),
        ..Default::default()
    };
    match session.lock(&name, options).await.map_err(|e| e.to_string())? {
        Acquisition::Held(guard) => {
            let guard = Arc::new(guard);
            let following = guard.clone();
            let lost = tokio::spawn(async move { following.lost().await.expect("the grant's events") });
            Ok(Grant::Lock { guard, permits, lost: Some(lost) })
        }
        Acquisition::Busy(holders) => Err(format!("busy: {:?}", holders.iter().map(|h| h.token).collect::<Vec<_>>())),
    }
}

async fn run_case(client: &Client, case: &Value) {
    let prefix = format!("conformance-{:x}/", rand_suffix());
    let name = |n: &str| format!("{prefix}{n}").into_bytes();
    let mut sessions: HashMap<String, Arc<Session>> = HashMap::new();
    let mut grants: HashMap<String, Grant> = HashMap::new();
    for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
        let at = format!("{}: step {i} {step}", case["name"]);
        let token_of = |grants: &HashMap<String, Grant>, g: &Value| grants[g.as_str().unwrap()].key_and_token().1;
        match text(step, "op") {
            "session" => {
                let session = client.session(step["ttl"].as_i64().unwrap()).await.unwrap();
                sessions.insert(text(step, "as").into(), Arc::new(session));
            }
            op @ ("acquire" | "campaign") => {
                let session = sessions[text(step, "session")].clone();
                let work = if op == "acquire" {
                    tokio::spawn(acquire(session, name(text(step, "lock")), step.clone()))
                } else {
                    let (election, value) = (name(text(step, "election")), text(step, "value").as_bytes().to_vec());
                    tokio::spawn(async move {
                        session.campaign(&election, &value).await.map(Grant::Leader).map_err(|e| e.to_string())
                    })
                };
                if step["background"].as_bool() == Some(true) {
                    grants.insert(text(step, "as").into(), Grant::Pending(work));
                    continue;
                }
                let outcome = work.await.unwrap();
                if step["expect"].as_str() == Some("busy") {
                    let want: Vec<i64> =
                        step["holders"].as_array().unwrap().iter().map(|g| token_of(&grants, g)).collect();
                    assert_eq!(outcome.err(), Some(format!("busy: {want:?}")), "{at}");
                    continue;
                }
                grants.insert(text(step, "as").into(), outcome.unwrap_or_else(|e| panic!("{at}: {e}")));
                check_grant(&grants, text(step, "as"), step, &at).await;
            }
            "await" => {
                let g = text(step, "grant");
                let Some(Grant::Pending(work)) = grants.remove(g) else {
                    panic!("{at}: nothing runs in the background")
                };
                let grant = tokio::time::timeout(Duration::from_secs(15), work).await.expect(&at).unwrap();
                grants.insert(g.into(), grant.unwrap_or_else(|e| panic!("{at}: {e}")));
                check_grant(&grants, g, step, &at).await;
            }
            "release" => {
                let (key, token) = grants[text(step, "grant")].key_and_token();
                let r = client.locks().release(ReleaseRequest { key, token, ..Default::default() }).await.unwrap();
                let r = r.into_inner();
                assert_eq!(Some(r.released), step["expect"].as_bool(), "{at}");
                if let Some(holds) = step["holds"].as_u64() {
                    assert_eq!(r.holds as u64, holds, "{at}");
                }
            }
            "validate" => {
                let grant = &grants[text(step, "grant")];
                let permits = if let Grant::Lock { permits, .. } = grant { *permits } else { 1 };
                let (key, token) = grant.key_and_token();
                let current = client.validate(&key, token, permits).await.unwrap().current;
                assert_eq!(Some(current), step["expect"].as_bool(), "{at}");
            }
            "describe" => {
                let want: Vec<i64> = step["holders"].as_array().unwrap().iter().map(|g| token_of(&grants, g)).collect();
                let want = (want, step["waiters"].as_u64().unwrap() as usize);
                let req = DescribeRequest {
                    name: name(text(step, "lock")),
                    permits: step["permits"].as_u64().unwrap_or(1) as u32,
                    ..Default::default()
                };
                // Background steps queue in their own time: look until it matches, 5 s at most.
                let deadline = Instant::now() + Duration::from_secs(5);
                let seen = loop {
                    let d = client.locks().describe(req.clone()).await.unwrap().into_inner();
                    let seen = (d.holders.iter().map(|h| h.token).collect::<Vec<_>>(), d.waiters.len());
                    if seen == want || Instant::now() > deadline {
                        break seen;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                assert_eq!(seen, want, "{at}");
            }
            "revoke" => {
                let lease = sessions[text(step, "session")].lease();
                client
                    .lease()
                    .lease_revoke(raftlock::proto::etcdserverpb::LeaseRevokeRequest { id: lease })
                    .await
                    .unwrap();
            }
            "lost" => {
                let Some(Grant::Lock { lost, .. }) = grants.get_mut(text(step, "grant")) else {
                    panic!("{at}: not a lock")
                };
                let within = Duration::from_millis(step["within_ms"].as_u64().unwrap());
                let lost = lost.take().expect("told once");
                let kind = tokio::time::timeout(within, lost).await.expect(&at).unwrap();
                let want = match text(step, "cause") {
                    "lease_ended" => Kind::LeaseEnded,
                    "released" => Kind::Released,
                    other => panic!("{at}: unknown cause {other}"),
                };
                assert_eq!(kind, want, "{at}");
            }
            "leader" => {
                let value = match client.leader(&name(text(step, "election"))).await {
                    Ok(r) => r.kv.map(|kv| String::from_utf8(kv.value).unwrap()),
                    Err(e) if e.to_string().contains("election: no leader") => None,
                    Err(e) => panic!("{at}: {e}"),
                };
                assert_eq!(value.as_deref(), step["expect"].as_str(), "{at}");
            }
            "resign" => {
                let Some(Grant::Leader(l)) = grants.remove(text(step, "grant")) else {
                    panic!("{at}: not a leadership")
                };
                let resigned = Grant::Resigned { key: l.key.key.clone(), token: l.key.rev };
                l.resign().await.unwrap();
                grants.insert(text(step, "grant").into(), resigned);
            }
            other => panic!("{at}: unknown op {other}"),
        }
    }
    for session in sessions.into_values() {
        let _ = client
            .lease()
            .lease_revoke(raftlock::proto::etcdserverpb::LeaseRevokeRequest { id: session.lease() })
            .await;
    }
}

async fn check_grant(grants: &HashMap<String, Grant>, name: &str, step: &Value, at: &str) {
    let (key, token) = grants[name].key_and_token();
    if let Some(other) = step["token_above"].as_str() {
        assert!(token > grants[other].key_and_token().1, "{at}");
    }
    if let Some(other) = step["same_as"].as_str() {
        assert_eq!((key, token), grants[other].key_and_token(), "{at}");
    }
    if let (Some(holds), Grant::Lock { guard, .. }) = (step["holds"].as_u64(), &grants[name]) {
        assert_eq!(guard.holds() as u64, holds, "{at}");
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[tokio::test]
async fn the_rust_client_runs_the_conformance_steps() {
    let cluster = Cluster::start(3).await;
    let client = native(&cluster, 0).await;
    let steps: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/conformance/locks.json")).unwrap(),
    )
    .unwrap();
    for case in steps["cases"].as_array().unwrap() {
        run_case(&client, case).await;
    }
}
