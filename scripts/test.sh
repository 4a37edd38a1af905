#!/usr/bin/env bash
# Runs raftlock's test suite on a fresh machine: installs what the tests need
# (Debian's protobuf-compiler for the etcd-client test dependency, Debian's
# etcd-client for etcdctl 3.4, etcd 3.5.1 from PyPI for etcdctl 3.5,
# python-etcd3 from PyPI for the python interop test, Debian's golang-go and
# golang-etcd-server-dev for the Go clientv3 interop test, dnsmasq-base for
# the DNS discovery and Kubernetes manifest tests (with iproute2 and openssl),
# prometheus for the test that runs a real Prometheus, curl for the
# HTTP/JSON gateway test, raftlock release 0.1.0 built from git for the
# upgrade test), then
# runs every test (the server's, the fault suite's checkers, the Python
# client's pytest suite, in a virtualenv of its own, the Go client's go
# test, and the web console's in headless Chromium, which
# scripts/test-console.sh installs). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v go >/dev/null || missing+=(golang-go)
command -v curl >/dev/null || missing+=(curl)
[ -d /usr/share/gocode/src/go.etcd.io/etcd/clientv3 ] || missing+=(golang-etcd-server-dev)
command -v dnsmasq >/dev/null || missing+=(dnsmasq-base)
command -v prometheus >/dev/null || missing+=(prometheus)
command -v ip >/dev/null || missing+=(iproute2)
command -v openssl >/dev/null || missing+=(openssl)
scripts/apt-install.sh "${missing[@]}"
RAFTLOCK_ETCD_DIR=$(scripts/install-etcd.sh)
RAFTLOCK_PYTHON_ETCD3=$(scripts/install-python-etcd3.sh)
# Release 0.1.0, for the rolling upgrade and downgrade test (built from git
# history once, unoptimized: about 3 minutes).
RAFTLOCK_RELEASE_0_1_0=$(scripts/old-release.sh)
export RAFTLOCK_ETCD_DIR RAFTLOCK_PYTHON_ETCD3 RAFTLOCK_RELEASE_0_1_0

# Ports the test harness chose and then found taken by a process outside
# its claims (testkit's Builder::spawn chooses again, and says who held
# them): shown at the end, pass or fail, since a passing test's output is not.
taken=/tmp/raftlock-test-ports/taken.log
rm -f "$taken"
trap '[ -s "$taken" ] && { echo "test.sh: ports found taken during the tests:"; cat "$taken"; } >&2; true' EXIT

# The crate's shape first (seconds): no import circle, layers kept, openraft
# only under src/raft, sled only under src/storage, files under 600 lines.
python3 scripts/check-layers.py

# With raftlockctl's etcd-client bench driver (it needs protoc, installed above).
cargo test --workspace --features raftlock/bench-etcd-client "$@"

# The Python client's own tests (pytest), against members of the debug
# build that `cargo test` just made.
RAFTLOCK_BIN=$PWD/target/debug/raftlock scripts/test-python-client.sh

# The Go client's own tests (go vet, go test), built offline in GOPATH mode
# from Debian's Go packages, against the same debug build.
RAFTLOCK_BIN=$PWD/target/debug/raftlock scripts/test-go-client.sh

# The web console in headless Chromium (Selenium), against the same build.
RAFTLOCK_BIN=$PWD/target/debug/raftlock RAFTLOCKCTL_BIN=$PWD/target/debug/raftlockctl scripts/test-console.sh
