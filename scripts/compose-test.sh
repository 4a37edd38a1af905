#!/usr/bin/env bash
# The docker-compose test: builds the raftlock image without a registry
# (scripts/docker-image.sh), then brings the top-level docker-compose.yml up
# and puts it through a stopped leader and a partitioned one, then the TLS
# variant (docker-compose.tls.yml) with mTLS clients (tests/compose.rs). The
# two share the published ports, so they run one after the other.
# Needs Docker with Compose (v2 `docker compose` or v1 `docker-compose`) and
# what scripts/test.sh installs (etcdctl 3.5, protoc).
set -euo pipefail
cd "$(dirname "$0")/.."
RAFTLOCK_ETCD_DIR=$(scripts/install-etcd.sh)
export RAFTLOCK_ETCD_DIR
scripts/docker-image.sh >/dev/null
cargo test --test compose -- --ignored --nocapture --test-threads=1
