//! The command-line tools the tests run, found and run one way: etcd's
//! (etcdctl 3.4 from Debian's etcd-client, etcd and etcdctl 3.5.1 installed
//! by `scripts/install-etcd.sh`) and raftlock's own `raftlockctl`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Where etcd 3.5.1's binaries are: `$RAFTLOCK_ETCD_DIR` (set by
/// `scripts/test.sh`), else where `scripts/install-etcd.sh` puts them.
pub fn etcd_dir() -> PathBuf {
    std::env::var("RAFTLOCK_ETCD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/etcd-3.5.1"))
}

/// etcdctl 3.4 (Debian's) and 3.5.1, each checked to exist.
pub fn etcdctls() -> Vec<PathBuf> {
    let all = vec![PathBuf::from("/usr/bin/etcdctl"), etcd_dir().join("etcdctl")];
    for p in &all {
        assert!(p.exists(), "{} is missing: run the tests with scripts/test.sh, which installs it", p.display());
    }
    all
}

/// An etcdctl binary aimed at some endpoints (v3 API).
pub struct Etcdctl {
    pub bin: PathBuf,
    pub endpoints: String,
}

impl Etcdctl {
    /// etcdctl 3.5.1 at `endpoints` (comma-separated).
    pub fn v35(endpoints: &str) -> Etcdctl {
        Etcdctl { bin: etcd_dir().join("etcdctl"), endpoints: endpoints.to_string() }
    }

    /// Run it with `args`, `stdin` as its input; whatever the outcome.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoints)).args(args);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().unwrap()
    }

    /// Run it with `args`; it must succeed. Returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(out.status.success(), "{} {args:?}: {}", self.bin.display(), text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// `raftlockctl`, as cargo built it, with nothing on its stdin.
pub fn raftlockctl() -> Command {
    let mut cmd = Command::new(crate::cluster::built_binary("raftlockctl"));
    cmd.stdin(Stdio::null());
    cmd
}

/// stdout then stderr of a finished command, as text.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}
