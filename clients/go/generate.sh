#!/usr/bin/env bash
# Generates the Go client's protobuf code (clients/go/lockpb) from
# proto/raftlock/v1/lock.proto and clients/go/proto (the etcd messages it
# uses, under a package of its own), with Debian's protoc and the
# protoc-gen-go and protoc-gen-go-grpc built from Debian's Go source
# (golang-google-protobuf-dev 1.28.1, golang-google-grpc-dev 1.33.3) into
# .tools/go-bin: Debian's protoc-gen-go package cannot be installed beside
# golang-etcd-server-dev, which the clientv3 tests need. lock.proto is read with its one etcd import
# pointed at that package instead (the header is wire-identical), so that
# the client links beside etcd's clientv3. The generated files are checked
# in; `--check` regenerates them elsewhere and fails if they differ (the
# Go client's tests run it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd -P)
root=$(cd "$here/../.." && pwd)
check=false
[ "${1:-}" = --check ] && check=true
gocode=/usr/share/gocode/src
for need in protoc go "$gocode/google.golang.org/protobuf/cmd/protoc-gen-go" \
    "$gocode/google.golang.org/grpc/cmd/protoc-gen-go-grpc"; do
  command -v "$need" >/dev/null || [ -d "$need" ] || {
    echo "$need is missing: scripts/test-go-client.sh installs it" >&2
    exit 1
  }
done
bin=$root/.tools/go-bin
for plugin in google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc; do
  [ -x "$bin/${plugin##*/}" ] ||
    GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$root/.tools/go-cache" GOFLAGS= \
      go build -o "$bin/${plugin##*/}" "$plugin"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/in/raftlock/v1" "$work/out"
sed -e 's|import "etcdserverpb/rpc.proto";|import "raftlock/client/etcd.proto";|' \
    -e 's|etcdserverpb\.ResponseHeader|raftlock.client.etcd.ResponseHeader|g' \
    "$root/proto/raftlock/v1/lock.proto" >"$work/in/raftlock/v1/lock.proto"
if grep -q etcdserverpb "$work/in/raftlock/v1/lock.proto"; then
  echo "lock.proto names an etcd type the Go client does not have: add it to clients/go/proto" >&2
  exit 1
fi
protoc -I "$work/in" -I "$here/proto" \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out="$work/out" --go_opt=paths=source_relative \
  --go_opt=Mraftlock/v1/lock.proto=raftlock/lockpb \
  --go_opt=Mraftlock/client/etcd.proto=raftlock/lockpb \
  --go-grpc_out="$work/out" --go-grpc_opt=paths=source_relative \
  --go-grpc_opt=Mraftlock/v1/lock.proto=raftlock/lockpb \
  --go-grpc_opt=Mraftlock/client/etcd.proto=raftlock/lockpb \
  raftlock/v1/lock.proto raftlock/client/etcd.proto
mkdir -p "$work/lockpb"
mv "$work/out/raftlock/v1/"*.go "$work/out/raftlock/client/"*.go "$work/lockpb/"
if $check; then
  if ! diff -r "$here/lockpb" "$work/lockpb" >&2; then
    echo "clients/go/lockpb is not what clients/go/generate.sh makes from proto/: run it and commit" >&2
    exit 1
  fi
else
  rm -rf "$here/lockpb"
  cp -r "$work/lockpb" "$here/lockpb"
fi
