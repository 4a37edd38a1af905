//! What the conformance tests share: loading scenario and golden files, a
//! fresh etcd 3.5.1 to record goldens against, and the comparison of a
//! recorded golden with raftlock's responses.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

pub fn load(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fresh single-member etcd 3.5.1 to record goldens against; killed when
/// dropped.
pub struct RecordingEtcd {
    pub url: String,
    child: Child,
    _data: tempfile::TempDir,
}

impl RecordingEtcd {
    /// Start one with `extra` flags and wait until it serves.
    pub async fn start(extra: &[&str]) -> RecordingEtcd {
        let data = tempfile::tempdir().unwrap();
        let (client_port, peer_port) = (super::free_port(), super::free_port());
        let url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let child = std::process::Command::new(super::etcd_dir().join("etcd"))
            .args(["--name", "rec", "--data-dir", data.path().to_str().unwrap()])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("rec={peer_url}"), "--log-level", "error"])
            .args(extra)
            .spawn()
            .expect("start etcd");
        // Owned at once, so that a panic below still stops it.
        let etcd = RecordingEtcd { url, child, _data: data };
        loop {
            if let Ok(mut c) = etcd_client::Client::connect([etcd.url.clone()], None).await {
                if c.get("probe", None).await.is_ok() {
                    return etcd;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RecordingEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every op of `actual` whose response differs from `golden`'s, described;
/// panics if the scenarios or ops themselves changed since recording.
pub fn mismatches(suite: &str, golden: &Value, actual: &Value) -> Vec<String> {
    let (want, got) = (golden["scenarios"].as_array().unwrap(), actual["scenarios"].as_array().unwrap());
    assert_eq!(want.len(), got.len(), "{suite}: scenarios changed since the goldens were recorded");
    let mut out = Vec::new();
    for (w, g) in want.iter().zip(got) {
        let (wr, gr) = (w["results"].as_array().unwrap(), g["results"].as_array().unwrap());
        assert_eq!(wr.len(), gr.len(), "{suite}/{}: ops changed since the goldens were recorded", w["name"]);
        for (i, (wo, go)) in wr.iter().zip(gr).enumerate() {
            assert_eq!(wo["op"], go["op"], "{suite}/{}#{i}: op changed; re-record the goldens", w["name"]);
            if wo["response"] != go["response"] {
                out.push(format!(
                    "{suite}/{}#{i} {}\n  etcd:     {}\n  raftlock: {}",
                    w["name"], wo["op"], wo["response"], go["response"]
                ));
            }
        }
    }
    out
}
