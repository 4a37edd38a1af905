#!/usr/bin/env bash
# raftlock's fuzz targets (fuzz/, cargo fuzz with libFuzzer): every decoder
# of bytes that come from outside or from disk — peer messages, a log
# entry's command (decoded and applied twice: apply must be total and
# deterministic), WAL segments, the state store's journal, snapshot and
# backup images, the JSON gateway's streamed bodies. Each target starts
# from its checked-in corpus (fuzz/corpus/<target>) and fails on a panic, a
# crash, or more than 2 GiB of memory.
#
#   scripts/fuzz.sh                       # the short pass CI runs: 20 s a target
#   scripts/fuzz.sh --seconds 600         # a longer run: 10 min a target
#   scripts/fuzz.sh --seconds 60 wal_segment snapshot_image
#   scripts/fuzz.sh --build               # install cargo-fuzz and build the
#                                         # targets only (CI does it in the
#                                         # background, while the fault
#                                         # suite leaves a core idle)
#
# Installs cargo-fuzz from crates.io if it is missing. Built without a
# sanitizer (`-s none`): the code fuzzed is safe Rust, where a sanitizer
# finds nothing a panic does not, and a build without one needs no nightly
# toolchain. What a run finds is kept under fuzz/artifacts/<target>/;
# inputs that reached new code are added to the corpus directory (commit
# the useful ones).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=20
targets=()
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build) build_only=1; shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(peer_payload command_apply wal_segment state_journal snapshot_image gateway_json)
fi
command -v cargo-fuzz >/dev/null || cargo install --locked --quiet cargo-fuzz
# The server's runtime flag (.cargo/config.toml) is not read for fuzz/'s own workspace.
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tokio_unstable"
# Built once for all targets (cargo fuzz builds every target without one).
cargo fuzz build -s none --dev
[ "$build_only" = 0 ] || exit 0
failed=()
for t in "${targets[@]}"; do
  corpus="fuzz/corpus/$t"
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  echo "fuzz: $t for ${seconds} s from $(ls "$corpus" | wc -l) corpus inputs"
  if cargo fuzz run -s none --dev "$t" "$corpus" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
      -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 2> "fuzz/artifacts/$t/run.log"; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "fuzz/artifacts/$t/run.log" | tail -1 || true
  else
    failed+=("$t")
    tail -40 "fuzz/artifacts/$t/run.log"
  fi
done
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
