#!/usr/bin/env bash
# Builds raftlock release 0.1.0 (commit 71620aa, CHANGELOG.md) from this
# repository's history, once, and prints the directory that holds its
# `raftlock` (build output on stderr). The rolling upgrade and downgrade
# test (tests/e2e/versions.rs) runs it beside the current build.
#
# A debug build without optimization or debug info, in a target directory
# of its own under this tree's (target/releases/build): about 3 minutes
# from cold on 2 cores. The current tree's dependencies cannot be shared:
# their features are unified over this workspace, which 0.1.0's lacks, so
# every crate would build again anyway, and optimized it takes three times
# as long.
set -euo pipefail
cd "$(dirname "$0")/.."
release=0.1.0
commit=71620aa65fe442a31d7da6a67ce5746df32f31a4
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
out=$target/releases/$release
if [ -x "$out/raftlock" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$commit" ]; then
  echo "$out"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  # A shallow clone: fetch the release's commit.
  git fetch --quiet origin "$commit" >&2
fi
src=$target/releases/src-$release
git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
git worktree prune
git worktree add --quiet --detach "$src" "$commit" >&2
(cd "$src" && CARGO_TARGET_DIR=$target/releases/build cargo build --quiet --bin raftlock -p raftlock \
  --config 'profile.dev.opt-level=0' --config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.debug=0' >&2)
mkdir -p "$out"
cp "$target/releases/build/debug/raftlock" "$out/"
echo "$commit" >"$out/commit"
git worktree remove --force "$src"
echo "$out"
