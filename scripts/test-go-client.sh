#!/usr/bin/env bash
# Runs the Go client's tests (clients/go: go vet, then go test against real
# 3-member clusters of $RAFTLOCK_BIN, default target/debug/raftlock, with
# raftlockctl beside it). Built offline in GOPATH mode from Debian's Go
# packages, which it installs when missing: golang-go, golang-google-grpc-dev
# and golang-google-protobuf-dev (the client's dependencies and its code
# generators' source), golang-etcd-server-dev (etcd's clientv3, which the
# tests link beside the client), protobuf-compiler (the generated code's
# check) and etcd-client (etcdctl, a contender in one test). Extra arguments
# go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
gocode=/usr/share/gocode/src
missing=()
command -v go >/dev/null || missing+=(golang-go)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v etcdctl >/dev/null || missing+=(etcd-client)
[ -d "$gocode/google.golang.org/grpc/cmd/protoc-gen-go-grpc" ] || missing+=(golang-google-grpc-dev)
[ -d "$gocode/google.golang.org/protobuf/cmd/protoc-gen-go" ] || missing+=(golang-google-protobuf-dev)
[ -d "$gocode/go.etcd.io/etcd/clientv3" ] || missing+=(golang-etcd-server-dev)
scripts/apt-install.sh "${missing[@]}"
# A GOPATH of the project's own in which the module's path, raftlock, is
# clients/go.
gopath=$PWD/.tools/go-client-gopath
mkdir -p "$gopath/src"
ln -sfn "$PWD/clients/go" "$gopath/src/raftlock"
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$PWD/.tools/go-cache" GOFLAGS=
export RAFTLOCK_BIN=${RAFTLOCK_BIN:-$PWD/target/debug/raftlock}
cd "$gopath/src/raftlock"
go vet ./...
go test -count=1 "$@" ./...
