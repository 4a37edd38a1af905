//! etcd's auth on a real cluster, through the clients users run: etcdctl's
//! `user`, `role` and `auth` commands (3.4 and 3.5) unchanged, etcd-client
//! with a user, raftlockctl with `--user`, python-etcd3 with `user=`; the
//! auth store surviving restarts; JWT tokens (`--auth-token jwt,...`),
//! accepted by every member and going stale when users or roles change; a
//! client certificate's CommonName as the user with `--client-cert-auth`;
//! no user tying keys to another's lease. The exact answers of every service
//! are `tests/auth_conformance.rs`'s.

use crate::common::certs::{self, Certs};
use crate::common::{raftlockctl, text, Etcdctl};
use etcd_client::{Client, ConnectOptions};

/// `pre` then `args`: a command line with common flags first.
fn with<'a>(pre: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
    [pre, args].concat()
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// etcdctl 3.4 and 3.5 administer auth with their own commands: users,
/// roles, permissions, enabling (etcdctl grants `root` the root role itself,
/// relying on etcd's exact error), and then act as the users they made.
#[tokio::test]
async fn etcdctl_user_role_and_auth_commands_work_unchanged() {
    let cluster = crate::common::Cluster::start_with(3, &["--bcrypt-cost", "4"]).await;
    let endpoints = cluster.endpoints().join(",");
    for (i, bin) in crate::common::etcdctls().into_iter().enumerate() {
        let etcdctl = Etcdctl { bin, endpoints: endpoints.clone() };
        let root = ["--user", "root:rootpw"];
        let app = format!("app{i}/");
        etcdctl.ok(&["user", "add", "root:rootpw"]);
        let enabled = etcdctl.ok(&["auth", "enable"]);
        assert!(enabled.contains("Authentication Enabled"), "{enabled}");
        let out = etcdctl.run(&["put", "k", "v"], None);
        assert!(!out.status.success() && text(&out).contains("user name is empty"), "{}", text(&out));
        etcdctl.ok(&with(&root, &["role", "add", "app"]));
        etcdctl.ok(&with(&root, &["role", "grant-permission", "app", "readwrite", &app, "--prefix=true"]));
        etcdctl.ok(&with(&root, &["user", "add", "alice:alicepw"]));
        etcdctl.ok(&with(&root, &["user", "grant-role", "alice", "app"]));
        let role = etcdctl.ok(&with(&root, &["role", "get", "app"]));
        assert!(role.contains(&format!("[{app}, app{})", i + 1)) || role.contains(&app), "{role}");
        let users = etcdctl.ok(&with(&root, &["user", "list"]));
        assert_eq!(users.split_whitespace().collect::<Vec<_>>(), ["alice", "root"]);

        let alice = ["--user", "alice:alicepw"];
        let key = format!("{app}x");
        assert_eq!(etcdctl.ok(&with(&alice, &["put", &key, "1"])).trim(), "OK");
        assert_eq!(etcdctl.ok(&with(&alice, &["get", &key, "--print-value-only"])).trim(), "1");
        let out = etcdctl.run(&with(&alice, &["put", "elsewhere", "1"]), None);
        assert!(text(&out).contains("etcdserver: permission denied"), "{}", text(&out));
        let out = etcdctl.run(&with(&alice, &["user", "list"]), None);
        assert!(text(&out).contains("etcdserver: permission denied"), "{}", text(&out));
        let out = etcdctl.run(&["--user", "alice:wrong", "get", &key], None);
        assert!(text(&out).contains("authentication failed, invalid user ID or password"), "{}", text(&out));
        // etcdctl's own lock recipe under the user's prefix.
        let held = etcdctl.ok(&with(&alice, &["lock", &format!("{app}lock"), "echo", "held"]));
        assert!(held.contains("held"), "{held}");

        etcdctl.ok(&with(&root, &["user", "revoke-role", "alice", "app"]));
        let out = etcdctl.run(&with(&alice, &["get", &key]), None);
        assert!(text(&out).contains("etcdserver: permission denied"), "{}", text(&out));
        etcdctl.ok(&with(&root, &["auth", "disable"]));
        assert_eq!(etcdctl.ok(&["get", &key, "--print-value-only"]).trim(), "1");
        for args in [["user", "delete", "alice"], ["user", "delete", "root"], ["role", "delete", "app"]] {
            etcdctl.ok(&args);
        }
        etcdctl.ok(&["role", "delete", "root"]);
    }
}

/// The auth store is replicated state: it survives every member's restart
/// (checkpoint and journal), and etcd-client and raftlockctl log in with it.
#[tokio::test]
async fn users_and_permissions_survive_restarts_and_serve_every_client() {
    let mut cluster = crate::common::Cluster::start_with(3, &["--bcrypt-cost", "4"]).await;
    let etcdctl = Etcdctl::v35(&cluster.endpoints().join(","));
    etcdctl.ok(&["user", "add", "root:rootpw"]);
    etcdctl.ok(&["user", "add", "ops:opspw"]);
    etcdctl.ok(&["role", "add", "ops"]);
    etcdctl.ok(&["role", "grant-permission", "ops", "readwrite", "jobs/", "--prefix=true"]);
    etcdctl.ok(&["user", "grant-role", "ops", "ops"]);
    etcdctl.ok(&["auth", "enable"]);
    for i in 0..3 {
        cluster.kill(i);
    }
    for i in 0..3 {
        cluster.restart(i).expect("restart");
    }
    cluster.log_in_as("root", "rootpw");
    cluster.wait_ready().await;
    // With auth on and plaintext peers, each member says (within a second
    // of seeing auth on) what its open peer port allows.
    for i in 0..3 {
        let warned = || {
            let log = cluster.log_of(i);
            log.contains("peers are not authenticated") && log.contains("root included")
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !warned() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(warned(), "member {i}: {}", cluster.log_of(i));
    }

    for i in 0..3 {
        let options = ConnectOptions::new().with_user("ops", "opspw");
        let mut c = Client::connect([cluster.members[i].endpoint()], Some(options)).await.expect("log in as ops");
        c.put(format!("jobs/{i}"), "ran", None).await.expect("ops writes under jobs/");
        let denied = c.put("payroll", "x", None).await.unwrap_err();
        assert_eq!(
            crate::common::grpc_error(denied),
            (tonic::Code::PermissionDenied, "etcdserver: permission denied".into())
        );
    }

    // raftlockctl logs in with --user; the native lock API needs READ and
    // WRITE on the lock name's prefix.
    let endpoint = cluster.members[0].endpoint();
    let run = |args: &[&str]| raftlockctl().arg("--endpoints").arg(&endpoint).args(args).output().unwrap();
    let out = run(&["--user", "ops:opspw", "lock", "jobs/nightly", "--", "echo", "ran nightly"]);
    assert!(out.status.success() && text(&out).contains("ran nightly"), "{}", text(&out));
    let out = run(&["--user", "ops:opspw", "lock", "payroll", "--", "echo", "must not run"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("permission denied") && !text(&out).contains("must not run"), "{}", text(&out));
    let out = run(&["lock", "jobs/nightly", "--", "echo", "must not run"]);
    assert!(text(&out).contains("user name is empty"), "{}", text(&out));
    let out = run(&["--user", "ops:nope", "get", "jobs/0"]);
    assert!(text(&out).contains("authentication failed"), "{}", text(&out));
    let out = run(&["--user", "ops", "--password", "opspw", "get", "jobs/0"]);
    assert!(out.status.success() && text(&out).contains("ran"), "{}", text(&out));
}

/// Write an EC P-256 key pair for JWT signing; returns the flag.
fn jwt_flag(dir: &std::path::Path) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let (private, public) = (dir.join("jwt.key"), dir.join("jwt.pub"));
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    format!("jwt,pub-key={},priv-key={},sign-method=ES256,ttl=10m", path(&public), path(&private))
}

/// JWT tokens: signed by the member that authenticated, accepted by every
/// member with no log entry, refused when forged, and stale ("revision of
/// auth store is old") once users or roles change, after which clients
/// authenticate again.
#[tokio::test]
async fn jwt_tokens_are_accepted_everywhere_and_go_stale_when_auth_changes() {
    let keys = tempfile::tempdir().unwrap();
    let flag = jwt_flag(keys.path());
    let cluster = crate::common::Cluster::start_with(3, &["--auth-token", &flag, "--bcrypt-cost", "4"]).await;
    let etcdctl = Etcdctl::v35(&cluster.endpoints().join(","));
    etcdctl.ok(&["user", "add", "root:rootpw"]);
    etcdctl.ok(&["user", "add", "alice:alicepw"]);
    etcdctl.ok(&["role", "add", "app"]);
    etcdctl.ok(&["role", "grant-permission", "app", "readwrite", "app/", "--prefix=true"]);
    etcdctl.ok(&["user", "grant-role", "alice", "app"]);
    etcdctl.ok(&["auth", "enable"]);

    let channel = |i: usize| {
        let url = cluster.members[i].endpoint();
        async move { tonic::transport::Channel::from_shared(url).unwrap().connect().await.unwrap() }
    };
    use raftlock::proto::etcdserverpb::{self as pb, auth_client::AuthClient, kv_client::KvClient};
    let mut auth = AuthClient::new(channel(0).await);
    let login = pb::AuthenticateRequest { name: "alice".into(), password: "alicepw".into() };
    let token = auth.authenticate(login.clone()).await.unwrap().into_inner().token;
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let with = |token: &str, key: &str| {
        let mut req =
            tonic::Request::new(pb::PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() });
        req.metadata_mut().insert("token", token.parse().unwrap());
        req
    };
    for i in 0..3 {
        KvClient::new(channel(i).await).put(with(&token, "app/x")).await.expect("every member accepts the token");
    }
    let mut forged = token.clone();
    forged.replace_range(forged.len() - 4.., "AAAA");
    let refused = KvClient::new(channel(1).await).put(with(&forged, "app/x")).await.unwrap_err();
    assert_eq!((refused.code(), refused.message()), (tonic::Code::Unauthenticated, "etcdserver: invalid auth token"));

    etcdctl.ok(&["--user", "root:rootpw", "user", "add", "bob:bobpw"]);
    let stale = KvClient::new(channel(2).await).put(with(&token, "app/x")).await.unwrap_err();
    assert_eq!(
        (stale.code(), stale.message()),
        (tonic::Code::InvalidArgument, "etcdserver: revision of auth store is old")
    );
    let fresh = auth.authenticate(login).await.unwrap().into_inner().token;
    KvClient::new(channel(2).await).put(with(&fresh, "app/x")).await.expect("a new token works");
}

/// With --client-cert-auth, a verified client certificate's CommonName is
/// the user: no token needed, and the user's permissions apply.
#[tokio::test]
async fn a_client_certificate_names_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let certs: Certs = certs::make(&dir.path().join("certs"));
    let cluster = crate::common::Cluster::start_tls(dir, 3, &certs, &["--bcrypt-cost", "4"]).await;
    let etcdctl = Etcdctl::v35(&cluster.endpoints().join(","));
    let tls = ["--cacert", path(&certs.ca), "--cert", path(&certs.alice.cert), "--key", path(&certs.alice.key)];
    etcdctl.ok(&with(&tls, &["user", "add", "root:rootpw"]));
    etcdctl.ok(&with(&tls, &["user", "add", "alice", "--no-password"]));
    etcdctl.ok(&with(&tls, &["role", "add", "app"]));
    etcdctl.ok(&with(&tls, &["role", "grant-permission", "app", "readwrite", "app/", "--prefix=true"]));
    etcdctl.ok(&with(&tls, &["user", "grant-role", "alice", "app"]));
    etcdctl.ok(&with(&tls, &["auth", "enable"]));

    // No --user: the certificate says alice.
    assert_eq!(etcdctl.ok(&with(&tls, &["put", "app/by-cert", "1"])).trim(), "OK");
    let out = etcdctl.run(&with(&tls, &["put", "other", "1"]), None);
    assert!(text(&out).contains("etcdserver: permission denied"), "{}", text(&out));
    let out = etcdctl.run(&with(&tls, &["user", "list"]), None);
    assert!(text(&out).contains("etcdserver: permission denied"), "{}", text(&out));
    // A token takes precedence over the certificate.
    let users = etcdctl.ok(&with(&tls, &["--user", "root:rootpw", "user", "list"]));
    assert_eq!(users.split_whitespace().collect::<Vec<_>>(), ["alice", "root"]);
}

/// Whoever ties a key to a lease must be able to write the lease's other
/// keys — through a txn, a lock or the native API as through a put — or one
/// user could tie a key to another's lease and stop its keepalives.
#[tokio::test]
async fn a_user_cannot_tie_keys_to_a_lease_whose_keys_it_may_not_write() {
    use etcd_client::{LockOptions, PutOptions, Txn, TxnOp};
    let cluster = crate::common::Cluster::start_with(3, &["--bcrypt-cost", "4"]).await;
    let etcdctl = Etcdctl::v35(&cluster.endpoints().join(","));
    etcdctl.ok(&["user", "add", "root:rootpw"]);
    for (user, prefix) in [("jobs", "jobs"), ("pay", "payroll")] {
        etcdctl.ok(&["user", "add", &format!("{user}:pw")]);
        etcdctl.ok(&["role", "add", user]);
        etcdctl.ok(&["role", "grant-permission", user, "readwrite", prefix, "--prefix=true"]);
        etcdctl.ok(&["user", "grant-role", user, user]);
    }
    etcdctl.ok(&["auth", "enable"]);
    let endpoint = cluster.members[0].endpoint();
    let login = |user: &str| Client::connect([endpoint.clone()], Some(ConnectOptions::new().with_user(user, "pw")));
    let mut pay = login("pay").await.unwrap();
    let lease = pay.lease_grant(30, None).await.unwrap().id();
    pay.put("payroll/x", "1", Some(PutOptions::new().with_lease(lease))).await.unwrap();

    let mut jobs = login("jobs").await.unwrap();
    let put = TxnOp::put("jobs/x", "v", Some(PutOptions::new().with_lease(lease)));
    let refused = jobs.txn(Txn::new().and_then([put])).await.unwrap_err();
    assert_eq!(
        crate::common::grpc_error(refused),
        (tonic::Code::PermissionDenied, "etcdserver: permission denied".into())
    );
    let refused = jobs.lock("jobs/lock", Some(LockOptions::new().with_lease(lease))).await.unwrap_err();
    assert_eq!(crate::common::grpc_error(refused), (tonic::Code::Unknown, "etcdserver: permission denied".into()));
    let mut native = raftlock::client::Client::connect([endpoint.clone()]).await.unwrap();
    native.authenticate("jobs", "pw").await.unwrap();
    let acquire =
        raftlock::proto::raftlock::v1::AcquireRequest { name: b"jobs/native".to_vec(), lease, ..Default::default() };
    let refused = native.locks().acquire(acquire).await.unwrap_err();
    assert_eq!((refused.code(), refused.message()), (tonic::Code::PermissionDenied, "etcdserver: permission denied"));

    // Nothing was tied to the lease: its holder keeps it alive as before.
    let (mut keeper, mut answers) = pay.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    assert!(answers.message().await.unwrap().unwrap().ttl() > 0);
    let on_lease = pay.lease_time_to_live(lease, Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys())).await;
    assert_eq!(on_lease.unwrap().keys(), [b"payroll/x".to_vec()]);
}

/// python-etcd3 logs in with `user=`/`password=` and gets etcd's answers.
/// It sends its token as gRPC call credentials, which grpc-python sends
/// over TLS only (so against etcd too): the cluster runs with mTLS.
#[tokio::test]
async fn python_etcd3_logs_in_as_a_user() {
    let python = std::env::var("RAFTLOCK_PYTHON_ETCD3").map(std::path::PathBuf::from).unwrap_or_else(|_| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/python-etcd3/bin/python")
    });
    assert!(python.exists(), "{} is missing: run the tests with scripts/test.sh, which installs it", python.display());
    let dir = tempfile::tempdir().unwrap();
    let certs: Certs = certs::make(&dir.path().join("certs"));
    let cluster = crate::common::Cluster::start_tls(dir, 3, &certs, &["--bcrypt-cost", "4"]).await;
    let follower = cluster.follower().await;
    let etcdctl = Etcdctl::v35(&cluster.endpoints().join(","));
    let tls = ["--cacert", path(&certs.ca), "--cert", path(&certs.alice.cert), "--key", path(&certs.alice.key)];
    etcdctl.ok(&with(&tls, &["user", "add", "root:rootpw"]));
    etcdctl.ok(&with(&tls, &["user", "add", "ops:opspw"]));
    etcdctl.ok(&with(&tls, &["role", "add", "ops"]));
    etcdctl.ok(&with(&tls, &["role", "grant-permission", "ops", "readwrite", "jobs/", "--prefix=true"]));
    etcdctl.ok(&with(&tls, &["user", "grant-role", "ops", "ops"]));
    etcdctl.ok(&with(&tls, &["auth", "enable"]));
    let script = r#"
import sys, etcd3
host, port, ca, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def client(**kw):
    return etcd3.client(host=host, port=port, ca_cert=ca, cert_cert=cert, cert_key=key, **kw)
def message(e):
    return e.details() if hasattr(e, "details") else str(e)
c = client(user="ops", password="opspw")
c.put("jobs/py", "yes")
assert c.get("jobs/py")[0] == b"yes"
try:
    c.put("payroll", "x")
    sys.exit("payroll was written")
except Exception as e:
    assert message(e) == "etcdserver: permission denied", repr(e)
try:
    client(user="ops", password="wrong").get("jobs/py")
    sys.exit("a wrong password was let in")
except Exception as e:
    assert "authentication failed" in message(e), repr(e)
print("ok")
"#;
    let out = std::process::Command::new(python)
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .args(["-c", script, "127.0.0.1", &cluster.members[follower].client_port.to_string()])
        .args([path(&certs.ca), path(&certs.alice.cert), path(&certs.alice.key)])
        .output()
        .unwrap();
    assert!(out.status.success() && text(&out).trim_end().ends_with("ok"), "python-etcd3 with a user:\n{}", text(&out));
}
