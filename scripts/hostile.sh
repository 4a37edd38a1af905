#!/usr/bin/env bash
# raftlock's hostile-client suite (faults/src/hostile): a 3-member cluster of
# real raftlock processes on 127.0.0.11-13, each under `ulimit -v` (8 GiB),
# attacked one way after another — a txn whose answer would be 12.7 GB,
# nested and oversized requests, garbage and cut gRPC frames, gateway bodies
# a byte per chunk, 5,000 streams on one connection, slowloris connections
# on both ports, a watcher that never reads, thousands of watched ranges,
# forged election leader keys, garbage and forged messages on the peer port,
# a flood of password guesses. After each: every member is the same process,
# takes a put and a linearizable get, and its peak RSS stays under 1.5 GiB.
# Prints a row per attack and `N passed, N failed`; exits non-zero on a failure.
#
#   scripts/hostile.sh                                  # every attack (~1 min)
#   scripts/hostile.sh --attack auth-flood,peer-garbage # some of them
#
# A failing run keeps the members' data and logs under target/faults/.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
scripts/apt-install.sh "${missing[@]}"
# scripts/test.sh's features, so that its build of raftlock serves here too.
cargo build --quiet -p raftlock -p raftlock-faults --bins --features raftlock/bench-etcd-client
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
exec "$target/debug/raftlock-faults" --hostile "$@"
