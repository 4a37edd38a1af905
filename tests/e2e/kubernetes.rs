//! The Kubernetes manifests (`deploy/kubernetes/`), run as Kubernetes would
//! run them, without Kubernetes: the YAML is parsed by a real parser, and
//! each pod of the StatefulSet is started with exactly its container's
//! command, arguments and environment (the image's `ENV`, `HOSTNAME`, the
//! downward API's fields, `$(VAR)` expanded as the kubelet expands it), in a
//! network namespace of its own with its own address (a macvlan on a veth
//! pair: no bridge for the host's firewall to filter), as the user the pod's
//! security context names, with a read-only root filesystem when the
//! container asks for one, its volumes bind-mounted where the manifest
//! mounts them, and the kubelet's `/etc/resolv.conf` (search path, ndots 5)
//! pointing at dnsmasq, which serves the records cluster DNS would: the
//! pods' names, the headless Service's SRV records (named for its ports),
//! and the client Service's name.
//!
//! Checked: the records appear one pod at a time and no member bootstraps
//! before all of them are there; `/livez` and `/readyz` on the probes' named
//! port answer as the kubelet needs (not ready without a leader, ready with
//! one); `kubectl exec raftlock-0 -- /raftlockctl member list` (the pod's
//! environment) lists three members by name; a member killed and restarted
//! (its volume kept) is ready again; the backup CronJob's container saves
//! snapshots through the client Service that restore. Both the plain and
//! the mTLS manifest. The plain one also grows to four members and back as
//! docs/kubernetes.md says, and runs that page's restore procedure (its
//! `--overrides` JSON read from the page) from the last backup: the
//! members come back ready with the snapshot's keys and nothing later.
//!
//! Caveats: needs root (namespaces, mounts, port 53), as CI runs; creates
//! the manifests' mount points (`/data`, `/backup`, `/etc/raftlock/tls`) on
//! this machine's root filesystem when missing (empty directories; what is
//! mounted on them is seen only inside the test's pods).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_yaml::Value;

const NAMESPACE: &str = "default";
const CLUSTER_DOMAIN: &str = "cluster.local";

/// The documents of a manifest file, by kind and name.
fn manifest(file: &str) -> BTreeMap<(String, String), Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc = Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
        let (kind, name) = (doc["kind"].as_str().unwrap(), doc["metadata"]["name"].as_str().unwrap());
        docs.insert((kind.to_string(), name.to_string()), doc.clone());
    }
    docs
}

fn doc<'a>(docs: &'a BTreeMap<(String, String), Value>, kind: &str, name: &str) -> &'a Value {
    docs.get(&(kind.to_string(), name.to_string())).unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// The image's environment: `ENV` of the image scripts/docker-image.sh builds.
fn image_env() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/Dockerfile.local");
    let dockerfile = std::fs::read_to_string(path).unwrap();
    let mut env = Vec::new();
    let mut lines = dockerfile.lines().skip_while(|l| !l.starts_with("ENV "));
    while let Some(line) = lines.next() {
        let line = line.trim_start_matches("ENV ").trim();
        for word in line.trim_end_matches('\\').split_whitespace() {
            let (k, v) = word.split_once('=').unwrap();
            env.push((k.to_string(), v.to_string()));
        }
        if !line.ends_with('\\') {
            break;
        }
    }
    assert!(!env.is_empty(), "the image's ENV");
    env
}

/// `$(VAR)` replaced by the value of a variable defined before, as the
/// kubelet does (`$$` is a literal `$`; an unknown reference stays).
fn expand(value: &str, defined: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = rest.strip_prefix("$(").and_then(|r| r.split_once(')')) {
            match defined.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = after;
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A container's environment in pod `pod`: the image's, then HOSTNAME, then
/// the container's own in order (fieldRef and `$(VAR)` resolved).
fn container_env(container: &Value, pod: &str) -> Vec<(String, String)> {
    let mut env = image_env();
    env.push(("HOSTNAME".into(), pod.into()));
    for var in container["env"].as_sequence().into_iter().flatten() {
        let name = text(&var["name"]);
        let value = match &var["valueFrom"]["fieldRef"]["fieldPath"] {
            Value::String(field) if field == "metadata.name" => pod.to_string(),
            Value::String(field) if field == "metadata.namespace" => NAMESPACE.to_string(),
            Value::Null => expand(&text(&var["value"]), &env),
            other => panic!("{name}: a field the test does not know: {other:?}"),
        };
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    env
}

fn env_value(env: &[(String, String)], name: &str) -> String {
    env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {name}"))
}

fn sh(script: &str) {
    let status = Command::new("sh").args(["-c", script]).status().unwrap();
    assert!(status.success(), "{script}");
}

/// A network for the test's pods: a veth pair whose one end carries a
/// macvlan for the host (`10.77.N.1`, where dnsmasq listens) and one per pod
/// (in the pod's network namespace), all in bridge mode.
struct Network {
    prefix: String,
    subnet: String,
    pods: Vec<String>,
    processes: Vec<Child>,
}

impl Network {
    fn new(n: u8) -> Network {
        let prefix = format!("rlk8s{n}");
        let net =
            Network { prefix: prefix.clone(), subnet: format!("10.77.{n}"), pods: Vec::new(), processes: Vec::new() };
        net.clean();
        sh(&format!(
            "ip link add {p}-a type veth peer name {p}-b && ip link set {p}-a up && ip link set {p}-b up && \
             ip link add link {p}-a name {p}-h type macvlan mode bridge && \
             ip addr add {s}.1/24 dev {p}-h && ip link set {p}-h up",
            p = prefix,
            s = net.subnet
        ));
        net
    }

    fn host_ip(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// A pod's network namespace at `ip`, with the kubelet's resolv.conf and hosts.
    fn pod(&mut self, name: &str, ip: &str, fqdn: &str) -> String {
        let netns = format!("{}-{name}", self.prefix);
        let etc = PathBuf::from("/etc/netns").join(&netns);
        std::fs::create_dir_all(&etc).unwrap();
        let search = format!("{NAMESPACE}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}");
        let resolv = format!("search {search}\nnameserver {}\noptions ndots:5\n", self.host_ip());
        std::fs::write(etc.join("resolv.conf"), resolv).unwrap();
        std::fs::write(etc.join("hosts"), format!("127.0.0.1 localhost\n{ip} {fqdn} {name}\n")).unwrap();
        let link = format!("{}-{}", self.prefix, self.pods.len());
        sh(&format!(
            "ip netns add {netns} && ip link add link {p}-a name {link} type macvlan mode bridge && \
             ip link set {link} netns {netns} && ip -n {netns} addr add {ip}/24 dev {link} && \
             ip -n {netns} link set {link} up && ip -n {netns} link set lo up",
            p = self.prefix
        ));
        self.pods.push(netns.clone());
        netns
    }

    fn clean(&self) {
        let p = &self.prefix;
        let _ = Command::new("sh")
            .args(["-c", &format!("for n in $(ip netns list | grep -o '^{p}-[^ ]*'); do ip netns del $n; rm -rf /etc/netns/$n; done; ip link del {p}-a 2>/dev/null; true")])
            .status();
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for child in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.clean();
    }
}

/// A container of a pod spec, run in network namespace `netns` as Kubernetes
/// would run it; `volumes` maps each volume name to the host directory it is.
fn run_container(
    spec: &Value,
    container: &Value,
    pod: &str,
    netns: &str,
    volumes: &BTreeMap<String, PathBuf>,
    log: &Path,
) -> Child {
    let env = container_env(container, pod);
    let mut argv: Vec<String> = container["command"].as_sequence().unwrap().iter().map(text).collect();
    argv.extend(container["args"].as_sequence().into_iter().flatten().map(text));
    let mut argv: Vec<String> = argv.iter().map(|a| expand(a, &env)).collect();
    argv[0] = match argv[0].as_str() {
        "/raftlock" => env!("CARGO_BIN_EXE_raftlock").to_string(),
        "/raftlockctl" => env!("CARGO_BIN_EXE_raftlockctl").to_string(),
        other => panic!("the image has no {other}"),
    };
    let security = &spec["securityContext"];
    let (user, group) = (text(&security["runAsUser"]), text(&security["runAsGroup"]));
    assert_eq!(security["runAsNonRoot"], Value::Bool(true));
    assert_ne!(user, "0");
    let mut script = String::from("set -e\n");
    for mount in container["volumeMounts"].as_sequence().into_iter().flatten() {
        let (name, at) = (text(&mount["name"]), text(&mount["mountPath"]));
        let source = volumes.get(&name).unwrap_or_else(|| panic!("volume {name}"));
        script.push_str(&format!("mkdir -p '{at}' && mount --bind '{}' '{at}'\n", source.display()));
    }
    if container["securityContext"]["readOnlyRootFilesystem"] == Value::Bool(true) {
        script.push_str("mount -o remount,bind,ro /\n");
    }
    script.push_str(&format!(
        "exec setpriv --reuid={user} --regid={group} --clear-groups --no-new-privs env -i \"$@\"\n"
    ));
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    Command::new("ip")
        .args(["netns", "exec", netns, "unshare", "--mount", "--", "sh", "-c", &script, "container"])
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// A volume as the kubelet leaves it for fsGroup `group`: owned by it.
fn volume(dir: &Path, name: &str, group: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).unwrap();
    sh(&format!("chown -R {group}:{group} '{}' && chmod 2770 '{}'", path.display(), path.display()));
    path
}

/// An HTTP GET's status, or None when nothing answers within a second.
fn probe(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "waited {secs} s for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The container port named `name`.
fn named_port(container: &Value, name: &str) -> u16 {
    let ports = container["ports"].as_sequence().unwrap();
    let port = ports.iter().find(|p| p["name"].as_str() == Some(name)).unwrap_or_else(|| panic!("no port {name}"));
    port["containerPort"].as_u64().unwrap() as u16
}

/// dnsmasq answering for the cluster: the pods' A records and the headless
/// Service's SRV records for the first `published` pods, and the client
/// Service's name for those of them in `serving` (a ClusterIP Service
/// sends to ready pods only: here its name has their addresses).
fn cluster_dns(
    net: &Network,
    dir: &Path,
    headless: &Value,
    pods: &[(String, String)],
    published: usize,
    serving: std::ops::Range<usize>,
) -> Child {
    let service = text(&headless["metadata"]["name"]);
    let zone = format!("{service}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}");
    let mut args = vec![
        "--keep-in-foreground".to_string(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        format!("--listen-address={}", net.host_ip()),
        "--bind-interfaces".into(),
        "--port=53".into(),
        format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
        format!("--log-facility={}", dir.join("dnsmasq.log").display()),
    ];
    for (_, ip) in &pods[serving] {
        args.push(format!("--host-record=raftlock-client.{NAMESPACE}.svc.{CLUSTER_DOMAIN},{ip}"));
    }
    for (pod, ip) in &pods[..published] {
        args.push(format!("--host-record={pod}.{zone},{ip}"));
        for port in headless["spec"]["ports"].as_sequence().unwrap() {
            let (name, number) = (text(&port["name"]), text(&port["port"]));
            args.push(format!("--srv-host=_{name}._tcp.{zone},{pod}.{zone},{number}"));
        }
    }
    let child = Command::new("dnsmasq").args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// Both manifests' shared checks, then the StatefulSet run for real.
fn run_statefulset(file: &str, n: u8, tls: bool) {
    assert_eq!(unsafe { libc::geteuid() }, 0, "namespaces, mounts and port 53 need root (CI runs as root)");
    let docs = manifest(file);
    let set = doc(&docs, "StatefulSet", "raftlock");
    let headless = doc(&docs, "Service", "raftlock");
    let client_service = doc(&docs, "Service", "raftlock-client");
    let pdb = doc(&docs, "PodDisruptionBudget", "raftlock");
    assert_eq!(headless["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], Value::Bool(true));
    assert_eq!(text(&pdb["spec"]["maxUnavailable"]), "1");
    assert_eq!(set["spec"]["podManagementPolicy"].as_str(), Some("Parallel"));
    assert_eq!(text(&set["spec"]["serviceName"]), "raftlock");
    let spec = &set["spec"]["template"]["spec"];
    assert_eq!(spec["enableServiceLinks"], Value::Bool(false));
    let container = &spec["containers"][0];
    let replicas = set["spec"]["replicas"].as_u64().unwrap() as usize;
    let env0 = container_env(container, "raftlock-0");
    assert_eq!(env_value(&env0, "RAFTLOCK_INITIAL_CLUSTER_SIZE"), replicas.to_string(), "replicas and the size agree");
    // Every Service port names a container port, and the headless Service's
    // port names are the SRV services discovery reads.
    for service in [headless, client_service] {
        for port in service["spec"]["ports"].as_sequence().unwrap() {
            named_port(container, port["targetPort"].as_str().unwrap());
        }
    }
    let srv: Vec<String> = headless["spec"]["ports"].as_sequence().unwrap().iter().map(|p| text(&p["name"])).collect();
    let expected = if tls { ["etcd-server-ssl", "etcd-client-ssl"] } else { ["etcd-server", "etcd-client"] };
    assert_eq!(srv, expected);

    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_path_buf();
    let mut net = Network::new(n);
    let zone = format!("raftlock.{NAMESPACE}.svc.{CLUSTER_DOMAIN}");
    let pods: Vec<(String, String)> =
        (0..replicas).map(|i| (format!("raftlock-{i}"), format!("{}.{}", net.subnet, 10 + i))).collect();
    let group = text(&spec["securityContext"]["fsGroup"]);
    let mut volumes: Vec<BTreeMap<String, PathBuf>> = Vec::new();
    let certs = dir.join("certs");
    if tls {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/make-certs.sh");
        let out = Command::new("bash").arg(script).args([NAMESPACE, certs.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    for (pod, ip) in &pods {
        net.pod(pod, ip, &format!("{pod}.{zone}"));
        let mut v = BTreeMap::new();
        v.insert("data".to_string(), volume(&dir, &format!("{pod}-data"), &group));
        if tls {
            // The Secret's keys as files, mode 0440, group fsGroup.
            let secret = volume(&dir, &format!("{pod}-tls"), &group);
            for file in ["ca.crt", "tls.crt", "tls.key"] {
                std::fs::copy(certs.join(file), secret.join(file)).unwrap();
            }
            sh(&format!("chown -R root:{group} '{0}' && chmod 0440 '{0}'/*", secret.display()));
            v.insert("tls".to_string(), secret);
        }
        volumes.push(v);
    }
    let metrics = named_port(container, "metrics");
    let probe_path = |probe: &str| text(&container[probe]["httpGet"]["path"]);
    assert_eq!(text(&container["readinessProbe"]["httpGet"]["port"]), "metrics");
    let (live, ready) = (probe_path("livenessProbe"), probe_path("readinessProbe"));
    assert_eq!(probe_path("startupProbe"), live);
    let at = |i: usize| format!("{}:{metrics}", pods[i].1);
    let log = |i: usize| dir.join(format!("raftlock-{i}.log"));
    // Where each member's process is in net.processes.
    let mut slot = vec![usize::MAX; replicas];
    let start = |net: &mut Network, slot: &mut Vec<usize>, i: usize| {
        let child = run_container(spec, container, &pods[i].0, &net.pods[i], &volumes[i], &log(i));
        slot[i] = net.processes.len();
        net.processes.push(child);
    };

    // DNS names two of the three pods (the third has no address yet):
    // raftlock-0 waits for it before bootstrapping.
    let mut dns = cluster_dns(&net, &dir, headless, &pods, replicas - 1, 0..replicas - 1);
    start(&mut net, &mut slot, 0);
    wait_for("raftlock-0 to wait for the third record", 20, || {
        std::fs::read_to_string(log(0)).unwrap_or_default().contains("2 of 3 members in DNS")
    });
    assert_eq!(probe(&at(0), &live), None, "no member before the whole cluster is in DNS");
    dns.kill().unwrap();
    dns.wait().unwrap();
    let dns_slot = net.processes.len();
    net.processes.push(cluster_dns(&net, &dir, headless, &pods, replicas, 0..replicas));
    // Alive, not ready: no leader without a second member.
    wait_for("raftlock-0's /livez", 30, || probe(&at(0), &live) == Some(200));
    assert_eq!(probe(&at(0), &ready), Some(503), "ready without a leader");
    for i in 1..replicas {
        start(&mut net, &mut slot, i);
    }
    for i in 0..replicas {
        wait_for(&format!("raftlock-{i} ready"), 60, || probe(&at(i), &ready) == Some(200));
    }

    // `kubectl exec raftlock-0 -- /raftlockctl member list`: the pod's
    // environment (its discovery domain, and with TLS its certificates).
    let (netns0, volumes0) = (net.pods[0].clone(), volumes[0].clone());
    let exec = |args: &[&str]| {
        let mut ctl = container.clone();
        ctl["command"] = serde_yaml::to_value(["/raftlockctl"]).unwrap();
        ctl["args"] = serde_yaml::to_value(args).unwrap();
        let out = dir.join("exec.out");
        let _ = std::fs::remove_file(&out);
        let mut child = run_container(spec, &ctl, &pods[0].0, &netns0, &volumes0, &out);
        assert!(child.wait().unwrap().success(), "{}", std::fs::read_to_string(&out).unwrap());
        std::fs::read_to_string(&out).unwrap()
    };
    let scheme = if tls { "https" } else { "http" };
    let wait_members = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let listed = exec(&["-w", "json", "member", "list"]);
            let names = (0..replicas).all(|i| listed.contains(&format!("\"raftlock-{i}\"")));
            if names {
                for (pod, _) in &pods {
                    assert!(listed.contains(&format!("{scheme}://{pod}.{zone}:2380")), "{listed}");
                }
                return;
            }
            assert!(Instant::now() < deadline, "members not named by their pods: {listed}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait_members();
    assert!(exec(&["put", "k8s/a", "1"]).contains("OK"));

    // A member killed and restarted with its volume: ready again, its data kept.
    let killed = slot[1];
    net.processes[killed].kill().unwrap();
    net.processes[killed].wait().unwrap();
    assert_eq!(probe(&at(1), &live), None);
    // Two of three keep the cluster ready (after an election, if the
    // killed member led: well within the readiness probe's 3 failures).
    for i in [0, 2] {
        wait_for(&format!("raftlock-{i} ready with raftlock-1 down"), 15, || probe(&at(i), &ready) == Some(200));
    }
    start(&mut net, &mut slot, 1);
    wait_for("raftlock-1 ready after its restart", 60, || probe(&at(1), &ready) == Some(200));
    assert!(exec(&["get", "k8s/a"]).contains("k8s/a"));

    if tls {
        return;
    }

    // Growing by one, as docs/kubernetes.md says: `kubectl set env ...
    // RAFTLOCK_INITIAL_CLUSTER_STATE=existing`, `member add`, a fourth pod
    // (and its DNS records); then shrinking back: `member remove`, after
    // which the removed member stops by itself.
    let added = exec(&["member", "add", "raftlock-3", &format!("--peer-urls=http://raftlock-3.{zone}:2380")]);
    assert!(added.contains("Member ") && added.contains("added to cluster"), "{added}");
    let mut grown = container.clone();
    for var in grown["env"].as_sequence_mut().unwrap() {
        if var["name"].as_str() == Some("RAFTLOCK_INITIAL_CLUSTER_STATE") {
            var["value"] = Value::String("existing".into());
        }
    }
    let mut pods = pods.clone();
    pods.push(("raftlock-3".to_string(), format!("{}.13", net.subnet)));
    net.pod("raftlock-3", &pods[3].1, &format!("raftlock-3.{zone}"));
    net.processes[dns_slot].kill().unwrap();
    net.processes[dns_slot].wait().unwrap();
    let dns_slot = net.processes.len();
    net.processes.push(cluster_dns(&net, &dir, headless, &pods, replicas + 1, 0..replicas));
    let mut v3 = BTreeMap::new();
    v3.insert("data".to_string(), volume(&dir, "raftlock-3-data", &group));
    let fourth = net.processes.len();
    let log3 = dir.join("raftlock-3.log");
    net.processes.push(run_container(spec, &grown, "raftlock-3", &net.pods[3], &v3, &log3));
    let at3 = format!("{}:{metrics}", pods[3].1);
    wait_for("raftlock-3 ready after joining", 60, || probe(&at3, &ready) == Some(200));
    let listed: serde_json::Value = serde_json::from_str(&exec(&["-w", "json", "member", "list"])).unwrap();
    let members = listed["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{listed}");
    let id3 = members.iter().find(|m| m["name"] == "raftlock-3").unwrap_or_else(|| panic!("{listed}"))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(exec(&["member", "remove", &id3]).contains("removed from cluster"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while net.processes[fourth].try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the removed member did not stop");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(exec(&["member", "list"]).lines().count() == 3);
    // `kubectl scale --replicas=3` deletes the fourth pod, and its records.
    net.processes[dns_slot].kill().unwrap();
    net.processes[dns_slot].wait().unwrap();
    net.processes.push(cluster_dns(&net, &dir, headless, &pods, replicas, 0..replicas));

    let (saved, files) = backup(&docs, &mut net, &dir, &group);
    assert!(exec(&["put", "k8s/after-backup", "1"]).contains("OK"));

    // docs/kubernetes.md's restore, from the last snapshot: the members
    // stopped (`scale --replicas=0`), each pod's restore container as the
    // docs run it, then the members started on the restored directory
    // (`set env RAFTLOCK_DATA_DIR=...`, `scale --replicas=3`).
    for i in 0..replicas {
        net.processes[slot[i]].kill().unwrap();
        net.processes[slot[i]].wait().unwrap();
    }
    let file = files.iter().max().unwrap();
    let (data_dir, restores) = documented_restore(file.file_name().unwrap().to_str().unwrap(), replicas);
    for (i, (restore_spec, restore)) in restores.iter().enumerate() {
        let mut v = volumes[i].clone();
        v.insert("backup".to_string(), saved.clone());
        let out = dir.join(format!("restore-{i}.log"));
        let mut child = run_container(restore_spec, restore, &pods[i].0, &net.pods[i], &v, &out);
        assert!(child.wait().unwrap().success(), "{}", std::fs::read_to_string(&out).unwrap());
    }
    let mut restored = container.clone();
    for var in restored["env"].as_sequence_mut().unwrap() {
        if var["name"].as_str() == Some("RAFTLOCK_DATA_DIR") {
            var["value"] = Value::String(data_dir.clone());
        }
    }
    for i in 0..replicas {
        let child = run_container(spec, &restored, &pods[i].0, &net.pods[i], &volumes[i], &log(i));
        slot[i] = net.processes.len();
        net.processes.push(child);
    }
    for i in 0..replicas {
        let deadline = Instant::now() + Duration::from_secs(60);
        while probe(&at(i), &ready) != Some(200) {
            let logs: Vec<String> =
                (0..replicas).map(|j| std::fs::read_to_string(log(j)).unwrap_or_default()).collect();
            assert!(
                Instant::now() < deadline,
                "restored raftlock-{i} not ready in 60 s; logs:\n{}",
                logs.join("\n---\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    wait_members();
    assert!(exec(&["get", "k8s/a"]).contains("k8s/a"));
    assert_eq!(exec(&["get", "k8s/after-backup", "--count-only"]).trim(), "0");
}

/// docs/kubernetes.md's restore procedure as its shell runs it for snapshot
/// `file`: the data directory it restores into, and each member's restore
/// pod (its spec and its one container) from the `--overrides` JSON, with
/// the block's variables expanded (`NS` as this test's namespace).
fn documented_restore(file: &str, replicas: usize) -> (String, Vec<(Value, Value)>) {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/kubernetes.md")).unwrap();
    let section = docs.split("## Restoring from a backup").nth(1).expect("a restore section");
    let block = section.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    let expand = |text: &str, vars: &BTreeMap<String, String>| {
        let mut out = text.to_string();
        // Longest names first, so `$NS` does not eat the start of `$NSX`.
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        for name in names {
            out = out.replace(&format!("${name}"), &vars[name]);
        }
        out
    };
    let mut vars = BTreeMap::new();
    for line in block.lines().take_while(|l| !l.starts_with("kubectl")) {
        for assignment in line.split("; ") {
            let (name, value) = assignment.split_once('=').unwrap();
            let value = expand(value, &vars);
            vars.insert(name.to_string(), value);
        }
    }
    vars.insert("NS".into(), NAMESPACE.into());
    vars.insert("FILE".into(), file.into());
    // The PEERS lines again, with this test's namespace.
    let mut peers = String::new();
    for line in block.lines().filter(|l| l.starts_with("PEERS=")) {
        vars.insert("PEERS".into(), peers.clone());
        peers = expand(line.trim_start_matches("PEERS="), &vars);
    }
    vars.insert("PEERS".into(), peers);
    assert!(block.contains("set env statefulset/raftlock RAFTLOCK_DATA_DIR=$DIR"), "{block}");
    let overrides = block.split("--overrides=\"").nth(1).unwrap().split("\"\ndone").next().unwrap();
    let pods = (0..replicas)
        .map(|i| {
            let mut vars = vars.clone();
            vars.insert("i".into(), i.to_string());
            let json: serde_json::Value = serde_json::from_str(&expand(&overrides.replace("\\\"", "\""), &vars))
                .unwrap_or_else(|e| panic!("the docs' --overrides: {e}"));
            let spec = serde_yaml::to_value(&json["spec"]).unwrap();
            let container = spec["containers"][0].clone();
            (spec, container)
        })
        .collect();
    (vars["DIR"].clone(), pods)
}

/// The backup CronJob's container, twice (as two scheduled runs), in a pod
/// of its own: a snapshot per run through the client Service, each restorable.
/// Returns the backup volume and the snapshots in it.
fn backup(
    docs: &BTreeMap<(String, String), Value>,
    net: &mut Network,
    dir: &Path,
    group: &str,
) -> (PathBuf, Vec<PathBuf>) {
    let backup_docs = manifest("backup.yaml");
    let job = doc(&backup_docs, "CronJob", "raftlock-backup");
    doc(&backup_docs, "PersistentVolumeClaim", "raftlock-backup");
    assert!(docs.len() >= 4);
    let spec = &job["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let ip = format!("{}.30", net.subnet);
    let netns = net.pod("backup", &ip, "backup");
    let mut volumes = BTreeMap::new();
    let saved = volume(dir, "backup", group);
    volumes.insert("backup".to_string(), saved.clone());
    for run in 0..2 {
        let log = dir.join(format!("backup-{run}.log"));
        let mut child = run_container(spec, container, "raftlock-backup-1", &netns, &volumes, &log);
        assert!(child.wait().unwrap().success(), "{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(1100));
    }
    let files: Vec<PathBuf> = std::fs::read_dir(&saved).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 2, "{files:?}");
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("raftlock-snapshot-") && name.ends_with("Z.db"), "{name}");
        let restored = dir.join(format!("restored-{name}"));
        let out = Command::new(env!("CARGO_BIN_EXE_raftlockctl"))
            .args(["snapshot", "restore"])
            .arg(file)
            .args(["--name", "r", "--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--data-dir"])
            .arg(&restored)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    (saved, files)
}

#[test]
fn the_statefulset_runs_as_kubernetes_runs_it() {
    run_statefulset("raftlock.yaml", 1, false);
}

#[test]
fn the_mtls_statefulset_runs_as_kubernetes_runs_it() {
    run_statefulset("raftlock-mtls.yaml", 2, true);
}
