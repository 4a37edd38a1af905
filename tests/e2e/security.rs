//! Security against real processes: mTLS on the client and peer ports (with
//! etcd-client, etcdctl 3.5, python-etcd3 and raftlockctl), peers that are
//! refused (no certificate, another CA, another cluster, an ID that is not a
//! member), a member started with another token that cannot join, and the
//! start-up errors of TLS flags. Certificates are made in the test (rcgen).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::certs::{self, Certs};
use crate::common::{raftlockctl, text, Cluster, Etcdctl};
use raftlock::proto::raftlock::peer::peer_client::PeerClient;
use raftlock::proto::raftlock::peer::RaftPayload;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The default `--initial-cluster-token`.
const TOKEN: &str = "raftlock-cluster";

fn tls_cluster_dir() -> (tempfile::TempDir, Certs) {
    let dir = tempfile::tempdir().unwrap();
    let certs = certs::make(&dir.path().join("certs"));
    (dir, certs)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn mtls_clients_are_served_and_clients_without_a_good_certificate_are_refused() {
    let (dir, certs) = tls_cluster_dir();
    let cluster = Cluster::start_tls(dir, 3, &certs, &[]).await;
    let follower = cluster.follower().await;
    let leader = cluster.leader().await;

    // etcd-client with alice's certificate, writing through a follower (so
    // over the TLS peer port to the leader) and reading on the leader.
    let mut c = cluster.client(follower).await;
    c.put("tls/a", "1", None).await.unwrap();
    let got = cluster.client(leader).await.get("tls/a", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");

    // Refused at the handshake: no client certificate; a certificate from
    // another CA; plaintext to the https port.
    let endpoint = cluster.members[follower].endpoint();
    let pem = |p: &PathBuf| std::fs::read(p).unwrap();
    let ca_only = etcd_client::ConnectOptions::new()
        .with_tls(etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(pem(&certs.ca))))
        .with_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2));
    let stranger = certs.client_options(&certs.stranger).with_timeout(Duration::from_secs(2));
    for (what, options) in [("no client certificate", ca_only), ("a certificate from another CA", stranger)] {
        let refused = match etcd_client::Client::connect([endpoint.clone()], Some(options)).await {
            Err(_) => true,
            Ok(mut c) => c.get("tls/a", None).await.is_err(),
        };
        assert!(refused, "a client with {what} was served");
    }
    let plain = endpoint.replace("https://", "http://");
    let plain_refused = match etcd_client::Client::connect(
        [plain],
        Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2))),
    )
    .await
    {
        Err(_) => true,
        Ok(mut c) => c.get("tls/a", None).await.is_err(),
    };
    assert!(plain_refused, "plaintext was served on an https port");

    // etcdctl 3.5 with --cacert --cert --key; without --cert it is refused.
    let etcdctl = Etcdctl::v35(&endpoint);
    let tls_args = ["--cacert", path(&certs.ca), "--cert", path(&certs.alice.cert), "--key", path(&certs.alice.key)];
    let put: Vec<&str> = tls_args.iter().copied().chain(["put", "tls/b", "2"]).collect();
    assert_eq!(etcdctl.ok(&put).trim(), "OK");
    let get: Vec<&str> = tls_args.iter().copied().chain(["get", "tls/b", "--print-value-only"]).collect();
    assert_eq!(etcdctl.ok(&get).trim(), "2");
    let out = etcdctl.run(&["--cacert", path(&certs.ca), "--dial-timeout", "2s", "get", "tls/b"], None);
    assert!(!out.status.success(), "etcdctl without a client certificate was served: {}", text(&out));

    // raftlockctl with the same flags, and with its RAFTLOCK_* variables.
    let out = raftlockctl()
        .args(["--endpoints", &format!("127.0.0.1:{}", cluster.members[follower].client_port)])
        .args(tls_args)
        .args(["lock", "tls-job", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "raftlockctl lock over mTLS: {}", text(&out));
    let out = raftlockctl()
        .env("RAFTLOCK_ENDPOINTS", &endpoint)
        .env("RAFTLOCK_CACERT", &certs.ca)
        .env("RAFTLOCK_CERT", &certs.alice.cert)
        .env("RAFTLOCK_KEY", &certs.alice.key)
        .args(["member", "list"])
        .output()
        .unwrap();
    assert!(out.status.success() && text(&out).matches("https://").count() >= 6, "{}", text(&out));

    // python-etcd3 with ca_cert / cert_cert / cert_key.
    let python = std::env::var("RAFTLOCK_PYTHON_ETCD3")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/python-etcd3/bin/python"));
    let script = "import sys, etcd3\n\
                  c = etcd3.client(host='127.0.0.1', port=int(sys.argv[1]), ca_cert=sys.argv[2], \
                  cert_cert=sys.argv[3], cert_key=sys.argv[4])\n\
                  c.put('tls/py', 'snake')\n\
                  print(c.get('tls/py')[0].decode())\n";
    let out = Command::new(python)
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .args(["-c", script, &cluster.members[follower].client_port.to_string()])
        .args([path(&certs.ca), path(&certs.alice.cert), path(&certs.alice.key)])
        .output()
        .unwrap();
    assert!(out.status.success() && text(&out).trim_end().ends_with("snake"), "python-etcd3 over mTLS: {}", text(&out));
}

/// A gRPC channel to a peer port, with TLS as given (None: plaintext).
async fn peer_channel(url: &str, tls: Option<ClientTlsConfig>) -> Result<Channel, tonic::transport::Error> {
    let mut endpoint = Endpoint::from_shared(url.to_string())?.connect_timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    endpoint.connect().await
}

#[tokio::test]
async fn the_peer_port_under_mtls_refuses_connections_without_a_member_certificate() {
    let (dir, certs) = tls_cluster_dir();
    let cluster = Cluster::start_tls(dir, 3, &certs, &[]).await;
    let url = cluster.peer_url(cluster.follower().await);
    let pem = |p: &PathBuf| std::fs::read(p).unwrap();
    let ca = Certificate::from_pem(pem(&certs.ca));
    let no_cert = ClientTlsConfig::new().ca_certificate(ca.clone());
    let stranger = ClientTlsConfig::new()
        .ca_certificate(ca.clone())
        .identity(Identity::from_pem(pem(&certs.stranger.cert), pem(&certs.stranger.key)));
    let member = ClientTlsConfig::new()
        .ca_certificate(ca)
        .identity(Identity::from_pem(pem(&certs.member.cert), pem(&certs.member.key)));
    for (what, tls) in
        [("no certificate", Some(no_cert)), ("another CA's certificate", Some(stranger)), ("plaintext", None)]
    {
        let answer = match peer_channel(&url, tls).await {
            Err(_) => None,
            Ok(channel) => Some(PeerClient::new(channel).vote(payload(vec![1])).await),
        };
        // Only the peer service answers FailedPrecondition (its gate) or Ok.
        let reached = match &answer {
            None => false,
            Some(Ok(_)) => true,
            Some(Err(s)) => s.code() == tonic::Code::FailedPrecondition,
        };
        assert!(!reached, "a peer with {what} reached the peer service");
    }
    // With a member certificate the connection is made, and the gate answers
    // (this request has no identity, so it is refused by the gate, not TLS).
    let channel = peer_channel(&url, Some(member)).await.expect("a member certificate is accepted");
    let status = PeerClient::new(channel).vote(payload(vec![1])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
}

fn payload(data: Vec<u8>) -> tonic::Request<RaftPayload> {
    tonic::Request::new(RaftPayload { data })
}

/// A peer request with the given identity (hex IDs), as members stamp it.
fn from(identity: Option<(u64, u64)>, data: Vec<u8>) -> tonic::Request<RaftPayload> {
    let mut req = payload(data);
    if let Some((cluster, member)) = identity {
        req.metadata_mut().insert("raftlock-cluster-id", format!("{cluster:x}").parse().unwrap());
        req.metadata_mut().insert("raftlock-member-id", format!("{member:x}").parse().unwrap());
    }
    req
}

/// A forwarded batch as the peer protocol encodes it: format byte 1, then
/// bincode (fixed-width little-endian) of a `ForwardBatch` numbered 7 holding
/// one `Command::Put` (variant 0) of `key` = `value`.
/// A forwarded batch of one put, with its first tag, or without one (as
/// followers of earlier raftlocks send it).
fn forwarded_put(key: &str, value: &str, tag: Option<u64>) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend(7u64.to_le_bytes()); // the batch's ID
    out.extend(1u64.to_le_bytes()); // one command
    out.extend(0u32.to_le_bytes());
    for bytes in [key.as_bytes(), value.as_bytes()] {
        out.extend((bytes.len() as u64).to_le_bytes());
        out.extend(bytes);
    }
    out.extend(0i64.to_le_bytes()); // lease
    out.extend([0u8, 0, 0]); // prev_kv, ignore_value, ignore_lease
    if let Some(tag) = tag {
        out.extend(tag.to_le_bytes()); // the first command's tag
    }
    out
}

/// Open a forwarding stream with the given identity, send it `batch` and
/// close the stream's sending side; once the leader has run the batch, its
/// answer if it sent one (only for commands that failed), or the status that
/// refused the stream.
async fn forward_once(
    peer: &mut PeerClient<Channel>,
    identity: Option<(u64, u64)>,
    batch: Vec<u8>,
) -> Result<Option<RaftPayload>, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(RaftPayload { data: batch }).unwrap();
    drop(tx);
    let mut req = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    if let Some((cluster, member)) = identity {
        req.metadata_mut().insert("raftlock-cluster-id", format!("{cluster:x}").parse().unwrap());
        req.metadata_mut().insert("raftlock-member-id", format!("{member:x}").parse().unwrap());
    }
    let mut answers = peer.forward(req).await?.into_inner();
    answers.message().await
}

#[tokio::test]
async fn peers_from_another_cluster_or_with_an_id_that_is_not_a_member_are_refused() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = cluster.follower().await;
    let mut peer = PeerClient::new(peer_channel(&cluster.peer_url(leader), None).await.unwrap());
    let cluster_id = raftlock::ids::cluster_id(TOKEN);
    let member_id = raftlock::ids::member_id(&[cluster.peer_url(follower)], TOKEN);
    let other_cluster = raftlock::ids::cluster_id("another-token");
    let mut kv = cluster.client(leader).await;

    let refusals = [
        ("no identity", None, tonic::Code::FailedPrecondition),
        ("another cluster", Some((other_cluster, member_id)), tonic::Code::FailedPrecondition),
        ("an ID that is not a member", Some((cluster_id, 0x5eed)), tonic::Code::PermissionDenied),
    ];
    for (i, (what, identity, code)) in refusals.into_iter().enumerate() {
        let key = format!("rogue/{i}");
        let status = forward_once(&mut peer, identity, forwarded_put(&key, "x", Some(99))).await.unwrap_err();
        assert_eq!(status.code(), code, "a forward from {what}: {status:?}");
        let status = peer.vote(from(identity, vec![1, 0])).await.unwrap_err();
        assert_eq!(status.code(), code, "a vote from {what}: {status:?}");
        // Pause elections for an hour (ControlRequest::PauseElections, variant 0).
        let mut pause = vec![1u8];
        pause.extend(0u32.to_le_bytes());
        pause.extend(3_600_000u64.to_le_bytes());
        let status = peer.admin(from(identity, pause)).await.unwrap_err();
        assert_eq!(status.code(), code, "an admin request from {what}: {status:?}");
        assert!(kv.get(key.as_str(), None).await.unwrap().kvs().is_empty(), "a forward from {what} was applied");
    }
    // The same bytes from a member of this cluster are applied: the refusals
    // above were for who sent them, not for what they said.
    let member = Some((cluster_id, member_id));
    let answer = forward_once(&mut peer, member, forwarded_put("rogue/member", "y", Some(99))).await;
    assert!(matches!(answer, Ok(None)), "applied, so not answered: {answer:?}");
    assert_eq!(kv.get("rogue/member", None).await.unwrap().kvs()[0].value(), b"y");
    // Without tags, as a follower of an earlier raftlock sends it: applied,
    // and answered with its result.
    let answer = forward_once(&mut peer, member, forwarded_put("rogue/untagged", "z", None)).await;
    assert!(matches!(answer, Ok(Some(_))), "answered with its results: {answer:?}");
    assert_eq!(kv.get("rogue/untagged", None).await.unwrap().kvs()[0].value(), b"z");

    // Only what a follower's clients' writes become is forwarded: a bare
    // auth change (Command::Auth, variant 9: Disable, variant 1) — which a
    // follower always wraps in its caller's AsUser — ends the stream, and
    // nothing is applied.
    let mut disable = vec![1u8];
    disable.extend(8u64.to_le_bytes()); // the batch's ID
    disable.extend(1u64.to_le_bytes()); // one command
    disable.extend(9u32.to_le_bytes()); // Command::Auth
    disable.extend(1u32.to_le_bytes()); // AuthCommand::Disable
    disable.extend(500u64.to_le_bytes()); // the first tag
    let status = forward_once(&mut peer, member, disable).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("does not forward an auth change without its caller"), "{status:?}");

    // Each refused sender is logged once, however often it retries.
    for _ in 0..20 {
        let _ = peer.vote(from(Some((cluster_id, 0x5eed)), vec![1])).await;
    }
    let log = cluster.log_of(leader);
    let logged = log.lines().filter(|l| l.contains("refusing peer requests") && l.contains("5eed")).count();
    assert_eq!(logged, 1, "{log}");
}

#[tokio::test]
async fn a_member_started_with_another_token_cannot_join_or_disturb_the_cluster() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut kv = cluster.client(leader).await;
    kv.put("before", "1", None).await.unwrap();
    let term = kv.status().await.unwrap().raft_term();

    // An intruder that believes it bootstraps a cluster with our three
    // members (its own token: other IDs); it campaigns again and again.
    let i = cluster.new_member();
    let intruder_cluster = format!("{},{}={}", cluster.initial_cluster(), cluster.members[i].name, cluster.peer_url(i));
    let intruder = cluster.members[i].data_dir.clone();
    let mut child = Command::new(env!("CARGO_BIN_EXE_raftlock"))
        .args(["--name", &cluster.members[i].name, "--data-dir", path(&intruder)])
        .args(["--listen-client-urls", &cluster.members[i].endpoint()])
        .args(["--listen-peer-urls", &cluster.peer_url(i)])
        .args(["--initial-cluster", &intruder_cluster, "--initial-cluster-token", "intruder"])
        .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Nothing changed: same members, same term (no vote reached anyone),
    // writes go on, and the intruder has no leader.
    let members = kv.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    assert_eq!(kv.status().await.unwrap().raft_term(), term, "the intruder's campaigns moved the term");
    kv.put("after", "2", None).await.unwrap();
    let mut lone = etcd_client::Client::connect(
        [cluster.members[i].endpoint()],
        Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2))),
    )
    .await
    .unwrap();
    assert_eq!(lone.status().await.unwrap().leader(), 0, "the intruder found a leader");
    let logs = cluster.logs();
    assert!(logs.contains("cluster ID mismatch"), "the refusal was not logged:\n{logs}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(kv.get("before", None).await.unwrap().kvs()[0].value(), b"1");
}

#[test]
fn tls_flags_that_cannot_work_stop_start_up_with_the_flags_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_raftlock"))
            .args(["--data-dir", path(&dir.path().join("d"))])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        text(&out)
    };
    let port = crate::common::free_port();
    let https = format!("https://127.0.0.1:{port}");
    let err = run(&["--listen-client-urls", &https]);
    assert!(err.contains("--cert-file and --key-file, or --auto-tls"), "{err}");
    let peer = format!("https://127.0.0.1:{}", crate::common::free_port());
    let err = run(&["--listen-peer-urls", &peer]);
    assert!(err.contains("--peer-cert-file and --peer-key-file, or --peer-auto-tls"), "{err}");
    let err = run(&["--listen-client-urls", &https, "--auto-tls", "--tls-min-version", "TLS1.1"]);
    assert!(err.contains("TLS1.1 is not supported"), "{err}");
    let err = run(&["--listen-client-urls", &https, "--auto-tls", "--cipher-suites", "TLS_RSA_WITH_RC4_128_SHA"]);
    assert!(err.contains("--cipher-suites"), "{err}");
}

#[test]
fn auto_tls_serves_https_with_a_certificate_made_under_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("auto.raftlock");
    let (client, peer) = (crate::common::free_port(), crate::common::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_raftlock"))
        .args(["--data-dir", path(&data), "--auto-tls", "--peer-auto-tls"])
        .args(["--listen-client-urls", &format!("https://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("https://127.0.0.1:{peer}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let etcdctl = Etcdctl::v35(&format!("https://127.0.0.1:{client}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out =
            etcdctl.run(&["--insecure-transport=false", "--insecure-skip-tls-verify", "put", "auto", "tls"], None);
        if out.status.success() || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for port in ["client", "peer"] {
        let key = data.join("fixtures").join(port).join("key.pem");
        assert!(key.exists(), "{} missing", key.display());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
