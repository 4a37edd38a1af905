#!/usr/bin/env bash
# Re-records the conformance goldens (tests/conformance/*.golden.json) against a
# fresh single-member etcd 3.5.1 (the auth golden against one run with
# tests/conformance/auth.rs's flags; the gateway golden with curl against its
# HTTP/JSON gateway), installed from PyPI by install-etcd.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
RAFTLOCK_ETCD_DIR=$(scripts/install-etcd.sh)
export RAFTLOCK_ETCD_DIR
cargo test --test conformance -- --ignored api::record_goldens --exact
cargo test --test conformance -- --ignored auth::record_auth_golden --exact
cargo test --test e2e -- --ignored gateway::record_gateway_golden --exact
git status --short tests/conformance
