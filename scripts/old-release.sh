#!/usr/bin/env bash
# Builds raftlock release 0.1.0 (commit 71620aa, CHANGELOG.md) from this
# repository's history, once, and prints the directory that holds its
# `raftlock` and `raftlockctl` (build output on stderr). The rolling
# upgrade and downgrade tests (tests/e2e/versions.rs) run it beside the
# current build.
#
# It builds in this tree's own target directory, from a git worktree of the
# commit: the dependencies both releases share are compiled once. The two
# raftlock crates do not collide there (their versions differ), but the
# binaries cargo copies to target/debug are the last built, so they are
# copied out, and the current tree's next build copies its own back.
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
(cd "$src" && CARGO_TARGET_DIR=$target cargo build --quiet --bins -p raftlock >&2)
mkdir -p "$out"
cp "$target/debug/raftlock" "$target/debug/raftlockctl" "$out/"
echo "$commit" >"$out/commit"
git worktree remove --force "$src"
echo "$out"
