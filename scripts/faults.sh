#!/usr/bin/env bash
# raftlock's fault suite (faults/): for each nemesis, a fresh cluster of real
# raftlock processes on 127.0.0.11-13 (or -15), workloads recording every
# operation (registers, acknowledged writes, leases, etcd and native locks,
# watches), faults injected for a while, then every history checked. Prints a
# table per nemesis: operations, faults injected, anomalies (must be 0).
#
#   scripts/faults.sh                      # the short pass CI runs (~7 min),
#                                          # then the election checks
#                                          # (pre-vote, check-quorum: ~1 min)
#   scripts/faults.sh --build              # build the binaries only
#   scripts/faults.sh --minutes 10         # a long run: 10 min per nemesis
#   scripts/faults.sh --nemesis pause-leader-long,bridge --members 5 --seed 42
#   scripts/faults.sh --upgrade            # the rolling upgrade from release
#                                          # 0.1.0 and back, leader last and
#                                          # leader first (~3 min; CI runs it)
#   scripts/faults.sh --upgrade --minutes 10   # the same, 10 min each
#
# A failing run keeps its histories, data and logs under target/faults/.
# Needs root (nftables cuts links between the members' addresses); installs
# Debian's nftables if it is missing, libfaketime (the clock-jump nemesis
# moves members' wall clocks with it), and protobuf-compiler (the suite's
# client, the etcd-client crate, needs protoc to build).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v nft >/dev/null || missing+=(nftables)
compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null || missing+=(libfaketime)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
scripts/apt-install.sh "${missing[@]}"
# Both packages' binaries (a `--bin` filter would apply to both and skip the suite's).
# scripts/test.sh's features, so that its build of raftlock serves here too.
cargo build --quiet -p raftlock -p raftlock-faults --bins --features raftlock/bench-etcd-client
# Cargo's target directory: ./target unless CARGO_TARGET_DIR or a config moves it.
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ "${1:-}" = --build ]; then
  exit 0
fi
if [ "${1:-}" = --upgrade ]; then
  shift
  # Release 0.1.0, built from git once (scripts/old-release.sh).
  old=$(scripts/old-release.sh)
  [ $# -gt 0 ] || set -- --minutes 0.25
  exec "$target/debug/raftlock-faults" --upgrade --old-raftlock "$old/raftlock" "$@"
fi
if [ $# -gt 0 ]; then
  exec "$target/debug/raftlock-faults" "$@"
fi
"$target/debug/raftlock-faults" --minutes 0.25
exec "$target/debug/raftlock-faults" --elections
