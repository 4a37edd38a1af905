#!/usr/bin/env bash
# Builds the raftlock:latest image without a registry: the two binaries are
# built here, statically linked (glibc's crt-static), and copied into an empty
# (FROM scratch) image. `docker compose up` then finds the image and does not
# build it. With a registry, `docker compose build` uses the Dockerfile instead.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static --cfg tokio_unstable" cargo build --release --target $target --bins >&2
context=target/docker-context
rm -rf "$context"; mkdir -p "$context/data"
cp "target/$target/release/raftlock" "target/$target/release/raftlockctl" "$context/"
docker build -q -f docker/Dockerfile.local -t raftlock:latest "$context" >&2
echo raftlock:latest
