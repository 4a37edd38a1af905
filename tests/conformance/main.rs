//! raftlock against etcd's own answers: request suites recorded from a real
//! etcd 3.5.1 (the `*.json` suites and their `*.golden.json` recordings beside
//! this file, re-recorded by scripts/record-goldens.sh) replayed against a
//! raftlock cluster, every answer compared field by field.

use raftlock_testkit as common;

mod api;
mod auth;
