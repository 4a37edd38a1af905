//! python-etcd3's locks (a different recipe from etcd's Mutex: one key
//! `/locks/<name>` created by a txn, released by a compare-and-delete, waited
//! for with a watch) against a 3-member raftlock cluster, through a follower.
//! `scripts/test.sh` installs python-etcd3 (`scripts/install-python-etcd3.sh`).

use std::path::PathBuf;
use std::process::Command;

use crate::common::Cluster;

#[tokio::test]
async fn python_etcd3_locks_work_against_raftlock() {
    let python = std::env::var("RAFTLOCK_PYTHON_ETCD3")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/python-etcd3/bin/python"));
    assert!(python.exists(), "{} is missing: run the tests with scripts/test.sh, which installs it", python.display());
    let cluster = Cluster::start(3).await;
    let follower = cluster.follower().await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/etcd3_locks.py");
    let out = Command::new(python)
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .arg(script)
        .arg("127.0.0.1")
        .arg(cluster.members[follower].client_port.to_string())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.trim_end().ends_with("ok"), "python-etcd3 locks failed:\n{text}");
}
