//! Versions: every face of a member tells its release and the etcd API
//! level it implements (`raftlock --version`, `raftlockctl version`,
//! `/version`, `Maintenance.Status` as etcdctl shows it, the build-info
//! metrics), and a member refuses a data directory of a newer format,
//! naming both releases, before it reads a byte of it.

use std::process::Command;

use crate::common::cluster::built_binary;
use crate::common::{free_port, http_get, raftlockctl, Cluster, Etcdctl};
use raftlock::version::{ETCD_API, RAFTLOCK};

#[tokio::test]
async fn every_face_of_a_member_tells_its_release_and_the_etcd_api_level() {
    let cluster = Cluster::start(1).await;
    let endpoint = cluster.members[0].endpoint();

    let (status, body) = http_get(&endpoint, "/version").await;
    assert_eq!(status, 200);
    let version: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(version, serde_json::json!({"etcdserver": ETCD_API, "etcdcluster": ETCD_API, "raftlock": RAFTLOCK}));

    let metrics = http_get(&endpoint, "/metrics").await.1;
    assert!(metrics.contains(&format!("etcd_server_version{{server_version=\"{ETCD_API}\"}} 1")), "{metrics}");
    let build_info = metrics.lines().find(|l| l.starts_with("raftlock_build_info{")).expect("a build-info gauge");
    assert!(build_info.contains(&format!("version=\"{RAFTLOCK}\"")) && build_info.ends_with(" 1"), "{build_info}");

    // etcd's clients read Maintenance.Status.version and gate features on it.
    let out = Etcdctl::v35(&endpoint).run(&["endpoint", "status", "-w", "json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status[0]["Status"]["version"], ETCD_API);

    let server = Command::new(built_binary("raftlock")).arg("--version").output().unwrap();
    let printed = String::from_utf8_lossy(&server.stdout);
    assert!(printed.starts_with(&format!("raftlock {RAFTLOCK}\n")) && printed.contains(ETCD_API), "{printed}");
    let ctl = raftlockctl().arg("version").output().unwrap();
    assert!(ctl.status.success());
    assert_eq!(String::from_utf8_lossy(&ctl.stdout), format!("raftlockctl version: {RAFTLOCK}\nAPI version: 3.5\n"));
}

#[tokio::test]
async fn a_member_refuses_a_data_directory_of_a_newer_format_naming_both_releases() {
    // A member's data, then its format file as a later release left it.
    let mut cluster = Cluster::start(1).await;
    let mut c = cluster.client(0).await;
    c.put("kept", "yes", None).await.unwrap();
    let data_dir = cluster.members[0].data_dir.clone();
    cluster.kill(0);
    let format = data_dir.join("format.json");
    let ours: serde_json::Value = serde_json::from_slice(&std::fs::read(&format).unwrap()).unwrap();
    assert_eq!(ours, serde_json::json!({"format": 1, "written_by": RAFTLOCK}));
    let newer = br#"{"format":2,"written_by":"7.3.0"}"#;
    std::fs::write(&format, newer).unwrap();

    let (client, peer) = (free_port(), free_port());
    let out = Command::new(built_binary("raftlock"))
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "it started on a newer format");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("data format 2") && said.contains("7.3.0") && said.contains(RAFTLOCK), "{said}");
    // Nothing of it was touched.
    assert_eq!(std::fs::read(&format).unwrap(), newer);
}
