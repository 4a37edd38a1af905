#!/usr/bin/env bash
# Prints the directory holding release builds of raftlock and raftlockctl:
# $BIN_DIR when set (an older build, say, to compare with), else cargo's
# release directory after building them there (build output on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${BIN_DIR:-}" ]; then
  cd "$BIN_DIR" && pwd
else
  # raftlockctl's etcd-client bench driver needs protoc to build.
  command -v protoc >/dev/null || scripts/apt-install.sh protobuf-compiler
  cargo build --release --bins -p raftlock -p bench-plot --features raftlock/bench-etcd-client >&2
  # Cargo's target directory: ./target unless CARGO_TARGET_DIR or a config moves it.
  echo "$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release"
fi
