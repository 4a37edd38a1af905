#!/usr/bin/env bash
# Builds the raftlock:latest image without a registry, from binaries built on
# this machine, into an empty (FROM scratch) image. `docker compose up` then
# finds the image and does not build it. With a registry, `docker compose
# build` uses the top-level Dockerfile instead.
#
#   scripts/docker-image.sh               # the release image: both binaries
#                                         # built here with the release profile
#                                         # (fat LTO), statically linked
#                                         # (glibc's crt-static)
#   scripts/docker-image.sh --test-build  # the test suite's dev-profile
#                                         # binaries (target/debug, which
#                                         # `scripts/test.sh` has built: no
#                                         # second build of the tree), with the
#                                         # shared libraries ldd names for them
#
# The second is what scripts/compose-test.sh (and so CI) runs: the same
# server code, image layout, user, volume and compose files, without the
# release build's ~15 minutes of compiling on two cores. The release image
# differs only in how the binaries were compiled and linked.
set -euo pipefail
cd "$(dirname "$0")/.."
context=target/docker-context
rm -rf "$context"; mkdir -p "$context/data" "$context/rootfs"
if [ "${1:-}" = --test-build ]; then
  # The features scripts/test.sh builds with, so that this is a no-op after it.
  command -v protoc >/dev/null || scripts/apt-install.sh protobuf-compiler
  cargo build --bins -p raftlock --features raftlock/bench-etcd-client >&2
  bin=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug
  for b in raftlock raftlockctl; do
    # Without the line tables: a third of the size, and the image needs none.
    objcopy --strip-debug "$bin/$b" "$context/rootfs/$b"
    # Each shared library (and the loader) at the path the binary asks for.
    for lib in $(ldd "$bin/$b" | grep -o '/[^ ]*'); do
      mkdir -p "$context/rootfs$(dirname "$lib")"
      cp -L "$lib" "$context/rootfs$lib"
    done
  done
else
  target=x86_64-unknown-linux-gnu
  RUSTFLAGS="-C target-feature=+crt-static --cfg tokio_unstable" cargo build --release --target $target --bins >&2
  cp "target/$target/release/raftlock" "target/$target/release/raftlockctl" "$context/rootfs/"
fi
docker build -q -f docker/Dockerfile.local -t raftlock:latest "$context" >&2
echo raftlock:latest
