#!/usr/bin/env bash
# The docker-compose test: builds the raftlock image without a registry
# (scripts/docker-image.sh), then brings the top-level docker-compose.yml up
# and puts it through a stopped leader and a partitioned one, then the TLS
# variant (docker-compose.tls.yml) with mTLS clients (tests/compose.rs). The
# two share the published ports, so they run one after the other.
# Needs Docker with Compose (v2 `docker compose` or v1 `docker-compose`) and
# what scripts/test.sh installs (etcdctl 3.5, protoc).
#
#   scripts/compose-test.sh                 # the image from the test build's
#                                           # binaries (what CI runs: after
#                                           # scripts/test.sh, nothing compiles)
#   RELEASE_IMAGE=1 scripts/compose-test.sh # the release image (static, fat
#                                           # LTO: ~15 minutes of building)
set -euo pipefail
cd "$(dirname "$0")/.."
RAFTLOCK_ETCD_DIR=$(scripts/install-etcd.sh)
export RAFTLOCK_ETCD_DIR
if [ "${RELEASE_IMAGE:-}" = 1 ]; then
  scripts/docker-image.sh >/dev/null
else
  scripts/docker-image.sh --test-build >/dev/null
fi
# scripts/test.sh's features, so that its build serves here too.
cargo test --features raftlock/bench-etcd-client --test compose -- --ignored --nocapture --test-threads=1
